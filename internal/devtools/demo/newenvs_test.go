package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/trajectory"
)

// task-suite: the shipped Terminal-Bench-format tasks as a training
// dataset (`rollout run`, split train by the task-id hash), task images
// built FROM the bookworm base, each task's own tests as the reward. The
// policy follows the reference solutions, so every rollout scores 1; only
// train-split tasks may appear.
func TestTaskSuiteEndToEnd(t *testing.T) {
	needImages(t, true)
	specs := []Spec{{Env: "task-suite", Groups: 2, GroupSize: 2}}
	res, err := Run(context.Background(), Options{SandboxInstance: testInstance(), Out: t.TempDir(), Specs: specs, Seed: 5,
		SuccessProb: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	recs := readRun(t, res[0].Dir)
	checkRecords(t, recs, 2, 2)
	for _, rec := range recs {
		if envs.TaskSplit(rec.ItemID, 0.2) != "train" {
			t.Errorf("item %s is not in the train split", rec.ItemID)
		}
		if rec.Status != trajectory.StatusOK || rec.Reward != 1 || rec.RewardComponents["reward_file"] != 1 {
			t.Errorf("%s rollout %d: status %s reward %v failure %+v components %v", rec.ItemID, rec.RolloutIndex,
				rec.Status, rec.Reward, rec.Failure, rec.RewardComponents)
		}
	}
	if _, err := os.Stat(filepath.Join(res[0].Dir, "eval", "metrics.json")); err == nil {
		t.Error("task-suite ran as an evaluation; want training collection")
	}
	assertNoContainers(t)
}

// webCorpus serves a searxng-style search API over a few HTML pages, on
// loopback: the web tools' only network in this test.
type webCorpus struct {
	srv            *httptest.Server
	searches, gets atomic.Int64
	pages          map[string]string // path → html
	titles         map[string]string
}

func startWebCorpus(t *testing.T) *webCorpus {
	t.Helper()
	w := &webCorpus{pages: map[string]string{
		"/wiki/orrin": "<html><head><title>Orrin</title></head><body><p>Orrin is a market town founded in <b>1187</b>.</p><script>x=1</script></body></html>",
		"/wiki/varn":  "<html><head><title>Lake Varn</title></head><body><p>Lake Varn has a maximum depth of 212 metres.</p></body></html>",
	}, titles: map[string]string{"/wiki/orrin": "Orrin", "/wiki/varn": "Lake Varn"}}
	mux := http.NewServeMux()
	mux.HandleFunc("/search", func(rw http.ResponseWriter, r *http.Request) {
		w.searches.Add(1)
		q := strings.ToLower(r.URL.Query().Get("q"))
		var res []map[string]string
		for p, title := range w.titles {
			if strings.Contains(q, strings.ToLower(strings.Fields(title)[len(strings.Fields(title))-1])) {
				res = append(res, map[string]string{"url": w.srv.URL + p, "title": title, "content": title + " article"})
			}
		}
		_ = json.NewEncoder(rw).Encode(map[string]any{"results": res})
	})
	mux.HandleFunc("/wiki/", func(rw http.ResponseWriter, r *http.Request) {
		w.gets.Add(1)
		body, ok := w.pages[r.URL.Path]
		if !ok {
			http.NotFound(rw, r)
			return
		}
		rw.Header().Set("Content-Type", "text/html")
		fmt.Fprint(rw, body)
	})
	w.srv = httptest.NewServer(mux)
	t.Cleanup(w.srv.Close)
	return w
}

// web-research with the searxng provider against the test's own loopback
// corpus: the simulated policy searches, extracts the page (HTML → text
// on the host) and answers; exact match scores it. SuccessProb 0.5 gives
// right and wrong answers: a rollout scores 1 exactly when its final
// answer is the reference.
func TestWebResearchEndToEnd(t *testing.T) {
	w := startWebCorpus(t)
	dir := t.TempDir()
	rows := []map[string]any{
		{"id": "orrin", "question": "In what year was Orrin founded?", "answer": "1187", "split": "train",
			"solution": map[string]any{
				"steps": []any{
					map[string]any{"tool_calls": []any{map[string]any{"name": "web_search", "arguments": map[string]any{"query": "Orrin founded"}}}},
					map[string]any{"tool_calls": []any{map[string]any{"name": "web_extract", "arguments": map[string]any{"urls": []string{w.srv.URL + "/wiki/orrin"}}}}},
					map[string]any{"final": "Answer: 1187"}},
				"wrong": []any{map[string]any{"final": "Answer: 1178"}}}},
		{"id": "varn", "question": "How deep is Lake Varn in metres?", "answer": []string{"212", "212 m"}, "split": "train",
			"solution": map[string]any{
				"steps": []any{
					map[string]any{"tool_calls": []any{map[string]any{"name": "web_search", "arguments": map[string]any{"query": "Lake Varn"}}}},
					map[string]any{"tool_calls": []any{map[string]any{"name": "web_extract", "arguments": map[string]any{"urls": []string{w.srv.URL + "/wiki/varn"}}}}},
					map[string]any{"final": "It is deep.\nAnswer: 212 m"}},
				"wrong": []any{map[string]any{"final": "Answer: 221"}}}},
	}
	var jl strings.Builder
	for _, r := range rows {
		b, _ := json.Marshal(r)
		jl.Write(append(b, '\n'))
	}
	ds := filepath.Join(dir, "q.jsonl")
	if err := os.WriteFile(ds, []byte(jl.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("web: {provider: searxng, url: %q, allow_private: true}\ndataset: {path: %q}\n", w.srv.URL, ds)
	specs := []Spec{{Env: "web-research", Groups: 2, GroupSize: 4, EnvConfig: cfg}}
	res, err := Run(context.Background(), Options{Out: dir, Specs: specs, Seed: 11, SuccessProb: 0.5, Logger: quiet})
	if err != nil {
		if len(res) == 1 {
			for _, rec := range readRun(t, res[0].Dir) {
				t.Logf("%s: %s %+v", rec.ItemID, rec.Status, rec.Failure)
			}
		}
		t.Fatal(err)
	}
	recs := readRun(t, res[0].Dir)
	checkRecords(t, recs, 2, 4)
	var right, wrong int
	for _, rec := range recs {
		if rec.Status != trajectory.StatusOK {
			t.Fatalf("%s rollout %d: %s %+v", rec.ItemID, rec.RolloutIndex, rec.Status, rec.Failure)
		}
		solved := strings.Contains(rec.Messages, "Answer: 1187") || strings.Contains(rec.Messages, "Answer: 212 m")
		if (rec.Reward == 1) != solved {
			t.Errorf("%s rollout %d: reward %v, solved %v", rec.ItemID, rec.RolloutIndex, rec.Reward, solved)
		}
		if solved {
			right++
			// The page text reached the model through web_extract.
			if !strings.Contains(rec.Messages, "founded in 1187") && !strings.Contains(rec.Messages, "maximum depth of 212 metres") {
				t.Errorf("%s: extracted page text missing from the transcript", rec.ItemID)
			}
			if strings.Contains(rec.Messages, "x=1") {
				t.Errorf("%s: script text leaked into the extraction", rec.ItemID)
			}
		} else {
			wrong++
		}
	}
	if right == 0 || wrong == 0 {
		t.Errorf("want both outcomes at success 0.5: %d right, %d wrong", right, wrong)
	}
	if w.searches.Load() == 0 || w.gets.Load() == 0 {
		t.Errorf("the corpus server saw %d searches and %d page fetches", w.searches.Load(), w.gets.Load())
	}
	t.Logf("web-research: %d right, %d wrong, %d searches, %d fetches", right, wrong, w.searches.Load(), w.gets.Load())
}
