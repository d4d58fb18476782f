package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/inference/sim"
)

// samplingSim is the simulator behind a recorder of every generation's
// temperature and max_tokens (POST /v1/completions: tokens mode).
type samplingSim struct {
	srv *httptest.Server
	mu  sync.Mutex
	gen []map[string]any
}

func newSamplingSim(t *testing.T) *samplingSim {
	t.Helper()
	h, err := sim.NewHandler(sim.Config{Family: "hermes", Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	s := &samplingSim{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			b, _ := io.ReadAll(r.Body)
			var body map[string]any
			if json.Unmarshal(b, &body) == nil {
				s.mu.Lock()
				s.gen = append(s.gen, map[string]any{"temperature": body["temperature"], "max_tokens": body["max_tokens"]})
				s.mu.Unlock()
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// TestCollectHarnessGroupSampling: a trainer's per-group sampling governs
// a harness env's gateway sessions through the server. The harness (busybox
// wget in the sandbox, over the tunnel) asks for temperature 0 and 5,000
// tokens; the group collected with sampling_json generates with the
// trainer's temperature and max_tokens, the group without it with the
// run's, and the harness's fields are only recorded.
func TestCollectHarnessGroupSampling(t *testing.T) {
	ref := needDocker(t)
	shared, _ := newShared(t, "servertest")
	s := newSamplingSim(t)
	dir := t.TempDir() // the server's data dir: the env file lives there
	h := startServer(t, Options{Sandboxes: shared, Images: shared, DataDir: dir}, RunOptions{})

	body := `{"model": "rollout-sim", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 5000}`
	env := map[string]any{
		"name": "harness-sampling", "prompt": "hi",
		"sandbox": map[string]any{"image": ref},
		"harness": map[string]any{"apis": []string{"openai"}, "budget": "1m",
			"command": `wget -q -O /tmp/out.json --header "Content-Type: application/json" --post-data '` + body + `' "$OPENAI_BASE_URL/chat/completions"`},
		"items":   []map[string]any{{"id": "a"}, {"id": "b"}},
		"rewards": []map[string]any{{"type": "exit_code", "command": "test -s /tmp/out.json"}},
	}
	b, _ := json.Marshal(env)
	envPath := filepath.Join(dir, "harness.yaml")
	if err := os.WriteFile(envPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := `env: ` + envPath + `
group_size: 1
inference: {backend: vllm, endpoints: [` + s.srv.URL + `], timeout: 2m}
parser: hermes
sampling: {temperature: 0.7, max_tokens: 64}
limits: {groups_in_flight: 1}
`
	c := startCollect(t, h.cli, &rolloutv1.CollectStart{
		ConfigYaml: cfg, InitialCredits: 2})
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{
		RequestId: "trainer", Count: 1, SamplingJson: `{"temperature": 0.25, "max_tokens": 17}`}}})
	c.until("the trainer-sampled group", c.settled(1, 0))
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{
		RequestId: "run", Count: 1}}})
	c.until("the run-sampled group", c.settled(2, 0))
	c.drain()

	want := map[string]int{"trainer": 17, "run": 64}
	for _, g := range c.groups {
		if len(g.Rollouts) != 1 {
			t.Fatalf("group %s: %d rollouts", g.GroupId, len(g.Rollouts))
		}
		ro := g.Rollouts[0]
		if ro.Status != "ok" || ro.StopReason != "harness_exit" || ro.Reward != 1 || len(ro.Tokens) == 0 {
			t.Fatalf("group %s (%s): %s %s (%s), reward %v, %d tokens", g.GroupId, g.RequestId, ro.Status, ro.StopReason, ro.FailureMessage, ro.Reward, len(ro.Tokens))
		}
		var calls []struct {
			Status    string         `json:"status"`
			Requested map[string]any `json:"requested"`
			MaxTokens int            `json:"max_tokens"`
			Granted   int            `json:"granted"`
		}
		if err := json.Unmarshal([]byte(ro.CallsJson), &calls); err != nil || len(calls) != 1 {
			t.Fatalf("group %s: calls %q: %v", g.GroupId, ro.CallsJson, err)
		}
		cl := calls[0]
		if cl.Status != "ok" || cl.Requested["temperature"] != 0.0 || cl.MaxTokens != 5000 || cl.Granted != want[g.RequestId] {
			t.Errorf("group %s (%s): call %+v; want the harness's temperature 0 and 5000 recorded, %d granted", g.GroupId, g.RequestId, cl, want[g.RequestId])
		}
	}
	// The engine saw only the groups' samplers: the trainer's and the
	// run's, never the harness's temperature 0.
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[[2]float64]int{}
	for _, f := range s.gen {
		temp, _ := f["temperature"].(float64)
		mt, _ := f["max_tokens"].(float64)
		seen[[2]float64{temp, mt}]++
	}
	if len(seen) != 2 || seen[[2]float64{0.25, 17}] == 0 || seen[[2]float64{0.7, 64}] == 0 {
		t.Errorf("engine generations by (temperature, max_tokens): %v; want (0.25, 17) and (0.7, 64) only", seen)
	}
}

// TestHarnessDistillBranches: on-policy distillation of a harness env
// through the server. The harness (busybox wget over the tunnel) makes two
// calls whose histories do not extend each other, so its session has two
// branches; with a distill block (the simulator as teacher, top-2) every
// branch's row carries the teacher's top-2 at each trained position and
// nothing elsewhere.
func TestHarnessDistillBranches(t *testing.T) {
	ref := needDocker(t)
	shared, _ := newShared(t, "servertest")
	s := newSamplingSim(t)
	dir := t.TempDir()
	h := startServer(t, Options{Sandboxes: shared, Images: shared, DataDir: dir}, RunOptions{})

	call := func(content, out string) string {
		body := `{"model": "rollout-sim", "messages": [{"role": "user", "content": "` + content + `"}]}`
		return `wget -q -O ` + out + ` --header "Content-Type: application/json" --post-data '` + body + `' "$OPENAI_BASE_URL/chat/completions"`
	}
	env := map[string]any{
		"name": "harness-distill", "prompt": "hi",
		"sandbox": map[string]any{"image": ref},
		"harness": map[string]any{"apis": []string{"openai"}, "budget": "1m",
			"command": call("hello there", "/tmp/a.json") + " && " + call("something else", "/tmp/b.json")},
		"items":   []map[string]any{{"id": "a"}},
		"rewards": []map[string]any{{"type": "exit_code", "command": "test -s /tmp/b.json"}},
	}
	b, _ := json.Marshal(env)
	envPath := filepath.Join(dir, "harness.yaml")
	if err := os.WriteFile(envPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	const topK = 2
	cfg := `env: ` + envPath + `
group_size: 1
inference: {backend: vllm, endpoints: [` + s.srv.URL + `], timeout: 2m}
parser: hermes
sampling: {temperature: 0.7, max_tokens: 32}
distill: {endpoint: ` + s.srv.URL + `, model: rollout-sim, top_k: 2}
`
	c := startCollect(t, h.cli, &rolloutv1.CollectStart{
		ConfigYaml: cfg, InitialCredits: 1})
	c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{Count: 1}}})
	c.until("the group", c.settled(1, 0))
	c.drain()

	if len(c.groups) != 1 || len(c.groups[0].Rollouts) != 1 {
		t.Fatalf("groups %v", c.groups)
	}
	ro := c.groups[0].Rollouts[0]
	if ro.Status != "ok" || ro.Reward != 1 || len(ro.Branches) != 1 {
		t.Fatalf("rollout %s %s (%s), reward %v, %d more branches", ro.Status, ro.StopReason, ro.FailureMessage, ro.Reward, len(ro.Branches))
	}
	for i, br := range []*rolloutv1.Rollout{ro, ro.Branches[0]} {
		if len(br.Tokens) == 0 || len(br.Distill) != len(br.Tokens) || len(br.LossMask) != len(br.Tokens) {
			t.Fatalf("branch %d: %d distill positions for %d tokens", i, len(br.Distill), len(br.Tokens))
		}
		trained := 0
		for p, tk := range br.Distill {
			switch {
			case br.LossMask[p] == 1 && (len(tk.GetTokenIds()) != topK || len(tk.GetLogprobs()) != topK):
				t.Fatalf("branch %d trained position %d: teacher %v", i, p, tk)
			case br.LossMask[p] == 0 && len(tk.GetTokenIds()) != 0:
				t.Fatalf("branch %d untrained position %d scored: %v", i, p, tk)
			}
			trained += int(br.LossMask[p])
		}
		if trained == 0 {
			t.Fatalf("branch %d: nothing trained", i)
		}
	}
}
