package main

import "github.com/spf13/cobra"

// sandboxCommands holds the `rollout sandbox` subcommands; each lives in its
// own sandbox_*.go file and adds itself with registerSandbox.
var sandboxCommands []func() *cobra.Command

func registerSandbox(newCmd func() *cobra.Command) {
	sandboxCommands = append(sandboxCommands, newCmd)
}

func init() { register(newSandboxCmd) }

func newSandboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Manage sandbox images and containers",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	for _, c := range sandboxCommands {
		cmd.AddCommand(c())
	}
	return cmd
}
