package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/testkit/llamacpptest"
	"github.com/rollout-rl/rollout/internal/testkit/simtest"
	"github.com/rollout-rl/rollout/runner"
	"github.com/rollout-rl/rollout/trajectory"
)

// gatewayRig is a standalone gateway served as `rollout gateway` serves
// it (RunGateway: gRPC with a bearer token, the front doors over HTTP) and
// a client of its session API.
type gatewayRig struct {
	gs     *GatewayServer
	client rolloutv1.GatewayServiceClient
	conn   *Client
	dir    string
	stop   func() error // shuts the gateway down, returns RunGateway's error
}

const gatewayToken = "gw-test-token"

func startGateway(t *testing.T, cfg runner.Config, opts GatewayOptions) *gatewayRig {
	t.Helper()
	return startGatewayTLS(t, cfg, opts, nil)
}

// startGatewayTLS is startGateway with the front doors over HTTPS when
// httpTLS is set.
func startGatewayTLS(t *testing.T, cfg runner.Config, opts GatewayOptions, httpTLS *tls.Config) *gatewayRig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Output.Dir == "" {
		cfg.Output.Dir = t.TempDir()
	}
	opts.BaseURL = "http://" + hl.Addr().String()
	if httpTLS != nil {
		opts.BaseURL = "https://" + hl.Addr().String()
	}
	gs, err := NewGatewayServer(ctx, cfg, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- RunGateway(ctx, gs, GatewayRunOptions{HTTPListener: hl, HTTPTLS: httpTLS,
			RunOptions: RunOptions{Transport: Transport{Token: gatewayToken}, Listener: gl, DrainTimeout: time.Minute}})
	}()
	conn, err := Dial(ClientOptions{Addr: gl.Addr().String(), Token: gatewayToken})
	if err != nil {
		t.Fatal(err)
	}
	r := &gatewayRig{gs: gs, client: rolloutv1.NewGatewayServiceClient(conn.Conn), conn: conn, dir: cfg.Output.Dir}
	r.stop = sync.OnceValue(func() error {
		cancel()
		err := <-done
		conn.Close()
		return err
	})
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("RunGateway: %v", err)
		}
	})
	return r
}

// chatHarness is a small scripted OpenAI-Chat harness: it echoes each
// reply as returned, answers each tool call with a tool result, and
// otherwise asks the model to continue.
type chatHarness struct {
	base, key, model string
	msgs             []map[string]any
	tools            []map[string]any
	toolResults      int
}

var lsTool = []map[string]any{{"type": "function", "function": map[string]any{"name": "terminal", "description": "Run a shell command",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"command": map[string]any{"type": "string"}}, "required": []string{"command"}}}}}

func newChatHarness(base, key, model, task string) *chatHarness {
	return &chatHarness{base: base, key: key, model: model, tools: lsTool,
		msgs: []map[string]any{{"role": "system", "content": "You are a terminal agent."}, {"role": "user", "content": task}}}
}

// step makes one call; it returns the finish reason.
func (h *chatHarness) step(t *testing.T) string {
	t.Helper()
	body := map[string]any{"messages": h.msgs, "tools": h.tools, "max_tokens": 128}
	if h.model != "" {
		body["model"] = h.model
	}
	status, raw := h.post(t, body)
	if status != http.StatusOK {
		t.Fatalf("chat completions: %d %s", status, raw)
	}
	var out struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
			Message      struct {
				Content   *string          `json:"content"`
				ToolCalls []map[string]any `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("reply %s: %v", raw, err)
	}
	m := out.Choices[0].Message
	echo := map[string]any{"role": "assistant", "content": m.Content}
	if len(m.ToolCalls) > 0 {
		echo["tool_calls"] = m.ToolCalls
	}
	h.msgs = append(h.msgs, echo)
	for _, tc := range m.ToolCalls {
		h.msgs = append(h.msgs, map[string]any{"role": "tool", "tool_call_id": tc["id"], "content": "answer.txt\nnotes.md"})
		h.toolResults++
	}
	if len(m.ToolCalls) == 0 {
		h.msgs = append(h.msgs, map[string]any{"role": "user", "content": "Continue: list the files."})
	}
	return out.Choices[0].FinishReason
}

func (h *chatHarness) post(t *testing.T, body any) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, h.base+"/chat/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+h.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// callGrammar makes llama-server's tiny random model answer each turn
// with a well-formed Hermes tool call (its command random): the harness
// then always has a tool result to send. A grammar constrains sampling,
// not the logprobs llama-server reports (the raw model's), so the trained
// ids still re-score.
const callGrammar = `root ::= "<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"" [a-z]{1,6} "\"}}\n</tool_call>"`

// TestGatewayRealEngine runs the standalone gateway against llama.cpp's
// llama-server (the tiny random Qwen3 held to tool calls by a grammar, a
// fixed seed):
// a group of G=2 sessions opened over gRPC, each driven by a scripted
// OpenAI-Chat harness over HTTP until it has answered a tool call with a
// result, closed and scored over gRPC; the group arrives on
// WatchSessionGroups and in the run directory's Parquet rows, identical,
// with the caller's rewards, GRPO advantages, the session ids and
// branches; each row's prompt is the server's own rendering of the first
// call, and its trained ids re-score against the server.
func TestGatewayRealEngine(t *testing.T) {
	e := llamacpptest.Start(t, llamacpptest.Options{Slots: 1, Ctx: 8192, Threads: 1})
	vocab := llamacpptest.NVocab(t, e)
	one, seed := 1.0, int64(11)
	cfg := runner.Config{GroupSize: 2, Parser: "hermes", ReasoningParser: "qwen3",
		Inference: inference.Config{Backend: inference.BackendLlamaCpp, Endpoints: []string{e.URL}, Retries: -1},
		Sampling: inference.Sampling{Temperature: &one, Seed: &seed, MaxTokens: 128,
			ExtraBody: map[string]any{"grammar": callGrammar}}}
	r := startGateway(t, cfg, GatewayOptions{})
	ctx := context.Background()

	watch, err := r.client.WatchSessionGroups(ctx, &rolloutv1.WatchSessionGroupsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := r.client.OpenSession(ctx, &rolloutv1.OpenSessionRequest{ItemId: "item-1", Metadata: map[string]string{"category": "ls"}})
	if err != nil {
		t.Fatal(err)
	}
	second, err := r.client.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: first.GroupId})
	if err != nil {
		t.Fatal(err)
	}
	if first.Index != 0 || second.Index != 1 || first.ApiKey == "" || first.SessionId == second.SessionId {
		t.Fatalf("sessions %+v %+v", first, second)
	}
	if _, err := r.client.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: first.GroupId}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a third session in a group of 2: %v, want FailedPrecondition", err)
	}
	// The harness learns the model as real ones do: the session's /v1/models.
	model := sessionModel(t, first.OpenaiBaseUrl)
	rewardOf := map[string]float64{first.SessionId: 1, second.SessionId: 0.25}
	firstPrompt := map[string][]map[string]any{}
	for _, s := range []*rolloutv1.OpenSessionResponse{first, second} {
		task := []string{"List the files in the working directory.", "Show what is in /tmp."}[s.Index]
		h := newChatHarness(s.OpenaiBaseUrl, s.ApiKey, model, task)
		firstPrompt[s.SessionId] = slices.Clone(h.msgs)
		for i := 0; i < 12 && (h.toolResults == 0 || i < 3); i++ {
			h.step(t)
		}
		if h.toolResults == 0 {
			t.Fatalf("session %d: no well-formed tool call in 12 calls (the seeded model should make one)", s.Index)
		}
		if _, err := r.client.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: s.SessionId, Reward: 1}); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("score before close: %v, want FailedPrecondition", err)
		}
		cl, err := r.client.CloseSession(ctx, &rolloutv1.CloseSessionRequest{SessionId: s.SessionId})
		if err != nil {
			t.Fatal(err)
		}
		sum := cl.Summary
		if sum.Status != "closed" || sum.Calls < 3 || sum.AnsweredCalls != sum.Calls || len(sum.Branches) != 1 || sum.CompletionTokens == 0 || sum.Branches[0].TrainedTokens == 0 {
			t.Fatalf("summary %+v", sum)
		}
		if _, err := r.client.CloseSession(ctx, &rolloutv1.CloseSessionRequest{SessionId: s.SessionId}); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("second close: %v, want FailedPrecondition", err)
		}
		if code, raw := h.post(t, map[string]any{"model": model, "messages": h.msgs}); code != http.StatusNotFound {
			t.Fatalf("a call after close: %d %s", code, raw)
		}
		sc, err := r.client.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: s.SessionId, Reward: rewardOf[s.SessionId], Metrics: map[string]float64{"files": 2}})
		if err != nil {
			t.Fatal(err)
		}
		if want := int32(1 - s.Index); sc.Pending != want {
			t.Fatalf("pending %d after scoring session %d, want %d", sc.Pending, s.Index, want)
		}
	}
	if _, err := r.client.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: first.SessionId, Reward: 1}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("double score: %v, want FailedPrecondition", err)
	}
	msg, err := watch.Recv()
	if err != nil {
		t.Fatal(err)
	}
	g := msg.Group
	if g.GroupId != first.GroupId || g.ItemId != "item-1" || g.Category != "ls" || g.Env != "gateway" || len(g.Rollouts) != 2 || g.Sequence == nil {
		t.Fatalf("group %s item %s category %s env %s, %d rollouts", g.GroupId, g.ItemId, g.Category, g.Env, len(g.Rollouts))
	}
	if math.Abs(g.Mean-0.625) > 1e-9 || g.Rollouts[0].Advantage == nil || *g.Rollouts[0].Advantage <= 0 || *g.Rollouts[1].Advantage >= 0 {
		t.Fatalf("mean %v, advantages %v %v", g.Mean, g.Rollouts[0].Advantage, g.Rollouts[1].Advantage)
	}

	run, err := trajectory.Open(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	var rows []trajectory.Record
	if err := run.Each(ctx, func(rec *trajectory.Record) error { rows = append(rows, *rec); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2", len(rows))
	}
	checked := 0
	for _, row := range rows {
		pr := g.Rollouts[row.RolloutIndex]
		sid := []string{first.SessionId, second.SessionId}[row.RolloutIndex]
		if row.SessionID != sid || pr.SessionId != sid || row.Branch != 0 || row.ParentBranch != -1 || row.Status != trajectory.StatusOK || row.GroupID != g.GroupId {
			t.Fatalf("row %d: session %s branch %d parent %d status %s", row.RolloutIndex, row.SessionID, row.Branch, row.ParentBranch, row.Status)
		}
		if row.Reward != rewardOf[sid] || row.RewardComponents["files"] != 2 || row.Advantage == nil || *row.Advantage != *pr.Advantage {
			t.Fatalf("row %d: reward %v components %v advantage %v (stream %v)", row.RolloutIndex, row.Reward, row.RewardComponents, row.Advantage, pr.Advantage)
		}
		if row.StopReason != string(runner.StopSessionClosed) || row.Calls == "" {
			t.Fatalf("row %d: stop reason %q, calls %q", row.RolloutIndex, row.StopReason, row.Calls)
		}
		if !slices.Equal(row.Tokens, pr.Tokens) || len(row.LossMask) != len(row.Tokens) || len(row.Logprobs) != len(row.Tokens) {
			t.Fatalf("row %d: the Parquet tokens differ from the stream's", row.RolloutIndex)
		}
		// The prompt is the server's own rendering of the first call.
		var tmpl struct {
			Prompt string `json:"prompt"`
		}
		e.MustCall(t, "/apply-template", map[string]any{"messages": firstPrompt[sid], "tools": lsTool}, &tmpl)
		want := e.Tokenize(t, tmpl.Prompt)
		if int(row.PromptTokens) != len(want) || !slices.Equal(toInts(row.Tokens[:row.PromptTokens]), want) {
			t.Fatalf("row %d: prompt ids (%d) are not the server's rendering of the first call (%d)", row.RolloutIndex, row.PromptTokens, len(want))
		}
		// Trained ids re-score against the server: they are what it sampled.
		for j, m := range row.LossMask {
			if m == 1 && j%4 == 0 {
				want := llamacpptest.Rescore(t, e, vocab, row.Tokens[:j], row.Tokens[j])
				if got := float64(row.Logprobs[j]); math.Abs(got-want) > 0.15 {
					t.Fatalf("row %d position %d: recorded logprob %.4f, the server's %.4f", row.RolloutIndex, j, got, want)
				}
				checked++
			}
		}
	}
	if checked == 0 {
		t.Fatal("nothing re-scored")
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("group %s: %d + %d tokens, %d trained ids re-scored", g.GroupId, len(rows[0].Tokens), len(rows[1].Tokens), checked)
}

func sessionModel(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var models struct {
		Data []struct {
			ID            string `json:"id"`
			ContextLength int    `json:"context_length"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&models); err != nil || len(models.Data) == 0 || models.Data[0].ContextLength != 8192 {
		t.Fatalf("/v1/models: %+v, %v (want the engine's model with its 8192-token context)", models, err)
	}
	return models.Data[0].ID
}

func toInts(ids []int32) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out
}

// TestGatewaySessionLifecycle covers the session API's errors, the idle
// expiry and the shutdown against the simulator (tokens mode): an unknown
// session is NOT_FOUND, a call without the token UNAUTHENTICATED, the
// open-session limit RESOURCE_EXHAUSTED; an idle session expires and is
// recorded failed (session_expired) in its written group, next to its
// scored sibling, whose advantage is computed over the ok rollouts only;
// at shutdown an open session and a closed unscored one are recorded the
// same way and their group is written.
func TestGatewaySessionLifecycle(t *testing.T) {
	srv := simtest.Start(t, sim.Config{Family: "hermes"})
	cfg := runner.Config{GroupSize: 2, Parser: "hermes",
		Inference: inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, Retries: -1}}
	r := startGateway(t, cfg, GatewayOptions{IdleTimeout: 2 * time.Second, MaxSessions: 2})
	ctx := context.Background()

	noAuth, err := Dial(ClientOptions{Addr: r.conn.Conn.Target()})
	if err != nil {
		t.Fatal(err)
	}
	defer noAuth.Close()
	if _, err := rolloutv1.NewGatewayServiceClient(noAuth.Conn).OpenSession(ctx, &rolloutv1.OpenSessionRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v, want Unauthenticated", err)
	}
	for _, c := range []struct {
		name string
		err  error
		code codes.Code
	}{
		{"close unknown", second(r.client.CloseSession(ctx, &rolloutv1.CloseSessionRequest{SessionId: "nope"})), codes.NotFound},
		{"score unknown", second(r.client.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: "nope"})), codes.NotFound},
		{"bad group id", second(r.client.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: "a/b"})), codes.InvalidArgument},
		{"nan reward", second(r.client.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: "x", Reward: math.NaN()})), codes.InvalidArgument},
	} {
		if status.Code(c.err) != c.code {
			t.Errorf("%s: %v, want %s", c.name, c.err, c.code)
		}
	}

	a, err := r.client.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: "g1"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.client.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: "g1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.OpenSession(ctx, &rolloutv1.OpenSessionRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("over max sessions: %v, want ResourceExhausted", err)
	}
	h := newChatHarness(a.OpenaiBaseUrl, a.ApiKey, "rollout-sim", "fix the bug")
	h.step(t)
	if _, err := r.client.CloseSession(ctx, &rolloutv1.CloseSessionRequest{SessionId: a.SessionId}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: a.SessionId, Reward: 1, BranchRewards: map[int32]float64{3: 1}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a reward for a branch the session lacks: %v, want InvalidArgument", err)
	}
	if _, err := r.client.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: a.SessionId, Reward: 1}); err != nil {
		t.Fatal(err)
	}
	// b is never used: its idle expiry closes it, and the group is written.
	watch, err := r.client.WatchSessionGroups(ctx, &rolloutv1.WatchSessionGroupsRequest{TokenLayout: rolloutv1.TokenLayout_TOKEN_LAYOUT_COMPACT})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := watch.Recv()
	if err != nil {
		t.Fatal(err)
	}
	g := msg.Group
	if g.GroupId != "g1" || len(g.Rollouts) != 2 || g.Rollouts[0].Status != "ok" || g.Rollouts[1].Status != runner.StatusInfraFailed ||
		g.Rollouts[1].FailureKind != runner.FailExpired || g.Rollouts[1].Advantage != nil || g.Rollouts[0].Advantage == nil || *g.Rollouts[0].Advantage != 0 {
		t.Fatalf("expired group: %+v", g)
	}
	if _, err := r.client.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: b.SessionId, Reward: 1}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("score an expired session: %v, want FailedPrecondition", err)
	}
	if code, _ := newChatHarness(b.OpenaiBaseUrl, b.ApiKey, "rollout-sim", "x").post(t, map[string]any{"model": "rollout-sim", "messages": []map[string]any{{"role": "user", "content": "hi"}}}); code != http.StatusNotFound {
		t.Fatalf("a call to an expired session: %d, want 404", code)
	}

	// Shutdown: one session closed but unscored, one open with a call.
	c, err := r.client.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: "g2"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := r.client.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: "g2"})
	if err != nil {
		t.Fatal(err)
	}
	newChatHarness(d.OpenaiBaseUrl, d.ApiKey, "rollout-sim", "fix the bug").step(t)
	if _, err := r.client.CloseSession(ctx, &rolloutv1.CloseSessionRequest{SessionId: c.SessionId}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.stop() }()
	msg, err = watch.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if g := msg.Group; g.GroupId != "g2" || len(g.Rollouts) != 2 || g.Rollouts[0].FailureKind != runner.FailExpired || g.Rollouts[1].FailureKind != runner.FailExpired {
		t.Fatalf("group at shutdown: %+v", g)
	}
	if _, err := watch.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("the watch stream after shutdown: %v, want its end", err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	run, err := trajectory.Open(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string][]trajectory.Record{}
	if err := run.EachGroup(ctx, func(_ int64, recs []trajectory.Record) error { groups[recs[0].GroupID] = recs; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(groups) != 2 || len(groups["g1"]) != 2 || len(groups["g2"]) != 2 {
		t.Fatalf("run directory groups %v", groups)
	}
	for _, rec := range groups["g2"] {
		if rec.Status != trajectory.StatusInfraFailed || rec.Failure == nil || rec.Failure.Kind != runner.FailExpired || rec.StopReason != string(runner.StopSessionExpired) {
			t.Fatalf("g2 row %d: status %s failure %+v stop %s", rec.RolloutIndex, rec.Status, rec.Failure, rec.StopReason)
		}
	}
	if rec := groups["g2"][1]; len(rec.Tokens) == 0 {
		t.Fatal("the open session's tokens were lost at shutdown")
	}
}

func second[T any](_ T, err error) error { return err }

// A standalone gateway makes a run's start checks: a model its engine does
// not serve fails NewGatewayServer as a config error naming it, before
// any session could fail on it; nothing is written.
func TestGatewayStartCheck(t *testing.T) {
	srv := simtest.Start(t, sim.Config{Family: "hermes"})
	cfg := runner.Config{Parser: "hermes", Output: runner.Output{Dir: t.TempDir()},
		Inference: inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, Model: "not-served", Retries: -1}}
	_, err := NewGatewayServer(context.Background(), cfg, GatewayOptions{BaseURL: "http://127.0.0.1:1"})
	if !errors.Is(err, runner.ErrConfig) || !errors.Is(err, inference.ErrModelNotServed) || !strings.Contains(err.Error(), "not-served") {
		t.Fatalf("err %v, want a config error naming the model", err)
	}
	if ents, _ := os.ReadDir(cfg.Output.Dir); len(ents) != 0 {
		t.Fatalf("the run directory has %d entries after a failed start", len(ents))
	}
}

// The front doors over HTTPS (rollout gateway --http-tls-cert/-key): a
// session's base URL answers a client that trusts the certificate, and a
// cleartext request gets no answer from a door.
func TestGatewayFrontDoorsTLS(t *testing.T) {
	dir := t.TempDir()
	certs(t, dir)
	httpTLS, err := LoadTLS(filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"))
	if err != nil {
		t.Fatal(err)
	}
	srv := simtest.Start(t, sim.Config{Family: "hermes"})
	cfg := runner.Config{Parser: "hermes",
		Inference: inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, Retries: -1}}
	r := startGatewayTLS(t, cfg, GatewayOptions{}, httpTLS)
	s, err := r.client.OpenSession(context.Background(), &rolloutv1.OpenSessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.OpenaiBaseUrl, "https://") {
		t.Fatalf("base URL %q, want https", s.OpenaiBaseUrl)
	}
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil || !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("ca: %v", err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := client.Get(s.OpenaiBaseUrl + "/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"object":"list"`)) {
		t.Fatalf("https models: %d %s", resp.StatusCode, body)
	}
	plain := "http://" + strings.TrimPrefix(s.OpenaiBaseUrl, "https://") + "/models"
	if resp, err := http.Get(plain); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if bytes.Contains(b, []byte(`"object":"list"`)) {
			t.Fatalf("a cleartext request was answered by the door: %d %s", resp.StatusCode, b)
		}
	}
}

// TestGatewayWatchReplay follows the run directory with from_sequence:
// the groups already written are replayed in sequence order, new ones
// arrive live, none twice; what a follower sent no plain watcher gets;
// and after a restart on the same run directory a follower picks up at
// its sequence.
func TestGatewayWatchReplay(t *testing.T) {
	srv := simtest.Start(t, sim.Config{Family: "hermes"})
	cfg := runner.Config{GroupSize: 1, Parser: "hermes",
		Inference: inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, Retries: -1}}
	cfg.Output.Dir = t.TempDir()
	ctx := context.Background()
	finish := func(r *gatewayRig, gid string, reward float64) {
		t.Helper()
		s, err := r.client.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: gid})
		if err != nil {
			t.Fatal(err)
		}
		newChatHarness(s.OpenaiBaseUrl, s.ApiKey, "rollout-sim", "fix the bug").step(t)
		if _, err := r.client.CloseSession(ctx, &rolloutv1.CloseSessionRequest{SessionId: s.SessionId}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.client.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: s.SessionId, Reward: reward}); err != nil {
			t.Fatal(err)
		}
	}
	from := func(n int64) *int64 { return &n }
	expect := func(w rolloutv1.GatewayService_WatchSessionGroupsClient, want ...string) []*rolloutv1.Group {
		t.Helper()
		var got []*rolloutv1.Group
		for i, id := range want {
			msg, err := w.Recv()
			if err != nil {
				t.Fatalf("group %d (%s): %v", i, id, err)
			}
			g := msg.Group
			if g.GroupId != id || g.Sequence == nil || len(g.Rollouts) != 1 || g.Rollouts[0].Status != "ok" {
				t.Fatalf("group %d: %s (sequence %v, %d rollouts), want %s", i, g.GroupId, g.Sequence, len(g.Rollouts), id)
			}
			if i > 0 && *g.Sequence != *got[i-1].Sequence+1 {
				t.Fatalf("group %s: sequence %d after %d", id, *g.Sequence, *got[i-1].Sequence)
			}
			got = append(got, g)
		}
		return got
	}

	r := startGateway(t, cfg, GatewayOptions{})
	finish(r, "g1", 1)
	finish(r, "g2", 0.5)
	bad, err := r.client.WatchSessionGroups(ctx, &rolloutv1.WatchSessionGroupsRequest{FromSequence: from(-1)})
	if err == nil {
		_, err = bad.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("from_sequence -1: %v, want InvalidArgument", err)
	}
	fctx, fcancel := context.WithCancel(ctx)
	f, err := r.client.WatchSessionGroups(fctx, &rolloutv1.WatchSessionGroupsRequest{FromSequence: from(0)})
	if err != nil {
		t.Fatal(err)
	}
	got := expect(f, "g1", "g2") // replayed from the run directory
	if *got[0].Sequence != 0 || got[0].Rollouts[0].Reward != 1 || got[1].Rollouts[0].Reward != 0.5 {
		t.Fatalf("replayed groups: sequence %d, rewards %v %v", *got[0].Sequence, got[0].Rollouts[0].Reward, got[1].Rollouts[0].Reward)
	}
	finish(r, "g3", 0)
	live := expect(f, "g3")[0] // live
	fcancel()
	// g1–g3 were delivered to the follower: a plain watcher's first group
	// is the next one.
	q, err := r.client.WatchSessionGroups(ctx, &rolloutv1.WatchSessionGroupsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	finish(r, "g4", 1)
	if g := expect(q, "g4")[0]; *g.Sequence != 3 {
		t.Fatalf("g4: sequence %d, want 3", *g.Sequence)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	// Restarted on the same run directory: the follower resumes at 1.
	r2 := startGateway(t, cfg, GatewayOptions{})
	f2, err := r2.client.WatchSessionGroups(ctx, &rolloutv1.WatchSessionGroupsRequest{FromSequence: from(1)})
	if err != nil {
		t.Fatal(err)
	}
	again := expect(f2, "g2", "g3", "g4")
	// The group replayed from Parquet is the group sent live, but for
	// what the run directory does not keep: the rollouts' ids (replayed:
	// group#index) and attempt counts.
	if d := cmp.Diff(live, again[1], protocmp.Transform(), protocmp.IgnoreFields(&rolloutv1.Rollout{}, "rollout_id", "attempts")); d != "" {
		t.Fatalf("g3 from the run directory differs from g3 sent live (-live +replayed):\n%s", d)
	}
	finish(r2, "g5", 0)
	if g := expect(f2, "g5")[0]; *g.Sequence != 4 {
		t.Fatalf("g5: sequence %d, want 4", *g.Sequence)
	}
}

// TestGatewayDistill: with a distill block the standalone gateway has the
// teacher (the simulator, top-2) score every branch of each ok session
// before the group is written: the group's rows carry the teacher's top-2
// at each trained position and nothing elsewhere. Hints, which judge the
// own loop's turns, are refused at start.
func TestGatewayDistill(t *testing.T) {
	srv := simtest.Start(t, sim.Config{Family: "hermes"})
	cfg := runner.Config{GroupSize: 1, Parser: "hermes",
		Inference: inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, Retries: -1},
		Distill:   &inference.TeacherConfig{Endpoint: srv.URL, Model: "rollout-sim", TopK: 2, Hints: &inference.HintConfig{}}}
	cfg.Output.Dir = t.TempDir()
	ctx := context.Background()
	if _, err := NewGatewayServer(ctx, cfg, GatewayOptions{}); !errors.Is(err, runner.ErrConfig) || !strings.Contains(err.Error(), "distill.hints") {
		t.Fatalf("hints on a standalone gateway: %v", err)
	}
	cfg.Distill.Hints = nil
	r := startGateway(t, cfg, GatewayOptions{})
	s, err := r.client.OpenSession(ctx, &rolloutv1.OpenSessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	h := newChatHarness(s.OpenaiBaseUrl, s.ApiKey, "rollout-sim", "fix the bug")
	h.step(t)
	h.step(t)
	if _, err := r.client.CloseSession(ctx, &rolloutv1.CloseSessionRequest{SessionId: s.SessionId}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: s.SessionId, Reward: 1}); err != nil {
		t.Fatal(err)
	}
	w, err := r.client.WatchSessionGroups(ctx, &rolloutv1.WatchSessionGroupsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	ro := msg.Group.Rollouts[0]
	if ro.Status != "ok" || len(ro.Tokens) == 0 || len(ro.Distill) != len(ro.Tokens) {
		t.Fatalf("rollout %s (%s): %d distill positions for %d tokens", ro.Status, ro.FailureMessage, len(ro.Distill), len(ro.Tokens))
	}
	trained := 0
	for p, tk := range ro.Distill {
		switch {
		case ro.LossMask[p] == 1 && (len(tk.GetTokenIds()) != 2 || len(tk.GetLogprobs()) != 2):
			t.Fatalf("trained position %d: teacher %v", p, tk)
		case ro.LossMask[p] == 0 && len(tk.GetTokenIds()) != 0:
			t.Fatalf("untrained position %d scored: %v", p, tk)
		}
		trained += int(ro.LossMask[p])
	}
	if trained == 0 {
		t.Fatal("nothing trained")
	}
}

// TestGatewayTenants: with tenants, sessions and groups belong to the
// tenant that opened them. Another tenant cannot join, close or score them
// (its calls find nothing), and each tenant's watchers, plain or following
// the run directory, get its own groups only.
func TestGatewayTenants(t *testing.T) {
	srv := simtest.Start(t, sim.Config{Family: "hermes"})
	cfg := runner.Config{GroupSize: 1, Parser: "hermes",
		Inference: inference.Config{Backend: inference.BackendVLLM, Endpoints: []string{srv.URL}, Retries: -1}}
	r := startGateway(t, cfg, GatewayOptions{Tenants: []Tenant{tenant("alice", "alice-token", Quotas{}), tenant("bob", "bob-token", Quotas{Sessions: 1})}})
	ctx := context.Background()
	client := func(token string) rolloutv1.GatewayServiceClient {
		c, err := Dial(ClientOptions{Addr: r.conn.Conn.Target(), Token: token})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return rolloutv1.NewGatewayServiceClient(c.Conn)
	}
	alice, bob, def := client("alice-token"), client("bob-token"), r.client // def: the --auth-token-file tenant
	finish := func(c rolloutv1.GatewayServiceClient, gid string) *rolloutv1.OpenSessionResponse {
		t.Helper()
		s, err := c.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: gid})
		if err != nil {
			t.Fatal(err)
		}
		newChatHarness(s.OpenaiBaseUrl, s.ApiKey, "rollout-sim", "fix the bug").step(t)
		if _, err := c.CloseSession(ctx, &rolloutv1.CloseSessionRequest{SessionId: s.SessionId}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: s.SessionId, Reward: 1}); err != nil {
			t.Fatal(err)
		}
		return s
	}

	// Bob cannot touch alice's open group or session.
	a, err := alice.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: "ga", GroupSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		err  error
		code codes.Code
	}{
		{"join", second(bob.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: "ga"})), codes.PermissionDenied},
		{"close", second(bob.CloseSession(ctx, &rolloutv1.CloseSessionRequest{SessionId: a.SessionId})), codes.NotFound},
		{"score", second(bob.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: a.SessionId, Reward: 1})), codes.NotFound},
		{"default's close", second(def.CloseSession(ctx, &rolloutv1.CloseSessionRequest{SessionId: a.SessionId})), codes.NotFound},
	} {
		if status.Code(c.err) != c.code {
			t.Errorf("bob's %s of alice's: %v, want %s", c.name, c.err, c.code)
		}
	}
	if _, err := alice.CloseSession(ctx, &rolloutv1.CloseSessionRequest{SessionId: a.SessionId}); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: a.SessionId, Reward: 0.5}); err != nil {
		t.Fatal(err)
	}
	finish(alice, "ga") // the group's second session: ga is written (sequence 0)
	// Bob's quota is one session open at a time: a second is refused until
	// the first is closed.
	b0, err := bob.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: "gb", GroupSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bob.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: "gb"}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("bob's second open session: %v, want ResourceExhausted (quotas.sessions 1)", err)
	}
	if _, err := bob.CloseSession(ctx, &rolloutv1.CloseSessionRequest{SessionId: b0.SessionId}); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: b0.SessionId, Reward: 0}); err != nil {
		t.Fatal(err)
	}
	b := finish(bob, "gb") // gb's second session: gb is written (sequence 1)
	if _, err := bob.OpenSession(ctx, &rolloutv1.OpenSessionRequest{GroupId: "ga"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("bob reusing alice's finished group id: %v, want PermissionDenied", err)
	}
	if _, err := alice.ScoreSession(ctx, &rolloutv1.ScoreSessionRequest{SessionId: b.SessionId, Reward: 1}); status.Code(err) != codes.NotFound {
		t.Fatalf("alice scoring bob's finished session: %v, want NotFound", err)
	}

	first := func(c rolloutv1.GatewayServiceClient, req *rolloutv1.WatchSessionGroupsRequest) *rolloutv1.Group {
		t.Helper()
		w, err := c.WatchSessionGroups(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		msg, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return msg.Group
	}
	from := int64(0)
	// Followers replay their own tenant's groups from the run directory.
	if g := first(bob, &rolloutv1.WatchSessionGroupsRequest{FromSequence: &from}); g.GroupId != "gb" || g.GetSequence() != 1 {
		t.Fatalf("bob's follower from 0: %s (sequence %d), want gb (1)", g.GroupId, g.GetSequence())
	}
	if g := first(alice, &rolloutv1.WatchSessionGroupsRequest{FromSequence: &from}); g.GroupId != "ga" || g.GetSequence() != 0 || len(g.Rollouts) != 2 {
		t.Fatalf("alice's follower from 0: %s (sequence %d)", g.GroupId, g.GetSequence())
	}
	// Plain watchers: bob's first group is his although alice's finished
	// first (and the followers above took none of the other's).
	finish(def, "gd")
	if g := first(def, &rolloutv1.WatchSessionGroupsRequest{}); g.GroupId != "gd" {
		t.Fatalf("default's watcher: %s, want gd", g.GroupId)
	}
}
