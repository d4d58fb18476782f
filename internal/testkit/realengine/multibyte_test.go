package realengine

import (
	"context"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/rollout-rl/rollout/trajectory"
)

// multiByteGrammar makes the model answer in CJK characters and emoji
// only: with tiny-qwen3's byte-level vocabulary (ids 0–255 are the bytes,
// no merge spans a non-ASCII byte) every character is 3 or 4 sampled ids,
// and all but the last of them leave the text inside a UTF-8 character,
// where llama-server withholds their probability entries.
const multiByteGrammar = `root ::= [一-龥😀-🙏]{16,40}`

// TestMultiByteEveryTokenScored is issue 37's "Done when" for llama.cpp:
// a collection forced into multi-byte output trains every sampled id
// (unscored_tokens 0 in every row) and every trained logprob agrees with
// the server's own for that id after that prefix.
func TestMultiByteEveryTokenScored(t *testing.T) {
	e := startEngine(t)
	c := collection{backend: "llamacpp", groups: 2, groupSize: 4, maxTokens: 48, maxTurns: 1,
		onTruncation: "stop", inFlight: 4,
		extra: map[string]any{"sampling": map[string]any{
			"temperature": 1.0, "max_tokens": 48,
			"extra_body": map[string]any{"grammar": multiByteGrammar},
		}}}
	dir, retried := c.run(t, suiteCtx(t), e)
	if len(retried) != 0 {
		t.Errorf("rollouts retried as infrastructure failures: %v", retried)
	}
	s := check(t, e, dir, true, 0) // every trained position re-scored
	t.Logf("multi-byte collection: %s", s)
	if s.unscored != 0 {
		t.Errorf("%d sampled ids without a logprob, want 0", s.unscored)
	}
	run, err := trajectory.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadAll(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The ids that leave the text inside a character are the ones
	// llama-server withholds; they must all be trained now. (tiny-qwen3:
	// id = byte below 256, and no merge holds a non-ASCII byte.)
	withheld, sampled := 0, 0
	for _, r := range recs {
		var pending []byte
		for j := int(r.PromptTokens); j < len(r.Tokens); j++ {
			if r.LossMask[j] == 0 {
				pending = nil
				continue
			}
			sampled++
			if id := r.Tokens[j]; id < 0x80 || id > 0xFF {
				pending = nil
				continue
			}
			pending = append(pending, byte(r.Tokens[j]))
			if !utf8.FullRune(pending) {
				withheld++
			} else {
				pending = nil
			}
		}
		var msgs []message
		if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
			t.Fatal(err)
		}
		if last := msgs[len(msgs)-1]; last.Role == "assistant" {
			if s, _ := last.Content.(string); !utf8.ValidString(s) {
				t.Errorf("%s: assistant content is not valid UTF-8: %q", r.ItemID, s)
			}
		}
	}
	t.Logf("trained sampled ids %d, of which %d end inside a UTF-8 character (withheld by llama-server's own entries)", sampled, withheld)
	if withheld == 0 {
		t.Fatalf("the grammar produced no multi-byte character: the test proves nothing")
	}
}
