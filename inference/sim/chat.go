package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rollout-rl/rollout/parsers"
)

type chatRequest struct {
	chatRender
	Model                  string          `json:"model"`
	ToolChoice             json.RawMessage `json:"tool_choice"`
	ParallelToolCalls      *bool           `json:"parallel_tool_calls"`
	Logprobs               bool            `json:"logprobs"`
	TopLogprobs            *int            `json:"top_logprobs"`
	ReturnTokensAsTokenIDs *bool           `json:"return_tokens_as_token_ids"`
	ReturnTokenIDs         *bool           `json:"return_token_ids"`
	SkipSpecialTokens      *bool           `json:"skip_special_tokens"`
	MaxTokens              *int            `json:"max_tokens"`
	MaxCompletionTokens    *int            `json:"max_completion_tokens"`
	N                      int             `json:"n"`
	Seed                   *int64          `json:"seed"`
	Stop                   stopList        `json:"stop"`
	Stream                 bool            `json:"stream"`
	StreamOptions          *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	IncludeReasoning *bool    `json:"include_reasoning"`
	PromptLogprobs   *int     `json:"prompt_logprobs"`
	ReturnPromptText *bool    `json:"return_prompt_text"`
	Temperature      *float64 `json:"temperature"`
	Echo             bool     `json:"echo"`
	RequestID        string   `json:"request_id"`
}

// toolChoice normalises tool_choice to "none", "auto", "required" or
// "named".
func (req *chatRequest) toolChoice() (string, *apiError) {
	raw := bytes.TrimSpace(req.ToolChoice)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		if len(req.Tools) > 0 {
			return "auto", nil
		}
		return "none", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "none", "auto":
			return s, nil
		case "required":
			return "", badRequest(`tool_choice "required" (guided decoding) is not implemented yet in the simulator`)
		}
		return "", badRequest("tool_choice %q must be none, auto, required or a named function", s)
	}
	return "", badRequest("named tool_choice (guided decoding) is not implemented yet in the simulator")
}

// chatOutput is one choice after server-side parsing.
type chatOutput struct {
	genChoice
	Text      string // decoded text seen by the parsers
	Reasoning *string
	Content   *string
	Calls     []map[string]any
	Finish    string
	// Byte ranges of Text that belong to reasoning and content, for
	// streaming deltas. Tool-call text is withheld until the end.
	rStart, rEnd, cStart, cEnd int
}

func (h *handler) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if !h.readModelRequest(w, r, &req, &req.Model) {
		return
	}
	choice, e := req.toolChoice()
	if e == nil {
		e = req.validate()
	}
	if e != nil {
		writeError(w, e)
		return
	}
	if h.llama() {
		h.llamaChat(w, r, &req, choice)
		return
	}
	promptText, prompt, e := h.render(truncateMistralIDs(h.cfg.Family, req.chatRender))
	if e != nil {
		writeError(w, e)
		return
	}
	var promptTextField any
	if req.ReturnPromptText != nil && *req.ReturnPromptText {
		promptTextField = promptText
	}
	maxT := req.MaxCompletionTokens
	if maxT == nil {
		maxT = req.MaxTokens
	}
	p := genParams{MaxTokens: maxT, N: req.N, Seed: req.Seed, Stop: req.Stop}
	seed := seedOf(req.Seed, prompt, h.cfg.Seed)
	id := requestID(r, req.RequestID, "chatcmpl-", seed)
	if req.Stream {
		h.chatStream(w, r, &req, choice, prompt, promptTextField, p, id)
		return
	}
	all, f, ok := h.runGeneration(w, r, [][]int{prompt}, p, 0)
	if !ok {
		return
	}
	outs, e := h.parseChoices(&req, choice, all[0], id)
	if e != nil {
		writeError(w, e)
		return
	}
	asIDs := req.ReturnTokensAsTokenIDs != nil && *req.ReturnTokensAsTokenIDs
	retIDs := req.ReturnTokenIDs != nil && *req.ReturnTokenIDs
	var choices []any
	gen := 0
	for i, o := range outs {
		gen += len(o.IDs)
		msg := map[string]any{"role": "assistant", "content": o.Content, "refusal": nil, "annotations": nil, "audio": nil,
			"function_call": nil, "tool_calls": o.Calls, "reasoning": o.Reasoning}
		var lp any
		if req.Logprobs {
			lp = map[string]any{"content": h.chatLogprobs(o.genChoice, topK(req.TopLogprobs), asIDs, true)}
		}
		c := map[string]any{"index": i, "message": msg, "logprobs": lp, "finish_reason": o.Finish, "stop_reason": o.StopReason,
			"token_ids": nil, "routed_experts": nil}
		if retIDs {
			c["token_ids"] = o.IDs
		}
		choices = append(choices, c)
	}
	resp := map[string]any{"id": id, "object": "chat.completion", "created": h.cfg.Now().Unix(), "model": h.cfg.Model,
		"choices": choices, "service_tier": nil, "system_fingerprint": fingerprint, "usage": usage(len(prompt), gen),
		"prompt_logprobs": nil, "prompt_token_ids": nil, "prompt_text": promptTextField, "kv_transfer_params": nil}
	if retIDs {
		resp["prompt_token_ids"] = prompt
	}
	h.writeBody(w, f, resp)
}

func topK(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

func (req *chatRequest) validate() *apiError {
	switch {
	case req.Echo:
		return badRequest("echo=true is not implemented yet in the simulator")
	case req.PromptLogprobs != nil:
		return badRequest("prompt_logprobs is not implemented yet in the simulator")
	case req.TopLogprobs != nil && *req.TopLogprobs != 0 && !req.Logprobs:
		return badRequest("when using `top_logprobs`, `logprobs` must be set to true")
	case req.TopLogprobs != nil && (*req.TopLogprobs < -1 || *req.TopLogprobs > 20):
		return badRequest("top_logprobs must be between 0 and 20 (--max-logprobs), got %d", *req.TopLogprobs)
	case req.StreamOptions != nil && !req.Stream:
		return badRequest("Stream options can only be defined when `stream=True`.")
	case len(req.Messages) == 0:
		return badRequest("messages must not be empty")
	}
	return nil
}

// parseChoices runs the server-side reasoning and tool parsers over each
// sampled output, as vLLM with --reasoning-parser and --tool-call-parser.
func (h *handler) parseChoices(req *chatRequest, choice string, cs []genChoice, id string) ([]chatOutput, *apiError) {
	parseTools := len(req.Tools) > 0 && choice != "none"
	// Tool parsers force skip_special_tokens=false; otherwise the request
	// decides (default true).
	skip := req.SkipSpecialTokens == nil || *req.SkipSpecialTokens
	if parseTools {
		skip = false
	}
	var tp parsers.Parser
	var schemas []parsers.ToolSchema
	if parseTools {
		var err error
		if tp, err = parsers.Get(h.cfg.Family); err != nil {
			return nil, &apiError{Status: 500, Type: "InternalServerError", Msg: fmt.Sprintf("tool-call parser for family %q is not available in this build: %v", h.cfg.Family, err)}
		}
		for _, t := range req.Tools {
			schemas = append(schemas, parsers.ToolSchema{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters})
		}
	}
	eot := h.tok.mustID(h.tmpl.eot)
	out := make([]chatOutput, len(cs))
	callIdx := 0
	for i, c := range cs {
		o := chatOutput{genChoice: c, Finish: c.Finish}
		ids := c.IDs
		if len(ids) > 0 && ids[len(ids)-1] == eot && c.Finish == "stop" {
			ids = ids[:len(ids)-1] // the stop token is not part of the text
		}
		o.Text, _ = h.tok.Decode(ids, skip)
		rest, restAt := o.Text, 0
		if h.cfg.Reasoning {
			reasoning, content, cAt := h.splitReasoning(o.Text, req.ChatTemplateKwargs.thinkingDisabled())
			if reasoning != nil {
				o.rStart, o.rEnd = strings.Index(o.Text, *reasoning), 0
				o.rEnd = o.rStart + len(*reasoning)
				if req.IncludeReasoning == nil || *req.IncludeReasoning {
					o.Reasoning = reasoning
				}
			}
			rest, restAt = content, cAt
		}
		content := rest
		o.cStart, o.cEnd = restAt, restAt+len(rest)
		o.Calls = []map[string]any{}
		if parseTools {
			res := tp.Parse(rest, schemas)
			if len(res.Errors) > 0 && h.llama() {
				// llama.cpp's template-derived tool-call parser refuses
				// the whole answer when the model's call text does not
				// parse (also when it is cut at max_tokens).
				return nil, &apiError{Status: 500, Type: "server_error", Msg: "The model produced output that does not match the expected peg-native format"}
			}
			if len(res.ToolCalls) > 0 {
				calls := res.ToolCalls
				if req.ParallelToolCalls != nil && !*req.ParallelToolCalls {
					calls = calls[:1]
				}
				for _, tc := range calls {
					callID := "chatcmpl-tool-" + randomHex(hashString(id)+uint64(callIdx), 16)
					switch {
					case h.cfg.Family == "kimi_k2" && tc.ID != "":
						callID = tc.ID
					case h.cfg.Family == "mistral":
						// vLLM with a Mistral tokenizer: 9 alphanumerics.
						callID = randomHex(hashString(id)+uint64(callIdx), 5)[:9]
					}
					callIdx++
					o.Calls = append(o.Calls, map[string]any{"id": callID, "type": "function",
						"function": map[string]any{"name": tc.Name, "arguments": tc.Arguments}})
				}
				o.Finish = "tool_calls"
				content = ""
				if res.Content != nil {
					content = *res.Content
				}
				// Streaming reveals content up to the first call only.
				if k := strings.Index(rest, content); content != "" && k >= 0 {
					o.cStart, o.cEnd = restAt+k, restAt+k+len(content)
				} else {
					o.cEnd = o.cStart
				}
			}
		}
		if content != "" || o.Reasoning == nil && len(o.Calls) == 0 {
			o.Content = &content
		}
		out[i] = o
	}
	return out, nil
}

// reasoningParserName is the vLLM --reasoning-parser matching the template.
func (h *handler) reasoningParserName() string {
	switch {
	case h.tmpl.name == "qwen3":
		return "qwen3"
	case h.cfg.Family == "kimi_k2" || h.cfg.Family == "glm45":
		return h.cfg.Family
	}
	return "deepseek_r1"
}

// splitReasoning separates the think block. It uses the project's reasoning
// parser when one is registered; the simulator's own output always has the
// "<think>…</think>" shape, so the fallback split is exact for it.
func (h *handler) splitReasoning(text string, thinkingDisabled bool) (reasoning *string, content string, contentAt int) {
	if rp, err := parsers.GetReasoning(h.reasoningParserName()); err == nil {
		r, c := rp.Extract(text, parsers.ReasoningOptions{ThinkingDisabled: thinkingDisabled})
		at := strings.LastIndex(text, c)
		if at < 0 || c == "" {
			at = len(text)
		}
		return r, c, at
	}
	if thinkingDisabled && !strings.Contains(text, "</think>") {
		return nil, text, 0
	}
	body := strings.TrimPrefix(text, "<think>")
	off := len(text) - len(body)
	i := strings.Index(body, "</think>")
	if i < 0 {
		return &body, "", len(text)
	}
	r := body[:i]
	return &r, body[i+len("</think>"):], off + i + len("</think>")
}

// chatStream answers with server-sent events: a role chunk, one chunk per
// sampled token (withheld tool-call text gives empty deltas), the finish
// chunk carrying the parsed tool calls, an optional usage chunk, [DONE].
func (h *handler) chatStream(w http.ResponseWriter, r *http.Request, req *chatRequest, toolChoice string, prompt []int, promptText any, p genParams, id string) {
	f := h.drawFault()
	if h.preFault(w, r, f) {
		return
	}
	cs, e := h.generate(prompt, p, 0)
	if e != nil {
		writeError(w, e)
		return
	}
	outs, e := h.parseChoices(req, toolChoice, cs, id)
	if e != nil {
		writeError(w, e)
		return
	}
	asIDs := req.ReturnTokensAsTokenIDs != nil && *req.ReturnTokensAsTokenIDs
	retIDs := req.ReturnTokenIDs != nil && *req.ReturnTokenIDs
	created := h.cfg.Now().Unix()
	seed := seedOf(req.Seed, prompt, h.cfg.Seed)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	send := func(v any) {
		b, _ := marshal(v) // plain maps and slices always encode
		_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	chunk := func(choices []any) map[string]any {
		return map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": h.cfg.Model, "choices": choices}
	}
	longest := 0
	for _, o := range outs {
		longest = max(longest, len(o.IDs))
	}
	total := h.latency(longest, seed)
	perTok := h.cfg.Latency.PerToken
	first := total - time.Duration(longest)*perTok // TTFT plus jitter
	var roles []any
	for i := range outs {
		roles = append(roles, map[string]any{"index": i, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil})
	}
	head := chunk(roles)
	if retIDs {
		head["prompt_token_ids"] = prompt
	}
	if promptText != nil {
		head["prompt_text"] = promptText
	}
	if !h.wait(r.Context(), first) {
		return
	}
	send(head)
	sentR := make([]int, len(outs))
	sentC := make([]int, len(outs))
	for j := 0; j < longest; j++ {
		if j > 0 && !h.wait(r.Context(), perTok) {
			return
		}
		if f == faultTruncate && j == longest/2 {
			panic(http.ErrAbortHandler)
		}
		if f == faultMalformed && j == longest/2 {
			_, _ = fmt.Fprintf(w, "data: {\"id\": \"%s\", \"choices\": [{\"index\": 0, \"delta\": {\"content\": \n\n", id)
		}
		var choices []any
		for i, o := range outs {
			if j >= len(o.IDs) {
				continue
			}
			prefix, _ := h.tok.Decode(o.IDs[:j+1], req.skipForStream(toolChoice))
			L := min(len(prefix), len(o.Text))
			for L > 0 && L < len(o.Text) && !utf8.RuneStart(o.Text[L]) {
				L--
			}
			delta := map[string]any{}
			if o.Reasoning != nil {
				if end := min(L, o.rEnd); end > o.rStart+sentR[i] {
					delta["reasoning"] = o.Text[o.rStart+sentR[i] : end]
					sentR[i] = end - o.rStart
				}
			}
			if end := min(L, o.cEnd); end > o.cStart+sentC[i] {
				delta["content"] = o.Text[o.cStart+sentC[i] : end]
				sentC[i] = end - o.cStart
			}
			c := map[string]any{"index": i, "delta": delta, "logprobs": nil, "finish_reason": nil}
			last := j == len(o.IDs)-1
			if last {
				if len(o.Calls) > 0 {
					var tcs []any
					for k, call := range o.Calls {
						tcs = append(tcs, map[string]any{"index": k, "id": call["id"], "type": "function", "function": call["function"]})
					}
					delta["tool_calls"] = tcs
				}
				c["finish_reason"] = o.Finish
				c["stop_reason"] = o.StopReason
			}
			if req.Logprobs {
				one := o.genChoice
				one.IDs, one.Logprobs = o.IDs[j:j+1], o.Logprobs[j:j+1]
				c["logprobs"] = map[string]any{"content": h.chatLogprobs(one, topK(req.TopLogprobs), asIDs, true)}
			}
			if retIDs {
				c["token_ids"] = o.IDs[j : j+1]
			} else if len(delta) == 0 && !last {
				continue // nothing visible and no ids requested
			}
			choices = append(choices, c)
		}
		if len(choices) > 0 {
			send(chunk(choices))
		}
	}
	gen := 0
	for _, o := range outs {
		gen += len(o.IDs)
	}
	h.countFinished(len(prompt), cs)
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		u := chunk([]any{})
		u["usage"] = usage(len(prompt), gen)
		send(u)
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

func (req *chatRequest) skipForStream(toolChoice string) bool {
	if len(req.Tools) > 0 && toolChoice != "none" {
		return false
	}
	return req.SkipSpecialTokens == nil || *req.SkipSpecialTokens
}
