package agent

import (
	"context"
	"time"
)

// pipe runs spec with stdin fed from the request's inbound Data frames and
// stdout streamed back as Data frames (OpPipe). It returns when the
// command exited (or was killed on cancel) and its stdout is drained.
func (s *server) pipe(ctx context.Context, pr *peer, id uint32, spec *ExecSpec, data <-chan []byte) (*ExecResult, error) {
	if spec == nil {
		return nil, invalidf("pipe without a command")
	}
	if spec.Shell || spec.TimeoutNS != 0 || spec.Stdin != nil || spec.Merge {
		return nil, invalidf("pipe takes argv or command only (no shell session, timeout, stdin or merge)")
	}
	limit, err := outputCap(spec)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	stderr := newCapBuf(limit)
	ps := *spec
	ps.KeepStdin = true
	r, err := s.launch(&ps, &frameWriter{p: pr, id: id}, stderr, false)
	if err != nil {
		return nil, err
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- r.wait() }()
	exited := make(chan struct{})
	feedDone := make(chan struct{})
	go func() {
		defer close(feedDone)
		in := data
		for {
			select {
			case b, ok := <-in:
				if !ok {
					_ = r.stdin.Close()
					return
				}
				if _, err := r.stdin.Write(b); err != nil {
					// The command closed its stdin or exited: drop the rest.
					in = drain(in)
				}
			case <-exited:
				return
			}
		}
	}()
	cancelled := false
	select {
	case <-waitErr:
	case <-ctx.Done():
		cancelled = true
		r.killGroup()
		<-waitErr
	}
	close(exited)
	<-feedDone
	r.killGroup() // whatever the command left in its group
	r.finish()
	_ = pr.send(FrameEnd, id, nil)
	res := &ExecResult{ExitCode: exitCode(r.cmd.ProcessState), DurationNS: int64(time.Since(start))}
	res.Stderr, res.StderrTotal, res.StderrTruncated = stderr.bytes()
	if cancelled {
		res.ExitCode = 137
	}
	return res, nil
}

// drain returns a channel that is never ready after consuming c in the
// background until it closes, so a stopped reader never blocks the serve
// loop.
func drain(c <-chan []byte) <-chan []byte {
	go func() {
		for range c {
		}
	}()
	return nil
}
