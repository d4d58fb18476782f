package inference

import (
	"context"
	"net/http"

	json "github.com/segmentio/encoding/json"
)

// Affinity pins a series of calls (one episode) to the endpoint that served
// the previous one while it stays healthy and under its cap. The zero value
// is ready to use; share one per episode.
type Affinity struct{ a affinity }

// NewAffinity returns an Affinity whose first endpoint is chosen from key
// (e.g. the GRPO group id) by rendezvous hashing, load permitting.
func NewAffinity(key string) *Affinity { return &Affinity{a: affinity{key: key}} }

// CallOptions are per-call routing and body options of the typed client.
type CallOptions struct {
	Affinity  *Affinity
	RequestID string         // sent as X-Request-Id and named in errors
	Extra     map[string]any // merged into the JSON body last (wins)
}

func (o CallOptions) aff() *affinity {
	if o.Affinity == nil {
		return nil
	}
	return &o.Affinity.a
}

func encodeBody(v any, extra map[string]any, op, reqID string) ([]byte, error) {
	// Without json.Marshal's EscapeHTML: a body for an inference server is
	// not HTML, and escaping <, > and & (chat templates and tool output are
	// full of them) was a third of encoding a render with a tool result.
	var prompt []int32
	var promptJSON []byte
	if pc, ok := v.(promptCarrier); ok {
		v, prompt, promptJSON = pc.withoutPrompt()
	}
	b, err := json.Append(make([]byte, 0, 1024+8*len(prompt)), v, json.SortMapKeys)
	if err != nil {
		return nil, &Error{Class: ErrRequest, Op: op, RequestID: reqID, Msg: "encode request", Err: err}
	}
	if len(prompt) > 0 {
		if promptJSON == nil {
			promptJSON = appendIDs(nil, prompt)
		}
		if b, err = appendField(b, promptKey, promptJSON); err != nil {
			return nil, &Error{Class: ErrRequest, Op: op, RequestID: reqID, Msg: "encode request: prompt", Err: err}
		}
	}
	if tc, ok := v.(toolsCarrier); ok {
		if raw, both := tc.encodedTools(); len(raw) > 0 {
			if both {
				return nil, &Error{Class: ErrRequest, Op: op, RequestID: reqID, Msg: "encode request: both Tools and ToolsJSON are set"}
			}
			if b, err = appendField(b, toolsKey, raw); err != nil {
				return nil, &Error{Class: ErrRequest, Op: op, RequestID: reqID, Msg: "encode request: tools", Err: err}
			}
		}
	}
	b, err = withExtra(b, extra)
	if err != nil {
		return nil, &Error{Class: ErrRequest, Op: op, RequestID: reqID, Msg: "merge extra_body", Err: err}
	}
	return b, nil
}

func (p *Pool) post(ctx context.Context, o CallOptions, path string, req, out any) (string, error) {
	body, err := encodeBody(req, o.Extra, "POST "+path, o.RequestID)
	if err != nil {
		return "", err
	}
	return p.call(ctx, o.aff(), http.MethodPost, path, o.RequestID, body, out)
}

// ChatCompletion posts /v1/chat/completions (non-streaming). It returns the
// base URL that answered.
func (p *Pool) ChatCompletion(ctx context.Context, o CallOptions, req *ChatRequest) (*ChatResponse, string, error) {
	var out ChatResponse
	ep, err := p.post(ctx, o, "/v1/chat/completions", req, &out)
	if err != nil {
		return nil, "", err
	}
	return &out, ep, nil
}

// Completion posts /v1/completions.
func (p *Pool) Completion(ctx context.Context, o CallOptions, req *CompletionRequest) (*CompletionResponse, string, error) {
	out := CompletionResponse{expectEcho: req.promptJSON}
	ep, err := p.post(ctx, o, "/v1/completions", req, &out)
	if err != nil {
		return nil, "", err
	}
	return &out, ep, nil
}

// Tokenize posts /tokenize (prompt or chat form).
func (p *Pool) Tokenize(ctx context.Context, o CallOptions, req *TokenizeRequest) (*TokenizeResponse, error) {
	var out TokenizeResponse
	ep, err := p.post(ctx, o, "/tokenize", req, &out)
	if err != nil {
		return nil, err
	}
	if out.Tokens == nil {
		return nil, &Error{Class: ErrInfra, Endpoint: ep, Op: "POST /tokenize", RequestID: o.RequestID, Status: 200, Msg: "response has no tokens"}
	}
	return &out, nil
}

// Detokenize posts /detokenize and returns the text (vLLM's `prompt` key,
// SGLang's `text`, llama.cpp's `content`).
func (p *Pool) Detokenize(ctx context.Context, o CallOptions, model string, tokens []int32) (string, error) {
	var out detokenizeResponse
	ep, err := p.post(ctx, o, "/detokenize", &DetokenizeRequest{Model: model, Tokens: tokens}, &out)
	if err != nil {
		return "", err
	}
	switch {
	case out.Prompt != nil:
		return *out.Prompt, nil
	case out.Text != nil:
		return *out.Text, nil
	case out.Content != nil:
		return *out.Content, nil
	}
	return "", &Error{Class: ErrInfra, Endpoint: ep, Op: "POST /detokenize", RequestID: o.RequestID, Status: 200, Msg: "response has neither prompt, text nor content"}
}

// Generate posts vLLM's /inference/v1/generate.
func (p *Pool) Generate(ctx context.Context, o CallOptions, req *GenerateRequest) (*GenerateResponse, string, error) {
	var out GenerateResponse
	ep, err := p.post(ctx, o, "/inference/v1/generate", req, &out)
	if err != nil {
		return nil, "", err
	}
	return &out, ep, nil
}

// SGLangGenerate posts SGLang's native /generate.
func (p *Pool) SGLangGenerate(ctx context.Context, o CallOptions, req *SGLangRequest) (*SGLangResponse, string, error) {
	var out SGLangResponse
	ep, err := p.post(ctx, o, "/generate", req, &out)
	if err != nil {
		return nil, "", err
	}
	return &out, ep, nil
}

// AtroposGenerate posts the Atropos custom vLLM server's /generate.
func (p *Pool) AtroposGenerate(ctx context.Context, o CallOptions, req *AtroposRequest) (*AtroposResponse, string, error) {
	var out AtroposResponse
	ep, err := p.post(ctx, o, "/generate", req, &out)
	if err != nil {
		return nil, "", err
	}
	return &out, ep, nil
}

// Models gets /v1/models from the first endpoint that answers.
func (p *Pool) Models(ctx context.Context) (*ModelsResponse, error) {
	var out ModelsResponse
	if _, err := p.call(ctx, nil, http.MethodGet, "/v1/models", "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
