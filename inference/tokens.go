package inference

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"

	openai "github.com/sashabaranov/go-openai"
	"golang.org/x/sync/errgroup"
)

// tokenEpisode is the tokens mode: the episode owns the exact sequence.
//
// Invariants after every successful Generate:
//   - seq.Tokens = first prompt + for each turn: [sampled ids] + masked
//     template ids up to the next turn's generation prompt;
//   - Mask is 1 exactly on sampled ids; Logprobs hold the sampling logprob
//     there and 1.0 elsewhere;
//   - pending holds the template ids that follow the last sampled turn
//     (the newline after <|im_end|>, or the whole closing after a length
//     cut); they are inserted, masked, in front of the next segment.
type tokenEpisode struct {
	c      *Client
	spec   EpisodeSpec
	tools  EncodedTools // spec.Tools, encoded once
	maxLen int
	aff    Affinity // generation pool
	taff   Affinity // tokenizer pool when separate

	mu       sync.Mutex
	seq      Sequence
	consumed int // len(messages) at the last Generate
	turns    int
	pending  []int32
	finished bool
	// prints fingerprints the messages already in the sequence: tokens mode
	// needs an append-only history, and a rewritten one (compaction, edited
	// tool output) would otherwise go unnoticed.
	prints []uint64
	// templateKey is the model and its chat_template_kwargs (JSON), the
	// key of what is learned per template (closing, prefill); toolsKey
	// fingerprints tools for segmentShape. Both fixed at Start: they are
	// read on every turn.
	templateKey string
	toolsKey    uint64
	// lastIDs and lastPieces are the last turn's sampled ids and their
	// pieces (nil when the response did not spell them): TokenSpans
	// places spans of that turn without the server.
	lastIDs    []int32
	lastPieces *tokenPieces
	// promptEnc encodes the growing prompt for the vllm generator.
	promptEnc promptEncoder
}

// newTokenEpisode computes the episode's per-template keys once.
func newTokenEpisode(c *Client, spec EpisodeSpec, tools EncodedTools, maxLen int) *tokenEpisode {
	kw, _ := json.Marshal(spec.Sampling.ChatTemplateKwargs)
	h := fnv.New64a()
	h.Write(tools)
	e := &tokenEpisode{c: c, spec: spec, tools: tools, maxLen: maxLen,
		templateKey: spec.Model + "\x00" + string(kw), toolsKey: h.Sum64()}
	e.aff.a.key, e.taff.a.key = spec.Group, spec.Group
	return e
}

var _ Episode = (*tokenEpisode)(nil)

func (e *tokenEpisode) tokOpts(suffix string) CallOptions {
	o := CallOptions{RequestID: e.spec.ID + "-" + suffix}
	if e.c.tok == e.c.pool {
		o.Affinity = &e.aff
	} else {
		o.Affinity = &e.taff
	}
	return o
}

// render is the ids of messages under the chat template: rendered
// in-process when Config.LocalRender is set (and checked against the
// server, localrender.go), else by the server.
func (e *tokenEpisode) render(ctx context.Context, msgs []openai.ChatCompletionMessage, genPrompt bool, suffix string) ([]int32, error) {
	if l := e.c.local; l != nil && !l.off.Load() {
		return l.render(ctx, e, msgs, genPrompt, suffix, true)
	}
	return e.serverRender(ctx, msgs, genPrompt, suffix)
}

// driftRender is render for Finish's drift check: a whole conversation
// rendered once, so not kept in the local render cache.
func (e *tokenEpisode) driftRender(ctx context.Context, msgs []openai.ChatCompletionMessage, genPrompt bool) ([]int32, error) {
	if l := e.c.local; l != nil && !l.off.Load() {
		return l.render(ctx, e, msgs, genPrompt, "drift", false)
	}
	return e.serverRender(ctx, msgs, genPrompt, "drift")
}

// serverRender asks the server for the ids of messages under the chat
// template.
func (e *tokenEpisode) serverRender(ctx context.Context, msgs []openai.ChatCompletionMessage, genPrompt bool, suffix string) ([]int32, error) {
	if e.c.cfg.Backend == BackendLlamaCpp {
		return llamaRender(ctx, e.c.tok, e.tokOpts(suffix), msgs, e.tools, genPrompt, e.spec.Sampling.ChatTemplateKwargs)
	}
	resp, err := e.c.tok.Tokenize(ctx, e.tokOpts(suffix), &TokenizeRequest{
		Model:               e.spec.Model,
		Messages:            msgs,
		ToolsJSON:           e.tools,
		AddGenerationPrompt: &genPrompt,
		ChatTemplateKwargs:  e.spec.Sampling.ChatTemplateKwargs,
	})
	if err != nil {
		return nil, err
	}
	return resp.Tokens, nil
}

// renderPrompt is render for the first prompt; it also learns
// max_model_len from /tokenize when /v1/models did not report it.
func (e *tokenEpisode) renderPrompt(ctx context.Context, msgs []openai.ChatCompletionMessage) ([]int32, error) {
	if e.c.cfg.Backend == BackendLlamaCpp || (e.c.local != nil && e.maxLen > 0) {
		return e.render(ctx, msgs, true, "t1-prompt")
	}
	gp := true
	resp, err := e.c.tok.Tokenize(ctx, e.tokOpts("t1-prompt"), &TokenizeRequest{
		Model:               e.spec.Model,
		Messages:            msgs,
		ToolsJSON:           e.tools,
		AddGenerationPrompt: &gp,
		ChatTemplateKwargs:  e.spec.Sampling.ChatTemplateKwargs,
	})
	if err != nil {
		return nil, err
	}
	if e.maxLen == 0 && resp.MaxModelLen > 0 {
		e.maxLen = resp.MaxModelLen
	}
	return resp.Tokens, nil
}

func (e *tokenEpisode) Generate(ctx context.Context, messages []openai.ChatCompletionMessage) (Turn, error) {
	ctx, span := startGeneration(ctx, &e.spec, e.c.gen.name())
	t, err := e.generate(ctx, messages, TurnOptions{})
	endGeneration(span, t, err)
	return t, err
}

func (e *tokenEpisode) generate(ctx context.Context, messages []openai.ChatCompletionMessage, o TurnOptions) (Turn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.finished {
		return Turn{}, e.usage("Generate after Finish")
	}
	if len(messages) == 0 {
		return Turn{}, e.usage("no messages")
	}
	ok := false
	restore := e.snapshot()
	defer func() {
		if !ok {
			restore()
		}
	}()

	turnNo := e.turns + 1
	if i := e.rewritten(messages); i >= 0 {
		return Turn{}, e.usage(fmt.Sprintf("turn %d: message %d changed since it was sent; tokens mode needs an append-only history (start a new episode after compaction)", turnNo, i))
	}
	if err := e.appendInput(ctx, messages, turnNo); err != nil {
		return Turn{}, err
	}

	maxTokens, err := e.budget(turnNo, o)
	if err != nil {
		return Turn{}, err
	}
	prompt := slices.Clip(e.seq.Tokens)
	reqID := e.spec.ID + "-t" + strconv.Itoa(turnNo)
	s, vers, cuts, err := e.sampleTurn(ctx, prompt, maxTokens, reqID, turnNo)
	if err != nil {
		return Turn{}, fmt.Errorf("episode %s turn %d: generate: %w", e.spec.ID, turnNo, err)
	}
	if len(s.ids) == 0 {
		return Turn{}, badAnswer(s.endpoint, e.c.gen.name(), reqID, "generation returned no tokens (finish_reason %q)", s.finish)
	}
	closing, err := e.closing(ctx)
	if err != nil {
		return Turn{}, fmt.Errorf("episode %s turn %d: template closing: %w", e.spec.ID, turnNo, err)
	}
	last := s.ids[len(s.ids)-1]
	if s.stop == stopUnknown {
		// A stop string was requested and the server did not say which
		// stop fired: the end-of-turn token is recognisable in the closing.
		s.stop = stopString
		if slices.Contains(closing, last) {
			s.stop = stopToken
		}
	}
	text, err := e.turnText(ctx, s)
	if err != nil {
		return Turn{}, fmt.Errorf("episode %s turn %d: decode: %w", e.spec.ID, turnNo, err)
	}

	e.appendSample(s, vers, cuts, closing)
	e.lastIDs, e.lastPieces = s.ids, s.pieces
	e.turns = turnNo
	ok = true
	ep := s.endpoint
	em := e.c.pool.metricsFor(ep)
	if em != nil {
		em.tokensIn.Add(float64(len(prompt)))
		em.tokensOut.Add(float64(len(s.ids)))
	}
	return Turn{
		Text:             text,
		FinishReason:     s.finish,
		PromptTokens:     len(prompt),
		CompletionTokens: len(s.ids),
		CompletionIDs:    slices.Clone(s.ids),
		Logprobs:         slices.Clone(s.logprobs),
		Endpoint:         ep,
		Version:          vers[len(vers)-1],
		Cuts:             len(cuts),
	}, nil
}

// promptJSON is prompt encoded for the generator that sends it encoded
// (vllm's /v1/completions), else nil.
func (e *tokenEpisode) promptJSON(prompt []int32) []byte {
	if _, ok := e.c.gen.(completionsGen); !ok {
		return nil
	}
	return e.promptEnc.encode(prompt)
}

// snapshot returns what undoes a failed turn: the episode as it was, so
// the caller may retry Generate with the same messages.
func (e *tokenEpisode) snapshot() (restore func()) {
	snapLen, snapTurns, snapConsumed, snapPending, snapUnscored := len(e.seq.Tokens), len(e.seq.TurnStarts), e.consumed, e.pending, e.seq.Unscored
	snapCuts, snapPrints, snapRouting := len(e.seq.Cuts), len(e.prints), e.seq.Routing
	return func() {
		e.seq.Routing = snapRouting
		e.seq.Tokens = e.seq.Tokens[:snapLen]
		e.seq.Mask = e.seq.Mask[:snapLen]
		e.seq.Logprobs = e.seq.Logprobs[:snapLen]
		e.seq.Versions = e.seq.Versions[:snapLen]
		e.seq.Cuts = e.seq.Cuts[:snapCuts]
		e.seq.TurnStarts = e.seq.TurnStarts[:snapTurns]
		e.consumed, e.pending = snapConsumed, snapPending
		e.seq.Unscored = snapUnscored
		if snapLen == 0 {
			e.seq.PromptLen = 0
		}
		e.prints = e.prints[:snapPrints]
	}
}

// appendInput appends the ids of what the turn adds to the sequence,
// masked: the rendered prompt on the first turn, later the previous
// turn's pending closing and the new messages' segment. It fingerprints
// the messages so that a rewritten history is caught next turn.
func (e *tokenEpisode) appendInput(ctx context.Context, messages []openai.ChatCompletionMessage, turnNo int) error {
	if e.turns == 0 {
		ids, err := e.renderPrompt(ctx, messages)
		if err != nil {
			return fmt.Errorf("episode %s: render prompt: %w", e.spec.ID, err)
		}
		e.appendMasked(ids)
		e.seq.PromptLen = len(ids)
	} else {
		if len(messages) <= e.consumed || messages[e.consumed].Role != openai.ChatMessageRoleAssistant {
			return e.usage(fmt.Sprintf("turn %d: messages[%d] must be the assistant message of turn %d (have %d messages)", turnNo, e.consumed, e.turns, len(messages)))
		}
		seg, err := e.segment(ctx, messages[e.consumed], messages[e.consumed+1:], turnNo)
		if err != nil {
			return fmt.Errorf("episode %s turn %d: new-message ids: %w", e.spec.ID, turnNo, err)
		}
		e.appendMasked(e.pending)
		e.appendMasked(seg)
		e.pending = nil
	}
	e.consumed = len(messages)
	for i := len(e.prints); i < len(messages); i++ {
		e.prints = append(e.prints, fingerprint(messages[i]))
	}
	return nil
}

// appendSample appends the sampled ids, trained, with their logprobs,
// versions and cuts, and keeps as pending what of the template's closing
// the next turn must add: the sampled stop token stands for the
// end-of-turn token, so only what follows it.
func (e *tokenEpisode) appendSample(s sample, vers []int64, cuts []Cut, closing []int32) {
	start := len(e.seq.Tokens)
	e.seq.TurnStarts = append(e.seq.TurnStarts, start)
	e.seq.Tokens = append(e.seq.Tokens, s.ids...)
	e.seq.Logprobs = append(e.seq.Logprobs, s.logprobs...)
	e.seq.Versions = append(e.seq.Versions, vers...)
	for range s.ids {
		e.seq.Mask = append(e.seq.Mask, 1)
	}
	for _, c := range cuts {
		if c.Position >= 0 {
			c.Position += start
		}
		e.seq.Cuts = append(e.seq.Cuts, c)
	}
	for _, i := range s.unscored {
		e.seq.Mask[start+i] = 0 // sampled, but no logprob to train with
	}
	e.seq.Unscored += len(s.unscored)
	if s.routing != nil {
		// The request's prompt was the whole sequence so far: its routing
		// covers every token before this turn's last sampled id.
		e.seq.Routing = s.routing
	}
	last := s.ids[len(s.ids)-1]
	if s.stop == stopToken {
		// The sampled stop token stands for the template's end-of-turn
		// token; what the template writes after it was never sampled.
		if i := slices.Index(closing, last); i >= 0 {
			e.pending = slices.Clone(closing[i+1:])
		} else {
			e.pending = slices.Clone(closing[1:])
		}
	} else {
		// Length cut or stop string: no end-of-turn token was sampled, so
		// the template's whole closing goes in, masked.
		e.pending = slices.Clone(closing)
	}
}

func (e *tokenEpisode) usage(msg string) error {
	return &Error{Class: ErrRequest, Op: "episode", RequestID: e.spec.ID, Msg: msg}
}

func (e *tokenEpisode) appendMasked(ids []int32) {
	e.seq.Tokens = append(e.seq.Tokens, ids...)
	v := e.c.PolicyVersion()
	n := len(ids)
	e.seq.Mask = slices.Grow(e.seq.Mask, n)
	e.seq.Logprobs = slices.Grow(e.seq.Logprobs, n)
	e.seq.Versions = slices.Grow(e.seq.Versions, n)
	for range ids {
		e.seq.Mask = append(e.seq.Mask, 0)
		e.seq.Logprobs = append(e.seq.Logprobs, 1.0)
		e.seq.Versions = append(e.seq.Versions, v)
	}
}

// budget is the context-length guard: max_tokens must fit after the prompt.
func (e *tokenEpisode) budget(turnNo int, o TurnOptions) (int, error) {
	want := e.spec.Sampling.MaxTokens
	if o.MaxTokens > 0 && (want == 0 || o.MaxTokens < want) {
		want = o.MaxTokens
	}
	if e.maxLen <= 0 {
		if want == 0 {
			// vLLM's /v1/completions would default to 16 tokens.
			return 0, &Error{Class: ErrRequest, Op: "episode", RequestID: e.spec.ID, Msg: "max_tokens unset and the server reports no max_model_len"}
		}
		return want, nil
	}
	room := e.maxLen - len(e.seq.Tokens)
	if want == 0 || (o.FitContext && room > 0 && want > room) {
		want = room
	}
	if room <= 0 || want > room {
		return 0, &Error{Class: ErrRequest, Op: "episode", RequestID: e.spec.ID,
			Msg: fmt.Sprintf("turn %d: prompt of %d tokens + max_tokens %d exceeds max_model_len %d", turnNo, len(e.seq.Tokens), want, e.maxLen),
			Err: ErrContextLength}
	}
	return want, nil
}

const (
	baseUser = "x"
)

// closing returns the template ids that end an assistant turn (e.g.
// <|im_end|> "\n"), learned once per model and template kwargs: the common
// suffix of two renders that differ only in the assistant's content.
func (e *tokenEpisode) closing(ctx context.Context) ([]int32, error) {
	if e.c.cfg.Backend == BackendLlamaCpp {
		return learnCached(ctx, e.c, e.c.closing, "closing", e.closingKey(), e.probeClosingNoPrefill)
	}
	return learnCached(ctx, e.c, e.c.closing, "closing", e.closingKey(), e.probeClosing)
}

func (e *tokenEpisode) closingKey() string { return e.templateKey }

// probeClosingNoPrefill learns the closing from renders that end with a
// user message, for llama-server: started with its defaults it treats a
// trailing assistant message as a prefill to continue (rendering the
// generation prompt and the content, no closing), and refuses one when the
// template's thinking is on; with --no-prefill-assistant it renders it
// closed. A trailing user message renders the same either way.
//
// [user x, assistant y, user x] and the same with z share a suffix S: the
// closing, then the last user turn. The lone [user x] ends with that user
// turn too (after whatever the template puts first: a system block, the
// tools), so the suffix S shares with it is the user turn, and the rest of
// S is the closing. When what precedes the user turn also ends like the
// closing, the shared part runs into it and the closing found is shorter
// (at least one id, the end-of-turn token): the ids of the sequence are the
// same, only split differently between a turn's closing and the next
// segment. Whether the server prefills is kept for segment and Finish.
func (e *tokenEpisode) probeClosingNoPrefill(ctx context.Context, key string) ([]int32, error) {
	conv := func(content string) []openai.ChatCompletionMessage {
		return []openai.ChatCompletionMessage{
			{Role: openai.ChatMessageRoleUser, Content: baseUser},
			{Role: openai.ChatMessageRoleAssistant, Content: content},
			{Role: openai.ChatMessageRoleUser, Content: baseUser},
		}
	}
	// Without tools: where a template puts them (a system block first, or
	// before the last user turn) would make the lone user message and the
	// last user turn differ. The closing does not depend on them (it is
	// cached per model and kwargs alone).
	render := func(ctx context.Context, msgs []openai.ChatCompletionMessage, suffix string) ([]int32, error) {
		return llamaRender(ctx, e.c.tok, e.tokOpts(suffix), msgs, nil, false, e.spec.Sampling.ChatTemplateKwargs)
	}
	var ry, rz, ru []int32
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) { ry, err = render(gctx, conv("y"), "closing-y"); return })
	g.Go(func() (err error) { rz, err = render(gctx, conv("z"), "closing-z"); return })
	g.Go(func() (err error) {
		ru, err = render(gctx, []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: baseUser}}, "closing-user")
		return
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	n, err := e.closingSuffix(ry, rz)
	if err != nil {
		return nil, err
	}
	s := ry[len(ry)-n:]
	// Does the server close a trailing assistant message? Then [user x,
	// assistant y] is ry up to y's closing, which is the closing exactly,
	// and everything works as with any other server. A prefill stops
	// right after y (or is refused, as llama-server refuses one when the
	// template's thinking is on).
	rp, perr := render(ctx, conv("y")[:2], "closing-trailing")
	if perr != nil && ctx.Err() != nil {
		return nil, perr
	}
	prefill := perr != nil || len(rp) <= len(ry)-n || !slices.Equal(rp, ry[:min(len(rp), len(ry))])
	var cl []int32
	if prefill {
		m := min(commonSuffix(s, ru), len(s)-1)
		cl = slices.Clone(s[:len(s)-m])
	} else {
		cl = slices.Clone(rp[len(ry)-n:])
	}
	e.c.mu.Lock()
	e.c.closing[key] = cl
	e.c.closingTail[key] = slices.Clone(s)
	if prefill {
		e.c.prefill[key] = true
	}
	e.c.mu.Unlock()
	return cl, nil
}

// prefill reports whether the server renders a trailing assistant message
// as a prefill (learned with the closing; llama.cpp only).
func (e *tokenEpisode) prefill() bool {
	e.c.mu.Lock()
	defer e.c.mu.Unlock()
	return e.c.prefill[e.closingKey()]
}

// closingSuffix is the length of the common suffix of the renders of the
// two probe conversations (answers "y" and "z"): the assistant-turn
// closing. None, or one render being all suffix, is a template tokens
// mode cannot work with (the same answer on every request: a
// configuration error).
func (e *tokenEpisode) closingSuffix(ry, rz []int32) (int, error) {
	n := commonSuffix(ry, rz)
	if n == 0 || n == len(ry) || n == len(rz) {
		return 0, &Error{Class: ErrRequest, Op: "template probe", RequestID: e.spec.ID, Err: ErrTemplate,
			Msg: fmt.Sprintf("cannot find the assistant-turn closing of model %s's chat template (renders of %d and %d ids share a %d-id suffix)", e.spec.Model, len(ry), len(rz), n)}
	}
	return n, nil
}

func commonSuffix(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[len(a)-1-n] == b[len(b)-1-n] {
		n++
	}
	return n
}

// probeClosing renders the two probe conversations of closing and caches
// their common suffix under key.
func (e *tokenEpisode) probeClosing(ctx context.Context, key string) ([]int32, error) {
	conv := func(content string) []openai.ChatCompletionMessage {
		return []openai.ChatCompletionMessage{
			{Role: openai.ChatMessageRoleUser, Content: baseUser},
			{Role: openai.ChatMessageRoleAssistant, Content: content},
		}
	}
	var ry, rz []int32
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) { ry, err = e.render(gctx, conv("y"), false, "closing-y"); return })
	g.Go(func() (err error) { rz, err = e.render(gctx, conv("z"), false, "closing-z"); return })
	if err := g.Wait(); err != nil {
		return nil, err
	}
	n, err := e.closingSuffix(ry, rz)
	if err != nil {
		return nil, err
	}
	cl := slices.Clone(ry[len(ry)-n:])
	e.c.mu.Lock()
	e.c.closing[key] = cl
	e.c.mu.Unlock()
	return cl, nil
}

// segment returns the ids of the new messages plus the next generation
// prompt, as the template renders them right after an assistant turn.
//
// It renders a fixed base [user "x", last assistant] with and without the
// new messages and takes what follows the base assistant's closing. The
// base assistant's own rendering may differ between the two renders (Qwen3
// drops <think> from assistant turns before the last user message; Mistral
// moves the tool list to the last user turn) — that part is never used:
// the cut is made after the k-th closing, where k counts the closings in
// the base render. Sampled ids are never re-rendered.
func (e *tokenEpisode) segment(ctx context.Context, lastAssistant openai.ChatCompletionMessage, newMsgs []openai.ChatCompletionMessage, turnNo int) ([]int32, error) {
	closing, err := e.closing(ctx)
	if err != nil {
		return nil, err
	}
	if l := e.c.local; l != nil && !l.off.Load() {
		// In-process: the segment's text learned per shape, the new
		// messages' texts put in, checked against the render below
		// (localrender.go).
		return l.segment(ctx, e, lastAssistant, newMsgs, closing, func() ([]int32, error) {
			return e.renderSegment(ctx, lastAssistant, newMsgs, closing, turnNo)
		})
	}
	return e.renderSegment(ctx, lastAssistant, newMsgs, closing, turnNo)
}

// renderSegment is segment by two renders of the conversation (one, once
// the assistant shape's closing count is known).
func (e *tokenEpisode) renderSegment(ctx context.Context, lastAssistant openai.ChatCompletionMessage, newMsgs []openai.ChatCompletionMessage, closing []int32, turnNo int) ([]int32, error) {
	if lastAssistant.Content == "" && len(lastAssistant.MultiContent) == 0 && len(lastAssistant.ToolCalls) == 0 {
		// A turn whose only call could not be parsed leaves an empty
		// assistant message, which some templates refuse (llama.cpp: HTTP
		// 400 "Assistant message must contain either 'content' or
		// 'tool_calls'"). Its rendering is never used (see above), so any
		// content will do.
		lastAssistant.Content = baseUser
	}
	base := []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: baseUser}, lastAssistant}
	with := append(slices.Clip(base), newMsgs...)
	t := strconv.Itoa(turnNo)
	shape, fast := e.segmentShape(ctx, lastAssistant, closing)
	if fast && !e.c.cfg.TwoRenderSegments {
		e.c.mu.Lock()
		k, known := e.c.segClosings[shape]
		e.c.mu.Unlock()
		if known {
			// One render: the base render's closing count is known for
			// this assistant shape, and nothing the assistant wrote can
			// add a closing of its own.
			rn, err := e.render(ctx, with, true, "t"+t+"-next")
			if err != nil {
				return nil, err
			}
			if pos := nthOcc(rn, closing, k); pos >= 0 {
				return slices.Clone(rn[pos+len(closing):]), nil
			}
			// Fewer closings than learned: fall through to the two renders,
			// which decide.
		}
	}
	var k int
	if e.prefill() {
		// No base render: it would end with the assistant message, which
		// this server renders as a prefill (see probeClosingNoPrefill).
		// The cut counts the closings of the lone user message (with the
		// episode's tools, which may add a system block), plus the
		// assistant's own.
		ru, err := e.render(ctx, base[:1], false, "t"+t+"-base")
		if err != nil {
			return nil, err
		}
		k = countOcc(ru, closing) + 1
	} else {
		// One render after the other, not in parallel: both are short (two
		// messages plus the new ones), and in parallel each episode would
		// hold two connections and two goroutines of its own — at thousands
		// of loops, twice the connections to dial and keep
		// (docs/inference.md).
		rb, err := e.render(ctx, base, false, "t"+t+"-base")
		if err != nil {
			return nil, err
		}
		if !hasSuffix(rb, closing) {
			return nil, &Error{Class: ErrRequest, Op: "template probe", RequestID: e.spec.ID, Err: ErrTemplate,
				Msg: "the base render does not end with the assistant closing; this template is not supported in tokens mode"}
		}
		k = countOcc(rb, closing)
	}
	rn, err := e.render(ctx, with, true, "t"+t+"-next")
	if err != nil {
		return nil, err
	}
	pos := nthOcc(rn, closing, k)
	if pos < 0 {
		return nil, &Error{Class: ErrRequest, Op: "template probe", RequestID: e.spec.ID, Err: ErrTemplate,
			Msg: fmt.Sprintf("the render with new messages has fewer than %d assistant closings; cannot locate the new segment", k)}
	}
	if fast {
		e.c.mu.Lock()
		if len(e.c.segClosings) < 4096 {
			e.c.segClosings[shape] = k
		}
		e.c.mu.Unlock()
	}
	return slices.Clone(rn[pos+len(closing):]), nil
}

// segmentShape keys the closing count of segment's base render: model,
// template kwargs, tools, and the assistant message's form (content or
// not, reasoning or not, how many tool calls). fast is false when the
// count may depend on the message's text: when the end-of-turn token's
// text cannot be learned, is blank, or appears in what the assistant wrote
// (a template renders it as the special token, one closing more).
func (e *tokenEpisode) segmentShape(ctx context.Context, m openai.ChatCompletionMessage, closing []int32) (string, bool) {
	eot, err := e.tokenText(ctx, closing[0])
	if err != nil || strings.TrimSpace(eot) == "" {
		return "", false
	}
	has := func(s string) bool { return strings.Contains(s, eot) }
	if has(m.Content) || has(m.ReasoningContent) {
		return "", false
	}
	for _, p := range m.MultiContent {
		if has(p.Text) {
			return "", false
		}
	}
	for _, tc := range m.ToolCalls {
		if has(tc.Function.Name) || has(tc.Function.Arguments) || has(tc.ID) {
			return "", false
		}
	}
	flag := func(b bool) byte {
		if b {
			return '1'
		}
		return '0'
	}
	key := fmt.Sprintf("%s\x00%x\x00%c%c%c%d", e.templateKey, e.toolsKey, flag(m.Content != "" || len(m.MultiContent) > 0),
		flag(m.ReasoningContent != ""), flag(m.Name != ""), len(m.ToolCalls))
	return key, true
}

func hasSuffix(s, suf []int32) bool {
	return len(s) >= len(suf) && slices.Equal(s[len(s)-len(suf):], suf)
}

func countOcc(s, sub []int32) int {
	n := 0
	for i := 0; i+len(sub) <= len(s); {
		if slices.Equal(s[i:i+len(sub)], sub) {
			n++
			i += len(sub)
		} else {
			i++
		}
	}
	return n
}

// nthOcc is the start of the n-th (1-based) non-overlapping occurrence.
func nthOcc(s, sub []int32, n int) int {
	for i := 0; i+len(sub) <= len(s); {
		if slices.Equal(s[i:i+len(sub)], sub) {
			n--
			if n == 0 {
				return i
			}
			i += len(sub)
		} else {
			i++
		}
	}
	return -1
}

// turnText is the decoded turn for the caller's parsers: special tokens
// kept (tool-call markers may be special), the final stop token dropped.
func (e *tokenEpisode) turnText(ctx context.Context, s sample) (string, error) {
	ids := s.ids
	if s.text == nil {
		if s.stop == stopToken {
			ids = ids[:len(ids)-1]
		}
		if len(ids) == 0 {
			return "", nil
		}
		if t, ok := s.pieces.textOf(len(ids)); ok {
			return t, nil
		}
		return e.c.tok.Detokenize(ctx, e.tokOpts("t"+strconv.Itoa(e.turns+1)+"-text"), e.spec.Model, ids)
	}
	text := *s.text
	if s.stop == stopToken {
		eot, err := e.tokenText(ctx, ids[len(ids)-1])
		if err != nil {
			return "", err
		}
		text = strings.TrimSuffix(text, eot)
	}
	return text, nil
}

// tokenText decodes one id, cached per model (end-of-turn tokens are few).
func (e *tokenEpisode) tokenText(ctx context.Context, id int32) (string, error) {
	key := e.spec.Model + "\x00" + strconv.Itoa(int(id))
	return learnCached(ctx, e.c, e.c.eotText, "eot", key, func(ctx context.Context, key string) (string, error) {
		t, err := e.c.tok.Detokenize(ctx, e.tokOpts("eot"), e.spec.Model, []int32{id})
		if err != nil {
			return "", err
		}
		e.c.mu.Lock()
		if len(e.c.eotText) < 1024 {
			e.c.eotText[key] = t
		}
		e.c.mu.Unlock()
		return t, nil
	})
}

// learnCached returns m[key] when it is cached (m is guarded by c.mu),
// else runs fn once for every caller asking for the same key at the same
// time (learn); fn stores what it learned in m itself.
func learnCached[T any](ctx context.Context, c *Client, m map[string]T, kind, key string, fn func(context.Context, string) (T, error)) (T, error) {
	cached := func() (T, bool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		v, ok := m[key]
		return v, ok
	}
	if v, ok := cached(); ok {
		return v, nil
	}
	v, err := c.learn(ctx, kind+"\x00"+key, func(ctx context.Context) (any, error) {
		if v, ok := cached(); ok {
			return v, nil // learned between our miss and this flight
		}
		return fn(ctx, key)
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return v.(T), nil
}

// learn runs fn once for all the callers that ask for key at the same
// time (singleflight). A caller whose leader was cancelled while its own
// context is still live runs the lookup again rather than inherit the
// leader's cancellation; a caller whose context ends stops waiting.
func (c *Client) learn(ctx context.Context, key string, fn func(context.Context) (any, error)) (any, error) {
	for {
		led := false
		ch := c.learnOnce.DoChan(key, func() (any, error) {
			led = true // read after the receive below: ordered by the channel
			return fn(ctx)
		})
		select {
		case r := <-ch:
			if !led && r.Err != nil && ctx.Err() == nil && errors.Is(r.Err, context.Canceled) {
				continue // another caller's cancellation, not ours
			}
			return r.Val, r.Err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Finish returns the sequence and runs the drift check: the final
// conversation is rendered once and compared with what was trained on.
func (e *tokenEpisode) Finish(ctx context.Context, messages []openai.ChatCompletionMessage) (Sequence, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.finished = true
	out := Sequence{
		Tokens:     slices.Clone(e.seq.Tokens),
		Mask:       slices.Clone(e.seq.Mask),
		Logprobs:   slices.Clone(e.seq.Logprobs),
		Versions:   slices.Clone(e.seq.Versions),
		Cuts:       slices.Clone(e.seq.Cuts),
		TurnStarts: slices.Clone(e.seq.TurnStarts),
		PromptLen:  e.seq.PromptLen,
		Unscored:   e.seq.Unscored,
		Routing:    e.seq.Routing,
	}
	if e.turns == 0 {
		return out, nil
	}
	var scope []openai.ChatCompletionMessage
	var trained []int32
	genPrompt := false
	if len(messages) > e.consumed && e.consumed <= len(messages) && messages[e.consumed].Role == openai.ChatMessageRoleAssistant {
		// The conversation up to the last generated turn, closed by the
		// template: compare with the tokens plus the pending closing.
		scope = messages[:e.consumed+1]
		trained = append(slices.Clone(e.seq.Tokens), e.pending...)
	} else {
		// The caller did not record the last turn: compare up to its prompt.
		scope = messages[:min(e.consumed, len(messages))]
		trained = e.seq.Tokens[:e.seq.TurnStarts[len(e.seq.TurnStarts)-1]]
		genPrompt = true
	}
	if !genPrompt && e.prefill() {
		// The server would render the trailing assistant message as a
		// prefill: there is no closed render to compare with.
		out.DriftTokens = -1
		return out, nil
	}
	rendered, err := e.driftRender(ctx, scope, genPrompt)
	if err != nil {
		// The sequence is still exact; only the measurement failed.
		e.c.log.Warn("inference: drift check failed", "episode", e.spec.ID, "err", err)
		out.DriftTokens = -1
		if errors.Is(err, context.Canceled) {
			return out, err
		}
		return out, nil
	}
	out.DriftTokens = DiffTokens(trained, rendered)
	return out, nil
}

// rewritten returns the index of the first already-sent message that
// differs from what was sent, or -1.
func (e *tokenEpisode) rewritten(messages []openai.ChatCompletionMessage) int {
	for i, fp := range e.prints {
		if i >= len(messages) {
			return i
		}
		if fingerprint(messages[i]) != fp {
			return i
		}
	}
	return -1
}

func fingerprint(m openai.ChatCompletionMessage) uint64 {
	h := fnv.New64a()
	w := func(s string) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	w(m.Role)
	w(m.Content)
	w(m.Name)
	w(m.ToolCallID)
	w(m.ReasoningContent)
	for _, p := range m.MultiContent {
		w(string(p.Type))
		w(p.Text)
		if p.ImageURL != nil {
			w(p.ImageURL.URL)
		}
	}
	for _, tc := range m.ToolCalls {
		w(tc.ID)
		w(tc.Function.Name)
		w(tc.Function.Arguments)
	}
	return h.Sum64()
}

// CheckTemplate is the start check of tokens mode's template handling:
// it learns the chat template's assistant-turn closing and cuts the
// segment that follows an assistant turn calling a tool, as every rollout
// will, with the run's sampling (its chat_template_kwargs). A template
// tokens mode cannot work with fails here, once, with an error wrapping
// ErrTemplate, before any rollout; in chat mode there is nothing to check.
func (c *Client) CheckTemplate(ctx context.Context, s Sampling) error {
	if c.gen == nil {
		return nil
	}
	ep, err := c.Start(ctx, EpisodeSpec{ID: "template-check", Sampling: s})
	if err != nil {
		return err
	}
	e := ep.(*tokenEpisode)
	call := openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant, Content: baseUser, ToolCalls: []openai.ToolCall{{
		ID: "call00000", Type: openai.ToolTypeFunction, Function: openai.FunctionCall{Name: "probe", Arguments: "{}"}}}}
	result := []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleTool, Content: baseUser, ToolCallID: "call00000", Name: "probe"}}
	if _, err := e.segment(ctx, call, result, 0); err != nil {
		return fmt.Errorf("chat template check (model %s): %w", e.spec.Model, err)
	}
	if c.cfg.Backend != BackendLlamaCpp {
		return nil
	}
	// On llama.cpp the segment's cut is not checked against a base render
	// (a prefilling server cannot give one): check here, once, that a turn
	// calling a tool closes like the probe's plain turn — [user, turn,
	// user] ends with the closing and the user turn either way.
	e.c.mu.Lock()
	tail := e.c.closingTail[e.closingKey()]
	e.c.mu.Unlock()
	rc, err := llamaRender(ctx, e.c.tok, e.tokOpts("closing-call"), []openai.ChatCompletionMessage{
		{Role: openai.ChatMessageRoleUser, Content: baseUser}, call, {Role: openai.ChatMessageRoleUser, Content: baseUser}},
		nil, false, e.spec.Sampling.ChatTemplateKwargs)
	if err != nil {
		return fmt.Errorf("chat template check (model %s): %w", e.spec.Model, err)
	}
	if !hasSuffix(rc, tail) {
		return fmt.Errorf("chat template check (model %s): %w", e.spec.Model, &Error{Class: ErrRequest, Op: "template probe", RequestID: e.spec.ID, Err: ErrTemplate,
			Msg: "an assistant turn that calls a tool does not end with the closing of other assistant turns; this template is not supported in tokens mode"})
	}
	return nil
}
