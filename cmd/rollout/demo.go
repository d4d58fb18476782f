package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/internal/demo"
	"github.com/rollout-rl/rollout/internal/dockerclient"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/sandbox/image"
)

func init() { register(newDemoCmd) }

func newDemoCmd() *cobra.Command {
	var out, backend, family string
	var successProb float64
	var seed int64
	var envNames []string
	var groups, groupSize int
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the main job end to end: the built-in simulator, real Docker sandboxes, terminal-tasks and swe-tests",
		Long: `demo builds the sandbox image if it is missing, starts the built-in vLLM
simulator in-process (its policy follows the envs' reference solutions with
probability --success-prob, so groups have reward variance), runs a few
groups of terminal-tasks and swe-tests in real Docker sandboxes, writes the
trajectories as Parquet under --out and prints a summary.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			w := cmd.OutOrStdout()
			cli, err := dockerclient.New(ctx)
			if err != nil {
				return err
			}
			t0 := time.Now()
			res, err := image.Ensure(ctx, cli, "bookworm", image.Options{Log: os.Stderr})
			cli.Close()
			if err != nil {
				return fmt.Errorf("sandbox image: %w", err)
			}
			if res.Built {
				fmt.Fprintf(w, "built %s in %s\n", res.Ref, time.Since(t0).Round(time.Second))
			}
			log := newLogger(os.Stderr)
			bars := map[string]*progress{}
			specs := demo.DefaultSpecs()
			if len(envNames) > 0 {
				specs = nil
				for _, n := range envNames {
					specs = append(specs, demo.Spec{Env: n, Groups: groups, GroupSize: groupSize})
				}
			}
			results, err := demo.Run(ctx, demo.Options{
				Out: out, Specs: specs, Backend: backend, Family: family,
				SuccessProb: successProb, Seed: seed, Logger: log,
				Progress: func(env string, e runner.Event) {
					p, ok := bars[env]
					if !ok {
						p = newProgress(os.Stderr, log.With("env", env))
						bars[env] = p
					}
					p.event(e)
				},
			})
			for _, p := range bars {
				p.done()
			}
			for _, r := range results {
				fmt.Fprintf(w, "\n== %s\n", r.Env)
				printSummary(w, r.Dir, r.Summary)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "\nnext: rollout inspect %s/%s   (or --html page.html)\n", out, specs[0].Env)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "out/demo", "output directory (one run directory per env)")
	cmd.Flags().StringVar(&backend, "backend", "vllm", "inference backend against the simulator: vllm (token-exact), chat, vllm-generate, sglang")
	cmd.Flags().StringVar(&family, "family", "hermes", "tool-call format the simulated model emits (and the parser)")
	cmd.Flags().Float64Var(&successProb, "success-prob", 0.7, "probability that a rollout follows the correct solution")
	cmd.Flags().Int64Var(&seed, "seed", 1, "simulator seed")
	cmd.Flags().StringSliceVar(&envNames, "env", nil, "built-in envs with reference solutions to run instead of terminal-tasks and swe-tests (e.g. task-suite, web-research); eval-only envs run as evaluations")
	cmd.Flags().IntVar(&groups, "groups", 3, "groups per --env")
	cmd.Flags().IntVar(&groupSize, "group-size", 4, "rollouts per group for --env")
	return cmd
}
