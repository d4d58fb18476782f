package synth

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/rollout-rl/rollout/trajectory"
)

// TestSyntheticSharedPrompt: with SharedPrompt the rollouts of a group
// share their prompt ids and system and user messages, groups differ, and
// the rest of each record is the record drawn without the option.
func TestSyntheticSharedPrompt(t *testing.T) {
	opts := Options{Tokens: 2048, GroupSize: 4, SharedPrompt: true}
	p := 2048 / 8
	prompt := func(r trajectory.Record) (string, []int32) {
		var msgs []map[string]any
		if err := json.Unmarshal([]byte(r.Messages), &msgs); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(msgs[0]["content"], msgs[1]["content"]), r.Tokens[:p]
	}
	first := Trajectory(3, 0, opts)
	t0, ids0 := prompt(first)
	for i := 1; i < 8; i++ {
		r := Trajectory(3, i, opts)
		ti, idsi := prompt(r)
		same := ti == t0 && slices.Equal(idsi, ids0)
		if (i < 4) != same {
			t.Fatalf("record %d (group %d) shares the prompt of record 0: %v", i, i/4, same)
		}
		own := Trajectory(3, i, Options{Tokens: 2048, GroupSize: 4})
		if !slices.Equal(r.Tokens[p:], own.Tokens[p:]) || !slices.Equal(r.LossMask, own.LossMask) || !slices.Equal(r.Logprobs, own.Logprobs) {
			t.Fatalf("record %d: past the prompt, SharedPrompt changed the record", i)
		}
	}
}
