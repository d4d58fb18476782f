package envservertest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"sync"
)

// NeMoGymOptions shape the resources server's behaviour.
type NeMoGymOptions struct {
	// FailVerify answers /verify with HTTP 500 (a server that fails).
	FailVerify bool
	// NoReward answers /verify without a reward (a protocol violation).
	NoReward bool
}

// The resources server is NeMo Gym's session-state example written
// anew: /seed_session starts a counter at the row's initial_count, the
// tools increment_counter {count} and get_counter_value {} act on this
// session's counter, and /verify rewards 1 when the counter equals the
// row's expected_count.
type nemoGym struct {
	opts     NeMoGymOptions
	mu       sync.Mutex
	counters map[string]int
	calls    map[string]int
}

const sessionCookie = "nemo_gym_session"

// NeMoGymHandler serves the resources-server protocol.
func NeMoGymHandler(opts NeMoGymOptions) http.Handler {
	s := &nemoGym{opts: opts, counters: map[string]int{}, calls: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "healthy"})
	})
	mux.HandleFunc("POST /seed_session", s.seed)
	mux.HandleFunc("POST /increment_counter", s.session(s.increment))
	mux.HandleFunc("POST /get_counter_value", s.session(s.get))
	mux.HandleFunc("POST /verify", s.session(s.verify))
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, openAPI)
	})
	return mux
}

// openAPI declares the routes the way FastAPI does: request bodies by
// reference to components/schemas.
var openAPI = map[string]any{
	"openapi": "3.1.0",
	"paths": map[string]any{
		"/seed_session": map[string]any{"post": map[string]any{"summary": "Seed Session"}},
		"/verify":       map[string]any{"post": map[string]any{"summary": "Verify"}},
		"/increment_counter": map[string]any{"post": map[string]any{"summary": "Increment Counter",
			"requestBody": map[string]any{"content": map[string]any{"application/json": map[string]any{
				"schema": map[string]any{"$ref": "#/components/schemas/IncrementCounterRequest"}}}}}},
		"/get_counter_value": map[string]any{"post": map[string]any{"summary": "Get Counter Value"}},
		"/health":            map[string]any{"get": map[string]any{"summary": "Health"}},
	},
	"components": map[string]any{"schemas": map[string]any{
		"IncrementCounterRequest": map[string]any{"type": "object", "title": "IncrementCounterRequest",
			"properties": map[string]any{"count": map[string]any{"type": "integer", "title": "Count"}}, "required": []string{"count"}},
	}},
}

func (s *nemoGym) seed(w http.ResponseWriter, r *http.Request) {
	var body struct {
		InitialCount *int `json:"initial_count"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.InitialCount == nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": "initial_count: field required"})
		return
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	s.mu.Lock()
	s.counters[id] = *body.InitialCount
	s.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/", HttpOnly: true})
	writeJSON(w, http.StatusOK, map[string]any{})
}

// session resolves the request's session from its cookie.
func (s *nemoGym) session(h func(w http.ResponseWriter, r *http.Request, id string, body []byte)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := r.Cookie(sessionCookie)
		s.mu.Lock()
		_, known := s.counters[valueOf(c, err)]
		s.mu.Unlock()
		if !known {
			writeJSON(w, http.StatusBadRequest, map[string]any{"detail": "no session: call /seed_session first"})
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			return
		}
		h(w, r, c.Value, body)
	}
}

func valueOf(c *http.Cookie, err error) string {
	if err != nil {
		return ""
	}
	return c.Value
}

func (s *nemoGym) increment(w http.ResponseWriter, _ *http.Request, id string, body []byte) {
	var a struct {
		Count *int `json:"count"`
	}
	if err := json.Unmarshal(body, &a); err != nil || a.Count == nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": "count: an integer is required"})
		return
	}
	s.mu.Lock()
	s.counters[id] += *a.Count
	s.calls[id]++
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "server": NeMoGymMarker})
}

func (s *nemoGym) get(w http.ResponseWriter, _ *http.Request, id string, _ []byte) {
	s.mu.Lock()
	n := s.counters[id]
	s.calls[id]++
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"count": n, "server": NeMoGymMarker})
}

func (s *nemoGym) verify(w http.ResponseWriter, _ *http.Request, id string, body []byte) {
	if s.opts.FailVerify {
		http.Error(w, "Internal Server Error", http.StatusInternalServerError)
		return
	}
	var req map[string]any
	if err := json.Unmarshal(body, &req); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": err.Error()})
		return
	}
	resp, _ := req["response"].(map[string]any)
	output, ok := resp["output"].([]any)
	if !ok {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": "response.output: field required"})
		return
	}
	expected, _ := req["expected_count"].(float64)
	s.mu.Lock()
	n, calls := s.counters[id], s.calls[id]
	s.mu.Unlock()
	if s.opts.NoReward {
		writeJSON(w, http.StatusOK, req)
		return
	}
	reward := 0.0
	if float64(n) == expected {
		reward = 1
	}
	out := req
	out["reward"] = reward
	out["reward_components"] = map[string]any{"count_matches": reward}
	out["tool_calls"] = calls
	out["output_items"] = len(output)
	writeJSON(w, http.StatusOK, out)
}
