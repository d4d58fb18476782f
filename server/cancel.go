package server

import (
	"time"
)

// DefaultCancelGrace is Options.CancelGrace's default: how long the
// in-flight rollouts of a job cancelled without cancel_in_flight may take
// to finish and be written before they are cancelled too.
const DefaultCancelGrace = 30 * time.Second

// boundCancel makes a draining CancelJob end the job within the grace,
// whatever its rollouts wait on (a generation that never returns, a
// sandbox, a retry): past it, the job's in-flight rollouts are cancelled;
// their groups are not written and a resumed job collects them again. A
// job whose endpoints are all unreachable does not wait that long: its
// watch cancels them after 3 s (assemble).
func (s *Server) boundCancel(jr *jobRun) {
	grace := s.opts.CancelGrace
	if grace == 0 {
		grace = DefaultCancelGrace
	}
	if grace < 0 {
		return
	}
	time.AfterFunc(grace, func() {
		select {
		case <-jr.done:
			return
		default:
		}
		s.log.Info("cancelled job still has rollouts in flight after the cancel grace; cancelling them", "job", jr.st.ID, "grace", grace.String())
		jr.cancel()
	})
}
