package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/agentloop"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/sandbox"
	"github.com/rollout-rl/rollout/tools"
)

func init() { register(newChatCmd) }

type chatFlags struct {
	endpoint, parser, reasoningParser, image, backend, model, out, system string
	sandboxBackend                                                        string
	toolsets                                                              []string
	maxTurns                                                              int
	timeout                                                               time.Duration
	tokenIDs                                                              bool
	temperature                                                           float64
	maxTokens                                                             int
	extraBody                                                             string
}

func newChatCmd() *cobra.Command {
	var f chatFlags
	cmd := &cobra.Command{
		Use:   "chat --endpoint URL --parser NAME --image IMG \"task\"",
		Short: "Run one debug episode: the agent loop with real tools in a fresh sandbox",
		Long: `Run one agent episode against an OpenAI-compatible or vLLM/SGLang endpoint, with the
built-in tools executing in a fresh Docker sandbox, and print the transcript (tool calls,
results, stop reason). --out writes the episode as one JSON trajectory object
(messages, tokens, loss_mask, logprobs, stop_reason, ...).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 || strings.TrimSpace(args[0]) == "" {
				return usageError(cmd, errors.New("give exactly one task as the argument"))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return runChat(cmd, f, args[0]) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.endpoint, "endpoint", "", "base URL of the inference server (required)")
	fl.StringVar(&f.parser, "parser", "", "tool-call parser (vLLM --tool-call-parser name); required for tokens-mode backends")
	fl.StringVar(&f.reasoningParser, "reasoning-parser", "", "reasoning parser (tokens-mode backends)")
	fl.StringVar(&f.image, "image", "", "sandbox image (required)")
	fl.StringVar(&f.sandboxBackend, "sandbox-backend", sandbox.BackendDocker, "sandbox backend: docker, or runc (runc directly, no engine daemon; root; network none)")
	fl.StringVar(&f.backend, "backend", inference.BackendChat, "backend: chat, vllm, vllm-generate, sglang or llamacpp")
	fl.StringVar(&f.model, "model", "", "model name (default: the first model of /v1/models)")
	fl.IntVar(&f.maxTurns, "max-turns", agentloop.DefaultMaxTurns, "maximum generations")
	fl.StringVar(&f.out, "out", "", "write the episode as one JSON trajectory object to this file")
	fl.StringVar(&f.system, "system", "You are an agent working in a Linux sandbox. Use the tools to complete the task, then answer without calling a tool.", "system prompt (empty for none)")
	fl.StringSliceVar(&f.toolsets, "toolsets", []string{tools.ToolsetTerminal, tools.ToolsetFile, tools.ToolsetTodo}, "toolsets or tool names to offer")
	fl.DurationVar(&f.timeout, "timeout", 30*time.Minute, "wall-clock limit of the episode")
	fl.BoolVar(&f.tokenIDs, "token-ids", false, "chat backend: ask the server for token ids and logprobs (vLLM ≥ 0.10.2, the simulator); on by default with --out, --token-ids=false for servers without them")
	fl.Float64Var(&f.temperature, "temperature", 1.0, "sampling temperature")
	fl.IntVar(&f.maxTokens, "max-tokens", 0, "max tokens per generation (0: server default)")
	fl.StringVar(&f.extraBody, "extra-body", "", `JSON object merged into every generation request (the run config's sampling.extra_body), e.g. '{"logit_bias": {"659": 4}}'`)
	return cmd
}

func runChat(cmd *cobra.Command, f chatFlags, task string) error {
	switch {
	case f.endpoint == "":
		return usageError(cmd, errors.New("--endpoint is required"))
	case f.image == "":
		return usageError(cmd, errors.New("--image is required"))
	case f.maxTurns <= 0:
		return usageError(cmd, fmt.Errorf("--max-turns must be positive, got %d", f.maxTurns))
	}
	switch f.backend {
	case inference.BackendChat:
	case inference.BackendVLLM, inference.BackendVLLMGenerate, inference.BackendSGLang, inference.BackendLlamaCpp:
		if f.parser == "" {
			return usageError(cmd, fmt.Errorf("--parser is required with --backend %s (tool calls are parsed client-side)", f.backend))
		}
	default:
		return usageError(cmd, fmt.Errorf("unknown --backend %q; want chat, vllm, vllm-generate, sglang or llamacpp", f.backend))
	}
	var extra map[string]any
	if f.extraBody != "" {
		if err := json.Unmarshal([]byte(f.extraBody), &extra); err != nil || extra == nil {
			return usageError(cmd, fmt.Errorf("--extra-body must be a JSON object: %q", f.extraBody))
		}
	}
	set, err := tools.Default().Resolve(f.toolsets, nil)
	if err != nil {
		return usageError(cmd, err)
	}
	ctx := cmd.Context()
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))

	// --out promises tokens, loss_mask and logprobs: in chat mode only the
	// server's token ids can give them, so ask unless told not to.
	tokenIDs := f.tokenIDs
	if f.out != "" && !cmd.Flags().Changed("token-ids") {
		tokenIDs = true
	}
	policy, err := inference.New(inference.Config{Backend: f.backend, Endpoints: []string{f.endpoint}, Model: f.model,
		ChatTokenIDs: tokenIDs, Logger: log})
	if err != nil {
		return usageError(cmd, err)
	}
	if c, ok := policy.(interface{ Close() error }); ok {
		defer c.Close()
	}
	backend, err := openLocalBackend(ctx, f.sandboxBackend, log, false)
	if err != nil {
		if errors.Is(err, sandbox.ErrInvalid) {
			return usageError(cmd, err)
		}
		return fmt.Errorf("sandbox backend %s: %w", f.sandboxBackend, err)
	}
	defer backend.Close(context.WithoutCancel(ctx))
	id := fmt.Sprintf("chat-%d", time.Now().UnixNano())
	sb, err := backend.Create(ctx, sandbox.Spec{Image: f.image, Labels: map[string]string{"rollout.chat": id}})
	if err != nil {
		return fmt.Errorf("create sandbox from %s: %w", f.image, err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := sb.Close(cctx); err != nil {
			log.Warn("close sandbox", "id", sb.ID(), "err", err)
		}
	}()

	var msgs []openai.ChatCompletionMessage
	if f.system != "" {
		msgs = append(msgs, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleSystem, Content: f.system})
	}
	msgs = append(msgs, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleUser, Content: task})
	temp := f.temperature
	cfg := agentloop.Config{ID: id, Messages: msgs, Tools: set, Model: f.model, Parser: f.parser, ReasoningParser: f.reasoningParser,
		MaxTurns: f.maxTurns, Timeout: f.timeout, Sampling: inference.Sampling{Temperature: &temp, MaxTokens: f.maxTokens, ExtraBody: extra}}
	res, runErr := agentloop.Run(ctx, cfg, agentloop.Deps{Policy: policy, Runtime: tools.NewRuntime(sb, id), Logger: log})
	if errors.Is(runErr, agentloop.ErrConfig) && res.TurnsUsed == 0 {
		return usageError(cmd, runErr)
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "user: %s\n", task)
	fmt.Fprint(out, res.Transcript(len(msgs), 2000))
	if f.out != "" {
		b, err := json.MarshalIndent(res.Trajectory(), "", "  ")
		if err != nil {
			return fmt.Errorf("encode trajectory: %w", err)
		}
		if err := os.WriteFile(f.out, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", f.out, err)
		}
		fmt.Fprintf(out, "trajectory written to %s\n", f.out)
	}
	if runErr != nil {
		return withExitCode(1, fmt.Errorf("episode failed (%s): %w", res.StopReason, runErr))
	}
	return nil
}
