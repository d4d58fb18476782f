package inference

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	openai "github.com/sashabaranov/go-openai"
)

// Wire types for the servers' JSON. go-openai's message and tool types are
// used as fields, never embedded: ChatCompletionMessage has its own
// (Un)MarshalJSON, which would swallow any field declared next to it.

// samplingFields are the OpenAI/vLLM-style top-level sampling keys shared by
// /v1/chat/completions, /v1/completions and the Atropos /generate.
type samplingFields struct {
	Temperature       *float64 `json:"temperature,omitempty"`
	TopP              *float64 `json:"top_p,omitempty"`
	TopK              *int     `json:"top_k,omitempty"`
	MinP              *float64 `json:"min_p,omitempty"`
	MaxTokens         int      `json:"max_tokens,omitempty"`
	Stop              []string `json:"stop,omitempty"`
	Seed              *int64   `json:"seed,omitempty"`
	RepetitionPenalty *float64 `json:"repetition_penalty,omitempty"`
	PresencePenalty   *float64 `json:"presence_penalty,omitempty"`
	FrequencyPenalty  *float64 `json:"frequency_penalty,omitempty"`
}

func samplingOf(s Sampling, maxTokens int) samplingFields {
	return samplingFields{
		Temperature:       s.Temperature,
		TopP:              s.TopP,
		TopK:              s.TopK,
		MinP:              s.MinP,
		MaxTokens:         maxTokens,
		Stop:              s.Stop,
		Seed:              s.Seed,
		RepetitionPenalty: s.RepetitionPenalty,
		PresencePenalty:   s.PresencePenalty,
		FrequencyPenalty:  s.FrequencyPenalty,
	}
}

// ChatRequest is a /v1/chat/completions body with the vLLM extensions.
type ChatRequest struct {
	Model    string                         `json:"model,omitempty"`
	Messages []openai.ChatCompletionMessage `json:"messages"`
	Tools    []openai.Tool                  `json:"tools,omitempty"`
	// ToolsJSON, when set, is sent as "tools" instead of Tools.
	ToolsJSON EncodedTools `json:"-"`
	samplingFields
	Logprobs           bool           `json:"logprobs,omitempty"`
	TopLogprobs        *int           `json:"top_logprobs,omitempty"`
	ReturnTokenIDs     bool           `json:"return_token_ids,omitempty"`
	SkipSpecialTokens  *bool          `json:"skip_special_tokens,omitempty"`
	ChatTemplateKwargs map[string]any `json:"chat_template_kwargs,omitempty"`
}

// ChatMessage is the response message; Reasoning is read from either
// `reasoning` (vLLM ≥ #27752) or `reasoning_content` (older vLLM, SGLang,
// DeepSeek).
type ChatMessage struct {
	Role             string            `json:"role"`
	Content          *string           `json:"content"`
	Reasoning        *string           `json:"reasoning"`
	ReasoningContent *string           `json:"reasoning_content"`
	ToolCalls        []openai.ToolCall `json:"tool_calls"`
}

// ReasoningText prefers the current field name.
func (m ChatMessage) ReasoningText() string {
	if m.Reasoning != nil && *m.Reasoning != "" {
		return *m.Reasoning
	}
	if m.ReasoningContent != nil {
		return *m.ReasoningContent
	}
	return ""
}

// LogprobEntry is one position of a chat-style logprobs.content list. ID is
// llama.cpp's token id (it has no token_ids field and names tokens by text).
type LogprobEntry struct {
	Token   string   `json:"token"`
	Logprob *float64 `json:"logprob"`
	ID      *int32   `json:"id,omitempty"`
}

// ChatLogprobs is choices[i].logprobs in chat and /inference/v1/generate.
type ChatLogprobs struct {
	Content []LogprobEntry `json:"content"`
}

// ChatChoice is one choice of a chat completion.
type ChatChoice struct {
	Index        int           `json:"index"`
	Message      ChatMessage   `json:"message"`
	FinishReason string        `json:"finish_reason"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	TokenIDs     TokenIDs      `json:"token_ids"`
}

// Usage is the OpenAI usage block.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// ChatResponse is a non-streaming chat completion.
type ChatResponse struct {
	ID             string       `json:"id"`
	Model          string       `json:"model"`
	Choices        []ChatChoice `json:"choices"`
	Usage          *Usage       `json:"usage"`
	PromptTokenIDs TokenIDs     `json:"prompt_token_ids"`
}

// CompletionRequest is a /v1/completions body with a token-id prompt.
// encodeBody writes the prompt itself (promptCarrier).
type CompletionRequest struct {
	Model  string   `json:"model,omitempty"`
	Prompt TokenIDs `json:"prompt,omitempty"`
	samplingFields
	Logprobs               *int  `json:"logprobs,omitempty"`
	ReturnTokenIDs         bool  `json:"return_token_ids,omitempty"`
	ReturnTokensAsTokenIDs bool  `json:"return_tokens_as_token_ids,omitempty"`
	SkipSpecialTokens      *bool `json:"skip_special_tokens,omitempty"`
	// promptJSON is Prompt already encoded (a promptEncoder's), sent
	// instead of encoding Prompt.
	promptJSON []byte
}

// CompletionLogprobs is the parallel-array logprobs of /v1/completions.
type CompletionLogprobs struct {
	Tokens        TokenStrings `json:"tokens"`
	TokenLogprobs Logprobs     `json:"token_logprobs"`
}

// CompletionChoice is one choice of /v1/completions.
type CompletionChoice struct {
	Index          int                 `json:"index"`
	Text           string              `json:"text"`
	Logprobs       *CompletionLogprobs `json:"logprobs"`
	FinishReason   string              `json:"finish_reason"`
	StopReason     json.RawMessage     `json:"stop_reason"` // null, a token id or a stop string
	TokenIDs       TokenIDs            `json:"token_ids"`
	PromptTokenIDs PromptEcho          `json:"prompt_token_ids"`
}

// CompletionResponse is a non-streaming /v1/completions response.
type CompletionResponse struct {
	ID      string             `json:"id"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage"`
	// expectEcho is the request's encoded prompt: an echo of the same
	// bytes is taken as matching without parsing (PromptEcho.Same).
	expectEcho []byte
}

// TokenizeRequest covers both forms of /tokenize: Prompt (completion form)
// or Messages (chat form, with tools and add_generation_prompt).
type TokenizeRequest struct {
	Model    string                         `json:"model,omitempty"`
	Prompt   *string                        `json:"prompt,omitempty"`
	Messages []openai.ChatCompletionMessage `json:"messages,omitempty"`
	Tools    []openai.Tool                  `json:"tools,omitempty"`
	// ToolsJSON, when set, is sent as "tools" instead of Tools.
	ToolsJSON           EncodedTools   `json:"-"`
	AddGenerationPrompt *bool          `json:"add_generation_prompt,omitempty"`
	AddSpecialTokens    *bool          `json:"add_special_tokens,omitempty"`
	ChatTemplateKwargs  map[string]any `json:"chat_template_kwargs,omitempty"`
}

// TokenizeResponse is the /tokenize answer.
type TokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      TokenIDs `json:"tokens"`
}

// DetokenizeRequest is the /detokenize body.
type DetokenizeRequest struct {
	Model  string   `json:"model,omitempty"`
	Tokens TokenIDs `json:"tokens"`
}

// detokenizeResponse reads vLLM's `prompt`, SGLang's `text` and
// llama.cpp's `content`.
type detokenizeResponse struct {
	Prompt  *string `json:"prompt"`
	Text    *string `json:"text"`
	Content *string `json:"content"`
}

// GenerateParams is sampling_params of vLLM's /inference/v1/generate.
type GenerateParams struct {
	samplingFields
	Logprobs          *int  `json:"logprobs,omitempty"`
	Detokenize        *bool `json:"detokenize,omitempty"`
	SkipSpecialTokens *bool `json:"skip_special_tokens,omitempty"`
}

// GenerateRequest is the /inference/v1/generate body.
type GenerateRequest struct {
	RequestID      string          `json:"request_id,omitempty"`
	TokenIDs       TokenIDs        `json:"token_ids"`
	SamplingParams json.RawMessage `json:"sampling_params"`
	Model          string          `json:"model,omitempty"`
}

// GenerateChoice is one choice of /inference/v1/generate.
type GenerateChoice struct {
	Index        int           `json:"index"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason string        `json:"finish_reason"`
	TokenIDs     TokenIDs      `json:"token_ids"`
	// RoutedExperts is base64 of a .npy array (positions, layers, topk)
	// when vLLM runs with --enable-return-routed-experts.
	RoutedExperts *string `json:"routed_experts"`
}

// GenerateResponse is the /inference/v1/generate answer.
type GenerateResponse struct {
	RequestID string           `json:"request_id"`
	Choices   []GenerateChoice `json:"choices"`
}

// SGLangParams is sampling_params of SGLang's /generate.
type SGLangParams struct {
	MaxNewTokens      int      `json:"max_new_tokens,omitempty"`
	Temperature       *float64 `json:"temperature,omitempty"`
	TopP              *float64 `json:"top_p,omitempty"`
	TopK              *int     `json:"top_k,omitempty"`
	MinP              *float64 `json:"min_p,omitempty"`
	Stop              []string `json:"stop,omitempty"`
	RepetitionPenalty *float64 `json:"repetition_penalty,omitempty"`
	PresencePenalty   *float64 `json:"presence_penalty,omitempty"`
	FrequencyPenalty  *float64 `json:"frequency_penalty,omitempty"`
	SkipSpecialTokens *bool    `json:"skip_special_tokens,omitempty"`
	NoStopTrim        *bool    `json:"no_stop_trim,omitempty"`
}

// SGLangRequest is SGLang's native /generate body.
type SGLangRequest struct {
	InputIDs       TokenIDs        `json:"input_ids"`
	SamplingParams json.RawMessage `json:"sampling_params"`
	ReturnLogprob  bool            `json:"return_logprob"`
	RID            string          `json:"rid,omitempty"`
	// ReturnRoutedExperts asks for meta_info.routed_experts.
	ReturnRoutedExperts bool `json:"return_routed_experts,omitempty"`
}

// SGLangFinish is meta_info.finish_reason: {"type":"stop","matched":151645}.
type SGLangFinish struct {
	Type    string          `json:"type"`
	Matched json.RawMessage `json:"matched"`
}

// SGLangMeta is meta_info of an SGLang response.
type SGLangMeta struct {
	ID                  string              `json:"id"`
	FinishReason        *SGLangFinish       `json:"finish_reason"`
	PromptTokens        int                 `json:"prompt_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	OutputTokenLogprobs [][]json.RawMessage `json:"output_token_logprobs"`
	// WeightVersion is SGLang's weight version (a string; read as an
	// integer policy version when it is one).
	WeightVersion json.RawMessage `json:"weight_version,omitempty"`
	// WeightVersions are SGLang's per-token version spans over the output
	// ids (sglang#35926).
	WeightVersions []SGLangVersionSpan `json:"weight_versions,omitempty"`
	// RoutedExperts is base64 of little-endian int32, (positions,
	// layers × topk), when asked for and the server returns experts.
	RoutedExperts *string `json:"routed_experts,omitempty"`
}

// SGLangVersionSpan is one entry of meta_info.weight_versions: output ids
// [Start, End) were sampled under weight version Version.
type SGLangVersionSpan struct {
	Version json.RawMessage `json:"version"`
	Start   int             `json:"start"`
	End     int             `json:"end"`
}

// SGLangResponse is SGLang's /generate answer.
type SGLangResponse struct {
	Text      string     `json:"text"`
	OutputIDs TokenIDs   `json:"output_ids"`
	MetaInfo  SGLangMeta `json:"meta_info"`
}

// atroposPrompt is {"prompt_token_ids": [...]}.
type atroposPrompt struct {
	PromptTokenIDs TokenIDs `json:"prompt_token_ids"`
}

// AtroposRequest is the Atropos custom vLLM server's /generate body: every
// key besides prompt is a SamplingParams keyword.
type AtroposRequest struct {
	Prompt atroposPrompt `json:"prompt"`
	samplingFields
	N                 int   `json:"n"`
	Logprobs          int   `json:"logprobs"`
	SkipSpecialTokens *bool `json:"skip_special_tokens,omitempty"`
}

// AtroposResponse is its answer. Logprobs: per choice, per position a list
// holding one {"<id>": lp} dict.
type AtroposResponse struct {
	Text           []string                         `json:"text"`
	FinishReasons  []string                         `json:"finish_reasons"`
	Logprobs       [][][]map[string]json.RawMessage `json:"logprobs"`
	PromptTokenIDs PromptEcho                       `json:"prompt_token_ids"`
	TokenIDs       []TokenIDs                       `json:"token_ids"`
}

// ModelsResponse is /v1/models.
type ModelsResponse struct {
	Data []ModelCard `json:"data"`
}

// ModelCard is one /v1/models entry.
type ModelCard struct {
	ID          string     `json:"id"`
	Root        string     `json:"root"`
	MaxModelLen int        `json:"max_model_len"`
	Meta        *ModelMeta `json:"meta,omitempty"`
}

// ModelMeta is llama.cpp's /v1/models "meta" block (it has no
// max_model_len). NCtx is the server's whole context (all slots).
type ModelMeta struct {
	NCtx      int `json:"n_ctx"`
	NCtxTrain int `json:"n_ctx_train"`
	NVocab    int `json:"n_vocab"`
}

// withExtra appends extra keys to a JSON object. Python's json keeps the
// last duplicate key, so extra_body wins over typed fields, as in the
// OpenAI SDKs.
func withExtra(obj []byte, extra map[string]any) ([]byte, error) {
	for k, v := range extra {
		vb, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("extra_body key %q: %w", k, err)
		}
		kb, _ := json.Marshal(k)
		if obj, err = appendField(obj, kb, vb); err != nil {
			return nil, fmt.Errorf("extra_body: %w", err)
		}
	}
	return obj, nil
}

// appendField adds the member key:val (both already encoded) to the JSON
// object obj, in place: obj must be the caller's own buffer.
func appendField(obj, key, val []byte) ([]byte, error) {
	obj = bytes.TrimRight(obj, " \n")
	if len(obj) < 2 || obj[len(obj)-1] != '}' {
		return nil, fmt.Errorf("base is not a JSON object")
	}
	empty := len(bytes.TrimSpace(obj[1:len(obj)-1])) == 0
	obj = obj[:len(obj)-1]
	if !empty {
		obj = append(obj, ',')
	}
	obj = append(obj, key...)
	obj = append(obj, ':')
	obj = append(obj, val...)
	return append(obj, '}'), nil
}

// EncodedTools is a tools array already encoded as JSON. An episode sends
// the same tools with every render and chat turn; encoded per request,
// their schemas (kilobytes, through go-openai's MarshalJSON and the codec's
// check of what it returns) cost more CPU than the rest of the request
// (docs/inference.md, "Client cost"). A request carries it in ToolsJSON,
// and encodeBody copies it in as "tools" verbatim.
type EncodedTools []byte

// EncodeTools encodes ts once; no tools encode to nil (vLLM rejects
// "tools": []).
func EncodeTools(ts []openai.Tool) (EncodedTools, error) {
	if len(ts) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(ts)
	if err != nil {
		return nil, fmt.Errorf("encode tools: %w", err)
	}
	return EncodedTools(b), nil
}

// promptCarrier is a request whose prompt ids encodeBody writes itself,
// with strconv rather than the codec's reflection: a whole context of ids
// on every turn (a third of a gateway call's request encoding), or from
// an episode's promptEncoder, which encodes only what a turn adds.
// withoutPrompt is a copy of the request without them, the ids, and
// their encoding when it is at hand.
type promptCarrier interface {
	withoutPrompt() (any, []int32, []byte)
}

func (r *CompletionRequest) withoutPrompt() (any, []int32, []byte) {
	c := *r
	c.Prompt, c.promptJSON = nil, nil
	return &c, r.Prompt, r.promptJSON
}

// promptEncoder keeps an episode's prompt encoded as JSON across turns:
// every turn's prompt extends the last one's, so only the new ids are
// encoded. A prompt that does not extend the last (a failed turn undone)
// is encoded afresh.
type promptEncoder struct {
	ids []int32 // what buf encodes (a copy)
	buf []byte  // "[" ids joined by "," — no closing bracket
}

// encode is ids as a JSON array, valid until the next call.
func (p *promptEncoder) encode(ids []int32) []byte {
	if len(ids) < len(p.ids) || !slices.Equal(ids[:len(p.ids)], p.ids) {
		p.ids, p.buf = p.ids[:0], p.buf[:0]
	}
	if len(p.buf) == 0 {
		p.buf = append(p.buf, '[')
	}
	for _, id := range ids[len(p.ids):] {
		if len(p.buf) > 1 {
			p.buf = append(p.buf, ',')
		}
		p.buf = strconv.AppendInt(p.buf, int64(id), 10)
	}
	p.ids = append(p.ids, ids[len(p.ids):]...)
	out := append(p.buf, ']')
	return out[:len(out):len(out)]
}

var promptKey = []byte(`"prompt"`)

// appendIDs appends ids as a JSON array.
func appendIDs(b []byte, ids []int32) []byte {
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	return append(b, ']')
}

// toolsCarrier is a request that may carry its tools encoded ahead
// (ToolsJSON); both reports whether Tools is set as well.
type toolsCarrier interface {
	encodedTools() (raw EncodedTools, both bool)
}

func (r *ChatRequest) encodedTools() (EncodedTools, bool) {
	return r.ToolsJSON, len(r.Tools) > 0
}

func (r *TokenizeRequest) encodedTools() (EncodedTools, bool) {
	return r.ToolsJSON, len(r.Tools) > 0
}

var toolsKey = []byte(`"tools"`)

// parseTokenID reads "token_id:123".
func parseTokenID(s string) (int32, bool) {
	rest, ok := strings.CutPrefix(s, "token_id:")
	if !ok {
		return 0, false
	}
	// Up to 9 digits: in int32 range, what ParseInt gives.
	if len(rest) > 0 && len(rest) <= 9 {
		v := int32(0)
		for k := 0; k < len(rest); k++ {
			c := rest[k] - '0'
			if c > 9 {
				v = -1
				break
			}
			v = v*10 + int32(c)
		}
		if v >= 0 {
			return v, true
		}
	}
	n, err := strconv.ParseInt(rest, 10, 32)
	if err != nil || n < 0 {
		return 0, false
	}
	return int32(n), true
}

// validLogprob rejects NaN and positive values (a probability above 1).
func validLogprob(v float64) bool {
	return !math.IsNaN(v) && v <= 1e-6
}
