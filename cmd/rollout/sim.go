package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/demo"
)

func init() { register(newSimCmd) }

func newSimCmd() *cobra.Command {
	var (
		configPath  string
		host        string
		port        int
		cfg         sim.Config
		successProb float64
		envNames    []string
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Serve the vLLM simulator (OpenAI, vLLM, SGLang and Atropos routes) for manual use",
		Long: `Serve a simulated vLLM server: /v1/chat/completions, /v1/completions,
/tokenize, /detokenize, /inference/v1/generate, SGLang and Atropos /generate,
/v1/models, /health and /metrics, with a byte-level tokenizer, real chat
templates, a scripted tool-calling policy, latency and fault injection.
See docs/simulator.md.`,
		Example: `  rollout sim --family hermes --port 8000
  rollout sim --family qwen3_coder --reasoning --ttft 200ms --per-token 20ms
  rollout sim --config sim.yaml --error-rate 0.05 --seed 7
  rollout sim --env terminal-tasks --env swe-tests --success-prob 0.7`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			final := sim.Config{}
			if configPath != "" {
				c, err := loadSimConfig(configPath)
				if err != nil {
					return usageError(cmd, err)
				}
				final = c
			}
			// Flags given on the command line override the file.
			fl := cmd.Flags()
			set := func(name string, apply func()) {
				if fl.Changed(name) {
					apply()
				}
			}
			set("family", func() { final.Family = cfg.Family })
			set("template", func() { final.Template = cfg.Template })
			set("model", func() { final.Model = cfg.Model })
			set("max-model-len", func() { final.MaxModelLen = cfg.MaxModelLen })
			set("ttft", func() { final.Latency.TTFT = cfg.Latency.TTFT })
			set("per-token", func() { final.Latency.PerToken = cfg.Latency.PerToken })
			set("jitter", func() { final.Latency.Jitter = cfg.Latency.Jitter })
			set("error-rate", func() { final.Faults.ErrorRate = cfg.Faults.ErrorRate })
			set("hang-rate", func() { final.Faults.HangRate = cfg.Faults.HangRate })
			set("drop-rate", func() { final.Faults.DropRate = cfg.Faults.DropRate })
			set("malformed-rate", func() { final.Faults.MalformedRate = cfg.Faults.MalformedRate })
			set("truncate-rate", func() { final.Faults.TruncateRate = cfg.Faults.TruncateRate })
			set("seed", func() { final.Seed = cfg.Seed })
			set("reasoning", func() { final.Reasoning = cfg.Reasoning })
			set("exact-length", func() { final.ExactLength = cfg.ExactLength })
			set("engine", func() { final.Engine = cfg.Engine })
			set("slots", func() { final.Slots = cfg.Slots })
			set("success-prob", func() { final.SuccessProb, final.SuccessProbSet = successProb, true })
			if fl.Changed("host") || fl.Changed("port") || final.Addr == "" {
				if port < 0 || port > 65535 {
					return usageError(cmd, fmt.Errorf("--port %d: must be within 0-65535", port))
				}
				final.Addr = net.JoinHostPort(host, strconv.Itoa(port))
			}
			for _, name := range envNames {
				scripts, err := demo.EnvScripts(cmd.Context(), name)
				if err != nil {
					return usageError(cmd, fmt.Errorf("--env %s: %w", name, err))
				}
				final.Scripts = append(final.Scripts, scripts...)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			final.Logger = log
			if _, err := sim.NewHandler(final); err != nil {
				return usageError(cmd, err)
			}
			ctx := cmd.Context()
			srv, err := sim.Start(ctx, final)
			if err != nil {
				return err
			}
			log.Info("simulator listening", "url", srv.URL, "family", orDefault(final.Family, "hermes"),
				"template", orDefault(final.Template, "(family default)"), "model", orDefault(final.Model, "rollout-sim"), "seed", final.Seed)
			<-ctx.Done()
			log.Info("simulator stopping")
			err = srv.Close()
			st := srv.Stats()
			log.Info("simulator stopped", "requests", st.Requests, "generated_tokens", st.GeneratedTokens, "connections", st.NewConns)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&configPath, "config", "", "YAML file with the simulator config (scripts, bench, latency, faults); flags override it")
	f.StringVar(&host, "host", "127.0.0.1", "address to listen on")
	f.IntVar(&port, "port", 8000, "port to listen on (0: any free port)")
	f.StringVar(&cfg.Family, "family", "hermes", "tool-call format the policy emits and the server parses")
	f.StringVar(&cfg.Template, "template", "", "chat template: chatml, hermes, qwen2.5, qwen3, llama3, deepseek_v3, mistral (default: from the family)")
	f.StringVar(&cfg.Model, "model", "rollout-sim", "served model name")
	f.IntVar(&cfg.MaxModelLen, "max-model-len", 32768, "context length in tokens")
	f.DurationVar(&cfg.Latency.TTFT, "ttft", 0, "time to first token")
	f.DurationVar(&cfg.Latency.PerToken, "per-token", 0, "time per generated token")
	f.DurationVar(&cfg.Latency.Jitter, "jitter", 0, "uniform random extra latency, up to this much")
	f.Float64Var(&cfg.Faults.ErrorRate, "error-rate", 0, "fraction of generation requests answered with HTTP 500")
	f.Float64Var(&cfg.Faults.HangRate, "hang-rate", 0, "fraction of generation requests that never answer")
	f.Float64Var(&cfg.Faults.DropRate, "drop-rate", 0, "fraction of generation requests whose connection is dropped")
	f.Float64Var(&cfg.Faults.MalformedRate, "malformed-rate", 0, "fraction of generation responses that are not valid JSON")
	f.Float64Var(&cfg.Faults.TruncateRate, "truncate-rate", 0, "fraction of generation responses cut short")
	f.Int64Var(&cfg.Seed, "seed", 0, "seed for the policy, logprobs and faults")
	f.Float64Var(&successProb, "success-prob", 1, "probability that an episode follows its script's correct path")
	f.BoolVar(&cfg.Reasoning, "reasoning", false, "open every turn with a <think> block")
	f.StringArrayVar(&envNames, "env", nil, "also follow this built-in env's reference solutions (repeatable; e.g. terminal-tasks, swe-tests)")
	f.BoolVar(&cfg.ExactLength, "exact-length", false, "always generate exactly max_tokens tokens (finish_reason length)")
	f.StringVar(&cfg.Engine, "engine", "vllm", "server to imitate: vllm (vLLM, SGLang and Atropos routes) or llamacpp (llama-server's routes and quirks)")
	f.IntVar(&cfg.Slots, "slots", 1, "llamacpp engine: llama-server's -np; --max-model-len is one slot's context")
	return cmd
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// loadSimConfig reads a YAML simulator config. A success_prob key, even 0,
// is taken as set.
func loadSimConfig(path string) (sim.Config, error) {
	var c sim.Config
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("read simulator config: %w", err)
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("parse simulator config %s: %w", path, err)
	}
	var keys map[string]any
	if err := yaml.Unmarshal(b, &keys); err != nil {
		return c, fmt.Errorf("parse simulator config %s: %w", path, err)
	}
	if keys == nil {
		return c, errors.New("simulator config " + path + " is empty")
	}
	_, c.SuccessProbSet = keys["success_prob"]
	return c, nil
}
