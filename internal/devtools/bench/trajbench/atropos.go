package trajbench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/rollout-rl/rollout/trajectory"
)

// WritePythonAtropos writes recs as Atropos itself saves groups
// (data_path_to_save_groups: json.dumps of each ScoredDataGroup): the size
// baseline of `rollout bench output`, not an export format. The groups are
// the Atropos export's own (trajectory.AtroposGroups, messages included);
// only the layout is Python's, because that is what a trainer fed by
// Atropos stores and receives: ", " and ": " separators, every key of the
// pydantic model with null for what is absent, and logprobs as the float64
// repr of the float32 values vLLM returns. The keys this repository adds
// (env_id, distill_*) are not written: the bench's records have none.
func WritePythonAtropos(out io.Writer, recs []trajectory.Record) error {
	groups, _, err := trajectory.AtroposGroups(recs, trajectory.AtroposOptions{IncludeMessages: true})
	if err != nil {
		return fmt.Errorf("atropos groups: %w", err)
	}
	bw := bufio.NewWriterSize(out, 1<<20)
	for i := range groups {
		writePyGroup(bw, &groups[i])
	}
	return bw.Flush()
}

// writePyGroup writes one group as one line, keys in the pydantic model's
// order.
func writePyGroup(w *bufio.Writer, g *trajectory.ScoredDataGroup) {
	w.WriteString(`{"tokens": `)
	writePyList(w, g.Tokens, writePyInts)
	w.WriteString(`, "masks": `)
	writePyList(w, g.Masks, writePyInts)
	w.WriteString(`, "scores": `)
	writePyFloats(w, g.Scores)
	w.WriteString(`, "advantages": `)
	writePyList(w, g.Advantages, writePyFloats)
	w.WriteString(`, "ref_logprobs": null, "messages": `)
	writePyList(w, g.Messages, func(w *bufio.Writer, msgs []json.RawMessage) {
		writePyList(w, msgs, func(w *bufio.Writer, m json.RawMessage) { writePySpaced(w, m) })
	})
	w.WriteString(`, "generation_params": `)
	writePyDict(w, g.GenerationParams)
	w.WriteString(`, "inference_logprobs": `)
	writePyList(w, g.InferenceLogprobs, func(w *bufio.Writer, lps []float32) {
		writePyList(w, lps, func(w *bufio.Writer, lp float32) { w.WriteString(pyFloat(float64(lp))) })
	})
	w.WriteString(`, "group_overrides": `)
	writePyDict(w, g.GroupOverrides)
	w.WriteString(`, "overrides": `)
	writePyList(w, g.Overrides, writePyDict)
	w.WriteString(`, "images": null}` + "\n")
}

// writePyList writes xs as a Python list, or null when xs is nil (the
// export leaves absent optional fields nil).
func writePyList[T any](w *bufio.Writer, xs []T, each func(*bufio.Writer, T)) {
	if xs == nil {
		w.WriteString("null")
		return
	}
	w.WriteByte('[')
	for i, x := range xs {
		if i > 0 {
			w.WriteString(", ")
		}
		each(w, x)
	}
	w.WriteByte(']')
}

func writePyInts(w *bufio.Writer, xs []int32) {
	var buf [16]byte
	writePyList(w, xs, func(w *bufio.Writer, x int32) { w.Write(strconv.AppendInt(buf[:0], int64(x), 10)) })
}

func writePyFloats(w *bufio.Writer, xs []float64) {
	writePyList(w, xs, func(w *bufio.Writer, x float64) { w.WriteString(pyFloat(x)) })
}

// writePyDict writes m with sorted keys (Go maps keep no order), floats
// as Python's repr and anything else as its JSON; nil is null.
func writePyDict(w *bufio.Writer, m map[string]any) {
	if m == nil {
		w.WriteString("null")
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	w.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			w.WriteString(", ")
		}
		kb, _ := json.Marshal(k)
		w.Write(kb)
		w.WriteString(": ")
		switch v := m[k].(type) {
		case float64:
			w.WriteString(pyFloat(v))
		default:
			b, _ := json.Marshal(v)
			writePySpaced(w, b)
		}
	}
	w.WriteByte('}')
}

// writePySpaced writes the JSON text b with json.dumps' separators: ", "
// and ": " outside strings, other whitespace outside strings dropped.
func writePySpaced(w *bufio.Writer, b []byte) {
	inStr, esc := false, false
	for _, c := range b {
		switch {
		case inStr:
			w.WriteByte(c)
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
		case c == '"':
			inStr = true
			w.WriteByte(c)
		case c == ',' || c == ':':
			w.WriteByte(c)
			w.WriteByte(' ')
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
		default:
			w.WriteByte(c)
		}
	}
}

// pyFloat formats like Python's repr(float).
func pyFloat(x float64) string {
	s := strconv.FormatFloat(x, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eIN") {
		s += ".0"
	}
	return s
}
