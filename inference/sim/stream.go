package sim

import (
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"
)

// streamOptions is the stream_options object of the OpenAI-style routes.
type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// tokenStream describes one streaming response of a token route
// (completions, generate): how to build a choice chunk for the j-th token of
// a choice, how to wrap choices into an event, and the optional usage event.
type tokenStream struct {
	prompts [][]int
	params  genParams
	seed    uint64
	// choice builds the choice object for token j of choice (pi, ci); delta
	// is the newly complete text (UTF-8 held back at partial runes).
	choice func(pi, ci int, c genChoice, j int, delta string) map[string]any
	wrap   func(choices []any) map[string]any
	usage  func(prompt, gen int) map[string]any // nil: no usage event
	skip   bool                                 // skip_special_tokens for the text deltas
}

// serveTokenStream answers with server-sent events, one event per token
// position, then [DONE]. Faults behave as in chat streaming.
func (h *handler) serveTokenStream(w http.ResponseWriter, r *http.Request, ts tokenStream) {
	f := h.drawFault()
	if h.preFault(w, r, f) {
		return
	}
	var all [][]genChoice
	longest := 0
	for _, ids := range ts.prompts {
		cs, e := h.generate(ids, ts.params, 0)
		if e != nil {
			writeError(w, e)
			return
		}
		for _, c := range cs {
			longest = max(longest, len(c.IDs))
		}
		all = append(all, cs)
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	send := func(v any) {
		b, _ := marshal(v) // maps, slices and our own marshalers always encode
		_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	perTok := h.cfg.Latency.PerToken
	first := h.latency(longest, ts.seed) - time.Duration(longest)*perTok
	if !h.wait(r.Context(), first) {
		return
	}
	sent := make([][]int, len(all))
	for pi := range all {
		sent[pi] = make([]int, len(all[pi]))
	}
	for j := 0; j < longest; j++ {
		if j > 0 && !h.wait(r.Context(), perTok) {
			return
		}
		if f == faultTruncate && j == longest/2 {
			panic(http.ErrAbortHandler)
		}
		if f == faultMalformed && j == longest/2 {
			_, _ = fmt.Fprint(w, "data: {\"choices\": [{\"index\": 0, \"text\": \n\n")
		}
		var choices []any
		for pi, cs := range all {
			for ci, c := range cs {
				if j >= len(c.IDs) {
					continue
				}
				text, _ := h.tok.Decode(c.IDs[:j+1], ts.skip)
				end := len(text)
				if j < len(c.IDs)-1 {
					end = completeUTF8(text)
				}
				delta := ""
				if end > sent[pi][ci] {
					delta = text[sent[pi][ci]:end]
					sent[pi][ci] = end
				}
				choices = append(choices, ts.choice(pi, ci, c, j, delta))
			}
		}
		send(ts.wrap(choices))
	}
	promptN, genN := 0, 0
	for pi, cs := range all {
		promptN += len(ts.prompts[pi])
		for _, c := range cs {
			genN += len(c.IDs)
		}
		h.countFinished(len(ts.prompts[pi]), cs)
	}
	if ts.usage != nil {
		send(ts.usage(promptN, genN))
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

// completeUTF8 is the length of the longest prefix of s that does not end
// inside a multi-byte character.
func completeUTF8(s string) int {
	for i := len(s) - 1; i >= 0 && i >= len(s)-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			if utf8.FullRuneInString(s[i:]) {
				return len(s)
			}
			return i
		}
	}
	return len(s)
}
