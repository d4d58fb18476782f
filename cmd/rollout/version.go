package main

import (
	"context"
	"fmt"
	"time"

	"github.com/moby/moby/client"
	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/internal/util/version"
)

func init() { register(newVersionCmd) }

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the rollout version, commit, Go version and Docker API version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := version.Get()
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "rollout %s\ncommit: %s\ngo: %s\n", info.Version, info.Commit, info.GoVersion)
			// The Docker line is informational: an absent engine is not an
			// error for `version`, so scripts can always call it.
			fmt.Fprintln(w, "docker:", dockerLine(cmd.Context()))
			return nil
		},
	}
}

func dockerLine(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	cli, err := dockerclient.New(ctx)
	if err != nil {
		return fmt.Sprintf("unreachable (%s)", dockerclient.Host())
	}
	defer cli.Close()
	sv, err := cli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		return fmt.Sprintf("unreachable (%s): %v", dockerclient.Host(), err)
	}
	return fmt.Sprintf("engine %s, API %s (client uses %s)", sv.Version, sv.APIVersion, cli.ClientVersion())
}
