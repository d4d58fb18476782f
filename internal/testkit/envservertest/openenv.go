// Package envservertest holds small env servers written from the
// environment protocols' documents, for the tests of envs/openenv,
// envs/nemogym and the end-to-end suite: an OpenEnv-protocol server (a
// counting game with MCP tools and an action schema) and a NeMo Gym
// resources server (a session counter). cmd/envservertest-server serves
// them; Binary and Image build it for a sandbox.
package envservertest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"
)

// Marker starts every observation and tool result of the test servers, so
// a test can tell that a tool result came from the env server.
const (
	OpenEnvMarker = "openenv-test:"
	NeMoGymMarker = "nemogym-test"
)

// OpenEnvOptions shape the OpenEnv server's behaviour.
type OpenEnvOptions struct {
	// MaxSessions is max_concurrent_envs: a connection past it gets
	// CAPACITY_REACHED and is closed (0: unlimited).
	MaxSessions int
	// StepsToDone: the episode is done after this many accepted steps
	// (default 3).
	StepsToDone int
	// DieAfterSteps closes the connection without an answer on that step
	// (0: never), as a server that dies mid-episode.
	DieAfterSteps int
	// BadJSONAfterSteps answers that step with text that is not JSON.
	BadJSONAfterSteps int
}

// The game: reset(seed) sets a counter to seed mod 10; the tool add(n)
// adds n and rewards 0.25 when n is 1..3 (else a tool error), and after
// StepsToDone accepted steps the episode is done with a final reward of 1.
// The tool peek() shows the counter, rewards nothing and counts as a step.
// In action mode an action {"value": n} is add(n).

type openEnv struct {
	opts   OpenEnvOptions
	active atomic.Int64
}

// OpenEnvHandler serves the OpenEnv protocol: /ws, /health, /schema.
func OpenEnvHandler(opts OpenEnvOptions) http.Handler {
	if opts.StepsToDone == 0 {
		opts.StepsToDone = 3
	}
	s := &openEnv{opts: opts}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "healthy"})
	})
	mux.HandleFunc("GET /schema", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{
			"action": map[string]any{"type": "object", "title": "AddAction",
				"properties": map[string]any{
					"value":    map[string]any{"type": "integer", "description": "how much to add (1 to 3)"},
					"metadata": map[string]any{"type": "object"},
				}, "required": []string{"value"}},
			"observation": map[string]any{"type": "object"},
			"state":       map[string]any{"type": "object"},
		})
	})
	mux.HandleFunc("GET /ws", s.ws)
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

type game struct {
	counter, steps int
	episode        string
	done           bool
}

func (s *openEnv) ws(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx := r.Context()
	send := func(v any) bool {
		b, _ := json.Marshal(v)
		return c.Write(ctx, websocket.MessageText, b) == nil
	}
	errMsg := func(code, msg string) map[string]any {
		return map[string]any{"type": "error", "data": map[string]any{"message": msg, "code": code}}
	}
	if n := s.active.Add(1); s.opts.MaxSessions > 0 && n > int64(s.opts.MaxSessions) {
		s.active.Add(-1)
		send(map[string]any{"type": "error", "data": map[string]any{"message": "server at capacity", "code": "CAPACITY_REACHED",
			"active_sessions": s.opts.MaxSessions, "max_sessions": s.opts.MaxSessions}})
		_ = c.Close(websocket.StatusNormalClosure, "")
		return
	}
	defer s.active.Add(-1)
	var g game
	var mu sync.Mutex
	for {
		_, raw, err := c.Read(ctx)
		if err != nil {
			return
		}
		var m struct {
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			send(errMsg("INVALID_JSON", "Invalid JSON: "+err.Error()))
			continue
		}
		mu.Lock()
		var reply any
		switch m.Type {
		case "reset":
			var d struct {
				Seed      *int   `json:"seed"`
				EpisodeID string `json:"episode_id"`
				Start     *int   `json:"start"`
			}
			_ = json.Unmarshal(m.Data, &d)
			g = game{episode: d.EpisodeID}
			if d.Seed != nil {
				g.counter = *d.Seed % 10
			}
			if d.Start != nil {
				g.counter = *d.Start
			}
			reply = observation(fmt.Sprintf("%s the counter starts at %d; add 1 to 3 with the add tool, %d times", OpenEnvMarker, g.counter, s.opts.StepsToDone), nil, false)
		case "step":
			var kind struct {
				Type string `json:"type"`
			}
			_ = json.Unmarshal(m.Data, &kind)
			if kind.Type == "list_tools" {
				reply = listTools()
				break
			}
			g.steps++
			if s.opts.DieAfterSteps > 0 && g.steps >= s.opts.DieAfterSteps {
				mu.Unlock()
				c.CloseNow()
				return
			}
			if s.opts.BadJSONAfterSteps > 0 && g.steps >= s.opts.BadJSONAfterSteps {
				mu.Unlock()
				_ = c.Write(ctx, websocket.MessageText, []byte("<html>not json"))
				continue
			}
			reply = s.step(&g, m.Data)
		case "state":
			reply = map[string]any{"type": "state", "data": map[string]any{"episode_id": g.episode, "step_count": g.steps}}
		case "close":
			mu.Unlock()
			_ = c.Close(websocket.StatusNormalClosure, "")
			return
		default:
			reply = errMsg("UNKNOWN_TYPE", "Unknown message type: "+m.Type)
		}
		mu.Unlock()
		if !send(reply) {
			return
		}
	}
}

func observation(text string, reward *float64, done bool) map[string]any {
	return map[string]any{"type": "observation", "data": map[string]any{
		"observation": map[string]any{"text": text}, "reward": reward, "done": done}}
}

func toolObservation(tool string, result any, toolErr map[string]any, reward *float64, done bool) map[string]any {
	return map[string]any{"type": "observation", "data": map[string]any{
		"observation": map[string]any{"tool_name": tool, "result": result, "error": toolErr}, "reward": reward, "done": done}}
}

func (s *openEnv) step(g *game, data json.RawMessage) any {
	var a struct {
		Type      string         `json:"type"`
		ToolName  string         `json:"tool_name"`
		Arguments map[string]any `json:"arguments"`
		Value     *json.Number   `json:"value"`
	}
	if err := json.Unmarshal(data, &a); err != nil {
		return map[string]any{"type": "error", "data": map[string]any{"message": "Invalid message", "code": "VALIDATION_ERROR", "errors": []string{err.Error()}}}
	}
	switch a.Type {
	case "list_tools":
		return listTools()
	case "call_tool":
		switch a.ToolName {
		case "add":
			n, ok := intArg(a.Arguments["n"])
			return s.add(g, "add", n, ok, true)
		case "peek":
			return toolObservation("peek", mcpText(fmt.Sprintf("%s counter %d after %d steps", OpenEnvMarker, g.counter, g.steps)), nil, nil, g.done)
		}
		return toolObservation(a.ToolName, nil, map[string]any{"error_type": "tool_not_found", "message": "no tool " + a.ToolName}, nil, g.done)
	case "":
		if a.Value == nil {
			return map[string]any{"type": "error", "data": map[string]any{"message": "Invalid message", "code": "VALIDATION_ERROR", "errors": []string{"value: field required"}}}
		}
		v, err := a.Value.Int64()
		return s.add(g, "", int(v), err == nil, false)
	}
	return map[string]any{"type": "error", "data": map[string]any{"message": "Invalid message", "code": "VALIDATION_ERROR", "errors": []string{"unknown action type " + a.Type}}}
}

func (s *openEnv) add(g *game, tool string, n int, ok, mcp bool) any {
	if !ok || n < 1 || n > 3 {
		msg := fmt.Sprintf("%s n must be an integer from 1 to 3", OpenEnvMarker)
		if mcp {
			return toolObservation(tool, nil, map[string]any{"error_type": "invalid_args", "message": msg}, nil, g.done)
		}
		return map[string]any{"type": "error", "data": map[string]any{"message": msg, "code": "EXECUTION_ERROR"}}
	}
	g.counter += n
	r := 0.25
	if !g.done && g.steps >= s.opts.StepsToDone {
		g.done = true
		r += 1
	}
	text := fmt.Sprintf("%s counter is now %d", OpenEnvMarker, g.counter)
	if g.done {
		text += "; episode done"
	}
	if mcp {
		return toolObservation(tool, mcpText(text), nil, &r, g.done)
	}
	return observation(text, &r, g.done)
}

// mcpText is an MCP tools/call result with one text content.
func mcpText(text string) map[string]any {
	return map[string]any{"content": []any{map[string]any{"type": "text", "text": text}}, "structured_content": nil, "is_error": false}
}

func intArg(v any) (int, bool) {
	f, ok := v.(float64)
	if !ok || f != float64(int(f)) {
		return 0, false
	}
	return int(f), true
}

// listTools is the answer to a list_tools action: the env's MCP tools.
func listTools() map[string]any {
	return map[string]any{"type": "observation", "data": map[string]any{"observation": map[string]any{"tools": []any{
		map[string]any{"name": "add", "description": "Add 1, 2 or 3 to the counter.", "input_schema": map[string]any{
			"type": "object", "properties": map[string]any{"n": map[string]any{"type": "integer"}}, "required": []string{"n"}}},
		map[string]any{"name": "peek", "description": "Show the counter.", "input_schema": map[string]any{"type": "object", "properties": map[string]any{}}},
	}}, "reward": nil, "done": false}}
}
