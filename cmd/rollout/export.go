package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/trajectory"
)

func init() { register(newExportCmd) }

func newExportCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "export KIND RUN_DIR -o FILE",
		Short: "Export a run's trajectories as SFT, DPO, Atropos, verl, SkyRL, NeMo Gym or eval data",
		Long: "Read the Parquet trajectories of RUN_DIR (or one part file) and write training or eval data.\n" +
			"Kinds: sft, dpo, atropos, verl, skyrl, nemo-gym, eval. Infra failures are never exported as training\n" +
			"data unless --include-failed is given (sft, dpo). See docs/trajectory-schema.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newExportSFTCmd(), newExportDPOCmd(), newExportAtroposCmd(),
		newExportTrainerCmd("verl", "verl AgentLoopOutput JSONL: one sample per rollout (and per session branch)", trajectory.WriteVerl),
		newExportTrainerCmd("skyrl", "SkyRL GeneratorOutput JSONL: one group per line", trajectory.WriteSkyRL),
		newExportTrainerCmd("nemo-gym", "NeMo Gym rollouts JSONL: Responses output items with token fields, reward", trajectory.WriteNeMoGym),
		newExportEvalCmd())
	return cmd
}

// filterFlags registers the shared record filters.
func filterFlags(cmd *cobra.Command, f *trajectory.Filter, minReward *float64) {
	cmd.Flags().Float64Var(minReward, "min-reward", 0, "drop rollouts with a lower reward (only when set)")
	cmd.Flags().IntVar(&f.TopK, "top-k", 0, "keep the K highest-reward rollouts of each group (0 = all)")
	cmd.Flags().BoolVar(&f.FinishedOnly, "finished-only", false, "drop rollouts that did not finish naturally (truncated, max turns)")
	cmd.Flags().BoolVar(&f.IncludeFailed, "include-failed", false, "keep infra-failed rollouts (excluded by default)")
	cmd.Flags().BoolVar(&f.Dedupe, "dedupe", false, "drop repeated conversations")
}

func applyMinReward(cmd *cobra.Command, f *trajectory.Filter, v float64) {
	if cmd.Flags().Changed("min-reward") {
		f.MinReward = &v
	}
}

func loadRun(cmd *cobra.Command, dir string) ([]trajectory.Record, error) {
	run, err := trajectory.Open(dir)
	if err != nil {
		return nil, withExitCode(1, err)
	}
	recs, err := run.ReadAll(cmd.Context())
	if err != nil {
		return nil, withExitCode(1, err)
	}
	return recs, nil
}

// writeOutput writes through a temp file renamed over path on success, so a
// failed export never leaves a half file that looks complete.
func writeOutput(path string, fn func(w io.Writer) error) error {
	if path == "-" {
		return fn(os.Stdout)
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("create output %s: %w", path, err)
	}
	bw := bufio.NewWriterSize(tmp, 1<<20)
	err = fn(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func requireOutput(cmd *cobra.Command, out string) error {
	if out == "" {
		return usageError(cmd, errors.New("-o FILE is required (use - for stdout)"))
	}
	return nil
}

// exportRun reads the run at dir, writes the export through writeOutput
// and reports its counts.
func exportRun(cmd *cobra.Command, what, dir, out string, write func(io.Writer, []trajectory.Record) (trajectory.ExportStats, error)) error {
	recs, err := loadRun(cmd, dir)
	if err != nil {
		return err
	}
	var st trajectory.ExportStats
	err = writeOutput(out, func(w io.Writer) error {
		st, err = write(w, recs)
		return err
	})
	if err != nil {
		return err
	}
	reportStats(cmd, what, out, st)
	return nil
}

func reportStats(cmd *cobra.Command, what, out string, st trajectory.ExportStats) {
	fmt.Fprintf(cmd.ErrOrStderr(), "%s: read %d rollouts, filtered %d, duplicates %d, skipped %d, wrote %d lines to %s\n",
		what, st.Read, st.Filtered, st.Duplicates, st.Skipped, st.Written, out)
}

func newExportSFTCmd() *cobra.Command {
	var (
		out, format string
		f           trajectory.Filter
		minReward   float64
	)
	cmd := &cobra.Command{
		Use:   "sft RUN_DIR -o FILE",
		Short: "SFT JSONL: ShareGPT conversations (Hermes layout) or OpenAI messages+tools",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireOutput(cmd, out); err != nil {
				return err
			}
			if format != trajectory.FormatShareGPT && format != trajectory.FormatMessages {
				return usageError(cmd, fmt.Errorf("--format %q: want sharegpt or messages", format))
			}
			applyMinReward(cmd, &f, minReward)
			return exportRun(cmd, "sft", args[0], out, func(w io.Writer, recs []trajectory.Record) (trajectory.ExportStats, error) {
				return trajectory.WriteSFT(w, recs, format, f)
			})
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "output JSONL file (- for stdout)")
	cmd.Flags().StringVar(&format, "format", trajectory.FormatShareGPT, "sharegpt or messages")
	filterFlags(cmd, &f, &minReward)
	return cmd
}

func newExportDPOCmd() *cobra.Command {
	var (
		out       string
		opts      trajectory.DPOOptions
		minReward float64
	)
	cmd := &cobra.Command{
		Use:   "dpo RUN_DIR -o FILE",
		Short: "DPO JSONL: chosen/rejected pairs within a group by reward margin",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireOutput(cmd, out); err != nil {
				return err
			}
			if opts.MinMargin < 0 {
				return usageError(cmd, fmt.Errorf("--min-margin %v: must be >= 0", opts.MinMargin))
			}
			applyMinReward(cmd, &opts.Filter, minReward)
			return exportRun(cmd, "dpo", args[0], out, func(w io.Writer, recs []trajectory.Record) (trajectory.ExportStats, error) {
				return trajectory.WriteDPO(w, recs, opts)
			})
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "output JSONL file (- for stdout)")
	cmd.Flags().Float64Var(&opts.MinMargin, "min-margin", 0, "minimum reward gap between chosen and rejected (equal rewards never pair)")
	cmd.Flags().IntVar(&opts.PairsPerGroup, "pairs-per-group", 1, "pair the i-th best with the i-th worst rollout, up to N pairs")
	f := &opts.Filter
	cmd.Flags().Float64Var(&minReward, "min-reward", 0, "drop rollouts with a lower reward (only when set)")
	cmd.Flags().BoolVar(&f.FinishedOnly, "finished-only", false, "drop rollouts that did not finish naturally")
	cmd.Flags().BoolVar(&f.IncludeFailed, "include-failed", false, "keep infra-failed rollouts (excluded by default)")
	cmd.Flags().BoolVar(&f.Dedupe, "dedupe", false, "drop repeated pairs")
	return cmd
}

func newExportAtroposCmd() *cobra.Command {
	var (
		out   string
		opts  trajectory.AtroposOptions
		envID int
	)
	cmd := &cobra.Command{
		Use:   "atropos RUN_DIR -o FILE",
		Short: "Atropos ScoredDataGroup JSONL (tokens, masks, scores, inference_logprobs, …)",
		Long: "One ScoredDataGroup per line, as Atropos' /scored_data accepts it and as its process mode\n" +
			"saves groups. Infra failures are always excluded; a group left short gets group_overrides.group_size.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireOutput(cmd, out); err != nil {
				return err
			}
			if cmd.Flags().Changed("env-id") {
				if envID < 0 {
					return usageError(cmd, fmt.Errorf("--env-id %d: must be >= 0", envID))
				}
				opts.EnvID = &envID
			}
			return exportRun(cmd, "atropos", args[0], out, func(w io.Writer, recs []trajectory.Record) (trajectory.ExportStats, error) {
				return trajectory.WriteAtropos(w, recs, opts)
			})
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "output JSONL file (- for stdout)")
	cmd.Flags().IntVar(&envID, "env-id", 0, "add env_id (the id from /register-env) to every group")
	cmd.Flags().IntVar(&opts.GroupSize, "group-size", 0, "registered group size; shorter groups get group_overrides (0 = largest group)")
	cmd.Flags().BoolVar(&opts.ZeroAdvantageOnTruncation, "zero-truncated", false, "set overrides.set_advantage_to_zero for length-truncated rollouts")
	cmd.Flags().BoolVar(&opts.IncludeMessages, "messages", true, "include the conversations (messages)")
	return cmd
}

// newExportTrainerCmd is a trainer-sample export (verl, skyrl, nemo-gym):
// the same filters as sft except --include-failed and --dedupe, because
// infra failures are never training data and samples are not deduplicated.
func newExportTrainerCmd(kind, short string, write func(io.Writer, []trajectory.Record, trajectory.Filter) (trajectory.ExportStats, error)) *cobra.Command {
	var (
		out       string
		f         trajectory.Filter
		minReward float64
	)
	cmd := &cobra.Command{
		Use:   kind + " RUN_DIR -o FILE",
		Short: short,
		Long: short + ".\nInfra failures and rollouts that generated nothing are always excluded; a run without token ids\n" +
			"is refused (nemo-gym writes it without token fields). See docs/trajectory-schema.md, \"Trainer exports\".",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireOutput(cmd, out); err != nil {
				return err
			}
			if f.TopK < 0 {
				return usageError(cmd, fmt.Errorf("--top-k %d: must be >= 0", f.TopK))
			}
			applyMinReward(cmd, &f, minReward)
			return exportRun(cmd, kind, args[0], out, func(w io.Writer, recs []trajectory.Record) (trajectory.ExportStats, error) {
				return write(w, recs, f)
			})
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "output JSONL file (- for stdout)")
	cmd.Flags().Float64Var(&minReward, "min-reward", 0, "drop rollouts with a lower reward (only when set)")
	cmd.Flags().IntVar(&f.TopK, "top-k", 0, "keep the K highest-reward rollouts of each group, with all their branches (0 = all)")
	cmd.Flags().BoolVar(&f.FinishedOnly, "finished-only", false, "drop rollouts that did not finish naturally (truncated, max turns)")
	return cmd
}

func newExportEvalCmd() *cobra.Command {
	var (
		out  string
		opts trajectory.EvalOptions
		thr  float64
	)
	cmd := &cobra.Command{
		Use:   "eval RUN_DIR -o DIR",
		Short: "Eval report: DIR/metrics.json (pass@k, rewards, failure rate, timings) and DIR/samples.jsonl",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" || out == "-" {
				return usageError(cmd, errors.New("-o DIR is required"))
			}
			for _, k := range opts.Ks {
				if k < 1 {
					return usageError(cmd, fmt.Errorf("--k %d: must be >= 1", k))
				}
			}
			opts.PassThreshold = &thr
			recs, err := loadRun(cmd, args[0])
			if err != nil {
				return err
			}
			rep, err := trajectory.WriteEvalReport(out, recs, opts)
			if err != nil {
				return err
			}
			all := rep.Results["all"]
			fmt.Fprintf(cmd.OutOrStdout(), "%d samples, %d items: pass@1 %.4f, mean reward %.4f, infra failures %.1f%%; wrote %s\n",
				int(all["n_samples"]), int(all["n_items"]), all["pass@1"], all["mean_reward"], 100*all["infra_failure_rate"], out)
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "output directory")
	cmd.Flags().Float64Var(&thr, "pass-threshold", 1.0, "a rollout passes when reward >= this")
	cmd.Flags().IntSliceVar(&opts.Ks, "k", nil, "k values for pass@k (default 1, powers of two, and the samples per item)")
	cmd.Flags().StringVar(&opts.ModelName, "model", "", "model name for config_general (default: from the records)")
	return cmd
}
