package server

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/util/secrets"
)

// TestInvalidArgument: malformed requests fail with InvalidArgument (or
// the code their problem calls for) and a message naming the field.
func TestInvalidArgument(t *testing.T) {
	data := t.TempDir()
	h := startServer(t, Options{DataDir: data, StateDir: filepath.Join(data, "state")}, RunOptions{})
	ctx := bg(t)
	valid := jobYAML("http://127.0.0.1:9", "runs/x", 1, 2)
	yamlReq := func(text string) *rolloutv1.StartJobRequest { return startReq(text, "") }
	for _, tc := range []struct {
		name  string
		req   *rolloutv1.StartJobRequest
		code  codes.Code
		field string
	}{
		{"no config", &rolloutv1.StartJobRequest{}, codes.InvalidArgument, "config"},
		{"blank yaml", yamlReq("  \n"), codes.InvalidArgument, "config_yaml"},
		{"broken yaml", yamlReq("env: [\n"), codes.InvalidArgument, "config_yaml"},
		{"unknown key", yamlReq(valid + "bogus_knob: 1\n"), codes.InvalidArgument, "bogus_knob"},
		{"unknown env", yamlReq(strings.Replace(valid, "toolcall-match", "no-such-env", 1)), codes.InvalidArgument, "env"},
		{"no output dir", yamlReq(jobYAML("http://127.0.0.1:9", "", 1, 2)), codes.InvalidArgument, "output.dir"},
		{"bad job id", startReq(valid, "no spaces please"), codes.InvalidArgument, "job_id"},
		{"bad mode", &rolloutv1.StartJobRequest{Config: &rolloutv1.StartJobRequest_ConfigYaml{ConfigYaml: valid}, Mode: 9}, codes.InvalidArgument, "mode"},
		{"empty config path", &rolloutv1.StartJobRequest{Config: &rolloutv1.StartJobRequest_ConfigPath{}}, codes.InvalidArgument, "config_path"},
		{"config path outside", &rolloutv1.StartJobRequest{Config: &rolloutv1.StartJobRequest_ConfigPath{ConfigPath: "/etc/passwd"}}, codes.PermissionDenied, "config_path"},
		{"output outside", yamlReq(jobYAML("http://127.0.0.1:9", "/etc/rollout-runs", 1, 2)), codes.PermissionDenied, "output.dir"},
		{"dataset outside", yamlReq(valid + "dataset: {path: ../../../etc/passwd}\n"), codes.PermissionDenied, "dataset.path"},
		{"env file outside", yamlReq(strings.Replace(valid, "toolcall-match", "/etc/env.yaml", 1)), codes.PermissionDenied, "env"},
		{"env_config path outside", yamlReq(strings.Replace(valid, "toolcall-match", "terminal-bench\nenv_config: {tasks_dir: /etc}", 1)), codes.PermissionDenied, "env_config.tasks_dir"},
		{"env_config file outside", yamlReq(strings.Replace(valid, "toolcall-match", "task-suite\nenv_config: {split_file: /etc/split.yaml}", 1)), codes.PermissionDenied, "env_config.split_file"},
		{"output in the state dir", yamlReq(jobYAML("http://127.0.0.1:9", "state/jobs", 1, 2)), codes.PermissionDenied, "state dir"},
	} {
		_, err := h.cli.StartJob(ctx, tc.req)
		wantCode(t, tc.name, err, tc.code, tc.field)
	}

	_, err := h.cli.GetJob(ctx, &rolloutv1.GetJobRequest{})
	wantCode(t, "GetJob without id", err, codes.InvalidArgument, "job_id")
	_, err = h.cli.GetJob(ctx, &rolloutv1.GetJobRequest{JobId: "nope"})
	wantCode(t, "GetJob of an unknown id", err, codes.NotFound, "job_id")
	_, err = h.cli.CancelJob(ctx, &rolloutv1.CancelJobRequest{})
	wantCode(t, "CancelJob without id", err, codes.InvalidArgument, "job_id")
	_, err = h.cli.DescribeEnvironment(ctx, &rolloutv1.DescribeEnvironmentRequest{})
	wantCode(t, "DescribeEnvironment without name", err, codes.InvalidArgument, "name")
	_, err = h.cli.DescribeEnvironment(ctx, &rolloutv1.DescribeEnvironmentRequest{Name: "nope"})
	wantCode(t, "DescribeEnvironment of an unknown env", err, codes.NotFound, "name")
	ws, err := h.cli.WatchJob(ctx, &rolloutv1.WatchJobRequest{})
	if err == nil {
		_, err = ws.Recv()
	}
	wantCode(t, "WatchJob without id", err, codes.InvalidArgument, "job_id")

	start := func(cfg string, credits int32) *rolloutv1.CollectGroupsRequest {
		return &rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Start{Start: &rolloutv1.CollectStart{ConfigYaml: cfg, InitialCredits: credits}}}
	}
	// A collect stream checks its endpoints at start (as a job's Run):
	// the messages after start need a live one.
	simSrv, err := sim.Start(ctx, sim.Config{Family: "hermes"})
	if err != nil {
		t.Fatal(err)
	}
	defer simSrv.Close()
	collectCfg := jobYAML(simSrv.URL, "", 0, 2)
	for _, tc := range []struct {
		name  string
		msgs  []*rolloutv1.CollectGroupsRequest
		field string
	}{
		{"credit first", []*rolloutv1.CollectGroupsRequest{{Msg: &rolloutv1.CollectGroupsRequest_Credit{Credit: &rolloutv1.CollectCredit{Groups: 1}}}}, "start"},
		{"empty start", []*rolloutv1.CollectGroupsRequest{start("", 0)}, "start.config_yaml"},
		{"bad start yaml", []*rolloutv1.CollectGroupsRequest{start("env: [", 0)}, "start.config_yaml"},
		{"negative credits", []*rolloutv1.CollectGroupsRequest{start(collectCfg, -1)}, "start.initial_credits"},
		{"zero credit", []*rolloutv1.CollectGroupsRequest{start(collectCfg, 0), {Msg: &rolloutv1.CollectGroupsRequest_Credit{Credit: &rolloutv1.CollectCredit{}}}}, "credit.groups"},
		{"zero next", []*rolloutv1.CollectGroupsRequest{start(collectCfg, 0), {Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{}}}}, "next.count"},
		{"bad sampling", []*rolloutv1.CollectGroupsRequest{start(collectCfg, 0), {Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{Count: 1, SamplingJson: `{"temprature": 1}`}}}}, "next.sampling_json"},
		{"no items", []*rolloutv1.CollectGroupsRequest{start(collectCfg, 0), {Msg: &rolloutv1.CollectGroupsRequest_Items{Items: &rolloutv1.CollectItems{}}}}, "items.items_json"},
		{"bad item", []*rolloutv1.CollectGroupsRequest{start(collectCfg, 0), {Msg: &rolloutv1.CollectGroupsRequest_Items{Items: &rolloutv1.CollectItems{ItemsJson: []string{"{not json"}}}}}, "items.items_json"},
		{"second start", []*rolloutv1.CollectGroupsRequest{start(collectCfg, 0), start(collectCfg, 0)}, "start"},
		{"empty message", []*rolloutv1.CollectGroupsRequest{start(collectCfg, 0), {}}, "msg"},
	} {
		err := collectErr(ctx, h.cli, tc.msgs)
		wantCode(t, tc.name, err, codes.InvalidArgument, tc.field)
	}
	// The start check: a model the endpoint does not serve is a config
	// error, an endpoint that does not answer is Unavailable, and so is a
	// distillation teacher that does not.
	wrongModel := strings.Replace(collectCfg, "  timeout: 2m\n", "  timeout: 2m\n  model: no-such-model\n", 1)
	wantCode(t, "collect with a model not served", collectErr(ctx, h.cli, []*rolloutv1.CollectGroupsRequest{start(wrongModel, 0)}), codes.InvalidArgument, "no-such-model")
	dead := strings.Replace(jobYAML("http://127.0.0.1:9", "", 0, 2), "  timeout: 2m\n", "  timeout: 2m\n  ready_timeout: 200ms\n", 1)
	wantCode(t, "collect with a dead endpoint", collectErr(ctx, h.cli, []*rolloutv1.CollectGroupsRequest{start(dead, 0)}), codes.Unavailable, "127.0.0.1:9")
	deadTeacher := strings.Replace(collectCfg, "  timeout: 2m\n", "  timeout: 2m\n  ready_timeout: 200ms\n", 1) + "distill: {endpoint: 'http://127.0.0.1:9', model: t}\n"
	wantCode(t, "collect with a dead teacher", collectErr(ctx, h.cli, []*rolloutv1.CollectGroupsRequest{start(deadTeacher, 0)}), codes.Unavailable, "distill teacher start check")
}

// collectErr sends msgs on a CollectGroups stream and returns the error
// that ends it.
func collectErr(ctx context.Context, cli *Client, msgs []*rolloutv1.CollectGroupsRequest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cli.CollectGroups(ctx)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			break // the server ended the stream: Recv has its status
		}
	}
	for {
		_, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func TestCheckListen(t *testing.T) {
	for addr, local := range map[string]bool{
		"127.0.0.1:50051": true, "127.8.9.1:1": true, "localhost:50051": true, "[::1]:50051": true,
		"unix:/run/rollout.sock": true, "unix:///run/rollout.sock": true,
		"0.0.0.0:50051": false, ":50051": false, "[::]:50051": false, "10.1.2.3:50051": false,
		"example.com:50051": false, "garbage": false,
	} {
		err := CheckListen(addr, false)
		if local != (err == nil) {
			t.Errorf("CheckListen(%q) without a token: %v", addr, err)
		}
		if err != nil && !errors.Is(err, ErrInsecureListen) {
			t.Errorf("CheckListen(%q): %v does not wrap ErrInsecureListen", addr, err)
		}
		if err := CheckListen(addr, true); err != nil {
			t.Errorf("CheckListen(%q) with a token: %v", addr, err)
		}
	}
}

func TestReadTokenFile(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"ok": "s3cret\n", "empty": " \n", "two": "a b\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if tok, err := ReadTokenFile(filepath.Join(dir, "ok")); err != nil || tok != "s3cret" {
		t.Errorf("ok: %q %v", tok, err)
	}
	for _, name := range []string{"empty", "two", "missing"} {
		if _, err := ReadTokenFile(filepath.Join(dir, name)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// nonLoopbackIP returns an address of this machine off loopback, or "".
func nonLoopbackIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return ""
}

// TestAuth: with a token, every call but health checks needs it, on
// unary calls and streams alike, off loopback as on it.
func TestAuth(t *testing.T) {
	const token = "s3cret-token"
	host := "127.0.0.1"
	if ip := nonLoopbackIP(); ip != "" {
		host = ip // the case the token exists for
	}
	ln, err := Listen(context.Background(), net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	h := startServer(t, Options{}, RunOptions{Listener: ln, Transport: Transport{Token: token}})
	ctx := bg(t)
	if _, err := h.cli.ListJobs(ctx, &rolloutv1.ListJobsRequest{}); err != nil {
		t.Fatalf("with the token: %v", err)
	}
	for name, tok := range map[string]string{"no token": "", "bad token": "s3cret-tokem", "prefix": "s3cret"} {
		cli, err := Dial(ClientOptions{Addr: h.addr, Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		_, err = cli.ListJobs(ctx, &rolloutv1.ListJobsRequest{})
		wantCode(t, name+": ListJobs", err, codes.Unauthenticated, "authorization")
		ws, err := cli.WatchJob(ctx, &rolloutv1.WatchJobRequest{JobId: "x"})
		if err == nil {
			_, err = ws.Recv()
		}
		wantCode(t, name+": WatchJob", err, codes.Unauthenticated, "authorization")
		err = collectErr(ctx, cli, nil)
		wantCode(t, name+": CollectGroups", err, codes.Unauthenticated, "authorization")
		// Health checks need no token (probes).
		hr, err := healthpb.NewHealthClient(cli.Conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s: health %v %v", name, hr, err)
		}
		cli.Close()
	}
}

// TestHealthReflectionMetrics checks the serving extras: health per
// service, reflection listing the API, /metrics with the rollout_*
// families, and the rate limit.
func TestHealthReflectionMetrics(t *testing.T) {
	s := newSim(t, "toolcall-match", -1)
	mln, err := Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := startServer(t, Options{}, RunOptions{MetricsListener: mln})
	ctx := bg(t)

	hc := healthpb.NewHealthClient(h.cli.Conn)
	for _, svc := range []string{"", "rollout.v1.RolloutService"} {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %v %v", svc, r, err)
		}
	}

	rc, err := reflectionpb.NewServerReflectionClient(h.cli.Conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !strings.Contains(strings.Join(names, " "), "rollout.v1.RolloutService") {
		t.Errorf("reflection lists %v", names)
	}
	_ = rc.CloseSend()

	envs, err := h.cli.ListEnvironments(ctx, &rolloutv1.ListEnvironmentsRequest{})
	if err != nil || len(envs.Environments) == 0 {
		t.Fatalf("ListEnvironments: %v %v", envs, err)
	}
	d, err := h.cli.DescribeEnvironment(ctx, &rolloutv1.DescribeEnvironmentRequest{Name: "toolcall-match"})
	if err != nil || d.ConfigSchemaJson == "" || d.Environment.GroupSize == 0 {
		t.Fatalf("DescribeEnvironment: %v %v", d, err)
	}

	j := h.start(t, startReq(jobYAML(s.URL, "runs/m", 2, 2), ""))
	if res := h.watch(ctx, j.Id, false, nil); res.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("job: %v %v", res.finished, res.err)
	}
	resp, err := http.Get("http://" + mln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`rollout_rollouts_total{env="toolcall-match",status="ok"}`,
		`rollout_groups_total{env="toolcall-match",source="job"}`,
		`rollout_rollout_phase_seconds_bucket{env="toolcall-match",phase="generation"`,
		`rollout_reward_count{env="toolcall-match"}`,
		`rollout_jobs{state="succeeded"} 1`,
		`rollout_grpc_requests_total{code="OK",method="StartJob"}`,
		"rollout_inference_request_duration_seconds",
		"rollout_agentloop_",
		"rollout_trajectory_rows_written_total",
		"rollout_sandbox_containers",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestRateLimit(t *testing.T) {
	// One call's worth of burst and a refill far beyond the test.
	h := startServer(t, Options{}, RunOptions{Transport: Transport{RateLimit: 0.0001, RateBurst: 1}})
	ctx := bg(t)
	if _, err := h.cli.ListJobs(ctx, &rolloutv1.ListJobsRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err := h.cli.ListJobs(ctx, &rolloutv1.ListJobsRequest{})
	wantCode(t, "second call", err, codes.ResourceExhausted, "rate limit")
	// Health checks are not limited.
	if _, err := healthpb.NewHealthClient(h.cli.Conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health under the rate limit: %v", err)
	}
}

// TestMaxMsgSize: a request above the server's limit is refused.
func TestMaxMsgSize(t *testing.T) {
	h := startServer(t, Options{}, RunOptions{Transport: Transport{MaxMsgSize: 1024}})
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = rolloutv1.NewRolloutServiceClient(conn).StartJob(bg(t), startReq(strings.Repeat("#", 4096), ""))
	wantCode(t, "oversized request", err, codes.ResourceExhausted, "")
}

// TestSecretEnvConfined: under `rollout serve --allow-env`, a job config
// may name only the allowed variables for its secrets; any other is
// refused with PermissionDenied before the job starts, so that a client
// cannot have the server send, say, its cloud credentials to an endpoint
// of the client's choosing.
func TestSecretEnvConfined(t *testing.T) {
	t.Setenv("ROLLOUT_TEST_SERVER_SECRET", "do-not-send")
	t.Setenv("ROLLOUT_TEST_ALLOWED_KEY", "fine")
	defer secrets.Restrict([]string{"ROLLOUT_TEST_ALLOWED_*"})()
	data := t.TempDir()
	h := startServer(t, Options{DataDir: data, StateDir: filepath.Join(data, "state")}, RunOptions{})
	ctx := bg(t)
	valid := jobYAML("http://127.0.0.1:9", "runs/x", 1, 2)
	for _, tc := range []struct{ name, yaml, field string }{
		{"teacher key", valid + "distill: {endpoint: 'http://127.0.0.1:9', model: m, api_key_env: ROLLOUT_TEST_SERVER_SECRET}\n", "api_key_env"},
		{"judge key", valid + "distill: {endpoint: 'http://127.0.0.1:9', model: m, hints: {api_key_env: ROLLOUT_TEST_SERVER_SECRET}}\n", "hints.api_key_env"},
		{"mcp token", valid + "mcp_servers: [{name: m, url: 'http://127.0.0.1:9/mcp', bearer_token_env: ROLLOUT_TEST_SERVER_SECRET}]\n", "ROLLOUT_TEST_SERVER_SECRET"},
	} {
		_, err := h.cli.StartJob(ctx, startReq(tc.yaml, ""))
		wantCode(t, tc.name, err, codes.PermissionDenied, tc.field)
	}
	// An allowed name is read; the job starts (and fails later at its
	// start check: nothing listens there).
	ok := strings.Replace(valid, "runs/x", "runs/ok", 1) + "distill: {endpoint: 'http://127.0.0.1:9', model: m, api_key_env: ROLLOUT_TEST_ALLOWED_KEY}\n"
	j, err := h.cli.StartJob(ctx, startReq(ok, ""))
	if err != nil {
		t.Fatalf("allowed variable: %v", err)
	}
	if _, err := h.cli.CancelJob(ctx, &rolloutv1.CancelJobRequest{JobId: j.GetJob().GetId()}); err != nil {
		t.Fatal(err)
	}
}
