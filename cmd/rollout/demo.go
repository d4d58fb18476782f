package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/internal/devtools/demo"
	"github.com/rollout-rl/rollout/internal/util/dockerclient"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/sandbox/image"
)

func init() { register(newDemoCmd) }

func newDemoCmd() *cobra.Command {
	var out, backend, family, sandboxBackend string
	var successProb float64
	var seed int64
	var envSpecs []string
	var distill, hints bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the main job end to end: the built-in simulator, real Docker sandboxes, terminal-tasks and swe-tests",
		Long: `demo builds the sandbox image if it is missing, starts the built-in vLLM
simulator in-process (its policy follows the envs' reference solutions with
probability --success-prob, so groups have reward variance), runs a few
groups of terminal-tasks and swe-tests in real Docker sandboxes, writes the
trajectories as Parquet under --out and prints a summary. --env runs other
envs instead (any env with reference solutions, e.g. guess-number:4:8 for 4
groups of 8).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			w := cmd.OutOrStdout()
			specs := demo.DefaultSpecs()
			if len(envSpecs) > 0 {
				var err error
				if specs, err = demo.ParseSpecs(envSpecs); err != nil {
					return err
				}
			}
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
			results, err := demo.Run(ctx, demo.Options{
				Out: out, Specs: specs, Backend: backend, Family: family,
				SuccessProb: successProb, Seed: seed, Logger: log, Distill: distill, Hints: hints, SandboxBackend: sandboxBackend,
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
	cmd.Flags().StringVar(&sandboxBackend, "sandbox-backend", "docker", "sandbox backend: docker, or runc (containers started by runc directly, no engine daemon; root)")
	cmd.Flags().StringVar(&family, "family", "hermes", "tool-call format the simulated model emits (and the parser)")
	cmd.Flags().Float64Var(&successProb, "success-prob", 0.7, "probability that a rollout follows the correct solution")
	cmd.Flags().Int64Var(&seed, "seed", 1, "simulator seed")
	cmd.Flags().BoolVar(&distill, "distill", false, "also score every trained token with the simulator as the distillation teacher (top-5 prompt_logprobs)")
	cmd.Flags().BoolVar(&hints, "hints", false, "with --distill: the simulator also judges each turn's next state for a hint, and the teacher rescores hinted turns (distill_hint loop events)")
	cmd.Flags().StringArrayVar(&envSpecs, "env", nil, "env to run instead of the default ones, as name[:groups[:group_size]] (repeatable; any env with reference solutions, e.g. task-suite, web-research, guess-number; eval-only envs run as evaluations)")
	return cmd
}
