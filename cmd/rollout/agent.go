package main

import (
	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/sandbox/agent"
)

func init() { register(newAgentCmd) }

// newAgentCmd is the in-container exec agent, for when this binary is
// static and is placed into sandboxes itself (see sandbox.ResolveAgent).
func newAgentCmd() *cobra.Command {
	return &cobra.Command{
		Use:                sandbox.AgentSubcommand,
		Short:              "Run the in-container sandbox agent (internal)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			if code := agent.Main(args); code != 0 {
				return withExitCode(code, nil)
			}
			return nil
		},
	}
}
