package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/internal/devtools/bench/gatewaybench"
)

// newBenchGatewayServeCmd is the gateway process of the bench's gateway
// suite (hidden: a measuring tool, not a product command).
func newBenchGatewayServeCmd() *cobra.Command {
	var (
		cfg     gatewaybench.ServeConfig
		profile string
	)
	cmd := &cobra.Command{
		Use:    "gateway-serve --engine URL --addr HOST:PORT",
		Short:  "Serve a capturing gateway with the bench's control routes (the gateway suite's child process)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if profile != "" {
				f, err := os.Create(profile)
				if err != nil {
					return fmt.Errorf("cpu profile: %w", err)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("cpu profile: %w", err)
				}
				defer pprof.StopCPUProfile()
			}
			return gatewaybench.Serve(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Engine, "engine", "", "the engine's base URL")
	f.StringVar(&cfg.Backend, "backend", inference.BackendVLLM, "tokens-mode inference backend")
	f.StringVar(&cfg.Addr, "addr", "127.0.0.1:0", "listen address")
	f.IntVar(&cfg.Sessions, "sessions", 0, "most sessions open at once (0: the gateway's default)")
	f.BoolVar(&cfg.Proxy, "proxy", false, "serve the baseline instead: a plain reverse proxy to the engine's /v1/ routes")
	f.StringVar(&cfg.LocalRender, "local-render", "", "render in-process from this model (a GGUF file or a Hugging Face model directory)")
	f.StringVar(&profile, "cpuprofile", "", "write the process's CPU profile to this file when it stops")
	_ = cmd.MarkFlagRequired("engine")
	return cmd
}
