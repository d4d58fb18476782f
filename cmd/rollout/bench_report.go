package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/internal/devtools/bench"
)

func newBenchReportCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:     "report BENCH.json [--out FILE]",
		Short:   "Render a `rollout bench --json` report as Markdown (docs/performance.md)",
		Example: `  rollout bench report out/bench.json --out docs/performance.md`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := bench.ReadReport(args[0])
			if err != nil {
				return withExitCode(2, err)
			}
			if out == "" {
				return bench.WriteMarkdown(cmd.OutOrStdout(), rep)
			}
			return writeFileAtomic(out, func(w io.Writer) error { return bench.WriteMarkdown(w, rep) })
		},
	}
	cmd.Flags().StringVarP(&out, "out", "o", "", "write to FILE instead of stdout (replaced atomically)")
	return cmd
}
