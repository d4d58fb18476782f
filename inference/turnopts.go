package inference

import (
	"context"

	openai "github.com/sashabaranov/go-openai"
)

// TurnOptions adjust one generation of a tokens-mode episode: what a
// caller that answers requests of its own (the gateway) needs per turn
// rather than per episode.
type TurnOptions struct {
	// MaxTokens caps this turn below the episode's max_tokens (0: the
	// episode's).
	MaxTokens int
	// FitContext lowers max_tokens to the room left in the model's
	// context instead of failing; ErrContextLength only when the prompt
	// leaves no room at all.
	FitContext bool
}

// GenerateWith is Generate with per-turn options. Only tokens-mode
// episodes have it; callers find it with a type assertion.
func (e *tokenEpisode) GenerateWith(ctx context.Context, messages []openai.ChatCompletionMessage, o TurnOptions) (Turn, error) {
	ctx, span := startGeneration(ctx, &e.spec, e.c.gen.name())
	t, err := e.generate(ctx, messages, o)
	endGeneration(span, t, err)
	return t, err
}

// Context returns the served model's name (the first served when model
// is empty) and its context window in tokens as the server reports it
// (vLLM's max_model_len, llama.cpp's per-slot n_ctx); 0 when the server
// does not say.
func (c *Client) Context(ctx context.Context, model string) (string, int, error) {
	return c.resolveModel(ctx, model)
}

// TokensMode reports whether the client renders and keeps token ids
// itself (every backend but chat).
func (c *Client) TokensMode() bool { return c.gen != nil }
