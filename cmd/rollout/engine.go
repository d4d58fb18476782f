package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/internal/devtools/engine"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/sandbox/image"
)

func init() { register(newEngineCmd) }

func newEngineCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "engine",
		Short: "Run a real inference engine locally (llama.cpp with the project's tiny model)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newEngineLlamacppCmd())
	return cmd
}

func newEngineLlamacppCmd() *cobra.Command {
	var (
		opts  engine.LlamacppOptions
		build bool
	)
	cmd := &cobra.Command{
		Use:   "llamacpp [flags] [-- extra llama-server args]",
		Short: "Serve the tiny random Qwen3 model with llama-server until interrupted",
		Long: "Start llama-server from " + image.Ref("llamacpp") + " in a Docker container, publish its port on\n" +
			"127.0.0.1 (--port 0: an ephemeral port), print the URL, and serve until Ctrl-C, then remove the\n" +
			"container. Arguments after -- are appended to llama-server's command line. The image is built\n" +
			"with `rollout sandbox image build --name llamacpp` (or --build). See docs/real-engines.md.",
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ExtraArgs = args
			opts.Owner = "cli"
			ctx := cmd.Context()
			cli, err := dockerclient.New(ctx)
			if err != nil {
				return err
			}
			defer cli.Close()
			out := cmd.OutOrStdout()
			if build {
				res, err := image.Ensure(ctx, cli, "llamacpp", image.Options{})
				if err != nil {
					return err
				}
				if res.Built {
					fmt.Fprintf(out, "%s: built (%s) in %s\n", res.Ref, res.Reason, res.Duration.Round(1e7))
				}
			}
			e, err := engine.StartLlamacpp(ctx, cli, opts)
			if err != nil {
				if errors.Is(err, engine.ErrImageMissing) {
					return fmt.Errorf("%w (or pass --build)", err)
				}
				return err
			}
			defer func() { _ = e.Stop(context.WithoutCancel(ctx)) }()
			fmt.Fprintf(out, "llama-server ready at %s (OpenAI API at %s/v1), container %s\n", e.URL, e.URL, e.ID[:12])
			fmt.Fprintf(out, "command: %s\n", strings.Join(e.Args, " "))
			fmt.Fprintln(out, "Ctrl-C stops it and removes the container.")
			<-ctx.Done()
			if err := e.Stop(context.WithoutCancel(ctx)); err != nil {
				return err
			}
			fmt.Fprintln(out, "stopped")
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.HostPort, "port", 8080, "host port on 127.0.0.1 (0: ephemeral)")
	f.StringVar(&opts.HostIP, "host-ip", "127.0.0.1", "host address to publish the port on")
	f.IntVar(&opts.Ctx, "ctx", 32768, "total context (-c), split over the slots")
	f.IntVar(&opts.Slots, "slots", 4, "parallel slots (-np)")
	f.IntVar(&opts.Threads, "threads", 1, "CPU threads (-t)")
	f.StringVar(&opts.Image, "image", image.Ref("llamacpp"), "engine image")
	f.StringVar(&opts.Name, "name", "", "container name (default: chosen by Docker)")
	f.BoolVar(&build, "build", false, "build the image first when it is missing or stale")
	return cmd
}
