package capture

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/gateway"
	"github.com/rollout-rl/rollout/gateway/doorkit"
	"github.com/rollout-rl/rollout/internal/util/version"
)

// SessionPrefix is the ServeMux pattern fragment every session route
// lives under: a harness's OpenAI base URL is http://host/s/<id>/v1.
const SessionPrefix = "/s/{session}"

// Server timeouts: a harness's request headers arrive at once; a
// generation may take minutes, so there is no write timeout.
const (
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 2 * time.Minute
)

// Handler serves doors under /s/{session}, plus per session /v1/models
// (OpenAI's list, or Anthropic's when the request carries an
// anthropic-version header) and the probes harnesses make at start:
// /props (llama.cpp's shape: the context window as
// default_generation_settings.n_ctx), /version and /health, each also
// under /v1. Doors must not register /v1/models themselves. Request
// bodies are limited to Options.MaxBodyBytes.
func Handler(g *Gateway, doors []gateway.FrontDoor) http.Handler {
	mux := http.NewServeMux()
	for _, d := range doors {
		d.Mount(mux, SessionPrefix, g)
	}
	for _, base := range []string{SessionPrefix, SessionPrefix + "/v1"} {
		mux.HandleFunc("GET "+base+"/models", g.serveModels)
		mux.HandleFunc("GET "+base+"/props", g.serveProps)
		mux.HandleFunc("GET "+base+"/version", g.serveVersion)
		mux.HandleFunc("GET "+base+"/health", g.serveHealth)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, http.StatusNotFound, "not_found_error", "no route "+r.Method+" "+r.URL.Path+" (a session's base URL is /s/<session>/v1)")
	})
	limit := g.opts.MaxBodyBytes
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		mux.ServeHTTP(w, r)
	})
}

// ServeSession serves connections from l (a sandbox's tunnel) so that
// they reach only the session: paths under /s/<session>/ and bare paths
// (/v1/chat/completions is taken as the session's), nothing under another
// session's prefix. It returns when l is closed or the session is closed
// (then with http.ErrServerClosed).
func (g *Gateway) ServeSession(l net.Listener, session string) error {
	s, err := g.session(session)
	if err != nil {
		return err
	}
	h := Handler(g, g.opts.Doors)
	own := "/s/" + session + "/"
	srv := &http.Server{
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          nil,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p := r.URL.Path
			switch {
			case strings.HasPrefix(p, own):
			case strings.HasPrefix(p, "/s/"):
				writeError(w, r, http.StatusNotFound, "not_found_error", "no such session on this connection")
				return
			default:
				r.URL.Path = own + strings.TrimPrefix(p, "/")
				r.URL.RawPath = ""
			}
			h.ServeHTTP(w, r)
		}),
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return gateway.Errorf(gateway.ErrSession, "", "the session is closed")
	}
	s.servers = append(s.servers, srv)
	s.mu.Unlock()
	return srv.Serve(l)
}

func (g *Gateway) serveModels(w http.ResponseWriter, r *http.Request) {
	models, err := g.Models(r.Context(), r.PathValue("session"))
	if err != nil {
		writeKind(w, r, err)
		return
	}
	if r.Header.Get("anthropic-version") != "" {
		type am struct {
			Type        string `json:"type"`
			ID          string `json:"id"`
			DisplayName string `json:"display_name"`
			CreatedAt   string `json:"created_at"`
		}
		out := struct {
			Data    []am   `json:"data"`
			HasMore bool   `json:"has_more"`
			FirstID string `json:"first_id"`
			LastID  string `json:"last_id"`
		}{Data: []am{}}
		for _, m := range models {
			out.Data = append(out.Data, am{Type: "model", ID: m.ID, DisplayName: m.ID, CreatedAt: "1970-01-01T00:00:00Z"})
		}
		if len(models) > 0 {
			out.FirstID, out.LastID = models[0].ID, models[len(models)-1].ID
		}
		doorkit.WriteJSON(w, http.StatusOK, out)
		return
	}
	type om struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		// vLLM's and OpenRouter's names for the context window; omitted
		// when the engine does not say.
		MaxModelLen   int `json:"max_model_len,omitempty"`
		ContextLength int `json:"context_length,omitempty"`
	}
	out := struct {
		Object string `json:"object"`
		Data   []om   `json:"data"`
	}{Object: "list", Data: []om{}}
	for _, m := range models {
		out.Data = append(out.Data, om{ID: m.ID, Object: "model", OwnedBy: m.OwnedBy, MaxModelLen: m.ContextLength, ContextLength: m.ContextLength})
	}
	doorkit.WriteJSON(w, http.StatusOK, out)
}

// serveProps answers llama.cpp's /props with what applies: the context
// window one request may use and the served model.
func (g *Gateway) serveProps(w http.ResponseWriter, r *http.Request) {
	models, err := g.Models(r.Context(), r.PathValue("session"))
	if err != nil {
		writeKind(w, r, err)
		return
	}
	if len(models) == 0 || models[0].ContextLength == 0 {
		writeError(w, r, http.StatusNotFound, "not_found_error", "the engine reports no context window")
		return
	}
	doorkit.WriteJSON(w, http.StatusOK, map[string]any{
		"default_generation_settings": map[string]any{"n_ctx": models[0].ContextLength},
		"total_slots":                 1,
		"model_alias":                 models[0].ID,
	})
}

func (g *Gateway) serveVersion(w http.ResponseWriter, r *http.Request) {
	if _, err := g.session(r.PathValue("session")); err != nil {
		writeKind(w, r, err)
		return
	}
	doorkit.WriteJSON(w, http.StatusOK, map[string]string{"version": version.Get().Version})
}

func (g *Gateway) serveHealth(w http.ResponseWriter, r *http.Request) {
	if _, err := g.session(r.PathValue("session")); err != nil {
		writeKind(w, r, err)
		return
	}
	doorkit.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// writeKind writes a gateway error from the probes, in the caller's API
// shape.
func writeKind(w http.ResponseWriter, r *http.Request, err error) {
	status, typ := http.StatusInternalServerError, "server_error"
	switch kind := gateway.KindOf(err); {
	case errors.Is(kind, gateway.ErrSession):
		status, typ = http.StatusNotFound, "not_found_error"
	case errors.Is(kind, gateway.ErrOverloaded):
		status, typ = http.StatusServiceUnavailable, "overloaded_error"
	}
	writeError(w, r, status, typ, err.Error())
}

// writeError writes OpenAI's error shape, or Anthropic's when the request
// carries an anthropic-version header.
func writeError(w http.ResponseWriter, r *http.Request, status int, typ, msg string) {
	if r.Header.Get("anthropic-version") != "" {
		doorkit.WriteJSON(w, status, map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
		return
	}
	doorkit.WriteJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": nil}})
}
