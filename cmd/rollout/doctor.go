package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/internal/devtools/doctor"
)

func init() { register(newDoctorCmd) }

func newDoctorCmd() *cobra.Command {
	var skipAgent bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check that this machine can run rollouts (Docker, images, disk, agent)",
		Long: "Check the Docker engine (reachable, API version, storage driver, free disk), the sandbox\n" +
			"base images and the sandbox agent. Prints one line per check; every problem says what to do.\n" +
			"Exit code 0 when everything the main job needs is present, 1 otherwise.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep := doctor.Run(cmd.Context(), doctor.Options{SkipAgent: skipAgent})
			out := cmd.OutOrStdout()
			for _, c := range rep.Checks {
				fmt.Fprintln(out, c)
			}
			if !rep.OK() {
				// The lines above are the message; nothing more to print.
				return withExitCode(1, nil)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&skipAgent, "skip-agent", false, "do not check (or build) the sandbox agent binary")
	return cmd
}
