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

// A cancelled call returns only once the agent has answered it — the
// agent answers after it has killed and reaped the command — so the next
// call cannot find that command still running. Here the agent takes
// 300 ms to answer the cancel.
func TestConnCancelWaitsForTheAgentsAnswer(t *testing.T) {
	hostR, agentW := io.Pipe()
	agentR, hostW := io.Pipe()
	c := newConn(hostR, hostW)
	defer agentW.Close()
	defer hostW.Close()
	const killTime = 300 * time.Millisecond
	answered := make(chan time.Time, 1)
	go func() {
		var id uint32
		for {
			f, err := agent.ReadFrame(agentR)
			if err != nil {
				return
			}
			switch f.Type {
			case agent.FrameRequest:
				id = f.ID
			case agent.FrameCancel:
				if f.ID != id {
					return
				}
				time.Sleep(killTime)
				b, _ := json.Marshal(agent.Response{Err: "command cancelled"})
				answered <- time.Now()
				_ = agent.WriteFrame(agentW, agent.FrameResponse, f.ID, b)
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.roundTrip(ctx, agent.Request{Op: agent.OpExec, Exec: &agent.ExecSpec{Command: "sleep 1000"}}, nil, nil)
	returned := time.Now()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	select {
	case at := <-answered:
		if returned.Before(at) {
			t.Fatalf("the call returned %v before the agent answered its cancel", at.Sub(returned))
		}
	default:
		t.Fatal("the call returned before the agent answered its cancel")
	}
}
