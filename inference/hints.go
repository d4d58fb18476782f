package inference

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"unicode/utf8"

	openai "github.com/sashabaranov/go-openai"
	"golang.org/x/sync/errgroup"

	"github.com/rollout-rl/rollout/internal/util/secrets"
)

// HintConfig turns on the hint-enhanced teacher context of Hermes'
// agentic on-policy distillation (docs/distillation.md, "Hints"): a judge
// reads what followed each assistant turn (tool output, a user's reply),
// votes whether it shows what the turn should have done, and writes a
// hint; the teacher then scores that turn's sampled ids with the hint
// appended to the last user message before it.
type HintConfig struct {
	// Endpoint, Model and APIKeyEnv name the judge's OpenAI-compatible chat
	// route; empty Endpoint and Model default to the teacher's (and then
	// its key).
	Endpoint  string `yaml:"endpoint,omitempty" json:"endpoint,omitempty"`
	Model     string `yaml:"model,omitempty" json:"model,omitempty"`
	APIKeyEnv string `yaml:"api_key_env,omitempty" json:"api_key_env,omitempty"`
	// Votes are judge calls per turn (default 3, Hermes' prm_votes).
	Votes int `yaml:"votes,omitempty" json:"votes,omitempty"`
	// Temperature of the judge's sampling (default 0.7) and its
	// max_tokens (default 500).
	Temperature *float64 `yaml:"temperature,omitempty" json:"temperature,omitempty"`
	MaxTokens   int      `yaml:"max_tokens,omitempty" json:"max_tokens,omitempty"`
	// MaxNextStateChars caps the next state shown to the judge (default
	// 4000); the head is kept.
	MaxNextStateChars int `yaml:"max_next_state_chars,omitempty" json:"max_next_state_chars,omitempty"`
	// Concurrency bounds the turns of one rollout judged and rescored at
	// once (default 8); a turn's votes are asked for together.
	Concurrency int `yaml:"concurrency,omitempty" json:"concurrency,omitempty"`
}

// minHintChars: a hint must be longer than 10 characters (Hermes).
const minHintChars = 11

// hintHeader introduces the hint in the user message (Hermes' wording).
const hintHeader = "\n\n[user's hint / instruction]\n"

// hintJudgePrompt is the judge's one user message. Its first line is
// fixed so that a scripted simulator can recognise it.
const hintJudgePrompt = `You are reviewing one step of an AI agent's work, after the fact.

The task the agent was given:
%s

The agent's response at this step:
%s

What came back after that response (tool output or the user's reply):
%s

Does what came back show that this response was wrong or could have been better, in a way a short instruction given before the step would have fixed (a failing command or test, an error message, a correction by the user, a missed requirement)?
If it does, write that instruction as a hint addressed to the agent: what to do, not a copy of the output. Put it between [HINT_START] and [HINT_END].
End your reply with \boxed{1} if what came back gives such a hint, or \boxed{-1} if it does not.`

// hintTaskChars caps the task text shown to the judge.
const hintTaskChars = 4000

// hintSetup is the judge route and the teacher's /tokenize, resolved by
// NewTeacher when hints are on.
type hintSetup struct {
	cfg      HintConfig
	judge    route
	model    string
	tokenize route
}

// newHintSetup resolves tc.Hints; base is the teacher's normalised URL.
func newHintSetup(tc TeacherConfig, base, teacherKey string) (*hintSetup, error) {
	h := *tc.Hints
	switch {
	case h.Votes == 0:
		h.Votes = 3
	case h.Votes < 0:
		return nil, fmt.Errorf("distill: hints.votes %d must be positive", h.Votes)
	}
	if h.Temperature == nil {
		t := 0.7
		h.Temperature = &t
	}
	if *h.Temperature < 0 {
		return nil, fmt.Errorf("distill: hints.temperature %v must not be negative", *h.Temperature)
	}
	if h.MaxTokens == 0 {
		h.MaxTokens = 500
	}
	if h.MaxNextStateChars == 0 {
		h.MaxNextStateChars = 4000
	}
	if h.Concurrency == 0 {
		h.Concurrency = 8
	}
	if h.MaxTokens < 0 || h.MaxNextStateChars < 0 || h.Concurrency < 0 {
		return nil, errors.New("distill: hints.max_tokens, max_next_state_chars and concurrency must be positive")
	}
	s := &hintSetup{cfg: h, model: h.Model}
	endpoint, judgeBase, key := tc.Endpoint, base, teacherKey
	if h.Endpoint != "" {
		var err error
		if judgeBase, err = normalizeBase(h.Endpoint); err != nil {
			return nil, fmt.Errorf("distill: hints: %w", err)
		}
		endpoint = h.Endpoint
	}
	if s.model == "" {
		s.model = tc.Model
	}
	if h.APIKeyEnv != "" {
		var err error
		if key, err = secrets.Lookup(h.APIKeyEnv); err != nil {
			return nil, fmt.Errorf("distill: hints.api_key_env: %w", err)
		}
	} else if h.Endpoint != "" && h.Endpoint != tc.Endpoint {
		key = "" // the teacher's key is not sent to another server
	}
	s.judge = route{endpoint: endpoint, url: judgeBase + "/v1/chat/completions", op: "POST /v1/chat/completions", apiKey: key}
	s.tokenize = route{endpoint: tc.Endpoint, url: base + "/tokenize", op: "POST /tokenize", apiKey: teacherKey}
	return s, nil
}

// Hints reports whether the teacher rescored turns under hints.
func (t *Teacher) Hints() bool { return t.hints != nil }

// HintInput is one finished rollout, as HintTurns reads it.
type HintInput struct {
	// Messages is the whole conversation; First is the index of its first
	// generated message (the task's own messages, few-shot assistant turns
	// included, come before it).
	Messages []openai.ChatCompletionMessage
	First    int
	Tools    []openai.Tool
	// ChatTemplateKwargs are the student's (e.g. enable_thinking), so the
	// teacher renders the same generation prompt.
	ChatTemplateKwargs map[string]any
	Sequence           Sequence
}

// HintedTurn is a turn the teacher scored under a hint.
type HintedTurn struct {
	Turn    int    // 0-based generation (index into Sequence.TurnStarts)
	Message int    // index of the turn's assistant message in Messages
	Hint    string // the hint appended to the last user message before it
	// Positive of Votes judge votes said the next state holds a hint.
	Positive, Votes int
	// Start is the turn's first position in Sequence.Tokens; IDs and
	// Logprobs are the teacher's top-K from there on, one per sampled id
	// (nil where the student's mask is 0).
	Start    int
	IDs      [][]int32
	Logprobs [][]float32
}

// HintStats counts what the judge said over one rollout.
type HintStats struct {
	Judged     int // turns shown to the judge
	Unreadable int // votes without a \boxed{1} or \boxed{-1}
}

// hintTurn is one judged turn: its assistant message and sampled span.
type hintTurn struct {
	turn, msg  int
	start, end int // sampled ids: Tokens[start:end]
	next       []openai.ChatCompletionMessage
}

// HintTurns asks the judge about every assistant turn that something
// followed and has the teacher score each turn with a hint under the
// hint-enhanced context: the conversation before the turn, with the hint
// appended to its last user message, rendered by the teacher's chat
// template, followed by the turn's exact sampled ids. A judge reply without
// a verdict is a vote for nothing (model output, not a failure); a judge
// or teacher that cannot be reached or refuses is an error.
func (t *Teacher) HintTurns(ctx context.Context, in HintInput) ([]HintedTurn, HintStats, error) {
	var st HintStats
	h := t.hints
	if h == nil {
		return nil, st, nil
	}
	turns, err := hintTurns(in)
	if err != nil {
		return nil, st, err
	}
	tools, err := EncodeTools(in.Tools)
	if err != nil {
		return nil, st, err
	}
	task := taskText(in.Messages)
	out := make([]*HintedTurn, len(turns))
	unreadable := make([]int, len(turns))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(h.cfg.Concurrency)
	for i, ht := range turns {
		g.Go(func() (err error) {
			defer recoverInto(&err, "hints, turn %d", ht.turn+1)
			prompt := fmt.Sprintf(hintJudgePrompt, task, responseText(in.Messages[ht.msg]), nextStateText(ht.next, h.cfg.MaxNextStateChars))
			verdicts := make([]hintVote, h.cfg.Votes)
			vg, vctx := errgroup.WithContext(gctx)
			for v := range verdicts {
				vg.Go(func() (err error) {
					defer recoverInto(&err, "hint judge, turn %d", ht.turn+1)
					text, err := t.judge(vctx, prompt)
					if err != nil {
						return err
					}
					verdicts[v] = parseHintVote(text)
					return nil
				})
			}
			if err := vg.Wait(); err != nil {
				return fmt.Errorf("hint judge, turn %d: %w", ht.turn+1, err)
			}
			hint, positive := chooseHint(verdicts)
			m := getMetrics()
			for _, v := range verdicts {
				switch {
				case !v.readable:
					unreadable[i]++
					m.hintVotes.WithLabelValues("unreadable").Inc()
				case v.positive:
					m.hintVotes.WithLabelValues("positive").Inc()
				default:
					m.hintVotes.WithLabelValues("negative").Inc()
				}
			}
			if hint == "" {
				return nil
			}
			ids, lps, err := t.scoreHinted(gctx, in, tools, ht, hint)
			if err != nil {
				return fmt.Errorf("hinted teacher context, turn %d: %w", ht.turn+1, err)
			}
			m.hinted.Inc()
			out[i] = &HintedTurn{Turn: ht.turn, Message: ht.msg, Hint: hint, Positive: positive, Votes: len(verdicts), Start: ht.start, IDs: ids, Logprobs: lps}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, st, err
	}
	st.Judged = len(turns)
	var res []HintedTurn
	for i, o := range out {
		st.Unreadable += unreadable[i]
		if o != nil {
			res = append(res, *o)
		}
	}
	return res, st, nil
}

// hintTurns pairs the generated assistant messages with the sequence's
// generations and keeps those followed by a next state, with a user
// message before them to carry a hint and something trained in them.
func hintTurns(in HintInput) ([]hintTurn, error) {
	seq := in.Sequence
	if len(seq.Tokens) != len(seq.Mask) {
		return nil, fmt.Errorf("hints: %d tokens but %d mask entries", len(seq.Tokens), len(seq.Mask))
	}
	if in.First < 0 || in.First > len(in.Messages) {
		return nil, fmt.Errorf("hints: first generated message %d outside %d messages", in.First, len(in.Messages))
	}
	var asst []int
	for i := in.First; i < len(in.Messages); i++ {
		if in.Messages[i].Role == openai.ChatMessageRoleAssistant {
			asst = append(asst, i)
		}
	}
	firstUser := slices.IndexFunc(in.Messages, func(x openai.ChatCompletionMessage) bool { return x.Role == openai.ChatMessageRoleUser })
	if len(asst) != len(seq.TurnStarts) {
		return nil, fmt.Errorf("hints: %d generated assistant messages but %d generations in the token sequence; turns cannot be located", len(asst), len(seq.TurnStarts))
	}
	var out []hintTurn
	for k, m := range asst {
		stop := len(in.Messages)
		if k+1 < len(asst) {
			stop = asst[k+1]
		}
		if m+1 == stop {
			continue // nothing came back: the final answer
		}
		if firstUser < 0 || firstUser > m {
			continue // no user message to carry a hint
		}
		start, bound := seq.TurnStarts[k], len(seq.Tokens)
		if k+1 < len(seq.TurnStarts) {
			bound = seq.TurnStarts[k+1]
		}
		if start < 0 || start > bound || bound > len(seq.Mask) {
			return nil, fmt.Errorf("hints: generation %d spans [%d, %d) outside the %d-token sequence", k+1, start, bound, len(seq.Mask))
		}
		end := start
		for p := start; p < bound; p++ {
			if seq.Mask[p] == 1 {
				end = p + 1
			}
		}
		if end == start {
			continue // nothing trained in this turn
		}
		out = append(out, hintTurn{turn: k, msg: m, start: start, end: end, next: in.Messages[m+1 : stop]})
	}
	return out, nil
}

// judge asks the judge once and returns its reply's text.
func (t *Teacher) judge(ctx context.Context, prompt string) (string, error) {
	h := t.hints
	body, err := json.Marshal(map[string]any{
		"model":       h.model,
		"messages":    []map[string]string{{"role": "user", "content": prompt}},
		"temperature": *h.cfg.Temperature,
		"max_tokens":  h.cfg.MaxTokens,
	})
	if err != nil {
		return "", err
	}
	var resp struct {
		Choices []struct {
			Message struct {
				Content          string `json:"content"`
				ReasoningContent string `json:"reasoning_content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := t.post(ctx, h.judge, body, &resp); err != nil {
		return "", err
	}
	if len(resp.Choices) == 0 {
		return "", &Error{Class: ErrInfra, Endpoint: h.judge.endpoint, Op: h.judge.op, Msg: "hint judge: no choices in the answer"}
	}
	return resp.Choices[0].Message.Content, nil
}

// scoreHinted renders the hint-enhanced context with the teacher's
// template and scores the turn's sampled ids after it.
func (t *Teacher) scoreHinted(ctx context.Context, in HintInput, tools EncodedTools, ht hintTurn, hint string) ([][]int32, [][]float32, error) {
	msgs, ok := withHint(in.Messages[:ht.msg], hint)
	if !ok { // hintTurns keeps only turns with a user message before them
		return nil, nil, errors.New("no user message before the turn to carry the hint")
	}
	gp := true
	body, err := encodeBody(&TokenizeRequest{Model: t.cfg.Model, Messages: msgs, ToolsJSON: tools, AddGenerationPrompt: &gp, ChatTemplateKwargs: in.ChatTemplateKwargs}, nil, t.hints.tokenize.op, "")
	if err != nil {
		return nil, nil, err
	}
	var rendered TokenizeResponse
	if err := t.post(ctx, t.hints.tokenize, body, &rendered); err != nil {
		return nil, nil, err
	}
	if len(rendered.Tokens) == 0 {
		return nil, nil, &Error{Class: ErrInfra, Endpoint: t.hints.tokenize.endpoint, Op: t.hints.tokenize.op, Msg: "distill: the teacher rendered the hinted context to no tokens"}
	}
	p0 := len(rendered.Tokens)
	seq := in.Sequence
	ids := append(slices.Clip([]int32(rendered.Tokens)), seq.Tokens[ht.start:ht.end]...)
	top, lps, err := t.Score(ctx, ids, func(p int) bool { return p >= p0 && seq.Mask[ht.start+p-p0] == 1 })
	if err != nil {
		return nil, nil, err
	}
	return top[p0:], lps[p0:], nil
}

// withHint copies msgs with hint appended to the last user message; false
// when there is none.
func withHint(msgs []openai.ChatCompletionMessage, hint string) ([]openai.ChatCompletionMessage, bool) {
	out := slices.Clone(msgs)
	for i := len(out) - 1; i >= 0; i-- {
		if out[i].Role != openai.ChatMessageRoleUser {
			continue
		}
		if len(out[i].MultiContent) > 0 {
			parts := slices.Clone(out[i].MultiContent)
			parts = append(parts, openai.ChatMessagePart{Type: openai.ChatMessagePartTypeText, Text: hintHeader + hint})
			out[i].MultiContent = parts
		} else {
			out[i].Content += hintHeader + hint
		}
		return out, true
	}
	return nil, false
}

// hintVote is one judge reply, read.
type hintVote struct {
	readable bool // it ended in \boxed{1} or \boxed{-1}
	positive bool
	hint     string
}

var (
	boxedRE = regexp.MustCompile(`\\boxed\{\s*([+-]?1)\s*\}`)
	hintRE  = regexp.MustCompile(`(?s)\[HINT_START\](.*?)\[HINT_END\]`)
)

// parseHintVote reads the last \boxed verdict and the last complete hint.
func parseHintVote(text string) hintVote {
	var v hintVote
	if m := boxedRE.FindAllStringSubmatch(text, -1); len(m) > 0 {
		v.readable = true
		v.positive = m[len(m)-1][1] != "-1"
	}
	if m := hintRE.FindAllStringSubmatch(text, -1); len(m) > 0 {
		v.hint = strings.TrimSpace(m[len(m)-1][1])
	}
	return v
}

// chooseHint picks the longest hint of a positive vote that is longer than
// 10 characters (Hermes), and counts the positive votes.
func chooseHint(votes []hintVote) (string, int) {
	best, positive := "", 0
	for _, v := range votes {
		if !v.positive {
			continue
		}
		positive++
		if utf8.RuneCountInString(v.hint) >= minHintChars && len(v.hint) > len(best) {
			best = v.hint
		}
	}
	return best, positive
}

// taskText is the first user message's text (what the judge is told the
// task was), cut to hintTaskChars.
func taskText(msgs []openai.ChatCompletionMessage) string {
	for _, m := range msgs {
		if m.Role == openai.ChatMessageRoleUser {
			return headChars(messageText(m), hintTaskChars)
		}
	}
	return "(none given)"
}

// responseText is an assistant message as the judge reads it: its text
// and its tool calls.
func responseText(m openai.ChatCompletionMessage) string {
	var b strings.Builder
	b.WriteString(messageText(m))
	for _, c := range m.ToolCalls {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "[tool call] %s(%s)", c.Function.Name, c.Function.Arguments)
	}
	if b.Len() == 0 {
		return "(empty)"
	}
	return b.String()
}

// nextStateText is the messages that followed a turn, labelled by role
// (and tool name), cut to limit characters.
func nextStateText(next []openai.ChatCompletionMessage, limit int) string {
	var b strings.Builder
	for i, m := range next {
		if i > 0 {
			b.WriteString("\n\n")
		}
		label := m.Role
		if m.Role == openai.ChatMessageRoleTool && m.Name != "" {
			label += ": " + m.Name
		}
		fmt.Fprintf(&b, "[%s]\n%s", label, messageText(m))
	}
	return headChars(b.String(), limit)
}

func messageText(m openai.ChatCompletionMessage) string {
	if len(m.MultiContent) == 0 {
		return m.Content
	}
	var parts []string
	for _, p := range m.MultiContent {
		if p.Type == openai.ChatMessagePartTypeText {
			parts = append(parts, p.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// headChars keeps the first limit characters of s, marking a cut.
func headChars(s string, limit int) string {
	if utf8.RuneCountInString(s) <= limit {
		return s
	}
	r := []rune(s)
	return string(r[:limit]) + "\n… [truncated]"
}

// recoverInto turns a panic of a hint goroutine into its error: the
// runner recovers its own goroutine's panics into failure records, not
// those of goroutines started here.
func recoverInto(err *error, format string, args ...any) {
	if p := recover(); p != nil {
		*err = fmt.Errorf("%s: panic: %v\n%s", fmt.Sprintf(format, args...), p, debug.Stack())
	}
}
