package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/internal/devtools/bench"
)

func init() { register(newBenchCmd) }

func newBenchCmd() *cobra.Command {
	var (
		jsonOut, corpus, kubeconfig string
		quick                       bool
	)
	cmd := &cobra.Command{
		Use:   "bench [suite...] [--json FILE] [--quick]",
		Short: "Measure the performance targets side by side with their baselines",
		Long: "Run the benchmark suites (default: all) and compare every measure with the target its\n" +
			"capability issue names. Suites: " + strings.Join(bench.Suites, ", ") + ".\n" +
			"Progress goes to stderr; --json writes the report ({\"machine\", \"run\", \"measures\"}), from which\n" +
			"`rollout bench report` renders docs/performance.md. Exits 1 when a suite fails, never because a\n" +
			"target is not met. The sandbox and runner suites need Docker.",
		Example: `  rollout bench --json out/bench.json
  rollout bench --quick
  rollout bench sandbox inference --json out/sandbox.json
  rollout bench parsers --corpus DIR     # time DIR/<parser>.txt (tools from DIR/tools.json)`,
		Args: func(cmd *cobra.Command, args []string) error {
			if _, err := bench.CheckSuites(args); err != nil {
				return usageError(cmd, err)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			suites, _ := bench.CheckSuites(args)
			if corpus != "" && !slices.Contains(suites, "parsers") {
				return usageError(cmd, errors.New("--corpus applies to the parsers suite, which is not selected"))
			}
			if corpus != "" {
				if st, err := os.Stat(corpus); err != nil || !st.IsDir() {
					return usageError(cmd, fmt.Errorf("--corpus %s: not a directory", corpus))
				}
			}
			rep, err := bench.Run(cmd.Context(), bench.Options{Suites: suites, Quick: quick, Corpus: corpus, Kubeconfig: kubeconfig, Log: cmd.ErrOrStderr()})
			if err != nil && len(rep.Measures) == 0 {
				return err
			}
			if jsonOut != "" {
				if werr := writeBenchJSON(jsonOut, rep, cmd.OutOrStdout()); werr != nil {
					return errors.Join(err, werr)
				}
			}
			if err != nil {
				return err
			}
			met, notMet, unmeasured := rep.Tally()
			out := cmd.OutOrStdout()
			if jsonOut != "-" {
				fmt.Fprintf(out, "%d targets met, %d not met, %d not measured\n", met, notMet, unmeasured)
				for _, m := range rep.Measures {
					if m.Target != "" && (m.Met == nil || !*m.Met) {
						fmt.Fprintf(out, "  %s\n", m.Line())
					}
				}
				if jsonOut != "" {
					fmt.Fprintf(out, "wrote %s\n", jsonOut)
				}
			}
			if len(rep.Run.Errors) > 0 {
				var names []string
				for s := range rep.Run.Errors {
					names = append(names, s)
				}
				slices.Sort(names)
				return fmt.Errorf("suites failed: %s (their measures are listed as not measured)", strings.Join(names, ", "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&jsonOut, "json", "", "write the JSON report to FILE (- for stdout)")
	f.BoolVar(&quick, "quick", false, "small counts: the whole run takes under two minutes (smoke test; numbers not comparable)")
	f.StringVar(&kubeconfig, "kubeconfig", os.Getenv("ROLLOUT_K8S_LAB_KUBECONFIG"), "sandbox suite: also measure the Kubernetes backend on this cluster (default $ROLLOUT_K8S_LAB_KUBECONFIG, the lab)")
	f.StringVar(&corpus, "corpus", "", "parsers suite: time every DIR/<parser>.txt instead of the repository corpus")
	cmd.AddCommand(newBenchReportCmd(), newBenchGatewayServeCmd())
	return cmd
}

// writeBenchJSON writes the report to path, or to stdout for "-".
func writeBenchJSON(path string, rep bench.Report, stdout io.Writer) error {
	if path == "-" {
		return rep.WriteJSON(stdout)
	}
	return writeFileAtomic(path, rep.WriteJSON)
}

// writeFileAtomic writes through a temporary file renamed over path, so
// that a failed write never leaves a truncated file behind.
func writeFileAtomic(path string, write func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".bench-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
