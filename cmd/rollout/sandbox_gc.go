package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/sandbox"
)

func init() { registerSandbox(newSandboxGCCmd) }

func newSandboxGCCmd() *cobra.Command {
	var opts sandbox.ReapOptions
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Remove orphaned sandbox containers of this service",
		Long: "Remove containers labelled io.rollout.managed=true whose creating process on this host is gone\n" +
			"(crashed runs). Containers of running instances are kept unless --all is given.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			removed, err := sandbox.GC(cmd.Context(), opts)
			out := cmd.OutOrStdout()
			for _, r := range removed {
				fmt.Fprintf(out, "removed %s %s (instance %s, %s)\n", r.ID[:12], r.Name, r.Instance, r.Reason)
			}
			fmt.Fprintf(out, "%d container(s) removed\n", len(removed))
			return err
		},
	}
	cmd.Flags().BoolVar(&opts.All, "all", false, "remove every sandbox container of this service, also those of running instances")
	cmd.Flags().BoolVar(&opts.OtherHosts, "other-hosts", false, "also remove containers created from other hosts (shared engine)")
	return cmd
}
