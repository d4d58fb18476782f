package atropos

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAPI is a stand-in for Atropos' run-api (atroposlib/api/server.py) on
// a real 127.0.0.1 socket: the trainer endpoints (/register, /batch), the
// env endpoints (/register-env with the "wait for trainer to start" gate,
// /info, /status-env as a GET with a JSON body, /scored_data,
// /scored_data_list, /disconnect-env), request gzip decoding and
// pydantic-like strict validation. Its process state is lost by restart();
// the test-side records survive.
type fakeAPI struct {
	t    testing.TB
	addr string

	srvMu sync.Mutex
	srv   *http.Server
	wg    sync.WaitGroup

	mu sync.Mutex
	// Process state (lost on restart).
	trainer  *fakeTrainer
	started  bool
	envs     []fakeEnv
	queue    []scoredData
	step     int
	maxQueue int // most groups ever queued at once
	// Test controls (survive restarts).
	fail   map[string][]int // path -> statuses to answer with, one per request
	always map[string]int   // path -> status to answer every request with
	strict bool             // 404 on /scored_data for an unknown env_id
	hc     *http.Client     // the trainer's client
	// Records (survive restarts).
	received      []scoredData // every accepted group, in order
	scoredReqs    []scoredReq
	statusEnvGets int
	registerCalls int
	disconnected  []int
}

type fakeTrainer struct {
	BatchSize   int `json:"batch_size"`
	MaxTokenLen int `json:"max_token_len"`
	NumSteps    int `json:"num_steps"`
}

type fakeEnv struct {
	name      string
	groupSize int
	maxLen    int
	weight    float64
	connected bool
}

type scoredReq struct {
	path    string
	gzipped bool
	groups  int
	status  int
}

// scoredData mirrors the API's ScoredData pydantic model.
type scoredData struct {
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

func newFakeAPI(t testing.TB) *fakeAPI {
	f := &fakeAPI{t: t, fail: map[string][]int{}, always: map[string]int{},
		hc: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	f.serve(ln)
	t.Cleanup(f.stop)
	return f
}

func (f *fakeAPI) url() string { return "http://" + f.addr }

func (f *fakeAPI) serve(ln net.Listener) {
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

// stop closes the listener and every connection: the API is unreachable.
func (f *fakeAPI) stop() {
	f.srvMu.Lock()
	srv := f.srv
	f.srv = nil
	f.srvMu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
	f.wg.Wait()
}

// start serves again on the same address.
func (f *fakeAPI) start() {
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

// restart is a new API process: every registration and queued group is
// lost. seed runs on the fresh state before it serves.
func (f *fakeAPI) restart(seed func(f *fakeAPI)) {
	f.stop()
	f.mu.Lock()
	f.trainer, f.started, f.envs, f.queue, f.step = nil, false, nil, nil, 0
	if seed != nil {
		seed(f)
	}
	f.mu.Unlock()
	f.start()
}

// failNext makes the next len(statuses) requests to path answer with them.
func (f *fakeAPI) failNext(path string, statuses ...int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[path] = append(f.fail[path], statuses...)
}

// failAll makes every request to path answer status until clearFail.
func (f *fakeAPI) failAll(path string, status int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.always[path] = status
}

func (f *fakeAPI) clearFail(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.fail, path)
	delete(f.always, path)
}

func (f *fakeAPI) snapshot() (received []scoredData, reqs []scoredReq) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]scoredData(nil), f.received...), append([]scoredReq(nil), f.scoredReqs...)
}

func (f *fakeAPI) handler() http.Handler {
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
	mux.HandleFunc("POST /scored_data", f.scoredData)
	mux.HandleFunc("POST /scored_data_list", f.scoredData)
	return f.injectFailures(gunzipRequests(mux))
}

// injectFailures answers a request with a queued failure status.
func (f *fakeAPI) injectFailures(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		status := f.always[r.URL.Path]
		if q := f.fail[r.URL.Path]; status == 0 && len(q) > 0 {
			status, f.fail[r.URL.Path] = q[0], q[1:]
		}
		if status != 0 && strings.HasPrefix(r.URL.Path, "/scored_data") {
			f.scoredReqs = append(f.scoredReqs, scoredReq{path: r.URL.Path, gzipped: r.Header.Get("Content-Encoding") == "gzip", status: status})
		}
		f.mu.Unlock()
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

func (f *fakeAPI) register(w http.ResponseWriter, r *http.Request) {
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
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.trainer == nil { // state is initialised only by the first call
		f.trainer = &fakeTrainer{BatchSize: req.BatchSize, MaxTokenLen: req.MaxTokenLen, NumSteps: req.NumSteps}
		f.step = req.StartingStep
	}
	writeJSON(w, 200, map[string]any{"uuid": 42})
}

// batch serves the trainer: the first call lets envs register; a batch is
// exactly batch_size sequences taken FIFO.
func (f *fakeAPI) batch(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.trainer == nil {
		writeJSON(w, 200, map[string]any{"status": "error", "message": "trainer not registered", "batch": []any{}})
		return
	}
	f.started = true
	n, k := 0, 0
	for k < len(f.queue) && n < f.trainer.BatchSize {
		n += len(f.queue[k].Tokens)
		k++
	}
	if n != f.trainer.BatchSize {
		writeJSON(w, 200, map[string]any{"batch": nil})
		return
	}
	b := append([]scoredData(nil), f.queue[:k]...)
	f.queue = f.queue[k:]
	f.step++
	writeJSON(w, 200, map[string]any{"batch": b})
}

func (f *fakeAPI) info(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.trainer == nil {
		writeJSON(w, 200, map[string]int{"batch_size": -1, "max_token_len": -1})
		return
	}
	writeJSON(w, 200, map[string]int{"batch_size": f.trainer.BatchSize, "max_token_len": f.trainer.MaxTokenLen})
}

func (f *fakeAPI) status(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	writeJSON(w, 200, map[string]int{"current_step": f.step, "queue_size": len(f.queue)})
}

func (f *fakeAPI) registerEnv(w http.ResponseWriter, r *http.Request) {
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
	f.mu.Lock()
	defer f.mu.Unlock()
	f.registerCalls++
	if !f.started {
		writeJSON(w, 200, map[string]string{"status": "wait for trainer to start"})
		return
	}
	k := 0
	for _, e := range f.envs {
		if e.name == *req.DesiredName {
			k++
		}
	}
	id := len(f.envs)
	f.envs = append(f.envs, fakeEnv{name: *req.DesiredName, groupSize: req.GroupSize, maxLen: req.MaxTokenLength, weight: req.Weight, connected: true})
	writeJSON(w, 200, map[string]any{
		"status": "success", "env_id": id, "wandb_name": fmt.Sprintf("%s_%d", *req.DesiredName, k),
		"checkpoint_dir": "checkpoints", "starting_step": f.step, "checkpoint_interval": 10, "num_steps": f.trainer.NumSteps,
	})
}

func (f *fakeAPI) disconnectEnv(w http.ResponseWriter, r *http.Request) {
	var req struct {
		EnvID int `json:"env_id"`
	}
	if !decodeStrict(w, r, &req) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.EnvID >= len(f.envs) {
		writeJSON(w, 200, map[string]string{"status": "failure", "error": "list index out of range"})
		return
	}
	f.envs[req.EnvID].connected = false
	f.disconnected = append(f.disconnected, req.EnvID)
	writeJSON(w, 200, map[string]string{"status": "success"})
}

// statusEnv reads its JSON body although it is a GET, as the API does; an
// unknown env_id is FastAPI's 500 for the IndexError.
func (f *fakeAPI) statusEnv(w http.ResponseWriter, r *http.Request) {
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
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statusEnvGets++
	id := *req.EnvID
	if f.trainer == nil || id < 0 || id >= len(f.envs) { // AttributeError or IndexError
		http.Error(w, "Internal Server Error", http.StatusInternalServerError)
		return
	}
	var total float64
	for _, e := range f.envs {
		if e.connected {
			total += float64(e.maxLen) * math.Max(0, e.weight)
		}
	}
	me := f.envs[id]
	maxGroup, self, others := 1, 0, map[int]int{}
	for _, g := range f.queue {
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
		"current_step": f.step, "queue_size": (self + avail) / me.groupSize, "unallocated_fraction": 1.0,
		"self_queue_size": self / me.groupSize, "max_group_size": maxGroup,
		"env_weight": math.Max(0.01, float64(me.maxLen)*me.weight/total),
	})
}

// scoredData serves /scored_data (one group) and /scored_data_list.
func (f *fakeAPI) scoredData(w http.ResponseWriter, r *http.Request) {
	list := r.URL.Path == "/scored_data_list"
	gz := r.Header.Get("X-Was-Gzipped") == "1"
	var groups []scoredData
	if list {
		if !decodeStrict(w, r, &groups) {
			return
		}
	} else {
		var g scoredData
		if !decodeStrict(w, r, &g) {
			return
		}
		groups = []scoredData{g}
	}
	for _, g := range groups {
		if msg := validateScored(&g); msg != "" {
			writeJSON(w, 422, map[string]string{"detail": msg})
			return
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.trainer == nil { // app.state.queue does not exist yet: AttributeError
		http.Error(w, "Internal Server Error", http.StatusInternalServerError)
		return
	}
	for _, g := range groups {
		if f.strict && (g.EnvID == nil || *g.EnvID >= len(f.envs)) {
			writeJSON(w, 404, map[string]string{"detail": "unknown env_id"})
			return
		}
	}
	f.scoredReqs = append(f.scoredReqs, scoredReq{path: r.URL.Path, gzipped: gz, groups: len(groups), status: 200})
	f.queue = append(f.queue, groups...)
	f.maxQueue = max(f.maxQueue, len(f.queue))
	f.received = append(f.received, groups...)
	if list {
		writeJSON(w, 200, map[string]any{"status": "received", "groups_processed": len(groups)})
		return
	}
	writeJSON(w, 200, map[string]string{"status": "received"})
}

// validateScored checks what pydantic would (required keys, messages with
// role and content) and the shapes a trainer relies on.
func validateScored(g *scoredData) string {
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

func (f *fakeAPI) trainerRegister(t testing.TB, batchSize, maxTokenLen, numSteps int) {
	t.Helper()
	body := fmt.Sprintf(`{"wandb_group":"g","wandb_project":"p","batch_size":%d,"max_token_len":%d,"checkpoint_dir":"c","save_checkpoint_interval":10,"starting_step":0,"num_steps":%d}`, batchSize, maxTokenLen, numSteps)
	resp, err := f.hc.Post(f.url()+"/register", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	drain(t, resp, 200)
}

// trainerBatch is one GET /batch; it returns the number of groups served.
func (f *fakeAPI) trainerBatch(t testing.TB) int {
	t.Helper()
	resp, err := f.hc.Get(f.url() + "/batch")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Batch []scoredData `json:"batch"`
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
