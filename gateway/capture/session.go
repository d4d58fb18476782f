package capture

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/parsers"
)

// Session is one rollout's harness conversation(s): a graph of branches.
type Session struct {
	g    *Gateway
	id   string
	spec inference.EpisodeSpec
	// maxCalls is the session's call limit.
	maxCalls int

	mu       sync.Mutex
	closed   bool
	inflight sync.WaitGroup
	calls    []*callState
	branches []*branch
	replies  map[string]*reply // by Reply.ID
	toolIDs  map[string]*reply // by the tool-call ids the gateway issued
	// rewritten counts replies echoed with other text; unanchored holds
	// the fingerprints of assistant turns no reply matched.
	rewritten  int
	unanchored map[uint64]bool
	servers    []*http.Server
	// Idle expiry (Options.IdleTimeout): the last call's start or end,
	// the calls in flight, the timer (nil without expiry).
	last   time.Time
	active int
	timer  *time.Timer
	// expired: the session was closed by its idle expiry.
	expired bool
}

// reply is one answer the gateway gave, as it sits in its branch.
type reply struct {
	id     string
	branch *branch
	pos    int // index of the reply message in its branch's messages
	msg    openai.ChatCompletionMessage
	norm   string // normalised content, for anchoring by position
	echoed bool
	// counted: a rewritten echo of it was already counted.
	counted bool
}

// branch is one inference episode: a maximal extending sequence of calls.
type branch struct {
	ep       turnGenerator
	toolsKey string
	msgs     []openai.ChatCompletionMessage // as the episode saw them, last reply included
	anchors  []*reply                       // per message: the reply it is (nil: not a reply)
	calls    []int
	lens     []int // completion tokens per call
	busy     bool
	dead     bool // its first generation failed: no turns, not recorded
	split    int
	num      int // its position in Session.branches (engine request ids)
}

type callState struct {
	rec    gateway.CallRecord
	key    uint64
	branch *branch
	reply  *reply
}

// ID is the session's secret id: the {session} of its base URL.
func (s *Session) ID() string { return s.id }

func (s *Session) complete(ctx context.Context, call gateway.Call) (gateway.Reply, error) {
	start := time.Now()
	s.mu.Lock()
	s.last = start
	s.active++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.last = time.Now()
		s.active--
		s.mu.Unlock()
	}()
	if call.Previous != "" {
		msgs, err := s.withPrevious(call)
		if err != nil {
			s.rejected(call, start, err)
			return gateway.Reply{}, err
		}
		call.Messages, call.Previous = msgs, ""
	}
	model, ctxLen, schemas, toolsKey, err := s.check(ctx, call)
	if err != nil {
		s.rejected(call, start, err)
		return gateway.Reply{}, err
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return gateway.Reply{}, gateway.Errorf(gateway.ErrSession, "", "the session is closed")
	}
	if len(s.calls) >= s.maxCalls {
		s.mu.Unlock()
		return gateway.Reply{}, gateway.Errorf(gateway.ErrBadRequest, "", "the session made %d calls, its limit", len(s.calls))
	}
	idx := len(s.calls)
	cs := &callState{rec: gateway.CallRecord{Index: idx, API: call.API, Branch: -1, Requested: call.Requested,
		MaxTokens: call.MaxTokens, Stream: call.Stream, Started: start, ToolChoice: toolChoiceString(call.ToolChoice)}}
	s.calls = append(s.calls, cs)
	msgs, anchors := s.anchor(call.Messages)
	cs.key = requestKey(msgs, toolsKey)
	for _, c := range s.calls[:idx] {
		if c.key == cs.key && c.rec.Status == gateway.CallOK && c.reply != nil && !c.reply.echoed {
			c.rec.Status = gateway.CallResent
			c.rec.Reason = fmt.Sprintf("the harness sent the identical request again (call %d)", idx)
		}
	}
	b, genMsgs := s.extending(msgs, anchors, toolsKey)
	isNew := b == nil
	if isNew {
		b = &branch{toolsKey: toolsKey, split: idx, num: len(s.branches)}
		genMsgs = msgs
		s.branches = append(s.branches, b)
	}
	b.busy = true
	cs.branch = b
	s.inflight.Add(1)
	s.mu.Unlock()
	defer s.inflight.Done()

	turn, err := s.generate(ctx, b, isNew, call, genMsgs)
	var r *reply
	var out gateway.Reply
	var reason string
	if err == nil {
		out, reason = s.g.parse(turn, call, schemas, model, s.spec.Sampling)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	b.busy = false
	cs.rec.Duration = time.Since(start)
	if err != nil {
		if len(b.calls) == 0 {
			b.dead = true
		}
		cerr := classify(err)
		cs.rec.Status, cs.rec.Reason, cs.rec.Kind = gateway.CallError, err.Error(), gateway.KindName(cerr)
		return gateway.Reply{}, cerr
	}
	out.ID = s.g.prefix + "-" + strconv.FormatUint(s.g.seq.Add(1), 10)
	out.ToolCalls = s.issueIDs(out.ToolCalls)
	msg := openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant, Content: out.Content,
		ReasoningContent: out.Reasoning, ToolCalls: out.ToolCalls}
	r = &reply{id: out.ID, branch: b, pos: len(genMsgs), msg: msg, norm: normalise(msg)}
	s.replies[r.id] = r
	for _, tc := range out.ToolCalls {
		s.toolIDs[tc.ID] = r
	}
	b.msgs = append(slices.Clip(genMsgs), msg)
	b.anchors = append(padAnchors(b.anchors, anchors, len(genMsgs)), r)
	b.calls = append(b.calls, idx)
	b.lens = append(b.lens, turn.CompletionTokens)
	cs.reply = r
	cs.rec.Status, cs.rec.Reason = gateway.CallOK, reason
	cs.rec.ReplyID = out.ID
	cs.rec.PromptTokens, cs.rec.CompletionTokens = turn.PromptTokens, turn.CompletionTokens
	cs.rec.Granted = granted(call.MaxTokens, s.spec.Sampling.MaxTokens, ctxLen, turn.PromptTokens)
	return out, nil
}

// check validates a call before it reaches the engine: the model, the
// messages, the tools.
func (s *Session) check(ctx context.Context, call gateway.Call) (model string, ctxLen int, schemas []parsers.ToolSchema, toolsKey string, err error) {
	names, ctxLen, err := s.g.served(ctx)
	if err != nil {
		return "", 0, nil, "", err
	}
	model = call.Model
	if model == "" {
		model = names[0]
	}
	if !slices.Contains(names, model) {
		return "", 0, nil, "", gateway.Errorf(gateway.ErrUnknownModel, "model", "the model %q does not exist (served: %s)", call.Model, strings.Join(names, ", "))
	}
	if err := validate(call); err != nil {
		return "", 0, nil, "", err
	}
	toolsKey, schemas, err = s.g.tools.keys(call)
	return model, ctxLen, schemas, toolsKey, err
}

// withPrevious is call's whole history when it names a previous reply
// (a Responses previous_response_id): the conversation that reply ended
// — its branch's messages up to and including it, each reply of the
// gateway carrying its id as Ref so it anchors back to its sampled ids —
// followed by the call's new messages. As the Responses API does, the
// previous call's instructions are not carried over: a leading system
// message of the history is dropped (the call's own, if it sent one,
// leads instead).
func (s *Session) withPrevious(call gateway.Call) ([]gateway.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, gateway.Errorf(gateway.ErrSession, "", "the session is closed")
	}
	r, ok := s.replies[call.Previous]
	if !ok {
		return nil, gateway.Errorf(gateway.ErrBadRequest, "previous_response_id", "previous_response_id %q is not a response of this session", call.Previous)
	}
	b := r.branch
	if r.pos >= len(b.msgs) {
		return nil, gateway.Errorf(gateway.ErrBadRequest, "previous_response_id", "previous_response_id %q: its conversation is not held by the session", call.Previous)
	}
	hist := make([]gateway.Message, 0, r.pos+1+len(call.Messages))
	for i, m := range b.msgs[:r.pos+1] {
		if i == 0 && m.Role == openai.ChatMessageRoleSystem {
			continue
		}
		gm := gateway.Message{ChatCompletionMessage: m}
		if i < len(b.anchors) && b.anchors[i] != nil {
			gm.Ref = b.anchors[i].id
		}
		hist = append(hist, gm)
	}
	if len(call.Messages) > 0 && call.Messages[0].Role == openai.ChatMessageRoleSystem {
		hist = append([]gateway.Message{call.Messages[0]}, hist...)
		return append(hist, call.Messages[1:]...), nil
	}
	return append(hist, call.Messages...), nil
}

// rejected records a call refused before generation (within the
// session's call limit: a harness looping on a bad request is data too).
func (s *Session) rejected(call gateway.Call, start time.Time, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.calls) >= s.maxCalls {
		return
	}
	s.calls = append(s.calls, &callState{rec: gateway.CallRecord{Index: len(s.calls), API: call.API, Branch: -1,
		Status: gateway.CallError, Reason: err.Error(), Kind: gateway.KindName(err), Requested: call.Requested, MaxTokens: call.MaxTokens,
		Stream: call.Stream, Started: start, Duration: time.Since(start), ToolChoice: toolChoiceString(call.ToolChoice)}})
}

// generate starts the branch's episode when it is new and generates.
func (s *Session) generate(ctx context.Context, b *branch, isNew bool, call gateway.Call, msgs []openai.ChatCompletionMessage) (inference.Turn, error) {
	if isNew {
		spec := s.spec
		spec.ID = s.spec.ID + "-b" + strconv.Itoa(b.num)
		spec.Tools = call.Tools
		ep, err := s.g.policy.Start(ctx, spec)
		if err != nil {
			return inference.Turn{}, fmt.Errorf("start branch episode: %w", err)
		}
		tg, ok := ep.(turnGenerator)
		if !ok {
			return inference.Turn{}, gateway.Errorf(gateway.ErrUpstream, "", "the inference backend is not in tokens mode; the gateway cannot capture tokens")
		}
		b.ep = tg
	}
	return b.ep.GenerateWith(ctx, msgs, inference.TurnOptions{MaxTokens: call.MaxTokens, FitContext: true})
}

// padAnchors returns prev extended with the call's anchors up to n.
func padAnchors(prev, call []*reply, n int) []*reply {
	out := slices.Clone(prev)
	for i := len(out); i < n; i++ {
		if i < len(call) {
			out = append(out, call[i])
		} else {
			out = append(out, nil)
		}
	}
	return out
}

// granted is min(asked, cap, room) over the limits that are set.
func granted(asked, cap, ctxLen, prompt int) int {
	g := 0
	for _, v := range []int{asked, cap} {
		if v > 0 && (g == 0 || v < g) {
			g = v
		}
	}
	if ctxLen > 0 {
		if room := ctxLen - prompt; g == 0 || room < g {
			g = room
		}
	}
	return g
}

func validate(call gateway.Call) error {
	if len(call.Messages) == 0 {
		return gateway.Errorf(gateway.ErrBadRequest, "messages", "messages is empty")
	}
	for i, m := range call.Messages {
		switch m.Role {
		case openai.ChatMessageRoleSystem, openai.ChatMessageRoleUser, openai.ChatMessageRoleAssistant:
		case openai.ChatMessageRoleTool:
			if m.ToolCallID == "" {
				return gateway.Errorf(gateway.ErrBadRequest, fmt.Sprintf("messages[%d].tool_call_id", i), "a tool message needs the tool_call_id it answers")
			}
		default:
			return gateway.Errorf(gateway.ErrBadRequest, fmt.Sprintf("messages[%d].role", i), "unknown role %q (want system, user, assistant or tool)", m.Role)
		}
	}
	if call.MaxTokens < 0 {
		return gateway.Errorf(gateway.ErrBadRequest, "max_tokens", "max_tokens %d is negative", call.MaxTokens)
	}
	return nil
}

// toolCache holds the parsed form of the tool lists calls send, by the
// API and the bytes its front door decoded them from (Call.ToolsRaw): a
// harness sends the same tools on every call, and the sessions of one
// harness send the same ones. Entries are shared and never modified.
type toolCache struct {
	mu sync.Mutex
	m  map[string]map[string]toolEntry // by API, then by the raw bytes
	n  int                             // entries in m
}

type toolEntry struct {
	key     string
	schemas []parsers.ToolSchema
}

// toolCacheSize bounds the cache: past it, the cache starts over.
const toolCacheSize = 256

// keys is toolKeys, from the cache when the call's raw tools were seen
// (the lookup copies nothing: a harness's tools can be tens of kB).
func (c *toolCache) keys(call gateway.Call) (string, []parsers.ToolSchema, error) {
	if len(call.Tools) == 0 || len(call.ToolsRaw) == 0 {
		return toolKeys(call.Tools)
	}
	c.mu.Lock()
	e, ok := c.m[call.API][string(call.ToolsRaw)]
	c.mu.Unlock()
	if ok {
		return e.key, e.schemas, nil
	}
	key, schemas, err := toolKeys(call.Tools)
	if err != nil {
		return "", nil, err
	}
	c.mu.Lock()
	if c.m == nil || c.n >= toolCacheSize {
		c.m, c.n = map[string]map[string]toolEntry{}, 0
	}
	if c.m[call.API] == nil {
		c.m[call.API] = map[string]toolEntry{}
	}
	if _, dup := c.m[call.API][string(call.ToolsRaw)]; !dup {
		c.n++
	}
	c.m[call.API][string(call.ToolsRaw)] = toolEntry{key: key, schemas: schemas}
	c.mu.Unlock()
	return key, schemas, nil
}

func toolKeys(tools []openai.Tool) (string, []parsers.ToolSchema, error) {
	if len(tools) == 0 {
		return "", nil, nil
	}
	b, err := json.Marshal(tools)
	if err != nil {
		return "", nil, gateway.Errorf(gateway.ErrBadRequest, "tools", "tools: %v", err)
	}
	schemas, err := parsers.ToolsFromOpenAI(b)
	if err != nil {
		return "", nil, gateway.Errorf(gateway.ErrBadRequest, "tools", "tools: %v", err)
	}
	return string(b), schemas, nil
}

func toolChoiceString(tc *gateway.ToolChoice) string {
	switch {
	case tc == nil:
		return ""
	case tc.Mode == "function":
		return "function:" + tc.Name
	default:
		return tc.Mode
	}
}

// anchor returns the call's messages with each echoed assistant turn
// replaced by the reply that produced it, and per message the reply
// (nil: not an anchored reply).
func (s *Session) anchor(in []gateway.Message) ([]openai.ChatCompletionMessage, []*reply) {
	out := make([]openai.ChatCompletionMessage, len(in))
	anchors := make([]*reply, len(in))
	for i, m := range in {
		cm := m.ChatCompletionMessage
		out[i] = cm
		if cm.Role != openai.ChatMessageRoleAssistant {
			continue
		}
		r := s.findReply(i, m)
		if r == nil || slices.Contains(anchors, r) {
			s.unanchored[fingerprint(cm)] = true
			continue
		}
		if !sameReply(cm, r.msg) && !r.counted {
			r.counted = true
			s.rewritten++
		}
		r.echoed = true
		out[i], anchors[i] = r.msg, r
	}
	return out, anchors
}

// findReply matches an echoed assistant turn: by Ref, by the tool-call
// ids the gateway issued, then by position and normalised content.
func (s *Session) findReply(pos int, m gateway.Message) *reply {
	if r, ok := s.replies[m.Ref]; ok && m.Ref != "" {
		return r
	}
	for _, tc := range m.ToolCalls {
		if r, ok := s.toolIDs[tc.ID]; ok && tc.ID != "" {
			return r
		}
	}
	norm := normalise(m.ChatCompletionMessage)
	for i := len(s.calls) - 1; i >= 0; i-- {
		if r := s.calls[i].reply; r != nil && r.pos == pos && r.norm == norm {
			return r
		}
	}
	return nil
}

// extending returns the idle branch the call extends and the messages
// its episode gets (the branch's own copy of the shared history: the
// harness's whitespace never reaches the episode), or nil.
func (s *Session) extending(msgs []openai.ChatCompletionMessage, anchors []*reply, toolsKey string) (*branch, []openai.ChatCompletionMessage) {
	var best *branch
	var bestMsgs []openai.ChatCompletionMessage
	for _, b := range s.branches {
		if b.busy || b.dead || b.ep == nil || b.toolsKey != toolsKey || (best != nil && len(b.msgs) <= len(best.msgs)) {
			continue
		}
		if n := len(b.msgs); len(msgs) > n && prefixOf(b, n, msgs, anchors) {
			best, bestMsgs = b, append(slices.Clone(b.msgs), msgs[n:]...)
			continue
		}
		// A harness that drops a thinking-only turn: the history is the
		// branch's up to its last reply, which had no content and no call.
		n := len(b.msgs) - 1
		last := b.anchors[n]
		if last != nil && last.msg.Content == "" && len(last.msg.ToolCalls) == 0 && len(msgs) > n &&
			msgs[n].Role != openai.ChatMessageRoleAssistant && prefixOf(b, n, msgs, anchors) {
			if !last.counted {
				last.counted = true
				s.rewritten++
			}
			last.echoed = true
			best, bestMsgs = b, append(slices.Clone(b.msgs), msgs[n:]...)
		}
	}
	return best, bestMsgs
}

// prefixOf reports whether msgs begins with the branch's first n
// messages: the same replies where the branch has replies, the same
// trimmed text elsewhere.
func prefixOf(b *branch, n int, msgs []openai.ChatCompletionMessage, anchors []*reply) bool {
	for j := 0; j < n; j++ {
		if b.anchors[j] != nil {
			if anchors[j] != b.anchors[j] {
				return false
			}
			continue
		}
		if anchors[j] != nil || !sameTrimmed(b.msgs[j], msgs[j]) {
			return false
		}
	}
	return true
}

func sameTrimmed(a, b openai.ChatCompletionMessage) bool {
	if a.Role != b.Role || a.Name != b.Name || a.ToolCallID != b.ToolCallID ||
		strings.TrimSpace(a.Content) != strings.TrimSpace(b.Content) || len(a.ToolCalls) != len(b.ToolCalls) {
		return false
	}
	for i := range a.ToolCalls {
		if a.ToolCalls[i].ID != b.ToolCalls[i].ID || a.ToolCalls[i].Function.Name != b.ToolCalls[i].Function.Name ||
			!sameJSON(a.ToolCalls[i].Function.Arguments, b.ToolCalls[i].Function.Arguments) {
			return false
		}
	}
	return len(a.MultiContent) == 0 && len(b.MultiContent) == 0
}

// sameJSON compares two argument strings as JSON values (a harness
// re-serialises them compact and sorted), as text when not JSON.
func sameJSON(a, b string) bool {
	if a == b {
		return true
	}
	var va, vb any
	if json.Unmarshal([]byte(a), &va) != nil || json.Unmarshal([]byte(b), &vb) != nil {
		return false
	}
	ca, _ := json.Marshal(va)
	cb, _ := json.Marshal(vb)
	return string(ca) == string(cb)
}

func sameReply(a, b openai.ChatCompletionMessage) bool {
	if a.Content != b.Content || a.ReasoningContent != b.ReasoningContent || len(a.ToolCalls) != len(b.ToolCalls) {
		return false
	}
	for i := range a.ToolCalls {
		if a.ToolCalls[i].ID != b.ToolCalls[i].ID || a.ToolCalls[i].Function != b.ToolCalls[i].Function {
			return false
		}
	}
	return true
}

// normalise is what survives a harness's normalisation of an assistant
// turn: the content without think blocks, trimmed, and the called tools.
func normalise(m openai.ChatCompletionMessage) string {
	c := m.Content
	for {
		i := strings.Index(c, "<think>")
		if i < 0 {
			break
		}
		j := strings.Index(c[i:], "</think>")
		if j < 0 {
			c = c[:i]
			break
		}
		c = c[:i] + c[i+j+len("</think>"):]
	}
	var b strings.Builder
	b.WriteString(strings.TrimSpace(c))
	for _, tc := range m.ToolCalls {
		b.WriteString("\x00")
		b.WriteString(tc.Function.Name)
	}
	return b.String()
}

func fingerprint(m openai.ChatCompletionMessage) uint64 {
	h := fnv.New64a()
	for _, s := range []string{m.Role, strings.TrimSpace(m.Content), m.Name, m.ToolCallID} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	for _, tc := range m.ToolCalls {
		h.Write([]byte(tc.ID + "\x00" + tc.Function.Name + "\x00" + tc.Function.Arguments + "\x00"))
	}
	return h.Sum64()
}

// requestKey identifies a call's canonical request (anchored messages,
// trimmed, and its tools) for re-send detection.
func requestKey(msgs []openai.ChatCompletionMessage, toolsKey string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(toolsKey))
	for _, m := range msgs {
		var b [8]byte
		v := fingerprint(m)
		for i := range b {
			b[i] = byte(v >> (8 * i))
		}
		h.Write(b[:])
	}
	return h.Sum64()
}

// issueIDs gives each call an id unique in the session, in the parser
// family's shape.
func (s *Session) issueIDs(calls []openai.ToolCall) []openai.ToolCall {
	for i := range calls {
		for {
			id := parsers.NewCallIDFor(s.g.tp)
			if _, taken := s.toolIDs[id]; !taken {
				calls[i].ID = id
				break
			}
		}
	}
	return calls
}

// parse turns generated text into a reply: reasoning, content, calls.
// Malformed tool-call text is the model's: the reply carries it as
// content and reason says so.
func (g *Gateway) parse(t inference.Turn, call gateway.Call, schemas []parsers.ToolSchema, model string, sampling inference.Sampling) (gateway.Reply, string) {
	out := gateway.Reply{Model: model, PromptTokens: t.PromptTokens, CompletionTokens: t.CompletionTokens}
	content := t.Text
	if g.rp != nil {
		var r *string
		r, content = g.rp.Extract(t.Text, parsers.ReasoningOptions{ThinkingDisabled: thinkingDisabled(sampling)})
		if r != nil {
			out.Reasoning = *r
		}
	}
	reason := ""
	noTools := len(call.Tools) == 0 || (call.ToolChoice != nil && call.ToolChoice.Mode == "none")
	if !noTools {
		res := g.tp.Parse(content, schemas)
		if len(res.Errors) > 0 {
			reason = "malformed tool call: " + res.Errors[0].Error()
		} else {
			content = ""
			if res.Content != nil {
				content = *res.Content
			}
			for _, c := range res.ToolCalls {
				out.ToolCalls = append(out.ToolCalls, openai.ToolCall{Type: openai.ToolTypeFunction,
					Function: openai.FunctionCall{Name: c.Name, Arguments: c.Arguments}})
			}
		}
	}
	out.Content = content
	switch {
	case t.FinishReason == gateway.FinishLength:
		out.FinishReason = gateway.FinishLength
	case len(out.ToolCalls) > 0:
		out.FinishReason = gateway.FinishToolCalls
	default:
		out.FinishReason = gateway.FinishStop
	}
	return out, reason
}

func thinkingDisabled(s inference.Sampling) bool {
	v, ok := s.ChatTemplateKwargs["enable_thinking"].(bool)
	return ok && !v
}

// Expired reports whether the session's idle expiry closed it.
func (s *Session) Expired() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expired
}

// expire runs on the idle timer: it closes the session when it has been
// idle for Options.IdleTimeout with no call in flight, else re-arms.
func (s *Session) expire() {
	d := s.g.opts.IdleTimeout
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if idle := time.Since(s.last); s.active > 0 || idle < d {
		wait := d
		if s.active == 0 {
			wait = d - idle
		}
		s.timer.Reset(wait)
		s.mu.Unlock()
		return
	}
	s.expired = true
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, err := s.close(ctx, true)
	if errors.Is(gateway.KindOf(err), gateway.ErrSession) {
		return // closed by its owner meanwhile
	}
	s.g.log.Info("gateway session expired", "rollout", s.spec.ID, "idle", d.String(), "calls", len(rec.Calls))
	if s.g.opts.OnExpire != nil {
		s.g.opts.OnExpire(s, rec, err)
	}
}

// Close ends the session: new calls get ErrSession, calls in flight are
// waited for, every branch's episode is finished and the record returned.
func (s *Session) Close(ctx context.Context) (gateway.SessionRecord, error) {
	return s.close(ctx, false)
}

func (s *Session) close(ctx context.Context, expiring bool) (gateway.SessionRecord, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		if s.expired && !expiring {
			return gateway.SessionRecord{}, gateway.Errorf(gateway.ErrSession, "", "the session expired (idle for %s)", s.g.opts.IdleTimeout)
		}
		return gateway.SessionRecord{}, gateway.Errorf(gateway.ErrSession, "", "the session is already closed")
	}
	if !expiring {
		s.expired = false
	}
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	servers := s.servers
	s.servers = nil
	s.mu.Unlock()
	s.g.mu.Lock()
	delete(s.g.sessions, s.id)
	s.g.mu.Unlock()
	for _, srv := range servers {
		_ = srv.Close()
	}
	done := make(chan struct{})
	go func() { s.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return gateway.SessionRecord{}, fmt.Errorf("close session: waiting for calls in flight: %w", ctx.Err())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.record(ctx)
}

// record finishes the branches and builds the session's record.
func (s *Session) record(ctx context.Context) (gateway.SessionRecord, error) {
	rec := gateway.SessionRecord{ID: s.id, Rewritten: s.rewritten, Unanchored: len(s.unanchored)}
	index := map[*branch]int{}
	var errs []error
	for _, b := range s.branches {
		if b.dead || b.ep == nil || len(b.calls) == 0 {
			continue
		}
		seq, err := b.ep.Finish(ctx, b.msgs)
		if err != nil {
			errs = append(errs, fmt.Errorf("finish branch %d: %w", len(rec.Branches), err))
		}
		for k, ci := range b.calls {
			c := s.calls[ci]
			last := k == len(b.calls)-1
			if c.rec.Status == gateway.CallOK && !c.reply.echoed && !last {
				c.rec.Status, c.rec.Reason = gateway.CallDiscarded, "no later call echoed the reply"
			}
			if c.rec.Status != gateway.CallOK && k < len(seq.TurnStarts) {
				// Kept out of training: in context, not trained.
				st := seq.TurnStarts[k]
				for i := st; i < st+b.lens[k] && i < len(seq.Mask); i++ {
					seq.Mask[i] = 0
				}
			}
		}
		index[b] = len(rec.Branches)
		rec.Branches = append(rec.Branches, gateway.Branch{Index: len(rec.Branches), Parent: -1, SplitCall: b.split,
			Calls: slices.Clone(b.calls), Messages: slices.Clone(b.msgs), Sequence: seq})
	}
	for k := range rec.Branches {
		bk := &rec.Branches[k]
		for j := 0; j < k; j++ {
			n := commonPrefix(bk.Sequence.Tokens, rec.Branches[j].Sequence.Tokens)
			n = min(n, bk.Sequence.PromptLen)
			if n > bk.Shared {
				bk.Parent, bk.Shared = j, n
			}
		}
	}
	for _, c := range s.calls {
		r := c.rec
		if i, ok := index[c.branch]; ok && r.Status != gateway.CallError {
			r.Branch = i
		}
		rec.Calls = append(rec.Calls, r)
	}
	return rec, errors.Join(errs...)
}

func commonPrefix(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
