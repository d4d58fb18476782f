// Package parsers turns raw model text into tool calls and separates
// reasoning from content, for every tool-call format vLLM knows.
//
// It owns the tool-call parser registry (names are vLLM's
// --tool-call-parser values) and the reasoning parser registry (vLLM's
// --reasoning-parser values). It depends on nothing but the standard
// library and the project's own registry table (internal/util/registry):
// tool schemas arrive as JSON.
package parsers

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/rollout-rl/rollout/internal/util/registry"
)

// ToolSchema is one tool the model may call, as in an OpenAI `tools` array
// entry's "function" object. Parameters is the raw JSON schema of the
// arguments; parsers use it to type values in string-encoded formats.
type ToolSchema struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// ToolCall is one well-formed call. Arguments is always a compact JSON
// object string.
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	// Raw is the exact substring of the model output the call was parsed
	// from, kept so that traces can be replayed byte for byte.
	Raw string `json:"-"`
	// Repairs names what the parser fixed to accept the call (nil when
	// it was well-formed as written): e.g. arguments given as a JSON
	// string and decoded, or a close marker the output lacked. The call's
	// parse status is "repaired" when any is set (Status).
	Repairs []string `json:"-"`
}

// Parse statuses of one call (Status).
const (
	StatusOK        = "ok"
	StatusRepaired  = "repaired"
	StatusMalformed = "malformed"
)

// CallStatus is one call's parse outcome, in output order.
type CallStatus struct {
	Index  int    `json:"index"`
	Name   string `json:"name,omitempty"`
	Status string `json:"status"` // StatusOK, StatusRepaired or StatusMalformed
	// Reason is the repairs ("; "-joined) or the CallError's reason.
	Reason string `json:"reason,omitempty"`
}

// Outcome is the parse status of one call, the rule every caller uses:
// malformed (with the CallError's reason) when err is set, else repaired
// (the repairs "; "-joined) when the parser fixed something, else ok.
func Outcome(repairs []string, err *CallError) (status, reason string) {
	switch {
	case err != nil:
		return StatusMalformed, err.Reason
	case len(repairs) > 0:
		return StatusRepaired, strings.Join(repairs, "; ")
	}
	return StatusOK, ""
}

// Statuses lists the parse outcome of every call of r, in the order the
// calls appear in the output (calls and errors share one index sequence).
func Statuses(r Result) []CallStatus {
	n := len(r.ToolCalls) + len(r.Errors)
	if n == 0 {
		return nil
	}
	out := make([]CallStatus, 0, n)
	ci, ei := 0, 0
	for i := range n {
		if ei < len(r.Errors) && r.Errors[ei].Index == i {
			e := &r.Errors[ei]
			st := CallStatus{Index: i, Name: e.Name}
			st.Status, st.Reason = Outcome(nil, e)
			out = append(out, st)
			ei++
			continue
		}
		if ci >= len(r.ToolCalls) {
			// Error indices out of order: list the rest as they come.
			e := &r.Errors[ei]
			st := CallStatus{Index: e.Index, Name: e.Name}
			st.Status, st.Reason = Outcome(nil, e)
			out = append(out, st)
			ei++
			continue
		}
		tc := r.ToolCalls[ci]
		ci++
		st := CallStatus{Index: i, Name: tc.Name}
		st.Status, st.Reason = Outcome(tc.Repairs, nil)
		out = append(out, st)
	}
	return out
}

// CallError describes a call that was recognised but could not be turned
// into a well-formed ToolCall. The agent loop reports it to the model.
type CallError struct {
	Index   int    `json:"index"`          // position among the calls of this output (0-based)
	Name    string `json:"name,omitempty"` // function name when it could be read
	Reason  string `json:"reason"`
	Snippet string `json:"snippet"` // raw text of the malformed call (possibly shortened)
	// Raw is the exact substring of the model output the call was read
	// from (never shortened), like ToolCall.Raw: it locates the call's
	// token span.
	Raw string `json:"-"`
}

func (e CallError) Error() string {
	if e.Name != "" {
		return fmt.Sprintf("tool call %d (%s): %s", e.Index, e.Name, e.Reason)
	}
	return fmt.Sprintf("tool call %d: %s", e.Index, e.Reason)
}

// Result is what a tool parser makes of one model output.
type Result struct {
	// Content is the text outside the calls, per the family's rule; nil
	// when empty.
	Content   *string
	ToolCalls []ToolCall
	Errors    []CallError
}

// Parser is a tool-call parser for one family. Implementations are safe for
// concurrent use.
type Parser interface {
	Parse(text string, tools []ToolSchema) Result
}

// ReasoningParser separates reasoning from content. Reasoning is nil when the
// output has none.
type ReasoningParser interface {
	Extract(text string, opts ReasoningOptions) (reasoning *string, content string)
}

// ReasoningOptions carries request settings that change how reasoning is
// delimited (e.g. Qwen3 with enable_thinking=false emits no <think> block).
type ReasoningOptions struct {
	// ThinkingDisabled reports chat_template_kwargs.enable_thinking=false.
	ThinkingDisabled bool
}

var (
	toolReg   = registry.New[Parser]("tool-call parser")
	reasonReg = registry.New[ReasoningParser]("reasoning parser")
)

// Register adds a tool-call parser under name. It panics on a duplicate
// name: registration happens at init time and a clash is a programming error.
func Register(name string, p Parser) { toolReg.Register(name, p) }

// RegisterReasoning adds a reasoning parser under name.
func RegisterReasoning(name string, p ReasoningParser) { reasonReg.Register(name, p) }

// Get returns the tool-call parser registered under name, or an error that
// lists the known names.
func Get(name string) (Parser, error) {
	p, ok := toolReg.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown tool-call parser %q; known parsers: %s", name, strings.Join(Names(), ", "))
	}
	return p, nil
}

// GetReasoning returns the reasoning parser registered under name, or an
// error that lists the known names.
func GetReasoning(name string) (ReasoningParser, error) {
	p, ok := reasonReg.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown reasoning parser %q; known parsers: %s", name, strings.Join(ReasoningNames(), ", "))
	}
	return p, nil
}

// Names lists the registered tool-call parsers, sorted.
func Names() []string { return toolReg.Names() }

// ReasoningNames lists the registered reasoning parsers, sorted.
func ReasoningNames() []string { return reasonReg.Names() }
