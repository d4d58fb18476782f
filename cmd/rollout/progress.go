package main

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/rollout-rl/rollout/runner"
)

// progress renders runner events: a one-line bar redrawn in place on a
// terminal, plain log lines every interval otherwise.
type progress struct {
	mu       sync.Mutex
	w        io.Writer
	tty      bool
	log      *slog.Logger
	start    time.Time
	total    int
	groups   int
	rollouts int
	ok       int
	failed   int
	reward   float64
	last     time.Time
	interval time.Duration
}

func newProgress(w *os.File, log *slog.Logger) *progress {
	return &progress{w: w, tty: isTerminal(w), log: log, start: time.Now(), interval: 10 * time.Second}
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func (p *progress) event(e runner.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e.Total > 0 {
		p.total = e.Total
	}
	if ro := e.Rollout; ro != nil {
		p.rollouts++
		if ro.Status == runner.StatusOK {
			p.ok++
			p.reward += ro.Score.Value
		} else {
			p.failed++
		}
	}
	if e.Group != nil {
		p.groups++
	}
	now := time.Now()
	if p.tty {
		if now.Sub(p.last) >= 100*time.Millisecond || e.Group != nil {
			fmt.Fprintf(p.w, "\r\033[K%s", p.line(now))
			p.last = now
		}
		return
	}
	if now.Sub(p.last) >= p.interval {
		p.log.Info("progress", "groups", p.groups, "of", p.total, "rollouts", p.rollouts, "infra_failed", p.failed, "mean_reward", p.mean())
		p.last = now
	}
}

func (p *progress) mean() float64 {
	if p.ok == 0 {
		return 0
	}
	return p.reward / float64(p.ok)
}

func (p *progress) line(now time.Time) string {
	el := now.Sub(p.start)
	rate := float64(p.rollouts) / max(el.Seconds(), 1e-9)
	eta := "?"
	if p.groups > 0 && p.total > 0 {
		eta = (time.Duration(float64(el) / float64(p.groups) * float64(p.total-p.groups))).Round(time.Second).String()
	}
	width := 24
	filled := 0
	if p.total > 0 {
		filled = p.groups * width / p.total
	}
	bar := make([]byte, width)
	for i := range bar {
		bar[i] = '.'
		if i < filled {
			bar[i] = '#'
		}
	}
	return fmt.Sprintf("[%s] groups %d/%d  rollouts %d (%.2f/s)  mean reward %.3f  infra failures %d  ETA %s",
		bar, p.groups, p.total, p.rollouts, rate, p.mean(), p.failed, eta)
}

// done ends the bar's line.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s\n", p.line(time.Now()))
	}
}

// printSummary writes the end-of-run summary.
func printSummary(w io.Writer, dir string, s runner.Summary) {
	fmt.Fprintf(w, "groups:      %d written, %d already done (resumed), %d dropped (equal scores)\n", s.Groups, s.GroupsSkipped, s.GroupsDropped)
	if s.GroupsInterrupted > 0 {
		fmt.Fprintf(w, "             %d interrupted by cancellation (not written; run again to collect them)\n", s.GroupsInterrupted)
	}
	fmt.Fprintf(w, "rollouts:    %d (%d ok, %d infra-failed after retries, %d retries)\n", s.Rollouts, s.RolloutsOK, s.InfraFailed, s.Retries)
	for k, n := range s.FailuresByKind {
		fmt.Fprintf(w, "  failure %-18s %d\n", k+":", n)
	}
	for _, k := range slices.Sorted(maps.Keys(s.StopReasons)) {
		fmt.Fprintf(w, "  stop    %-18s %d\n", k+":", s.StopReasons[k])
	}
	fmt.Fprintf(w, "mean reward: %.4f (ok rollouts)\n", s.MeanReward)
	if s.Elapsed > 0 {
		fmt.Fprintf(w, "elapsed:     %s (%.2f rollouts/s)\n", s.Elapsed.Round(time.Millisecond), float64(s.Rollouts)/s.Elapsed.Seconds())
	}
	fmt.Fprintf(w, "output:      %s\n", dir)
}
