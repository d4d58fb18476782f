package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/envs"
	"github.com/rollout-rl/rollout/rewards"
)

// gateSink admits groups only while open; it records how many groups were
// admitted and written, and the admission count at each write.
type gateSink struct {
	memSink
	mu       sync.Mutex
	open     chan struct{} // closed: admit freely
	admitted int
	limit    int   // admit at most this many before blocking (0: no limit)
	err      error // returned by Admit once limit is reached (instead of blocking)
}

func (s *gateSink) Admit(ctx context.Context) error {
	s.mu.Lock()
	if s.limit == 0 || s.admitted < s.limit {
		s.admitted++
		s.mu.Unlock()
		return nil
	}
	if s.err != nil {
		s.mu.Unlock()
		return s.err
	}
	open := s.open
	s.mu.Unlock()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-open:
	}
	s.mu.Lock()
	s.admitted++
	s.mu.Unlock()
	return nil
}

func (s *gateSink) counts() (admitted, written int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.memSink.mu.Lock()
	defer s.memSink.mu.Unlock()
	return s.admitted, len(s.groups)
}

// A blocking Admit pauses intake: no new group starts, the groups already
// running finish normally (not cancelled) and are written; opening the gate
// resumes intake.
func TestAdmitterPausesIntake(t *testing.T) {
	env := &scoreEnv{items: items(6), reward: func(envs.Outcome) (rewards.Score, error) { return rewards.Score{Value: 1}, nil }}
	cfg := baseConfig()
	cfg.Limits.GroupsInFlight = 4
	sink := &gateSink{open: make(chan struct{}), limit: 2}
	r, err := New(cfg, Deps{Logger: quiet, Env: env, Policy: &scriptPolicy{delay: 5 * time.Millisecond}, Sinks: []Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		sum Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, err := r.Run(context.Background())
		done <- result{sum, err}
	}()
	// Wait until the two admitted groups are written; the intake loop is
	// then parked in Admit.
	deadline := time.After(10 * time.Second)
	for {
		if _, w := sink.counts(); w == 2 {
			break
		}
		select {
		case <-deadline:
			t.Fatal("the admitted groups were never written")
		case <-time.After(5 * time.Millisecond):
		}
	}
	if a, w := sink.counts(); a != 2 || w != 2 {
		t.Fatalf("while paused: admitted %d written %d, want 2 and 2", a, w)
	}
	for _, g := range sink.groups {
		if g.OK != len(g.Rollouts) {
			t.Errorf("group %s: %d of %d rollouts ok while intake was paused", g.ID, g.OK, len(g.Rollouts))
		}
	}
	close(sink.open)
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.sum.Groups != 6 || res.sum.RolloutsOK != 24 {
		t.Fatalf("summary %+v", res.sum)
	}
}

func TestAdmitterStopsIntakeOrFails(t *testing.T) {
	env := &scoreEnv{items: items(5), reward: func(envs.Outcome) (rewards.Score, error) { return rewards.Score{Value: 1}, nil }}
	cfg := baseConfig()
	cfg.Limits.GroupsInFlight = 1

	stop := &gateSink{limit: 2, err: fmt.Errorf("trainer done: %w", ErrIntakeStopped)}
	r, _ := New(cfg, Deps{Logger: quiet, Env: env, Policy: &scriptPolicy{}, Sinks: []Sink{stop}})
	sum, err := r.Run(context.Background())
	if !errors.Is(err, ErrIntakeStopped) || sum.Groups != 2 {
		t.Fatalf("stop: err %v, %d groups; want ErrIntakeStopped after 2", err, sum.Groups)
	}

	fail := &gateSink{limit: 1, err: errors.New("bridge misconfigured")}
	r, _ = New(cfg, Deps{Logger: quiet, Env: env, Policy: &scriptPolicy{}, Sinks: []Sink{fail}})
	sum, err = r.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "bridge misconfigured") || errors.Is(err, ErrIntakeStopped) {
		t.Fatalf("fail: err %v", err)
	}
	if sum.Groups != 1 {
		t.Errorf("fail: %d groups written, want the 1 admitted", sum.Groups)
	}
}
