package trajectory

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// trainerFixture is the export fixture plus a second branch of rollout 1
// of group g-2 (a gateway session that rewrote its history): it shares its
// parent's first 5 tokens and ends on its own generation.
func trainerFixture() []Record {
	recs := fixtureRecords()
	b := recs[4]
	b.Branch, b.ParentBranch, b.SplitCall, b.SharedTokens = 1, 0, 1, 5
	b.Tokens = append(append([]int32{}, b.Tokens[:5]...), 900, 901, 902, 903, 904)
	b.LossMask = []int8{0, 0, 0, 1, 1, 0, 0, 0, 1, 1}
	b.Logprobs = []float32{0, 0, 0, -0.5, -0.25, 0, 0, 0, -0.125, -0.0625}
	b.Masks, b.TokenVersions, b.VersionCuts = nil, nil, nil
	b.CompletionTokens = int32(len(b.Tokens)) - b.PromptTokens
	b.ToolErrors, b.LoopEvents, b.CallStatuses, b.TurnRewards = nil, nil, nil, nil
	b.DeriveTrainingFields()
	return append(recs, b)
}

func TestTrainerExportsGolden(t *testing.T) {
	recs := trainerFixture()
	tests := []struct {
		golden string
		write  func(*bytes.Buffer, []Record, Filter) (ExportStats, error)
		want   ExportStats
	}{
		{"verl.jsonl", func(b *bytes.Buffer, r []Record, f Filter) (ExportStats, error) { return WriteVerl(b, r, f) }, ExportStats{Read: 7, Written: 6, Filtered: 1}},
		{"skyrl.jsonl", func(b *bytes.Buffer, r []Record, f Filter) (ExportStats, error) { return WriteSkyRL(b, r, f) }, ExportStats{Read: 7, Written: 2, Filtered: 1}},
		{"nemo_gym.jsonl", func(b *bytes.Buffer, r []Record, f Filter) (ExportStats, error) { return WriteNeMoGym(b, r, f) }, ExportStats{Read: 7, Written: 6, Filtered: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			var buf bytes.Buffer
			st, err := tt.write(&buf, recs, Filter{})
			if err != nil {
				t.Fatal(err)
			}
			if st != tt.want {
				t.Errorf("stats = %+v, want %+v", st, tt.want)
			}
			checkGolden(t, tt.golden, buf.Bytes())
		})
	}
}

// Every verl sample splits its record's tokens exactly, with aligned mask,
// logprobs (0.0 where untrained) and routing over all its tokens.
func TestVerlSamplesAlign(t *testing.T) {
	recs := trainerFixture()
	samples, _, err := VerlSamples(recs, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	ok := slices.DeleteFunc(slices.Clone(recs), func(r Record) bool { return r.Status != StatusOK })
	if len(samples) != len(ok) {
		t.Fatalf("%d samples for %d ok records", len(samples), len(ok))
	}
	for i, s := range samples {
		r := findRecord(t, ok, s.ExtraFields.Rollout)
		if got := append(slices.Clone(s.PromptIDs), s.ResponseIDs...); !slices.Equal(got, r.Tokens) {
			t.Errorf("sample %d: prompt+response %v, tokens %v", i, got, r.Tokens)
		}
		if len(s.PromptIDs) != int(r.PromptTokens) || len(s.ResponseMask) != len(s.ResponseIDs) || len(s.ResponseLogprobs) != len(s.ResponseIDs) {
			t.Errorf("sample %d: prompt %d (want %d), mask %d, logprobs %d, response %d", i, len(s.PromptIDs), r.PromptTokens, len(s.ResponseMask), len(s.ResponseLogprobs), len(s.ResponseIDs))
		}
		for j, m := range s.ResponseMask {
			p := int(r.PromptTokens) + j
			want := float32(0)
			if m == 1 {
				want = r.Logprobs[p]
			}
			if m != r.LossMask[p] || s.ResponseLogprobs[j] != want {
				t.Errorf("sample %d position %d: mask %d logprob %v, want %d %v", i, p, m, s.ResponseLogprobs[j], r.LossMask[p], want)
			}
		}
		if len(r.RoutedExperts) > 0 {
			checkExperts(t, r, s.RoutedExperts)
		} else if s.RoutedExperts != nil {
			t.Errorf("sample %d: routing without the record having any", i)
		}
		if s.RewardScore != r.Reward || s.NumTurns != 4 {
			t.Errorf("sample %d: reward %v turns %d", i, s.RewardScore, s.NumTurns)
		}
	}
	// The async record's versions reach verl's param_version fields.
	if v := samples[1].ExtraFields; v.ParamVersionStart == nil || *v.ParamVersionStart != 4 || *v.ParamVersionEnd != 5 {
		t.Errorf("param versions %+v", v)
	}
}

func TestSkyRLGroupsAlign(t *testing.T) {
	recs := trainerFixture()
	groups, _, err := SkyRLGroups(recs, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 2 {
		t.Fatalf("%d groups", len(groups))
	}
	for gi, g := range groups {
		n := len(g.ResponseIDs)
		if len(g.PromptTokenIDs) != n || len(g.LossMasks) != n || len(g.Rewards) != n || len(g.StopReasons) != n ||
			len(g.RolloutLogprobs) != n || len(g.TrajectoryIDs) != n || len(g.Rollout) != n || len(g.EnvMetrics) != n {
			t.Fatalf("group %d: per-trajectory lists of unequal length: %+v", gi, g)
		}
		for i := range n {
			r := findRecord(t, recs, g.Rollout[i])
			if len(g.LossMasks[i]) != len(g.ResponseIDs[i]) || len(g.RolloutLogprobs[i]) != len(g.ResponseIDs[i]) {
				t.Errorf("group %d trajectory %d: mask %d logprobs %d response %d", gi, i, len(g.LossMasks[i]), len(g.RolloutLogprobs[i]), len(g.ResponseIDs[i]))
			}
			if g.TrajectoryIDs[i] != (SkyRLTrajID{InstanceID: r.GroupID, RepetitionID: r.RolloutIndex}) {
				t.Errorf("trajectory id %+v", g.TrajectoryIDs[i])
			}
			if g.RolloutExpertIndices != nil {
				checkExperts(t, r, g.RolloutExpertIndices[i])
			}
		}
	}
	if groups[0].RolloutExpertIndices == nil || groups[1].RolloutExpertIndices != nil {
		t.Errorf("routing: g-1 has it, g-2 not")
	}
	// The g-2 group: rollouts 0 and 1, then rollout 1's branch 1.
	if b := groups[1].Rollout[2]; b.Branch != 1 || b.ParentBranch != 0 || b.RolloutIndex != 1 || groups[1].Rewards[2] != groups[1].Rewards[1] {
		t.Errorf("branch row %+v, rewards %v", b, groups[1].Rewards)
	}
}

// NeMo Gym: one generation per assistant turn on its last output item,
// prefix-contiguous (each prompt extends everything before it, as NeMo
// Gym's assert_prefix_contiguity checks), the generations exactly the
// trained positions.
func TestNeMoGymAlign(t *testing.T) {
	recs := trainerFixture()
	lines, _, err := NeMoGymRollouts(recs, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for li, l := range lines {
		r := findRecord(t, recs, l.Rollout)
		var seen, trained []int32
		gens := 0
		var types []string
		for _, it := range l.Response.Output {
			types = append(types, it.Type)
			if it.NeMoGymTokens == nil {
				continue
			}
			gens++
			tk := it.NeMoGymTokens
			if !slices.Equal(tk.PromptTokenIDs[:len(seen)], seen) {
				t.Errorf("line %d: prompt does not extend the tokens seen", li)
			}
			if len(tk.GenerationLogProbs) != len(tk.GenerationTokenIDs) {
				t.Errorf("line %d: %d logprobs for %d ids", li, len(tk.GenerationLogProbs), len(tk.GenerationTokenIDs))
			}
			if tk.RoutedExperts != nil && len(tk.RoutedExperts) != len(tk.PromptTokenIDs)+len(tk.GenerationTokenIDs) {
				t.Errorf("line %d: routing over %d positions", li, len(tk.RoutedExperts))
			}
			seen = append(slices.Clone(tk.PromptTokenIDs), tk.GenerationTokenIDs...)
			trained = append(trained, tk.GenerationTokenIDs...)
		}
		var want []int32
		for i, m := range r.LossMask {
			if m == 1 {
				want = append(want, r.Tokens[i])
			}
		}
		if gens != 2 || !slices.Equal(trained, want) || !slices.Equal(seen, r.Tokens[:len(seen)]) {
			t.Errorf("line %d: %d generations, trained %v want %v", li, gens, trained, want)
		}
		if got := strings.Join(types, ","); got != "reasoning,function_call,function_call_output,message" {
			t.Errorf("line %d: items %s", li, got)
		}
		if l.Response.Output[1].NeMoGymTokens == nil || l.Response.Output[3].NeMoGymTokens == nil {
			t.Errorf("line %d: token fields not on each turn's last item", li)
		}
		if len(l.ResponsesCreateParams.Input) != 2 || l.ResponsesCreateParams.Tools[0].Name != "terminal" {
			t.Errorf("line %d: params %+v", li, l.ResponsesCreateParams)
		}
	}
}

func findRecord(t *testing.T, recs []Record, ref RolloutRef) *Record {
	t.Helper()
	for i := range recs {
		if recs[i].GroupID == ref.GroupID && recs[i].RolloutIndex == ref.RolloutIndex && recs[i].Branch == ref.Branch {
			return &recs[i]
		}
	}
	t.Fatalf("no record for %+v", ref)
	return nil
}

// checkExperts: routing over every token, the recorded experts first,
// zeros after.
func checkExperts(t *testing.T, r *Record, got [][][]uint16) {
	t.Helper()
	sh := r.RoutedExpertsShape
	if len(got) != len(r.Tokens) {
		t.Fatalf("routing over %d positions, %d tokens", len(got), len(r.Tokens))
	}
	var flat []uint16
	for p := range got {
		if len(got[p]) != int(sh[1]) {
			t.Fatalf("position %d: %d layers", p, len(got[p]))
		}
		for _, k := range got[p] {
			flat = append(flat, k...)
		}
	}
	n := len(r.RoutedExperts)
	if !slices.Equal(flat[:n], r.RoutedExperts) || slices.ContainsFunc(flat[n:], func(v uint16) bool { return v != 0 }) {
		t.Errorf("routing %v, recorded %v", flat, r.RoutedExperts)
	}
}

func TestTrainerExportsFilters(t *testing.T) {
	recs := trainerFixture()
	half := 0.5
	tests := []struct {
		f    Filter
		want []string // group/index/branch of the samples
	}{
		{Filter{}, []string{"g-1/0/0", "g-1/1/0", "g-1/2/0", "g-2/0/0", "g-2/1/0", "g-2/1/1"}},
		// Min reward and finished-only are per rollout; a session's
		// branches go together.
		{Filter{MinReward: &half, FinishedOnly: true}, []string{"g-1/0/0", "g-2/1/0", "g-2/1/1"}},
		// Top-k ranks rollouts: the best of g-2 keeps both its branches.
		{Filter{TopK: 1}, []string{"g-1/0/0", "g-2/1/0", "g-2/1/1"}},
		// IncludeFailed never brings an infra failure into training data.
		{Filter{IncludeFailed: true, MinReward: &half}, []string{"g-1/0/0", "g-1/2/0", "g-2/1/0", "g-2/1/1"}},
	}
	for _, tt := range tests {
		samples, st, err := VerlSamples(recs, tt.f)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, s := range samples {
			x := s.ExtraFields.Rollout
			got = append(got, x.GroupID+"/"+itoa(x.RolloutIndex)+"/"+itoa(x.Branch))
		}
		if !slices.Equal(got, tt.want) || st.Written != len(tt.want) || st.Filtered != len(recs)-len(tt.want) {
			t.Errorf("%+v: got %v (%+v), want %v", tt.f, got, st, tt.want)
		}
	}
}

func itoa(v int32) string { b, _ := json.Marshal(v); return string(b) }

func TestTrainerExportsBadInput(t *testing.T) {
	writers := map[string]func(*bytes.Buffer, []Record, Filter) (ExportStats, error){
		"verl":     func(b *bytes.Buffer, r []Record, f Filter) (ExportStats, error) { return WriteVerl(b, r, f) },
		"skyrl":    func(b *bytes.Buffer, r []Record, f Filter) (ExportStats, error) { return WriteSkyRL(b, r, f) },
		"nemo-gym": func(b *bytes.Buffer, r []Record, f Filter) (ExportStats, error) { return WriteNeMoGym(b, r, f) },
	}
	mod := func(fn func(r *Record)) []Record {
		r := fixtureRecords()[0]
		fn(&r)
		return []Record{r}
	}
	chat := mod(func(r *Record) {
		r.Tokens, r.Masks, r.LossMask, r.Logprobs, r.RoutedExperts, r.RoutedExpertsShape = nil, nil, nil, nil, nil, nil
	})
	cases := []struct {
		name string
		recs []Record
		want map[string]string // writer → error text ("" = no error)
	}{
		{"empty", nil, map[string]string{"verl": "", "skyrl": "", "nemo-gym": ""}},
		{"chat mode", chat, map[string]string{"verl": "record has no token ids", "skyrl": "record has no token ids", "nemo-gym": ""}},
		{"misaligned loss mask", mod(func(r *Record) { r.LossMask = r.LossMask[:4] }),
			map[string]string{"verl": "loss_mask has 4 entries, tokens 9", "skyrl": "loss_mask has 4 entries, tokens 9", "nemo-gym": "loss_mask has 4 entries, tokens 9"}},
		{"prompt past the tokens", mod(func(r *Record) { r.PromptTokens = 12 }),
			map[string]string{"verl": "prompt_tokens 12 outside the 9 tokens", "skyrl": "prompt_tokens 12 outside the 9 tokens", "nemo-gym": "prompt_tokens 12 outside the 9 tokens"}},
		{"bad routing shape", mod(func(r *Record) { r.RoutedExpertsShape = []int32{8, 2} }),
			map[string]string{"verl": "routed_experts_shape [8 2] does not fit", "skyrl": "routed_experts_shape [8 2] does not fit", "nemo-gym": "routed_experts_shape [8 2] does not fit"}},
		{"messages not a list", mod(func(r *Record) { r.Messages = `{"role":"user"}` }),
			map[string]string{"verl": "messages column is not a JSON list", "skyrl": "", "nemo-gym": "messages column is not a JSON list"}},
		{"tools not function tools", mod(func(r *Record) { r.Tools = `{"x":1}` }),
			map[string]string{"verl": "", "skyrl": "", "nemo-gym": "tools column is not a list of function tools"}},
	}
	for _, c := range cases {
		for name, w := range writers {
			var buf bytes.Buffer
			_, err := w(&buf, c.recs, Filter{})
			want := c.want[name]
			switch {
			case want == "" && err != nil:
				t.Errorf("%s, %s: %v", c.name, name, err)
			case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
				t.Errorf("%s, %s: error %v, want %q", c.name, name, err, want)
			case want != "" && buf.Len() != 0:
				t.Errorf("%s, %s: wrote %d bytes before failing", c.name, name, buf.Len())
			}
		}
	}
	if _, err := WriteVerl(&bytes.Buffer{}, chat, Filter{}); !errors.Is(err, ErrNoTokens) {
		t.Errorf("chat mode: %v, want ErrNoTokens", err)
	}
	if _, err := WriteVerl(&bytes.Buffer{}, mod(func(r *Record) { r.PromptTokens = -1 }), Filter{}); !errors.Is(err, ErrInvalidRecord) {
		t.Errorf("negative prompt: %v, want ErrInvalidRecord", err)
	}
	// A group where only some rollouts carry routing is refused where the
	// group is one unit (SkyRL); verl samples stand alone.
	mixed := fixtureRecords()[:3]
	mixed[1].RoutedExperts, mixed[1].RoutedExpertsShape = nil, nil
	if _, err := WriteSkyRL(&bytes.Buffer{}, mixed, Filter{}); err == nil || !strings.Contains(err.Error(), "2 of 3 records carry routed experts") {
		t.Errorf("mixed routing: %v", err)
	}
}

// NeMo Gym: chat-mode rows carry no token fields; a row whose trained runs
// do not pair with its assistant turns is skipped and counted, not
// attached to the wrong items.
func TestNeMoGymUnpairedAndChat(t *testing.T) {
	recs := fixtureRecords()[:2]
	// An unscored sampled id inside the first generation splits it.
	recs[0].LossMask = []int8{0, 0, 0, 1, 0, 1, 0, 1, 1}
	recs[0].Masks = nil
	recs[0].DeriveTrainingFields()
	lines, st, err := NeMoGymRollouts(recs, Filter{})
	if err != nil || st.Skipped != 1 || st.Written != 1 || len(lines) != 1 || lines[0].Rollout.RolloutIndex != 1 {
		t.Fatalf("unpaired: %d lines, %+v, %v", len(lines), st, err)
	}
	chat := fixtureRecords()[0]
	chat.Tokens, chat.Masks, chat.LossMask, chat.Logprobs = nil, nil, nil, nil
	chat.RoutedExperts, chat.RoutedExpertsShape = nil, nil
	lines, _, err = NeMoGymRollouts([]Record{chat}, Filter{})
	if err != nil || len(lines) != 1 {
		t.Fatal(err)
	}
	for _, it := range lines[0].Response.Output {
		if it.NeMoGymTokens != nil {
			t.Errorf("chat-mode item with token fields: %+v", it)
		}
	}
	if u := lines[0].Response.Usage; u.InputTokens != 3 || u.OutputTokens != 6 {
		t.Errorf("chat-mode usage %+v", u)
	}
}

// FuzzTrainerExports: any messages, mask and prompt cut either fail with an
// error or give samples whose lists align; nothing panics.
func FuzzTrainerExports(f *testing.F) {
	f.Add(fixtureRecords()[0].Messages, []byte{0, 0, 0, 1, 1, 0, 0, 1, 1}, int32(3), int32(8))
	f.Add(`[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"x","arguments":"{bad"}}]}]`, []byte{1, 1}, int32(0), int32(2))
	f.Add(`[]`, []byte{}, int32(0), int32(0))
	f.Fuzz(func(t *testing.T, msgs string, mask []byte, prompt, routed int32) {
		r := fixtureRecords()[0]
		r.Messages, r.PromptTokens = msgs, prompt
		r.Tokens, r.LossMask, r.Logprobs = make([]int32, len(mask)), make([]int8, len(mask)), make([]float32, len(mask))
		for i, m := range mask {
			r.Tokens[i], r.LossMask[i], r.Logprobs[i] = int32(i), int8(m%2), -float32(i)
		}
		r.CompletionTokens = int32(len(mask)) - prompt
		r.RoutedExperts, r.RoutedExpertsShape = nil, nil
		if routed >= 0 && int(routed) <= len(mask) {
			r.RoutedExpertsShape = []int32{routed, 1, 2}
			r.RoutedExperts = make([]uint16, routed*2)
		}
		recs := []Record{r}
		if samples, _, err := VerlSamples(recs, Filter{}); err == nil {
			for _, s := range samples {
				if len(s.ResponseMask) != len(s.ResponseIDs) || len(s.PromptIDs)+len(s.ResponseIDs) != len(mask) ||
					(s.RoutedExperts != nil && len(s.RoutedExperts) != len(mask)) {
					t.Fatalf("verl sample misaligned: %+v", s)
				}
			}
		}
		if groups, _, err := SkyRLGroups(recs, Filter{}); err == nil {
			for _, g := range groups {
				if len(g.LossMasks[0]) != len(g.ResponseIDs[0]) {
					t.Fatalf("skyrl group misaligned: %+v", g)
				}
			}
		}
		if lines, _, err := NeMoGymRollouts(recs, Filter{}); err == nil {
			for _, l := range lines {
				for _, it := range l.Response.Output {
					if it.NeMoGymTokens != nil && len(it.GenerationLogProbs) != len(it.GenerationTokenIDs) {
						t.Fatalf("nemo-gym item misaligned: %+v", it)
					}
				}
			}
		}
	})
}
