package responses

import (
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/doorkit"
)

// Ids the door issues embed the Reply.ID, so that the harness's echo of
// an item names the reply it came from (Message.Ref).
const (
	respPrefix = "resp_"
	msgPrefix  = "msg_"
	rsPrefix   = "rs_"
	fcPrefix   = "fc_"
	// sealPrefix marks the encrypted_content the door issues: base64url
	// of {"r": Reply.ID, "t": reasoning}. It is not encrypted (the text
	// is the model's own reasoning, already in the harness's hands); it
	// carries the reply id and the exact reasoning through a harness that
	// drops the reasoning text from its echo.
	sealPrefix = "rollout."
)

func refFromID(id, prefix string) string {
	r, ok := strings.CutPrefix(id, prefix)
	if !ok {
		return ""
	}
	return r
}

// refFromCallItemID recovers the Reply.ID from "fc_<id>_<n>".
func refFromCallItemID(id string) string {
	r, ok := strings.CutPrefix(id, fcPrefix)
	if !ok {
		return ""
	}
	i := strings.LastIndexByte(r, '_')
	if i <= 0 {
		return ""
	}
	if _, err := strconv.Atoi(r[i+1:]); err != nil {
		return ""
	}
	return r[:i]
}

type sealed struct {
	R string `json:"r"`
	T string `json:"t,omitempty"`
}

func seal(replyID, reasoning string) string {
	b, _ := json.Marshal(sealed{R: replyID, T: reasoning})
	return sealPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// openSeal reads an encrypted_content the door issued; ok is false for
// any other value (a real provider's, a damaged one).
func openSeal(s string) (ref, reasoning string, ok bool) {
	rest, found := strings.CutPrefix(s, sealPrefix)
	if !found {
		return "", "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return "", "", false
	}
	var v sealed
	if json.Unmarshal(b, &v) != nil || v.R == "" {
		return "", "", false
	}
	return v.R, v.T, true
}

// Wire shapes of the response object and its output items.
type (
	response struct {
		ID                 string          `json:"id"`
		Object             string          `json:"object"`
		CreatedAt          int64           `json:"created_at"`
		Status             string          `json:"status"`
		Error              *respError      `json:"error"`
		IncompleteDetails  *incomplete     `json:"incomplete_details"`
		Instructions       json.RawMessage `json:"instructions"`
		MaxOutputTokens    *int            `json:"max_output_tokens"`
		Model              string          `json:"model"`
		Output             []any           `json:"output"`
		ParallelToolCalls  bool            `json:"parallel_tool_calls"`
		PreviousResponseID *string         `json:"previous_response_id"`
		Reasoning          json.RawMessage `json:"reasoning"`
		Store              bool            `json:"store"`
		Temperature        json.RawMessage `json:"temperature"`
		Text               json.RawMessage `json:"text"`
		ToolChoice         json.RawMessage `json:"tool_choice"`
		Tools              json.RawMessage `json:"tools"`
		TopP               json.RawMessage `json:"top_p"`
		Truncation         string          `json:"truncation"`
		Usage              *usage          `json:"usage"`
		Metadata           map[string]any  `json:"metadata"`
	}
	respError struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	incomplete struct {
		Reason string `json:"reason"`
	}
	usage struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens        int `json:"output_tokens"`
		OutputTokensDetails struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
		TotalTokens int `json:"total_tokens"`
	}
	reasoningItem struct {
		ID               string     `json:"id"`
		Type             string     `json:"type"`
		Status           string     `json:"status,omitempty"`
		Summary          []textPart `json:"summary"`
		Content          []textPart `json:"content,omitempty"`
		EncryptedContent *string    `json:"encrypted_content,omitempty"`
	}
	messageItem struct {
		ID      string     `json:"id"`
		Type    string     `json:"type"`
		Status  string     `json:"status"`
		Role    string     `json:"role"`
		Content []textPart `json:"content"`
	}
	textPart struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Annotations *[]any `json:"annotations,omitempty"`
		Logprobs    *[]any `json:"logprobs,omitempty"`
	}
	functionCallItem struct {
		ID        string `json:"id"`
		Type      string `json:"type"`
		Status    string `json:"status"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
)

func outText(text string) textPart {
	empty, none := []any{}, []any{}
	return textPart{Type: "output_text", Text: text, Annotations: &empty, Logprobs: &none}
}

// skeleton is the response object before output: what the request asked,
// echoed as the API does.
func skeleton(id string, req request, body map[string]json.RawMessage, model string, now time.Time) response {
	r := response{
		ID: id, Object: "response", CreatedAt: now.Unix(), Status: "in_progress",
		Instructions: orNull(req.Instructions), MaxOutputTokens: req.MaxOutputTokens, Model: model,
		Output: []any{}, ParallelToolCalls: req.ParallelToolCalls == nil || *req.ParallelToolCalls,
		Reasoning: orNull(body["reasoning"]), Temperature: orNull(body["temperature"]),
		Text: orDefault(body["text"], `{"format":{"type":"text"}}`), ToolChoice: orDefault(req.ToolChoice, `"auto"`),
		Tools: orDefault(req.Tools, `[]`), TopP: orNull(body["top_p"]), Truncation: "disabled",
		Metadata: map[string]any{},
	}
	if req.PreviousResponseID != "" {
		p := req.PreviousResponseID
		r.PreviousResponseID = &p
	}
	if s, ok := body["store"]; ok {
		_ = json.Unmarshal(s, &r.Store)
	} else {
		r.Store = true // the API's default; the gateway stores nothing either way
	}
	return r
}

func orNull(raw json.RawMessage) json.RawMessage {
	if !doorkit.IsSet(raw) {
		return json.RawMessage("null")
	}
	return raw
}

func orDefault(raw json.RawMessage, def string) json.RawMessage {
	if !doorkit.IsSet(raw) {
		return json.RawMessage(def)
	}
	return raw
}

// items are the reply's output items, in the API's order: reasoning,
// message, function calls.
func items(rep gateway.Reply, encrypted bool) []any {
	status := "completed"
	if rep.FinishReason == gateway.FinishLength {
		status = "incomplete"
	}
	var out []any
	if rep.Reasoning != "" {
		it := reasoningItem{ID: rsPrefix + rep.ID, Type: "reasoning", Summary: []textPart{},
			Content: []textPart{{Type: "reasoning_text", Text: rep.Reasoning}}}
		if encrypted {
			s := seal(rep.ID, rep.Reasoning)
			it.EncryptedContent = &s
		}
		out = append(out, it)
	}
	if rep.Content != "" || len(rep.ToolCalls) == 0 {
		out = append(out, messageItem{ID: msgPrefix + rep.ID, Type: "message", Status: status, Role: "assistant", Content: []textPart{outText(rep.Content)}})
	}
	for i, tc := range rep.ToolCalls {
		out = append(out, functionCallItem{ID: fcPrefix + rep.ID + "_" + strconv.Itoa(i), Type: "function_call", Status: "completed", CallID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	return out
}

// finish fills the response's output, status and usage from the reply.
func finish(r *response, rep gateway.Reply, encrypted bool) {
	r.Output = items(rep, encrypted)
	r.Status = "completed"
	if rep.FinishReason == gateway.FinishLength {
		r.Status = "incomplete"
		r.IncompleteDetails = &incomplete{Reason: "max_output_tokens"}
	}
	if rep.Model != "" {
		r.Model = rep.Model
	}
	u := &usage{InputTokens: rep.PromptTokens, OutputTokens: rep.CompletionTokens, TotalTokens: rep.PromptTokens + rep.CompletionTokens}
	r.Usage = u
}
