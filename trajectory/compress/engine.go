package compress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
)

// EngineTokenizer counts tokens with an inference server's tokenizer:
// vLLM's and SGLang's /tokenize (a "prompt", without special tokens) or
// llama.cpp's (a "content").
type EngineTokenizer struct {
	pool    *inference.Pool
	backend string
	model   string
}

var _ Tokenizer = (*EngineTokenizer)(nil)

// NewEngineTokenizer talks to url; backend is vllm, sglang or llamacpp.
func NewEngineTokenizer(url, backend, model, apiKey string, log *slog.Logger) (*EngineTokenizer, error) {
	switch backend {
	case inference.BackendVLLM, inference.BackendSGLang, inference.BackendLlamaCpp:
	default:
		return nil, fmt.Errorf("tokenizer backend %q: want %s, %s or %s", backend, inference.BackendVLLM, inference.BackendSGLang, inference.BackendLlamaCpp)
	}
	p, err := inference.NewPool(inference.PoolConfig{Endpoints: []string{url}, APIKey: apiKey, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", url, err)
	}
	return &EngineTokenizer{pool: p, backend: backend, model: model}, nil
}

// Count implements Tokenizer.
func (t *EngineTokenizer) Count(ctx context.Context, text string) (int, error) {
	if t.backend == inference.BackendLlamaCpp {
		ids, err := t.pool.LlamaTokenize(ctx, inference.CallOptions{}, &inference.LlamaTokenizeRequest{Content: text})
		return len(ids), err
	}
	no := false
	resp, err := t.pool.Tokenize(ctx, inference.CallOptions{}, &inference.TokenizeRequest{Model: t.model, Prompt: &text, AddSpecialTokens: &no})
	if err != nil {
		return 0, err
	}
	return len(resp.Tokens), nil
}

// Close releases the connections.
func (t *EngineTokenizer) Close() { t.pool.Close() }

// ChatSummarizer writes summaries through an OpenAI-compatible chat route.
type ChatSummarizer struct {
	pool  *inference.Pool
	model string
	// Temperature of the summaries (Hermes: 0.3).
	Temperature float64
}

var _ Summarizer = (*ChatSummarizer)(nil)

// NewChatSummarizer talks to url's /v1/chat/completions with model.
func NewChatSummarizer(url, model, apiKey string, log *slog.Logger) (*ChatSummarizer, error) {
	if model == "" {
		return nil, errors.New("summarizer: a model is required")
	}
	p, err := inference.NewPool(inference.PoolConfig{Endpoints: []string{url}, APIKey: apiKey, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("summarizer %s: %w", url, err)
	}
	return &ChatSummarizer{pool: p, model: model, Temperature: 0.3}, nil
}

const summarizerSystem = "You condense part of an AI agent's working session so that the agent can carry on from your summary alone."

const summarizerPrompt = `Below are consecutive turns of an agent's session: its own messages ([gpt]), the tool results it got ([tool]) and messages from the user ([human]).

Summarize them in at most about %d tokens. Keep what the agent needs to carry on: what it tried, the commands and file paths involved, what succeeded, what failed and the error messages, and what it decided. Write plain prose, in the past tense; do not address the agent and do not add anything that is not in the turns.

%s`

// Summarize implements Summarizer.
func (s *ChatSummarizer) Summarize(ctx context.Context, text string, maxTokens int) (string, error) {
	req := &inference.ChatRequest{Model: s.model, Messages: []openai.ChatCompletionMessage{
		{Role: openai.ChatMessageRoleSystem, Content: summarizerSystem},
		{Role: openai.ChatMessageRoleUser, Content: fmt.Sprintf(summarizerPrompt, maxTokens, text)},
	}}
	t := s.Temperature
	req.Temperature, req.MaxTokens = &t, maxTokens
	resp, _, err := s.pool.ChatCompletion(ctx, inference.CallOptions{}, req)
	if err != nil {
		return "", err
	}
	if len(resp.Choices) == 0 || resp.Choices[0].Message.Content == nil || strings.TrimSpace(*resp.Choices[0].Message.Content) == "" {
		return "", errors.New("the summarizer answered no text")
	}
	return *resp.Choices[0].Message.Content, nil
}

// Close releases the connections.
func (s *ChatSummarizer) Close() { s.pool.Close() }
