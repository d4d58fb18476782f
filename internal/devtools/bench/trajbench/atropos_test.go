package trajbench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/rollout-rl/rollout/trajectory"
)

// The baseline is the export's groups in another layout: every line parses
// to the same tokens, masks, scores and messages as AtroposGroups, with
// Python's separators and the pydantic model's null keys.
func TestWritePythonAtroposIsTheExportsGroups(t *testing.T) {
	recs := batch(16, 256, true)
	var buf bytes.Buffer
	if err := WritePythonAtropos(&buf, recs); err != nil {
		t.Fatal(err)
	}
	want, _, err := trajectory.AtroposGroups(recs, trajectory.AtroposOptions{IncludeMessages: true})
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&buf)
	sc.Buffer(nil, 1<<24)
	n := 0
	for ; sc.Scan(); n++ {
		line := sc.Text()
		if !strings.HasPrefix(line, `{"tokens": [[`) || !strings.HasSuffix(line, `"overrides": null, "images": null}`) {
			t.Fatalf("group %d is not in json.dumps layout: %.60q … %.60q", n, line, line[max(0, len(line)-60):])
		}
		var got struct {
			Tokens, Masks     [][]int32
			Scores            []float64
			Messages          [][]json.RawMessage
			InferenceLogprobs [][]float64 `json:"inference_logprobs"`
			RefLogprobs       any         `json:"ref_logprobs"`
		}
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("group %d: %v", n, err)
		}
		w := want[n]
		if !slices.EqualFunc(got.Tokens, w.Tokens, slices.Equal) || !slices.EqualFunc(got.Masks, w.Masks, slices.Equal) ||
			!slices.Equal(got.Scores, w.Scores) || len(got.Messages) != len(w.Messages) || got.RefLogprobs != nil {
			t.Fatalf("group %d differs from the export's", n)
		}
		for i, lps := range got.InferenceLogprobs {
			for j, lp := range lps {
				if float32(lp) != w.InferenceLogprobs[i][j] {
					t.Fatalf("group %d logprob %d/%d = %v, export %v", n, i, j, lp, w.InferenceLogprobs[i][j])
				}
			}
		}
	}
	if n != len(want) {
		t.Fatalf("%d lines, %d groups", n, len(want))
	}
}
