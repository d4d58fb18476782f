package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/rollout-rl/rollout/sandbox/agent"
)

// abortAgent is the far end of a conn that answers a call only when the
// host gives it up (a Cancel frame, or an End frame with a payload: an
// aborted upload), after killTime, as the agent answers once the command
// is killed and reaped. answered gets the time just before the answer.
func abortAgent(t *testing.T, killTime time.Duration) (c *Conn, answered <-chan time.Time) {
	t.Helper()
	hostR, agentW := io.Pipe()
	agentR, hostW := io.Pipe()
	t.Cleanup(func() { _ = agentW.Close(); _ = hostW.Close() })
	at := make(chan time.Time, 1)
	go func() {
		for {
			f, err := agent.ReadFrame(agentR)
			if err != nil {
				return
			}
			if f.Type == agent.FrameCancel || f.Type == agent.FrameEnd && len(f.Payload) > 0 {
				time.Sleep(killTime)
				b, _ := json.Marshal(agent.Response{Err: "cancelled"})
				at <- time.Now()
				_ = agent.WriteFrame(agentW, agent.FrameResponse, f.ID, b)
			}
		}
	}()
	return NewConn(hostR, hostW), at
}

func checkAnsweredFirst(t *testing.T, returned time.Time, answered <-chan time.Time) {
	t.Helper()
	select {
	case at := <-answered:
		if returned.Before(at) {
			t.Fatalf("the call returned %v before the agent answered", at.Sub(returned))
		}
	default:
		t.Fatal("the call returned before the agent answered")
	}
}

// A cancelled call returns only once the agent has answered it, so the
// next call cannot find the cancelled command still running.
func TestConnCancelWaitsForTheAgentsAnswer(t *testing.T) {
	c, answered := abortAgent(t, 300*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.roundTrip(ctx, agent.Request{Op: agent.OpExec, Exec: &agent.ExecSpec{Command: "sleep 1000"}}, nil, nil)
	returned := time.Now()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	checkAnsweredFirst(t, returned, answered)
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk gone") }

// So does an upload whose source fails: the agent drops the partial
// upload before it answers.
func TestConnAbortedUploadWaitsForTheAgentsAnswer(t *testing.T) {
	c, answered := abortAgent(t, 300*time.Millisecond)
	_, err := c.roundTrip(context.Background(), agent.Request{Op: agent.OpWrite, Path: "/tmp/x"}, failingReader{}, nil)
	returned := time.Now()
	if err == nil {
		t.Fatal("upload from a failing source succeeded")
	}
	checkAnsweredFirst(t, returned, answered)
}
