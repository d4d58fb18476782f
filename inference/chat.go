package inference

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"

	openai "github.com/sashabaranov/go-openai"
)

// chatEpisode is the chat mode: the server renders the template and parses
// tool calls and reasoning; each turn re-sends the whole conversation.
// When the server returns ids (Config.ChatTokenIDs), a sequence is spliced
// from them: turn i's prompt ids must extend the sequence so far; if the
// re-rendered history differs, the sequence restarts from that prompt (the
// earlier turns lose their trained mask) and the differing tokens are
// counted in DriftTokens.
type chatEpisode struct {
	c      *Client
	spec   EpisodeSpec
	tools  EncodedTools // spec.Tools, encoded once
	aff    Affinity
	maxLen int // 0: unknown
	// known is a lower bound of the next prompt's length: the last prompt
	// plus its completion (the history only grows).
	known int

	mu       sync.Mutex
	turns    int
	seq      Sequence
	noIDs    bool // some turn came back without ids or logprobs
	finished bool
}

var _ Episode = (*chatEpisode)(nil)

func (e *chatEpisode) Generate(ctx context.Context, messages []openai.ChatCompletionMessage) (Turn, error) {
	ctx, span := startGeneration(ctx, &e.spec, BackendChat)
	t, err := e.generate(ctx, messages)
	endGeneration(span, t, err)
	return t, err
}

func (e *chatEpisode) generate(ctx context.Context, messages []openai.ChatCompletionMessage) (Turn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.finished {
		return Turn{}, &Error{Class: ErrRequest, Op: "episode", RequestID: e.spec.ID, Msg: "Generate after Finish"}
	}
	if len(messages) == 0 {
		return Turn{}, &Error{Class: ErrRequest, Op: "episode", RequestID: e.spec.ID, Msg: "no messages"}
	}
	turnNo := e.turns + 1
	reqID := e.spec.ID + "-t" + strconv.Itoa(turnNo)
	s := e.spec.Sampling
	if e.maxLen > 0 && s.MaxTokens > 0 && e.known+s.MaxTokens > e.maxLen {
		return Turn{}, &Error{Class: ErrRequest, Op: "episode", RequestID: reqID,
			Msg: fmt.Sprintf("turn %d: prompt of at least %d tokens + max_tokens %d exceeds max_model_len %d", turnNo, e.known, s.MaxTokens, e.maxLen),
			Err: ErrContextLength}
	}
	e.c.mu.Lock()
	llama := e.c.llama
	e.c.mu.Unlock()
	req, extra := e.chatRequest(messages, s, turnNo, llama)
	o := CallOptions{Affinity: &e.aff, RequestID: reqID, Extra: extra}
	resp, ep, version, parseFailed, err := e.chat(ctx, o, req, turnNo, reqID, llama)
	if parseFailed {
		// The model's text did not parse as the template's tool-call
		// format; the server kept it. Replay the same sampling and hand
		// the raw text to the loop (its parser reads it).
		return e.replayTurn(ctx, messages, req, turnNo, reqID, nil, err)
	}
	if err != nil {
		return Turn{}, err
	}
	const op = "POST /v1/chat/completions"
	if len(resp.Choices) != 1 {
		return Turn{}, badAnswer(ep, op, reqID, "want 1 choice, got %d", len(resp.Choices))
	}
	ch := resp.Choices[0]
	ids, lps, err := chatStyleLogprobs(ep, op, reqID, ch.TokenIDs, ch.Logprobs, false)
	if err != nil {
		return Turn{}, err
	}
	promptIDs := resp.PromptTokenIDs
	if e.c.cfg.ChatTokenIDs {
		// No silent empties: ids were asked for, so a turn without them
		// is an error, never a turn with 0 tokens.
		if ids == nil || lps == nil {
			what := "the answer has no completion token ids"
			if ids != nil {
				what = "the answer has token ids but no logprobs"
			}
			return Turn{}, noIDsError(ep, op, reqID, what, nil)
		}
		if ch.TokenIDs == nil && resp.Usage != nil && resp.Usage.CompletionTokens != len(ids) {
			// The ids came from the logprob entries, and some are missing:
			// llama.cpp withholds the entry of a token that leaves the text
			// inside a UTF-8 character. Replay the turn at its seed on
			// /completion, which returns every id, and keep it only if it
			// is the same generation.
			if !llama || req.Seed == nil {
				return Turn{}, noIDsError(ep, op, reqID, fmt.Sprintf("the answer names %d of its %d completion tokens (llama.cpp gives no logprob entry to a token that ends inside a UTF-8 character; the llamacpp tokens backend keeps them)",
					len(ids), resp.Usage.CompletionTokens), nil)
			}
			return e.replayTurn(ctx, messages, req, turnNo, reqID, &namedTurn{ch: ch, ids: ids, n: resp.Usage.CompletionTokens, ep: ep}, nil)
		}
		if promptIDs == nil {
			// llama.cpp returns no prompt ids: render the same request's
			// messages on the server, as its chat route did.
			po := CallOptions{Affinity: &e.aff, RequestID: reqID + "-prompt"}
			promptIDs, err = e.c.promptIDsFallback(ctx, po, messages, req.ToolsJSON, s.ChatTemplateKwargs)
			if err != nil || len(promptIDs) == 0 {
				return Turn{}, noIDsError(ep, op, reqID, "the answer has no prompt_token_ids", err)
			}
		}
	}
	if ch.FinishReason == "" {
		return Turn{}, badAnswer(ep, op, reqID, "finish_reason missing")
	}
	t := chatTurn(resp, &ch, ids, lps, promptIDs, ep, version)
	if em := e.c.pool.metricsFor(ep); em != nil {
		em.tokensIn.Add(float64(t.PromptTokens))
		em.tokensOut.Add(float64(t.CompletionTokens))
	}
	e.known = t.PromptTokens + t.CompletionTokens
	e.splice(promptIDs, ids, lps, nil, version)
	e.turns = turnNo
	return t, nil
}

// chatTurn is the Turn of a chat answer: the message as the server parsed
// it, and token counts from the ids where there are ids, else the usage.
func chatTurn(resp *ChatResponse, ch *ChatChoice, ids []int32, lps []float32, promptIDs []int32, ep string, version int64) Turn {
	content := ""
	if ch.Message.Content != nil {
		content = *ch.Message.Content
	}
	t := Turn{
		Text:          content,
		Parsed:        true,
		Content:       content,
		Reasoning:     ch.Message.ReasoningText(),
		ToolCalls:     ch.Message.ToolCalls,
		FinishReason:  ch.FinishReason,
		CompletionIDs: ids,
		Logprobs:      lps,
		Endpoint:      ep,
		Version:       version,
	}
	if resp.Usage != nil {
		t.PromptTokens, t.CompletionTokens = resp.Usage.PromptTokens, resp.Usage.CompletionTokens
	}
	if promptIDs != nil {
		t.PromptTokens = len(promptIDs)
	}
	if ids != nil {
		t.CompletionTokens = len(ids)
	}
	return t
}

// chatRequest is the turn's /v1/chat/completions request and the extra
// body fields to send with it: the sampler in the fields the server
// understands, a per-turn seed on llama.cpp (so the turn can be replayed),
// ids and logprobs when the run asks for them.
func (e *chatEpisode) chatRequest(messages []openai.ChatCompletionMessage, s Sampling, turnNo int, llama bool) (req *ChatRequest, extra map[string]any) {
	req = &ChatRequest{
		Model:              e.spec.Model,
		Messages:           messages,
		samplingFields:     samplingOf(s, s.MaxTokens),
		ChatTemplateKwargs: s.ChatTemplateKwargs,
	}
	extra = s.ExtraBody
	if e.c.cfg.SamplerFields == SamplerFieldsOpenAI {
		// Only the fields the OpenAI API knows.
		req.TopK, req.MinP, req.RepetitionPenalty = nil, nil, nil
	} else if llama {
		extra = llamaChatSampler(s)
	}
	req.ToolsJSON = e.tools // nil without tools: vLLM rejects "tools": []
	if llama {
		// An explicit seed per rollout and turn: the turn can be replayed
		// exactly on /completion (llamaReplay).
		seed := chatSeed(e.spec.ID, turnNo, s.Seed)
		req.Seed = &seed
	}
	if e.c.cfg.ChatTokenIDs {
		req.Logprobs = true
		req.TopLogprobs = zeroIntPt
		if llama {
			// llama.cpp returns no logprobs at all with top_logprobs 0.
			one := 1
			req.TopLogprobs = &one
		}
		req.ReturnTokenIDs = true
	}
	return req, extra
}

// chat sends req and waits through policy updates: chat mode cannot
// continue a cut generation without re-rendering, so a turn aborted by an
// update is generated again, whole, once admission reopens. parseFailed
// reports a llama.cpp server that could not parse the model's tool calls
// (err says so): the caller replays the turn.
func (e *chatEpisode) chat(ctx context.Context, o CallOptions, req *ChatRequest, turnNo int, reqID string, llama bool) (resp *ChatResponse, ep string, version int64, parseFailed bool, err error) {
	for attempt := 0; ; attempt++ {
		t, err := e.c.gate.enter(ctx)
		if err != nil {
			return nil, "", 0, false, fmt.Errorf("episode %s turn %d: chat: %w", e.spec.ID, turnNo, err)
		}
		gctx, sink := withVersionSink(ctx)
		resp, ep, err = e.c.pool.ChatCompletion(gctx, o, req)
		if err != nil {
			e.c.gate.exit()
			return nil, "", 0, llama && serverParseFailure(err), fmt.Errorf("episode %s turn %d: chat: %w", e.spec.ID, turnNo, err)
		}
		ev, evOK := sink.get()
		version, _, _ = e.c.stamp(t, ev, evOK)
		e.c.gate.exit()
		if len(resp.Choices) != 1 || resp.Choices[0].FinishReason != "abort" {
			return resp, ep, version, false, nil
		}
		if attempt >= maxStalledCuts {
			return nil, "", 0, false, badAnswer(ep, "POST /v1/chat/completions", reqID, "%d consecutive chat generations aborted", attempt+1)
		}
		o.RequestID = reqID + "-a" + strconv.Itoa(attempt+1)
	}
}

// splice appends a turn; unscored are positions in ids without a logprob
// (masked out, as in tokens mode). version stamps the turn's positions:
// the chat route reports no per-token versions, so every id of the turn
// carries the version the turn was admitted under (rollout's own
// stamping, as tokens mode does on engines without version spans), and
// the prompt ids the version in force when they were appended.
func (e *chatEpisode) splice(prompt, ids []int32, lps []float32, unscored []int, version int64) {
	if e.noIDs {
		return
	}
	if prompt == nil || ids == nil || lps == nil {
		e.noIDs = true
		e.seq = Sequence{}
		return
	}
	q := &e.seq
	if e.turns == 0 || !hasPrefix(prompt, q.Tokens) {
		if e.turns > 0 {
			q.DriftTokens += DiffTokens(q.Tokens, prompt[:min(len(prompt), len(q.Tokens))])
		}
		drift := q.DriftTokens
		*q = Sequence{PromptLen: len(prompt), DriftTokens: drift}
		q.Tokens = append(q.Tokens, prompt...)
		q.Mask = make([]int8, len(prompt))
		q.Logprobs = slices.Repeat([]float32{1.0}, len(prompt))
		q.Versions = slices.Repeat([]int64{version}, len(prompt))
	} else {
		ext := prompt[len(q.Tokens):]
		q.Tokens = append(q.Tokens, ext...)
		for range ext {
			q.Mask = append(q.Mask, 0)
			q.Logprobs = append(q.Logprobs, 1.0)
			q.Versions = append(q.Versions, version)
		}
	}
	start := len(q.Tokens)
	q.TurnStarts = append(q.TurnStarts, start)
	q.Tokens = append(q.Tokens, ids...)
	q.Logprobs = append(q.Logprobs, lps...)
	for range ids {
		q.Mask = append(q.Mask, 1)
		q.Versions = append(q.Versions, version)
	}
	for _, i := range unscored {
		q.Mask[start+i] = 0
	}
	q.Unscored += len(unscored)
}

// llamaChatSampler is the extra body of a chat request to llama.cpp: its
// own names for the fields vLLM names differently, and its extra samplers
// made neutral. The configured extra_body wins.
func llamaChatSampler(s Sampling) map[string]any {
	out := map[string]any{"repeat_penalty": *s.RepetitionPenalty}
	for _, f := range llamaNeutral {
		out[f.key] = f.val
	}
	maps.Copy(out, s.ExtraBody)
	return out
}

func hasPrefix(s, pre []int32) bool {
	return len(s) >= len(pre) && slices.Equal(s[:len(pre)], pre)
}

// Finish returns whatever sequence the server's ids allowed (empty when it
// returned none). messages are not re-rendered in chat mode: the splice
// already measured the drift turn by turn.
func (e *chatEpisode) Finish(ctx context.Context, messages []openai.ChatCompletionMessage) (Sequence, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.finished = true
	if e.noIDs {
		return Sequence{}, nil
	}
	q := e.seq
	return Sequence{
		Tokens:      slices.Clone(q.Tokens),
		Mask:        slices.Clone(q.Mask),
		Logprobs:    slices.Clone(q.Logprobs),
		Versions:    slices.Clone(q.Versions),
		TurnStarts:  slices.Clone(q.TurnStarts),
		PromptLen:   q.PromptLen,
		DriftTokens: q.DriftTokens,
		Unscored:    q.Unscored,
	}, nil
}
