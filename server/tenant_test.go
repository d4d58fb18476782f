package server

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
)

func dialAs(t *testing.T, h *harness, token string) *Client {
	t.Helper()
	c, err := Dial(ClientOptions{Addr: h.addr, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func tenant(name, token string, q Quotas) Tenant {
	return Tenant{Name: name, TokenSHA256: sha256.Sum256([]byte(token)), Quotas: q}
}

// Two tenants of one server: one past its quotas gets RESOURCE_EXHAUSTED
// for jobs and for a CollectGroups stream, while the other's jobs and
// stream run and deliver their groups; neither sees nor touches the
// other's jobs; the single --auth-token-file token is one more tenant.
func TestTenantsApart(t *testing.T) {
	gated := newSim(t, "toolcall-match", 0) // alice's jobs wait at its gate
	open := newSim(t, "toolcall-match", -1)
	h := startServer(t, Options{Tenants: []Tenant{
		tenant("alice", "alice-token", Quotas{Jobs: 2, Rows: 4}),
		tenant("bob", "bob-token", Quotas{}),
	}}, RunOptions{Transport: Transport{Token: "legacy-token"}})
	alice, bob, legacy := dialAs(t, h, "alice-token"), dialAs(t, h, "bob-token"), dialAs(t, h, "legacy-token")
	ctx := bg(t)

	if _, err := dialAs(t, h, "nobody").ListJobs(ctx, &rolloutv1.ListJobsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("unknown token: %v, want Unauthenticated", err)
	}

	// alice: one job holds a slot (its generations wait at the gate).
	a1, err := alice.StartJob(ctx, startReq(jobYAML(gated.URL, "runs/a1", 2, 2), "a1"))
	if err != nil {
		t.Fatalf("alice's first job: %v", err)
	}
	gated.waitBlocked(t, 1)
	// Past her rows quota: a job of 3 groups × 2 and a stream asking for 3.
	_, err = alice.StartJob(ctx, startReq(jobYAML(gated.URL, "runs/a-big", 3, 2), ""))
	wantCode(t, "alice's 6-row job with a rows quota of 4", err, codes.ResourceExhausted, "tenant alice")
	stream, err := alice.CollectGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ac := &collectClient{t: t, stream: stream}
	ac.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Start{Start: &rolloutv1.CollectStart{
		ConfigYaml: jobYAML(open.URL, "", 0, 2)}}})
	ac.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{Count: 3}}})
	for {
		more, err := ac.recv()
		if err != nil {
			wantCode(t, "alice's stream asking for 6 rows", err, codes.ResourceExhausted, "quota-rows")
			break
		}
		if !more {
			t.Fatal("alice's stream past its rows quota ended without an error")
		}
	}
	// Past her jobs quota: a second job fits, a third does not.
	if _, err := alice.StartJob(ctx, startReq(jobYAML(gated.URL, "runs/a2", 1, 2), "a2")); err != nil {
		t.Fatalf("alice's second job: %v", err)
	}
	_, err = alice.StartJob(ctx, startReq(jobYAML(gated.URL, "runs/a3", 1, 2), ""))
	wantCode(t, "alice's third job with a jobs quota of 2", err, codes.ResourceExhausted, "quota-jobs")
	if n := metricValue(t, metricTenantRejected.WithLabelValues("alice", "jobs")); n < 1 {
		t.Errorf("rollout_tenant_rejected_total{tenant=alice,quota=jobs} = %v", n)
	}
	if n := metricValue(t, metricTenantHeld.WithLabelValues("alice", "jobs")); n != 2 {
		t.Errorf("rollout_tenant_held{tenant=alice,resource=jobs} = %v, want 2", n)
	}

	// bob sees nothing of alice's and cannot touch her jobs.
	for what, call := range map[string]func() error{
		"GetJob":    func() error { _, err := bob.GetJob(ctx, &rolloutv1.GetJobRequest{JobId: a1.Job.Id}); return err },
		"CancelJob": func() error { _, err := bob.CancelJob(ctx, &rolloutv1.CancelJobRequest{JobId: a1.Job.Id}); return err },
		"BeginPolicyUpdate": func() error {
			_, err := bob.BeginPolicyUpdate(ctx, &rolloutv1.BeginPolicyUpdateRequest{JobId: a1.Job.Id, Version: 1})
			return err
		},
		"WatchJob": func() error {
			w, err := bob.WatchJob(ctx, &rolloutv1.WatchJobRequest{JobId: a1.Job.Id})
			if err == nil {
				_, err = w.Recv()
			}
			return err
		},
	} {
		if status.Code(call()) != codes.NotFound {
			t.Errorf("bob's %s of alice's job: %v, want NotFound", what, call())
		}
	}
	if _, err := bob.StartJob(ctx, startReq(jobYAML(open.URL, "runs/b-steal", 1, 2), a1.Job.Id)); status.Code(err) != codes.AlreadyExists {
		t.Errorf("bob's StartJob with alice's job id: %v, want AlreadyExists", err)
	}
	list, err := bob.ListJobs(ctx, &rolloutv1.ListJobsRequest{})
	if err != nil || len(list.Jobs) != 0 {
		t.Fatalf("bob lists %v (%v), want none of alice's", list.GetJobs(), err)
	}

	// bob's job and stream run to the end while alice is exhausted.
	b1, err := bob.StartJob(ctx, startReq(jobYAML(open.URL, "runs/b1", 2, 2), "b1"))
	if err != nil {
		t.Fatalf("bob's job: %v", err)
	}
	res := (&harness{cli: bob}).watch(ctx, b1.Job.Id, true, nil)
	if res.err != nil || res.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED || len(res.groups) != 2 {
		t.Fatalf("bob's job: %v, %d groups (%v)", res.finished, len(res.groups), res.err)
	}
	bs, err := bob.CollectGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bc := &collectClient{t: t, stream: bs}
	bc.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Start{Start: &rolloutv1.CollectStart{
		ConfigYaml: jobYAML(open.URL, "", 0, 2), InitialCredits: 3}}})
	bc.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{Count: 3}}})
	bc.until("bob's 3 groups", bc.settled(3, 0))
	if err := bs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		more, err := bc.recv()
		if err != nil {
			t.Fatalf("bob's stream: %v", err)
		}
		if !more {
			break
		}
	}
	list, err = alice.ListJobs(ctx, &rolloutv1.ListJobsRequest{})
	if err != nil || len(list.Jobs) != 2 {
		t.Fatalf("alice lists %d jobs (%v), want her 2", len(list.GetJobs()), err)
	}

	// The --auth-token-file token is the tenant "default": its own jobs,
	// none of the others'.
	if _, err := legacy.GetJob(ctx, &rolloutv1.GetJobRequest{JobId: b1.Job.Id}); status.Code(err) != codes.NotFound {
		t.Errorf("the default tenant reads bob's job: %v", err)
	}
	d1, err := legacy.StartJob(ctx, startReq(jobYAML(open.URL, "runs/d1", 1, 2), ""))
	if err != nil {
		t.Fatalf("the default tenant's job: %v", err)
	}
	if res := (&harness{cli: legacy}).watch(ctx, d1.Job.Id, false, nil); res.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("the default tenant's job: %v (%v)", res.finished, res.err)
	}
	// alice cancels her own job.
	if _, err := alice.CancelJob(ctx, &rolloutv1.CancelJobRequest{JobId: a1.Job.Id, CancelInFlight: true}); err != nil {
		t.Fatalf("alice cancels her job: %v", err)
	}
}

func TestLoadTenants(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("bob.token", "bob-secret\n")
	sum := sha256.Sum256([]byte("alice-secret"))
	ok := write("ok.yaml", `tenants:
  - name: alice
    token_sha256: `+hex.EncodeToString(sum[:])+`
    quotas: {jobs: 2, rows: 1000}
  - name: bob
    token_file: bob.token
    rate_limit: 5
`)
	ts, err := LoadTenants(ok)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || ts[0].Name != "alice" || ts[0].TokenSHA256 != sum || ts[0].Quotas.Jobs != 2 || ts[0].Quotas.Rows != 1000 ||
		ts[1].TokenSHA256 != sha256.Sum256([]byte("bob-secret")) || ts[1].RateLimit != 5 {
		t.Fatalf("tenants: %+v", ts)
	}
	for name, c := range map[string]struct{ body, want string }{
		"dup-name":   {"tenants: [{name: a, token_file: bob.token}, {name: a, token_sha256: " + hex.EncodeToString(sum[:]) + "}]", "named twice"},
		"dup-token":  {"tenants: [{name: a, token_file: bob.token}, {name: b, token_file: bob.token}]", "same token"},
		"no-token":   {"tenants: [{name: a}]", "give a token"},
		"two-tokens": {"tenants: [{name: a, token_file: bob.token, token_sha256: " + hex.EncodeToString(sum[:]) + "}]", "not both"},
		"dup-cert":   {"tenants: [{name: a, client_names: [x]}, {name: b, client_names: [x]}]", "tenant \"a\"'s already"},
		"bad-hash":   {"tenants: [{name: a, token_sha256: abc}]", "64 hex digits"},
		"bad-name":   {"tenants: [{name: 'a b', token_file: bob.token}]", "letters, digits"},
		"unknown":    {"tenants: [{name: a, token_file: bob.token, quota: {jobs: 1}}]", "quota"},
		"empty":      {"tenants: []", "no tenants"},
	} {
		_, err := LoadTenants(write(name+".yaml", c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}
	if _, err := LoadTenants(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// metricValue reads a counter's or gauge's value.
func metricValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue() + m.GetGauge().GetValue()
}
