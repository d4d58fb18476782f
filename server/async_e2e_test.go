package server

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
	"github.com/rollout-rl/rollout/inference/sim"
	"github.com/rollout-rl/rollout/internal/devtools/demo"
)

// TestAsyncPolicyUpdatesE2E collects G=8 groups of a sandboxed env (real
// busybox containers) while a trainer updates the policy every second, in
// each pause mode. Every sampled token carries a version, no group exceeds
// max_staleness, aborted generations continue token-exactly (ids and
// logprobs equal what the simulator sampled, across the cut), and every
// requested group arrives exactly once.
func TestAsyncPolicyUpdatesE2E(t *testing.T) {
	ref := needDocker(t)
	shared, _ := newShared(t, "asynctest")
	scripts, err := demo.EnvScripts(context.Background(), "terminal-tasks", "train")
	if err != nil {
		t.Fatal(err)
	}
	h := startServer(t, Options{Sandboxes: shared, Images: shared}, RunOptions{})
	const groups, size, maxStale = 2, 8, 2
	for _, mode := range []string{"keep", "wait", "abort"} {
		t.Run(mode, func(t *testing.T) {
			srv, err := sim.Start(context.Background(), sim.Config{Family: "hermes", Seed: 7, SuccessProb: 0.7, Scripts: scripts,
				RecordGenerations: true, Latency: sim.Latency{TTFT: 20 * time.Millisecond, PerToken: 3 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			streamID := "async-" + mode
			cfg := fmt.Sprintf(`env: terminal-tasks
group_size: %d
inference:
  backend: vllm
  endpoints: [%s]
  timeout: 2m
parser: hermes
sampling: {max_tokens: 1024}
sandbox: {image: %s}
limits: {groups_in_flight: 1, sandboxes: %d}
async: {max_staleness: %d, on_stale: regenerate, max_regenerations: 20}
`, size, srv.URL, ref, size, maxStale)
			ctx := bg(t)
			stream, err := h.cli.CollectGroups(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c := &collectClient{t: t, stream: stream}
			c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Start{Start: &rolloutv1.CollectStart{
				ConfigYaml: cfg, InitialCredits: groups, StreamId: streamID}}})
			c.send(&rolloutv1.CollectGroupsRequest{Msg: &rolloutv1.CollectGroupsRequest_Next{Next: &rolloutv1.CollectNext{RequestId: "r", Count: groups}}})

			// The trainer: an update every second while collection runs,
			// each begun while a generation is in flight. Like a real
			// trainer it makes a new version only from new data: at most
			// maxStale updates per group received, so collection always
			// makes progress under the bound, however slow the machine.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var mu sync.Mutex
			version, updates := int64(0), 0
			var upErr error
			var received atomic.Int64
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Second):
					}
					for srv.Async().Running == 0 {
						select {
						case <-stop:
							return
						case <-time.After(2 * time.Millisecond):
						}
					}
					mu.Lock()
					next := version + 1
					allowed := int64(updates) < maxStale*(received.Load()+1)
					mu.Unlock()
					if !allowed {
						continue
					}
					if _, err := h.cli.BeginPolicyUpdate(ctx, &rolloutv1.BeginPolicyUpdateRequest{JobId: streamID, Version: next, Mode: mode}); err != nil {
						mu.Lock()
						upErr = fmt.Errorf("begin %d: %w", next, err)
						mu.Unlock()
						return
					}
					srv.SetPolicyVersion(next) // the trainer loads the weights
					if _, err := h.cli.EndPolicyUpdate(ctx, &rolloutv1.EndPolicyUpdateRequest{JobId: streamID, Version: next}); err != nil {
						mu.Lock()
						upErr = fmt.Errorf("end %d: %w", next, err)
						mu.Unlock()
						return
					}
					mu.Lock()
					version, updates = next, updates+1
					mu.Unlock()
				}
			})
			c.until("the requested groups", func() bool { received.Store(int64(len(c.groups))); return len(c.groups) == groups })
			close(stop)
			wg.Wait()
			c.drain()
			mu.Lock()
			defer mu.Unlock()
			if upErr != nil {
				t.Fatal(upErr)
			}
			if updates == 0 {
				t.Fatal("no policy update happened during collection")
			}
			t.Logf("%s: %d updates, %d groups, last status %v, simulator %+v", mode, updates, len(c.groups), c.last, srv.Async())

			// Nothing lost or duplicated.
			seen := map[string]bool{}
			for _, g := range c.groups {
				if seen[g.GroupId] {
					t.Errorf("group %s delivered twice", g.GroupId)
				}
				seen[g.GroupId] = true
				if len(g.Rollouts) != size {
					t.Errorf("group %s: %d rollouts", g.GroupId, len(g.Rollouts))
				}
				if g.PolicyLag == nil || *g.PolicyLag > maxStale {
					t.Errorf("group %s: lag %v outside max_staleness %d", g.GroupId, g.PolicyLag, maxStale)
				}
			}
			gens := map[string][]sim.GenerationRecord{}
			for _, r := range srv.Generations() {
				gens[r.RequestID] = append(gens[r.RequestID], r)
			}
			cuts, continued := 0, 0
			for _, g := range c.groups {
				for _, ro := range g.Rollouts {
					if ro.Status != "ok" {
						t.Errorf("rollout %s: %s %s", ro.RolloutId, ro.FailureKind, ro.FailureMessage)
						continue
					}
					if len(ro.TokenVersions) != len(ro.Tokens) {
						t.Fatalf("rollout %s: %d versions for %d tokens", ro.RolloutId, len(ro.TokenVersions), len(ro.Tokens))
					}
					n, k := checkTokenExact(t, ro, gens)
					cuts, continued = cuts+n, continued+k
				}
			}
			// Every continuation of an aborted generation in a delivered
			// rollout is one abort cut. An aborted generation of a group
			// regenerated as stale is not delivered: only with none
			// regenerated must an abort show in what was delivered.
			a := srv.Async()
			t.Logf("%s: %d abort cuts, %d continued generations in the delivered rollouts", mode, cuts, continued)
			if mode == "abort" && cuts != continued {
				t.Errorf("%d abort cuts recorded for %d continued generations", cuts, continued)
			}
			if mode == "abort" && a.Aborted > 0 && continued == 0 && c.last.GetStaleRegenerated() == 0 {
				t.Errorf("the simulator aborted %d generations, no delivered rollout continues one, and no group was regenerated", a.Aborted)
			}
			if mode != "abort" && cuts != 0 {
				t.Errorf("%d abort cuts in mode %s", cuts, mode)
			}
		})
	}
}

// checkTokenExact compares each turn of a rollout (the runs of trained
// positions) with the simulator's generations of that turn, joined across
// abort cuts, and checks the versions at each cut. It returns the abort
// cuts the rollout records and the continuations the simulator generated
// for it (one per abort).
func checkTokenExact(t *testing.T, ro *rolloutv1.Rollout, gens map[string][]sim.GenerationRecord) (cuts, continued int) {
	t.Helper()
	type span struct{ start, end int }
	var spans []span
	for i := 0; i < len(ro.LossMask); {
		if ro.LossMask[i] == 0 {
			i++
			continue
		}
		j := i
		for j < len(ro.LossMask) && ro.LossMask[j] == 1 {
			j++
		}
		spans = append(spans, span{i, j})
		i = j
	}
	for k, sp := range spans {
		base := ro.RolloutId + "-t" + strconv.Itoa(k+1)
		var parts []string
		for id := range gens {
			if id == base || strings.HasPrefix(id, base+"-c") {
				parts = append(parts, id)
			}
		}
		sort.Slice(parts, func(a, b int) bool { return contIndex(parts[a]) < contIndex(parts[b]) })
		var ids []int32
		var lps []float32
		var vers []int64
		for _, id := range parts {
			if len(gens[id]) != 1 {
				t.Fatalf("request %s generated %d times", id, len(gens[id]))
			}
			g := gens[id][0]
			for j, x := range g.IDs {
				ids = append(ids, int32(x))
				lps = append(lps, float32(g.Logprobs[j]))
				vers = append(vers, g.Versions[j])
			}
		}
		if !slices.Equal(ro.Tokens[sp.start:sp.end], ids) {
			t.Fatalf("rollout %s turn %d: ids differ from the simulator's (%d parts)", ro.RolloutId, k+1, len(parts))
		}
		if !slices.Equal(ro.Logprobs[sp.start:sp.end], lps) {
			t.Fatalf("rollout %s turn %d: logprobs differ from the simulator's", ro.RolloutId, k+1)
		}
		continued += len(parts) - 1
		if len(parts) > 1 {
			// A continued generation: its versions are exactly the simulator's.
			if !slices.Equal(ro.TokenVersions[sp.start:sp.end], vers) {
				t.Fatalf("rollout %s turn %d: versions %v, simulator %v", ro.RolloutId, k+1, ro.TokenVersions[sp.start:sp.end], vers)
			}
		}
	}
	for _, c := range ro.VersionCuts {
		if c.Kind != "abort" {
			continue
		}
		cuts++
		if c.Position <= 0 || int(c.Position) >= len(ro.Tokens) || ro.TokenVersions[c.Position] != c.To || ro.TokenVersions[c.Position-1] != c.From {
			t.Fatalf("rollout %s: cut %v does not match the token versions %v", ro.RolloutId, c, ro.TokenVersions[max(0, c.Position-2):min(len(ro.TokenVersions), int(c.Position)+2)])
		}
	}
	return cuts, continued
}

func contIndex(id string) int {
	i := strings.LastIndex(id, "-c")
	if i < 0 {
		return 0
	}
	n, err := strconv.Atoi(id[i+2:])
	if err != nil {
		return 0
	}
	return n
}
