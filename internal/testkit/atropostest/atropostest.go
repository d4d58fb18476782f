// Package atropostest is a stand-in for the Atropos trajectory API
// (run-api) for the tests of several packages: package atropos's own, and
// the end-to-end tests that run a job with the bridge (server, cmd/rollout).
// It is a test helper: it imports testing and reports through testing.TB.
package atropostest

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// API is a stand-in for Atropos' run-api (atroposlib/api/server.py) on
// a real 127.0.0.1 socket: the trainer endpoints (/register, /batch), the
// env endpoints (/register-env with the "wait for trainer to start" gate,
// /info, /status-env as a GET with a JSON body, /scored_data,
// /scored_data_list, /disconnect-env), request gzip decoding and
// pydantic-like strict validation. Its process state is lost by Restart;
// the test-side records survive. Tests read or seed the exported fields
// with Mu held.
type API struct {
	t    testing.TB
	addr string

	srvMu sync.Mutex
	srv   *http.Server
	wg    sync.WaitGroup

	Mu sync.Mutex
	// Process state (lost on restart).
	Trainer  *Trainer
	Started  bool // the trainer made its first GET /batch: envs may register
	Envs     []Env
	Queue    []ScoredData
	Step     int
	MaxQueue int // most groups ever queued at once
	// Test controls (survive restarts).
	fail   map[string][]int // path -> statuses to answer with, one per request
	always map[string]int   // path -> status to answer every request with
	Strict bool             // 404 on /scored_data for an unknown env_id
	hc     *http.Client     // the trainer's client
	// Records (survive restarts).
	Received      []ScoredData // every accepted group, in order
	ScoredReqs    []ScoredReq
	StatusEnvGets int
	RegisterCalls int
	Disconnected  []int // env ids, in the order of their POST /disconnect-env
}

// Trainer is what the trainer's POST /register set.
type Trainer struct {
	BatchSize   int `json:"batch_size"`
	MaxTokenLen int `json:"max_token_len"`
	NumSteps    int `json:"num_steps"`
}

// Env is one registration (POST /register-env); its env_id is its index.
type Env struct {
	Name      string
	GroupSize int
	MaxLen    int
	Weight    float64
	Connected bool
}

// ScoredReq is one request to /scored_data or /scored_data_list.
type ScoredReq struct {
	Path    string
	Gzipped bool
	Groups  int
	Status  int
}

// ScoredData mirrors the API's ScoredData pydantic model.
type ScoredData struct {
	Tokens            [][]int            `json:"tokens"`
	Masks             [][]int            `json:"masks"`
	Scores            []float64          `json:"scores"`
	Advantages        [][]float64        `json:"advantages"`
	RefLogprobs       [][]float64        `json:"ref_logprobs"`
	Messages          [][]map[string]any `json:"messages"`
	GenerationParams  map[string]any     `json:"generation_params"`
	InferenceLogprobs [][]float64        `json:"inference_logprobs"`
	Overrides         []map[string]any   `json:"overrides"`
	GroupOverrides    map[string]any     `json:"group_overrides"`
	Images            any                `json:"images"`
	EnvID             *int               `json:"env_id"`
}

// New serves a stand-in on 127.0.0.1 until the test ends. No trainer is
// registered yet: use StartTrainer (or TrainerRegister and TrainerBatch).
func New(t testing.TB) *API {
	f := &API{t: t, fail: map[string][]int{}, always: map[string]int{},
		hc: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	f.serve(ln)
	t.Cleanup(f.Stop)
	return f
}

// URL is the API's base URL.
func (f *API) URL() string { return "http://" + f.addr }

func (f *API) serve(ln net.Listener) {
	srv := &http.Server{Handler: f.handler(), ReadHeaderTimeout: 5 * time.Second}
	f.srvMu.Lock()
	f.srv = srv
	f.srvMu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		_ = srv.Serve(ln)
	}()
}

// Stop closes the listener and every connection: the API is unreachable.
func (f *API) Stop() {
	f.srvMu.Lock()
	srv := f.srv
	f.srv = nil
	f.srvMu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
	f.wg.Wait()
}

// Start serves again on the same address.
func (f *API) Start() {
	var ln net.Listener
	var err error
	for range 100 {
		if ln, err = net.Listen("tcp", f.addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		f.t.Fatalf("restart the stand-in on %s: %v", f.addr, err)
	}
	f.serve(ln)
}

// Restart is a new API process: every registration and queued group is
// lost. seed runs on the fresh state before it serves.
func (f *API) Restart(seed func(f *API)) {
	f.Stop()
	f.Mu.Lock()
	f.Trainer, f.Started, f.Envs, f.Queue, f.Step = nil, false, nil, nil, 0
	if seed != nil {
		seed(f)
	}
	f.Mu.Unlock()
	f.Start()
}

// FailNext makes the next len(statuses) requests to path answer with them.
func (f *API) FailNext(path string, statuses ...int) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.fail[path] = append(f.fail[path], statuses...)
}

// FailAll makes every request to path answer status until ClearFail.
func (f *API) FailAll(path string, status int) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.always[path] = status
}

// ClearFail ends the failures FailNext and FailAll set for path.
func (f *API) ClearFail(path string) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	delete(f.fail, path)
	delete(f.always, path)
}

// Snapshot returns the accepted groups and the /scored_data* requests so
// far.
func (f *API) Snapshot() (received []ScoredData, reqs []ScoredReq) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	return append([]ScoredData(nil), f.Received...), append([]ScoredReq(nil), f.ScoredReqs...)
}

func (f *API) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]string{"message": "AtroposLib API"})
	})
	mux.HandleFunc("POST /register", f.register)
	mux.HandleFunc("GET /batch", f.batch)
	mux.HandleFunc("GET /info", f.info)
	mux.HandleFunc("GET /status", f.status)
	mux.HandleFunc("POST /register-env", f.registerEnv)
	mux.HandleFunc("POST /disconnect-env", f.disconnectEnv)
	mux.HandleFunc("GET /status-env", f.statusEnv)
	mux.HandleFunc("POST /scored_data", f.scored)
	mux.HandleFunc("POST /scored_data_list", f.scored)
	return f.injectFailures(gunzipRequests(mux))
}

// injectFailures answers a request with a queued failure status.
func (f *API) injectFailures(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.Mu.Lock()
		status := f.always[r.URL.Path]
		if q := f.fail[r.URL.Path]; status == 0 && len(q) > 0 {
			status, f.fail[r.URL.Path] = q[0], q[1:]
		}
		if status != 0 && strings.HasPrefix(r.URL.Path, "/scored_data") {
			f.ScoredReqs = append(f.ScoredReqs, ScoredReq{Path: r.URL.Path, Gzipped: r.Header.Get("Content-Encoding") == "gzip", Status: status})
		}
		f.Mu.Unlock()
		if status != 0 {
			_, _ = io.Copy(io.Discard, r.Body)
			http.Error(w, fmt.Sprintf(`{"detail":"injected failure %d"}`, status), status)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// gunzipRequests is the API's GZipRequestMiddleware: a gzip body is
// decompressed; invalid gzip is a 400.
func gunzipRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(strings.ToLower(r.Header.Get("Content-Encoding")), "gzip") {
			next.ServeHTTP(w, r)
			return
		}
		zr, err := gzip.NewReader(r.Body)
		var body []byte
		if err == nil {
			body, err = io.ReadAll(zr)
		}
		if err != nil {
			http.Error(w, "Invalid gzip payload", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.Header.Del("Content-Encoding")
		r.Header.Set("X-Was-Gzipped", "1")
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decodeStrict decodes like pydantic with forbidden extras: wrong types or
// unknown keys are a 422.
func decodeStrict(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": err.Error()})
		return false
	}
	return true
}

func (f *API) register(w http.ResponseWriter, r *http.Request) {
	var req struct {
		WandbGroup             string `json:"wandb_group"`
		WandbProject           string `json:"wandb_project"`
		BatchSize              int    `json:"batch_size"`
		MaxTokenLen            int    `json:"max_token_len"`
		CheckpointDir          string `json:"checkpoint_dir"`
		SaveCheckpointInterval int    `json:"save_checkpoint_interval"`
		StartingStep           int    `json:"starting_step"`
		NumSteps               int    `json:"num_steps"`
	}
	if !decodeStrict(w, r, &req) {
		return
	}
	f.Mu.Lock()
	defer f.Mu.Unlock()
	if f.Trainer == nil { // state is initialised only by the first call
		f.Trainer = &Trainer{BatchSize: req.BatchSize, MaxTokenLen: req.MaxTokenLen, NumSteps: req.NumSteps}
		f.Step = req.StartingStep
	}
	writeJSON(w, 200, map[string]any{"uuid": 42})
}

// batch serves the trainer: the first call lets envs register; a batch is
// exactly batch_size sequences taken FIFO.
func (f *API) batch(w http.ResponseWriter, r *http.Request) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	if f.Trainer == nil {
		writeJSON(w, 200, map[string]any{"status": "error", "message": "trainer not registered", "batch": []any{}})
		return
	}
	f.Started = true
	n, k := 0, 0
	for k < len(f.Queue) && n < f.Trainer.BatchSize {
		n += len(f.Queue[k].Tokens)
		k++
	}
	if n != f.Trainer.BatchSize {
		writeJSON(w, 200, map[string]any{"batch": nil})
		return
	}
	b := append([]ScoredData(nil), f.Queue[:k]...)
	f.Queue = f.Queue[k:]
	f.Step++
	writeJSON(w, 200, map[string]any{"batch": b})
}

func (f *API) info(w http.ResponseWriter, r *http.Request) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	if f.Trainer == nil {
		writeJSON(w, 200, map[string]int{"batch_size": -1, "max_token_len": -1})
		return
	}
	writeJSON(w, 200, map[string]int{"batch_size": f.Trainer.BatchSize, "max_token_len": f.Trainer.MaxTokenLen})
}

func (f *API) status(w http.ResponseWriter, r *http.Request) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	writeJSON(w, 200, map[string]int{"current_step": f.Step, "queue_size": len(f.Queue)})
}

func (f *API) registerEnv(w http.ResponseWriter, r *http.Request) {
	var req struct {
		MaxTokenLength     int      `json:"max_token_length"`
		DesiredName        *string  `json:"desired_name"`
		Weight             float64  `json:"weight"`
		GroupSize          int      `json:"group_size"`
		MinBatchAllocation *float64 `json:"min_batch_allocation"`
	}
	if !decodeStrict(w, r, &req) {
		return
	}
	if req.DesiredName == nil {
		writeJSON(w, 422, map[string]string{"detail": "desired_name: none is not an allowed value"})
		return
	}
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.RegisterCalls++
	if !f.Started {
		writeJSON(w, 200, map[string]string{"status": "wait for trainer to start"})
		return
	}
	k := 0
	for _, e := range f.Envs {
		if e.Name == *req.DesiredName {
			k++
		}
	}
	id := len(f.Envs)
	f.Envs = append(f.Envs, Env{Name: *req.DesiredName, GroupSize: req.GroupSize, MaxLen: req.MaxTokenLength, Weight: req.Weight, Connected: true})
	writeJSON(w, 200, map[string]any{
		"status": "success", "env_id": id, "wandb_name": fmt.Sprintf("%s_%d", *req.DesiredName, k),
		"checkpoint_dir": "checkpoints", "starting_step": f.Step, "checkpoint_interval": 10, "num_steps": f.Trainer.NumSteps,
	})
}

func (f *API) disconnectEnv(w http.ResponseWriter, r *http.Request) {
	var req struct {
		EnvID int `json:"env_id"`
	}
	if !decodeStrict(w, r, &req) {
		return
	}
	f.Mu.Lock()
	defer f.Mu.Unlock()
	if req.EnvID >= len(f.Envs) {
		writeJSON(w, 200, map[string]string{"status": "failure", "error": "list index out of range"})
		return
	}
	f.Envs[req.EnvID].Connected = false
	f.Disconnected = append(f.Disconnected, req.EnvID)
	writeJSON(w, 200, map[string]string{"status": "success"})
}

// statusEnv reads its JSON body although it is a GET, as the API does; an
// unknown env_id is FastAPI's 500 for the IndexError.
func (f *API) statusEnv(w http.ResponseWriter, r *http.Request) {
	var req struct {
		EnvID *int `json:"env_id"`
	}
	if !decodeStrict(w, r, &req) {
		return
	}
	if req.EnvID == nil {
		writeJSON(w, 422, map[string]string{"detail": "env_id: field required"})
		return
	}
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.StatusEnvGets++
	id := *req.EnvID
	if f.Trainer == nil || id < 0 || id >= len(f.Envs) { // AttributeError or IndexError
		http.Error(w, "Internal Server Error", http.StatusInternalServerError)
		return
	}
	var total float64
	for _, e := range f.Envs {
		if e.Connected {
			total += float64(e.MaxLen) * math.Max(0, e.Weight)
		}
	}
	me := f.Envs[id]
	maxGroup, self, others := 1, 0, map[int]int{}
	for _, g := range f.Queue {
		n := len(g.Tokens)
		maxGroup = max(maxGroup, n)
		if g.EnvID != nil && *g.EnvID == id {
			self += n
		} else if g.EnvID != nil {
			others[*g.EnvID] += n
		}
	}
	avail := 0
	for _, n := range others {
		avail += (n + maxGroup - 1) / maxGroup * maxGroup
	}
	writeJSON(w, 200, map[string]any{
		"current_step": f.Step, "queue_size": (self + avail) / me.GroupSize, "unallocated_fraction": 1.0,
		"self_queue_size": self / me.GroupSize, "max_group_size": maxGroup,
		"env_weight": math.Max(0.01, float64(me.MaxLen)*me.Weight/total),
	})
}

// scored serves /scored_data (one group) and /scored_data_list.
func (f *API) scored(w http.ResponseWriter, r *http.Request) {
	list := r.URL.Path == "/scored_data_list"
	gz := r.Header.Get("X-Was-Gzipped") == "1"
	var groups []ScoredData
	if list {
		if !decodeStrict(w, r, &groups) {
			return
		}
	} else {
		var g ScoredData
		if !decodeStrict(w, r, &g) {
			return
		}
		groups = []ScoredData{g}
	}
	for _, g := range groups {
		if msg := validateScored(&g); msg != "" {
			writeJSON(w, 422, map[string]string{"detail": msg})
			return
		}
	}
	f.Mu.Lock()
	defer f.Mu.Unlock()
	if f.Trainer == nil { // app.state.queue does not exist yet: AttributeError
		http.Error(w, "Internal Server Error", http.StatusInternalServerError)
		return
	}
	for _, g := range groups {
		if f.Strict && (g.EnvID == nil || *g.EnvID >= len(f.Envs)) {
			writeJSON(w, 404, map[string]string{"detail": "unknown env_id"})
			return
		}
	}
	f.ScoredReqs = append(f.ScoredReqs, ScoredReq{Path: r.URL.Path, Gzipped: gz, Groups: len(groups), Status: 200})
	f.Queue = append(f.Queue, groups...)
	f.MaxQueue = max(f.MaxQueue, len(f.Queue))
	f.Received = append(f.Received, groups...)
	if list {
		writeJSON(w, 200, map[string]any{"status": "received", "groups_processed": len(groups)})
		return
	}
	writeJSON(w, 200, map[string]string{"status": "received"})
}

// validateScored checks what pydantic would (required keys, messages with
// role and content) and the shapes a trainer relies on.
func validateScored(g *ScoredData) string {
	if g.Tokens == nil || g.Masks == nil || g.Scores == nil {
		return "tokens, masks and scores are required"
	}
	if len(g.Masks) != len(g.Tokens) || len(g.Scores) != len(g.Tokens) {
		return "tokens, masks and scores must have one entry per sequence"
	}
	for i := range g.Tokens {
		if len(g.Masks[i]) != len(g.Tokens[i]) {
			return fmt.Sprintf("masks[%d] is not aligned with tokens[%d]", i, i)
		}
	}
	for _, conv := range g.Messages {
		for _, m := range conv {
			if _, ok := m["role"]; !ok {
				return "Message must have 'role' and 'content' fields"
			}
			if _, ok := m["content"]; !ok {
				return "Message must have 'role' and 'content' fields"
			}
		}
	}
	return ""
}

// Trainer-side calls, over HTTP like the real trainer.

// StartTrainer registers a trainer (POST /register) and makes its first
// GET /batch, which opens the gate for envs: batchSize sequences per batch,
// sequences of at most maxTokenLen tokens, numSteps steps.
func (f *API) StartTrainer(t testing.TB, batchSize, maxTokenLen, numSteps int) {
	t.Helper()
	f.TrainerRegister(t, batchSize, maxTokenLen, numSteps)
	f.TrainerBatch(t)
}

// TrainerRegister is the trainer's POST /register.
func (f *API) TrainerRegister(t testing.TB, batchSize, maxTokenLen, numSteps int) {
	t.Helper()
	body := fmt.Sprintf(`{"wandb_group":"g","wandb_project":"p","batch_size":%d,"max_token_len":%d,"checkpoint_dir":"c","save_checkpoint_interval":10,"starting_step":0,"num_steps":%d}`, batchSize, maxTokenLen, numSteps)
	resp, err := f.hc.Post(f.URL()+"/register", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	drain(t, resp, 200)
}

// TrainerBatch is one GET /batch; it returns the number of groups served.
func (f *API) TrainerBatch(t testing.TB) int {
	t.Helper()
	resp, err := f.hc.Get(f.URL() + "/batch")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Batch []ScoredData `json:"batch"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return len(out.Batch)
}

func drain(t testing.TB, resp *http.Response, want int) {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("HTTP %d, want %d: %s", resp.StatusCode, want, b)
	}
}

// WaitReceived waits until the API accepted at least n groups and returns
// them; it fails the test after timeout (a bound on a hang, not a timing
// assertion).
func (f *API) WaitReceived(t testing.TB, n int, timeout time.Duration) []ScoredData {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got, _ := f.Snapshot()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Atropos stand-in received %d groups, want %d", len(got), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Rollout is one successful rollout as a test expects it at the API: its
// token ids, loss mask (1 where trained), sampling logprobs (aligned with
// the tokens) and reward.
type Rollout struct {
	Tokens   []int32
	LossMask []int8
	Logprobs []float32
	Reward   float64
}

// CheckGroups asserts that got holds exactly the groups of want, in any
// order, each with exactly its rollouts, in any order: tokens as they are,
// masks the token id where trained and -100 elsewhere, scores the rewards,
// inference_logprobs the logprobs where trained and 1.0 elsewhere, and
// env_id set.
func CheckGroups(t testing.TB, got []ScoredData, want [][]Rollout) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("the API received %d groups, want %d", len(got), len(want))
	}
	byKey := map[string][]int{}
	for i, g := range got {
		k := groupKey(g.Tokens)
		byKey[k] = append(byKey[k], i)
	}
	for wi, w := range want {
		toks := make([][]int, len(w))
		for i, r := range w {
			toks[i] = ints(r.Tokens)
		}
		idx := byKey[groupKey(toks)]
		if len(idx) != 1 {
			t.Errorf("want group %d (%d rollouts): found %d times at the API", wi, len(w), len(idx))
			continue
		}
		checkGroup(t, wi, got[idx[0]], w)
	}
}

func checkGroup(t testing.TB, wi int, g ScoredData, want []Rollout) {
	t.Helper()
	if g.EnvID == nil {
		t.Errorf("group %d: env_id missing", wi)
	}
	if len(g.Masks) != len(g.Tokens) || len(g.Scores) != len(g.Tokens) || len(g.InferenceLogprobs) != len(g.Tokens) {
		t.Errorf("group %d: %d sequences, %d masks, %d scores, %d inference_logprobs", wi, len(g.Tokens), len(g.Masks), len(g.Scores), len(g.InferenceLogprobs))
		return
	}
	used := make([]bool, len(g.Tokens))
	for ri, r := range want {
		found := false
		why := "no sequence with these tokens"
		for i := range g.Tokens {
			if used[i] {
				continue
			}
			d := sameRollout(g, i, r)
			if d == "" {
				used[i], found = true, true
				break
			}
			if fmt.Sprint(g.Tokens[i]) == fmt.Sprint(ints(r.Tokens)) {
				why = d // the same sequence, with other masks, logprobs or score
			}
		}
		if !found {
			t.Errorf("group %d rollout %d (%d tokens, reward %v): no matching sequence at the API: %s", wi, ri, len(r.Tokens), r.Reward, why)
		}
	}
}

// sameRollout says how sequence i of g differs from r ("" if it does not).
func sameRollout(g ScoredData, i int, r Rollout) string {
	switch {
	case len(g.Tokens[i]) != len(r.Tokens) || len(r.LossMask) != len(r.Tokens) || len(r.Logprobs) != len(r.Tokens):
		return fmt.Sprintf("lengths: %d tokens at the API, want %d (mask %d, logprobs %d)", len(g.Tokens[i]), len(r.Tokens), len(r.LossMask), len(r.Logprobs))
	case g.Scores[i] != r.Reward:
		return fmt.Sprintf("score %v, want %v", g.Scores[i], r.Reward)
	case len(g.Masks[i]) != len(r.Tokens) || len(g.InferenceLogprobs[i]) != len(r.Tokens):
		return "masks or inference_logprobs not aligned with tokens"
	}
	trained := 0
	for k, tok := range r.Tokens {
		wantMask, wantLP := -100, 1.0
		if r.LossMask[k] != 0 {
			wantMask, wantLP = int(tok), float64(r.Logprobs[k])
			trained++
		}
		switch {
		case g.Tokens[i][k] != int(tok):
			return fmt.Sprintf("token %d: %d, want %d", k, g.Tokens[i][k], tok)
		case g.Masks[i][k] != wantMask:
			return fmt.Sprintf("mask %d: %d, want %d", k, g.Masks[i][k], wantMask)
		case math.Abs(g.InferenceLogprobs[i][k]-wantLP) > 1e-6:
			return fmt.Sprintf("inference_logprob %d: %v, want %v", k, g.InferenceLogprobs[i][k], wantLP)
		}
	}
	if trained == 0 {
		return "nothing trained in the expected rollout"
	}
	return ""
}

func ints(xs []int32) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x)
	}
	return out
}

// groupKey identifies a group by the multiset of its token sequences.
func groupKey(seqs [][]int) string {
	ks := make([]string, len(seqs))
	for i, s := range seqs {
		ks[i] = fmt.Sprint(s)
	}
	sort.Strings(ks)
	return strings.Join(ks, "|")
}
