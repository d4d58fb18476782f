package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/internal/util/imageref"
	"github.com/rollout-rl/rollout/sandbox/image"
)

func init() { registerSandbox(newSandboxImageCmd) }

func newSandboxImageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build the sandbox base images (no registry needed); push images to a registry",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newSandboxImageBuildCmd(), newSandboxImagePushCmd())
	return cmd
}

func newSandboxImagePushCmd() *cobra.Command {
	var registry string
	cmd := &cobra.Command{
		Use:   "push --registry HOST[:PORT] IMAGE...",
		Short: "Tag local images as HOST[:PORT]/IMAGE and push them there (for sandbox.kubernetes.image_registry)",
		Long: "Push images of the local Docker engine to a registry, so that Kubernetes nodes pull them\n" +
			"(sandbox.kubernetes.image_registry: HOST[:PORT]; docs/kubernetes.md, \"Images\"). Each IMAGE that\n" +
			"names no registry is tagged HOST[:PORT]/IMAGE first. The engine does the push: plain HTTP\n" +
			"only to registries it treats as insecure (127.0.0.0/8 by default); credentials are the\n" +
			"engine's (docker login). Push the agent image too (rollout-agent:<sha12>, see\n" +
			"`scripts/k8s-lab/lab.sh images`).",
		Example: "  rollout sandbox image push --registry 127.0.0.1:5000 rollout-sandbox:bookworm rollout-agent:0123456789ab",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := imageref.CheckRegistry(registry); err != nil {
				return usageError(cmd, fmt.Errorf("--registry: %w", err))
			}
			ctx := cmd.Context()
			cli, err := dockerclient.New(ctx)
			if err != nil {
				return err
			}
			defer cli.Close()
			for _, ref := range args {
				start := time.Now()
				pushed, err := image.Push(ctx, cli, registry, ref)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: pushed in %s\n", pushed, time.Since(start).Round(10*time.Millisecond))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&registry, "registry", "", "registry to push to: HOST[:PORT] (required)")
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
			"Harness recipes, built only when named: " + fmt.Sprint(image.HarnessNames()) + " (" + image.Ref("harness") + ").\n" +
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
