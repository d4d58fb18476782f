package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// commands holds the constructors of the top-level subcommands. Each
// subcommand lives in its own file and adds itself from an init function, so
// no file has to list them all.
var commands []func() *cobra.Command

func register(newCmd func() *cobra.Command) { commands = append(commands, newCmd) }

// exitError carries a specific exit code out of a subcommand.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

// withExitCode makes a subcommand exit with code, printing err (if any).
func withExitCode(code int, err error) error { return &exitError{code: code, err: err} }

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "rollout",
		Short:         "Collect scored agent trajectories for RL training, SFT data and evaluation",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError(cmd, err)
	})
	for _, c := range commands {
		root.AddCommand(c())
	}
	return root
}

// usageError reports bad flags or arguments: exit code 2 with usage.
func usageError(cmd *cobra.Command, err error) error {
	return withExitCode(2, fmt.Errorf("%w\n\n%s", err, cmd.UsageString()))
}

func execute(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCmd()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(os.Stderr, "rollout:", ee.err)
		}
		return ee.code
	}
	// cobra reports unknown subcommands and arity errors as plain errors.
	if isUsageError(err) {
		fmt.Fprintf(os.Stderr, "rollout: %v\nRun 'rollout --help' for usage.\n", err)
		return 2
	}
	fmt.Fprintln(os.Stderr, "rollout:", err)
	return 1
}
