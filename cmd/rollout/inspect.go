package main

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/trajectory"
)

func init() { register(newInspectCmd) }

func newInspectCmd() *cobra.Command {
	var (
		html  string
		limit int
	)
	cmd := &cobra.Command{
		Use:   "inspect RUN_DIR [--html out.html]",
		Short: "Summarise a run directory; optionally write a static HTML trajectory viewer",
		Long: "Print counts, the reward distribution, failure reasons and the slowest phases of a run\n" +
			"directory (or one part file). With --html, also write one self-contained page to browse the\n" +
			"trajectories: conversations with tool calls and results, rewards, and the token sequence with\n" +
			"trained tokens highlighted.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 1 {
				return usageError(cmd, fmt.Errorf("--limit %d: must be >= 1", limit))
			}
			run, err := trajectory.Open(args[0])
			if err != nil {
				return withExitCode(1, err)
			}
			recs, err := run.ReadAll(cmd.Context())
			if err != nil {
				return withExitCode(1, err)
			}
			if err := trajectory.WriteSummary(cmd.OutOrStdout(), args[0], trajectory.Summarize(run, recs)); err != nil {
				return err
			}
			if html == "" {
				return nil
			}
			title := filepath.Base(filepath.Clean(args[0]))
			if run.Manifest != nil && run.Manifest.RunID != "" {
				title = run.Manifest.RunID
			}
			err = writeOutput(html, func(w io.Writer) error {
				return trajectory.WriteHTML(w, recs, trajectory.HTMLOptions{Title: title, Limit: limit})
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "\nwrote %s (%d trajectories)\n", html, min(limit, len(recs)))
			return nil
		},
	}
	cmd.Flags().StringVar(&html, "html", "", "write a self-contained HTML viewer to this file")
	cmd.Flags().IntVar(&limit, "limit", 500, "at most this many trajectories in the HTML page")
	return cmd
}
