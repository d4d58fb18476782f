package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/internal/dockerclient"
	"github.com/rollout-rl/rollout/sandbox/image"
)

func init() { registerSandbox(newSandboxImageCmd) }

func newSandboxImageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build the sandbox base images (no registry needed)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newSandboxImageBuildCmd())
	return cmd
}

func newSandboxImageBuildCmd() *cobra.Command {
	var (
		name    string
		force   bool
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Build the sandbox base images (and, on request, engine images) from Debian packages; a no-op when they are current",
		Long: "Build rollout-sandbox:<name> images from Debian packages on this machine and import them\n" +
			"through the Docker Engine API. An image whose recipe hash label matches is left alone.\n" +
			"Sandbox recipes (--name all): " + fmt.Sprint(image.Names()) + ".\n" +
			"Engine recipes, built only when named: " + engineRecipes() + ".\n" +
			"See docs/images.md and docs/real-engines.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			names := image.Names()
			if name != "all" {
				if _, err := image.Describe(name); err != nil {
					return usageError(cmd, err)
				}
				names = []string{name}
			}
			ctx := cmd.Context()
			cli, err := dockerclient.New(ctx)
			if err != nil {
				return err
			}
			defer cli.Close()
			out := cmd.OutOrStdout()
			var log io.Writer
			if verbose {
				log = cmd.ErrOrStderr()
			}
			start := time.Now()
			for _, n := range names {
				fmt.Fprintf(out, "%s: checking\n", image.Ref(n))
				res, err := image.Ensure(ctx, cli, n, image.Options{Force: force, Log: log})
				if err != nil {
					return err
				}
				if res.Built {
					fmt.Fprintf(out, "%s: built (%s) in %s, id %s, recipe %s\n", res.Ref, res.Reason, res.Duration.Round(10*time.Millisecond), short(res.ID), res.Hash[:12])
				} else {
					fmt.Fprintf(out, "%s: up to date (recipe %s), checked in %s\n", res.Ref, res.Hash[:12], res.Duration.Round(time.Millisecond))
				}
			}
			fmt.Fprintf(out, "done in %s\n", time.Since(start).Round(10*time.Millisecond))
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "all", "image to build: all (the sandbox images) or one recipe name, e.g. llamacpp")
	cmd.Flags().BoolVar(&force, "force", false, "rebuild even when the image is current")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "show the build tools' output (mmdebstrap, apt-get) on stderr")
	return cmd
}

// engineRecipes lists the engine recipes with their image references.
func engineRecipes() string {
	var parts []string
	for _, n := range image.EngineNames() {
		parts = append(parts, n+" ("+image.Ref(n)+")")
	}
	return strings.Join(parts, ", ")
}

func short(id string) string {
	const p = "sha256:"
	if len(id) > len(p)+12 && id[:len(p)] == p {
		return id[len(p) : len(p)+12]
	}
	return id
}
