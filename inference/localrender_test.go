package inference_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/metrictest"
)

// simModel writes the simulator's hermes model directory and returns it.
func simModel(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := sim.WriteHFModel(dir, "hermes"); err != nil {
		t.Fatal(err)
	}
	return dir
}

// With local_render the episodes' sequences are the ones the server's
// renders give, id for id, and once each shape is checked the server
// renders no more (but for the sampled checks).
func TestLocalRenderEqualsServer(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes", Seed: 1})
	model := simModel(t)
	spec := func(i int) inference.EpisodeSpec {
		return inference.EpisodeSpec{ID: "lr" + string(rune('a'+i)), Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 256}}
	}
	for _, be := range []string{inference.BackendVLLM, inference.BackendSGLang} {
		t.Run(be, func(t *testing.T) {
			plain := openClient(t, inference.Config{Backend: be, Endpoints: []string{srv.URL}})
			local := openClient(t, inference.Config{Backend: be, Endpoints: []string{srv.URL}, LocalRender: model, LocalRenderVerifyEvery: 1 << 30})
			const episodes, warm = 8, 4
			counter := func(result string) float64 {
				return metrictest.Find(t, "rollout_inference_local_renders_total", "result", result).GetCounter().GetValue()
			}
			seg0 := counter("segment")
			var plainRenders, localRenders int64
			for i := range episodes {
				before := srv.Stats().ByRoute["POST /tokenize"]
				pt, pseq, _ := runEpisode(t, plain, spec(i), 3, i%2 == 1)
				mid := srv.Stats().ByRoute["POST /tokenize"]
				lt, lseq, _ := runEpisode(t, local, spec(i), 3, i%2 == 1)
				after := srv.Stats().ByRoute["POST /tokenize"]
				checkSequence(t, lseq, lt)
				if !slices.Equal(pseq.Tokens, lseq.Tokens) || !slices.Equal(pseq.Mask, lseq.Mask) {
					t.Fatalf("episode %d: local render's sequence differs from the server's (%d vs %d ids)", i, len(lseq.Tokens), len(pseq.Tokens))
				}
				if len(pt) != len(lt) || lseq.DriftTokens != 0 {
					t.Fatalf("episode %d: %d vs %d turns, drift %d", i, len(pt), len(lt), lseq.DriftTokens)
				}
				if i >= warm { // every shape is checked by then (twice each)
					plainRenders += mid - before
					localRenders += after - mid
				}
			}
			if local.LocalRenderOff() {
				t.Fatal("local render turned itself off")
			}
			// Later segments come from the learned text of their shape, no
			// template run: two per episode after the warm-up.
			if got := counter("segment") - seg0; got < 2*(episodes-warm) {
				t.Fatalf("%v segments from learned text, want at least %d", got, 2*(episodes-warm))
			}
			// The drift check at Finish renders locally too (its shapes
			// were checked in the warm-up): once every shape is checked,
			// the server renders nothing.
			if localRenders != 0 || plainRenders <= 0 {
				t.Fatalf("server renders in the last %d episodes: plain %d, local %d (want 0)", episodes-warm, plainRenders, localRenders)
			}
		})
	}
}

// A model whose template differs from the server's is caught by the first
// check: local rendering turns off and the server's ids are used.
func TestLocalRenderMismatchTurnsOff(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes", Seed: 2})
	model := simModel(t)
	cfgPath := filepath.Join(model, "tokenizer_config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	tmpl, _ := cfg["chat_template"].(string)
	if tmpl == "" {
		t.Fatal("no chat_template in the simulator's tokenizer_config.json")
	}
	cfg["chat_template"] = "X" + tmpl
	raw, _ = json.Marshal(cfg)
	if err := os.WriteFile(cfgPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	spec := inference.EpisodeSpec{ID: "mm", Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 256}}
	plain := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}})
	local := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, LocalRender: model})
	_, pseq, _ := runEpisode(t, plain, spec, 3, false)
	lt, lseq, _ := runEpisode(t, local, spec, 3, false)
	checkSequence(t, lseq, lt)
	if !local.LocalRenderOff() {
		t.Fatal("a different template did not turn local render off")
	}
	if !slices.Equal(pseq.Tokens, lseq.Tokens) {
		t.Fatal("after the mismatch the sequence is not the server's")
	}
}

func TestLocalRenderConfigErrors(t *testing.T) {
	model := simModel(t)
	for _, c := range []struct {
		cfg  inference.Config
		want string
	}{
		{inference.Config{Backend: inference.BackendChat, Endpoints: []string{"http://127.0.0.1:1"}, LocalRender: model}, "tokens-mode backend"},
		{inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{"http://127.0.0.1:1"}, LocalRender: filepath.Join(model, "nope")}, "nope"},
		{inference.Config{Backend: inference.BackendAtropos, Endpoints: []string{"http://127.0.0.1:1"}, LocalRender: model}, "tokenizer_endpoints"},
		{inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{"http://127.0.0.1:1"}, LocalRender: model, LocalRenderVerifyEvery: -1}, "negative"},
	} {
		_, err := inference.Open(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err %v, want one naming %q", c.cfg.LocalRender, err, c.want)
		}
	}
}

// Episodes rendering locally in parallel share the client's learned
// shapes and caches (run under -race in CI); every sequence is still the
// one the server's renders give.
func TestLocalRenderConcurrent(t *testing.T) {
	srv := startSim(t, sim.Config{Family: "hermes", Seed: 5})
	model := simModel(t)
	plain := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}})
	local := openClient(t, inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, LocalRender: model, LocalRenderVerifyEvery: 1 << 30})
	spec := func(i int) inference.EpisodeSpec {
		return inference.EpisodeSpec{ID: "lc" + strconv.Itoa(i), Tools: []openai.Tool{terminalTool}, Sampling: inference.Sampling{MaxTokens: 256}}
	}
	const n = 16
	want := make([][]int32, n)
	for i := range n {
		_, seq, _ := runEpisode(t, plain, spec(i), 3, i%2 == 0)
		want[i] = seq.Tokens
	}
	before := srv.Stats().ByRoute["POST /tokenize"]
	got := make([][]int32, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, seq, _, err := episode(local, spec(i), 3, i%2 == 0)
			got[i], errs[i] = seq.Tokens, err
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("episode %d: %v", i, errs[i])
		}
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("episode %d: local render's sequence differs from the server's", i)
		}
	}
	if local.LocalRenderOff() {
		t.Fatal("local render turned itself off")
	}
	// Episodes starting together do not all check the same shapes: the
	// server renders each shape's first checks only (two each, for the
	// handful of shapes these episodes have, their drift checks' included).
	if renders := srv.Stats().ByRoute["POST /tokenize"] - before; renders > 16 {
		t.Fatalf("%d server renders for %d episodes started together, want at most 16", renders, n)
	}
	t.Logf("%d server renders for %d episodes", srv.Stats().ByRoute["POST /tokenize"]-before, n)
}
