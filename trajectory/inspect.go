package trajectory

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
)

// Summary is what `rollout inspect` prints about a run.
type Summary struct {
	Files, Unlisted int
	// Rows counts rollouts (a gateway session once, whatever its
	// branches); OK and Failed split them.
	Rows, OK, Failed int
	// Sequences counts every row (each branch of a session is a trainable
	// sequence); Branched the rollouts with more than one branch.
	Sequences, Branched int
	Envs                map[string]int
	Groups, Items       int
	Tokens, Trained     int64
	// Sampled counts the ids the ok rows sampled; Unscored those of them
	// without a logprob (untrained; inference.max_unscored_share).
	Sampled, Unscored int64
	Reward            Distribution
	RewardHistogram   []HistogramBin
	StopReasons       map[string]int
	FailureKinds      map[string]FailureCount
	ToolErrorKinds    map[string]int
	// LoopEvents counts the agent loop's interventions by kind.
	LoopEvents map[string]int
	// CallParse counts tool calls by parser (the run's parser family,
	// manifest.parser; "(server)" in chat mode) and parse status.
	CallParse map[string]map[string]int
	// CallSpans counts, by parser, the calls with a token span.
	CallSpans map[string]int
	Phases    []PhaseStat
	Slowest   []SlowRollout
}

// Distribution summarises a set of values.
type Distribution struct {
	N                             int
	Min, P25, P50, P75, Max, Mean float64
}

// HistogramBin counts values in [Lo, Hi).
type HistogramBin struct {
	Lo, Hi float64
	Count  int
}

// FailureCount is how often an infra failure kind occurred, with one example.
type FailureCount struct {
	Count   int
	Example string
}

// PhaseStat is the time spent in one rollout phase across the run.
type PhaseStat struct {
	Name          string
	TotalMS       int64
	Share         float64 // of the summed total_ms
	P50, P90, Max float64
}

// SlowRollout identifies one of the slowest rollouts.
type SlowRollout struct {
	GroupID      string
	RolloutIndex int32
	Env          string
	TotalMS      int64
	Status       string
}

// Summarize computes a Summary of recs.
func Summarize(run *Run, recs []Record) Summary {
	s := Summary{Envs: map[string]int{}, StopReasons: map[string]int{}, FailureKinds: map[string]FailureCount{}, ToolErrorKinds: map[string]int{}, LoopEvents: map[string]int{}}
	if run != nil {
		s.Files, s.Unlisted = len(run.Files), len(run.Unlisted)
	}
	groups, items := map[string]bool{}, map[string]bool{}
	var rewards []float64
	branched := map[string]bool{}
	for i := range recs {
		r := &recs[i]
		s.Sequences++
		s.Tokens += int64(len(r.Tokens))
		s.Trained += int64(r.Trained())
		sampled, unscored := sampledTokens(r)
		s.Sampled += sampled
		s.Unscored += unscored
		if !r.Main() {
			branched[fmt.Sprintf("%s\x00%d", r.GroupID, r.RolloutIndex)] = true
		}
	}
	s.Branched = len(branched)
	// The rest is per rollout: its main row.
	recs = MainRows(recs)
	for i := range recs {
		r := &recs[i]
		s.Rows++
		s.Envs[r.Env]++
		groups[r.GroupID] = true
		items[r.Env+"\x00"+r.ItemID] = true
		if r.StopReason != "" {
			s.StopReasons[r.StopReason]++
		}
		for _, te := range r.ToolErrors {
			s.ToolErrorKinds[te.Tool+": "+te.Kind]++
		}
		for _, e := range r.LoopEvents {
			s.LoopEvents[e.Kind]++
		}
		if len(r.CallStatuses) > 0 {
			parser := r.Manifest.Parser
			if parser == "" {
				parser = "(server)"
			}
			if s.CallParse == nil {
				s.CallParse = map[string]map[string]int{}
			}
			if s.CallParse[parser] == nil {
				s.CallParse[parser] = map[string]int{}
			}
			for _, c := range r.CallStatuses {
				s.CallParse[parser][c.Status]++
				if c.SpanEnd > c.SpanStart {
					if s.CallSpans == nil {
						s.CallSpans = map[string]int{}
					}
					s.CallSpans[parser]++
				}
			}
		}
		if r.Status == StatusOK {
			s.OK++
			rewards = append(rewards, r.Reward)
		} else {
			s.Failed++
			kind, msg := "unknown", ""
			if r.Failure != nil {
				kind, msg = r.Failure.Kind, r.Failure.Message
			}
			fc := s.FailureKinds[kind]
			fc.Count++
			if fc.Example == "" {
				fc.Example = msg
			}
			s.FailureKinds[kind] = fc
		}
	}
	s.Groups, s.Items = len(groups), len(items)
	s.Reward = distribution(rewards)
	s.RewardHistogram = histogram(rewards, 10)

	phases := []struct {
		name string
		get  func(*Timings) int64
	}{
		{"generation", func(t *Timings) int64 { return t.GenerationMS }},
		{"tools", func(t *Timings) int64 { return t.ToolsMS }},
		{"sandbox_start", func(t *Timings) int64 { return t.SandboxStartMS }},
		{"reward", func(t *Timings) int64 { return t.RewardMS }},
	}
	var total int64
	for i := range recs {
		total += recs[i].Timings.TotalMS
	}
	for _, ph := range phases {
		var xs []float64
		var sum int64
		for i := range recs {
			v := ph.get(&recs[i].Timings)
			sum += v
			xs = append(xs, float64(v))
		}
		sort.Float64s(xs)
		p := PhaseStat{Name: ph.name, TotalMS: sum}
		if total > 0 {
			p.Share = float64(sum) / float64(total)
		}
		if len(xs) > 0 {
			p.P50, p.P90, p.Max = percentile(xs, 50), percentile(xs, 90), xs[len(xs)-1]
		}
		s.Phases = append(s.Phases, p)
	}
	sort.SliceStable(s.Phases, func(a, b int) bool { return s.Phases[a].TotalMS > s.Phases[b].TotalMS })
	idx := make([]int, len(recs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return recs[idx[a]].Timings.TotalMS > recs[idx[b]].Timings.TotalMS })
	for _, i := range idx[:min(5, len(idx))] {
		r := &recs[i]
		s.Slowest = append(s.Slowest, SlowRollout{GroupID: r.GroupID, RolloutIndex: r.RolloutIndex, Env: r.Env, TotalMS: r.Timings.TotalMS, Status: r.Status})
	}
	return s
}

func distribution(xs []float64) Distribution {
	if len(xs) == 0 {
		return Distribution{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	return Distribution{N: len(s), Min: s[0], P25: percentile(s, 25), P50: percentile(s, 50), P75: percentile(s, 75), Max: s[len(s)-1], Mean: sum / float64(len(s))}
}

func histogram(xs []float64, bins int) []HistogramBin {
	if len(xs) == 0 {
		return nil
	}
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	if lo == hi {
		return []HistogramBin{{Lo: lo, Hi: hi, Count: len(xs)}}
	}
	w := (hi - lo) / float64(bins)
	out := make([]HistogramBin, bins)
	for i := range out {
		out[i].Lo, out[i].Hi = lo+float64(i)*w, lo+float64(i+1)*w
	}
	for _, x := range xs {
		b := min(int((x-lo)/w), bins-1)
		out[b].Count++
	}
	return out
}

// WriteSummary prints s for a terminal.
func WriteSummary(w io.Writer, dir string, s Summary) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }
	p("run\t%s\n", dir)
	p("files\t%d", s.Files)
	if s.Unlisted > 0 {
		p(" (%d not yet in run.json)", s.Unlisted)
	}
	p("\n")
	p("rollouts\t%d (ok %d, infra_failed %d)\n", s.Rows, s.OK, s.Failed)
	p("groups / items\t%d / %d\n", s.Groups, s.Items)
	p("envs\t%s\n", countsLine(s.Envs))
	if s.Sequences > s.Rows {
		p("branches\t%d sequences; %d rollouts with more than one branch (gateway sessions)\n", s.Sequences, s.Branched)
	}
	if s.Tokens > 0 {
		per := "rollout"
		if s.Sequences > s.Rows {
			per = "sequence"
		}
		p("tokens\t%d (%.1f%% trained, %.0f per %s)\n", s.Tokens, 100*float64(s.Trained)/float64(s.Tokens), float64(s.Tokens)/float64(max(s.Sequences, 1)), per)
	}
	if s.Sampled > 0 {
		p("unscored\t%d of %d sampled tokens (%.2f%%; no logprob, not trained)\n", s.Unscored, s.Sampled, 100*float64(s.Unscored)/float64(s.Sampled))
	}
	p("stop reasons\t%s\n", countsLine(s.StopReasons))
	if len(s.LoopEvents) > 0 {
		p("loop events\t%s\n", countsLine(s.LoopEvents))
	}
	for _, parser := range slices.Sorted(maps.Keys(s.CallParse)) {
		c := s.CallParse[parser]
		n := 0
		for _, v := range c {
			n += v
		}
		share := func(k string) float64 { return 100 * float64(c[k]) / float64(n) }
		p("call parsing\t%s: %d calls, malformed %d (%.1f%%), repaired %d (%.1f%%), ok %d; with a token span %d\n",
			parser, n, c[CallMalformed], share(CallMalformed), c[CallRepaired], share(CallRepaired), c[CallOK], s.CallSpans[parser])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	d := s.Reward
	fmt.Fprintf(w, "reward (ok rollouts, n=%d): min %.4g  p25 %.4g  median %.4g  p75 %.4g  max %.4g  mean %.4g\n", d.N, d.Min, d.P25, d.P50, d.P75, d.Max, d.Mean)
	maxCount := 0
	for _, b := range s.RewardHistogram {
		maxCount = max(maxCount, b.Count)
	}
	for _, b := range s.RewardHistogram {
		bar := strings.Repeat("#", int(math.Round(40*float64(b.Count)/float64(max(maxCount, 1)))))
		fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("  [%8.4g, %8.4g]  %6d  %s", b.Lo, b.Hi, b.Count, bar), " "))
	}
	fmt.Fprintln(w)
	if len(s.FailureKinds) > 0 {
		fmt.Fprintln(w, "infra failures:")
		for _, k := range sortedKeys(s.FailureKinds, func(a, b FailureCount) bool { return a.Count > b.Count }) {
			fc := s.FailureKinds[k]
			fmt.Fprintf(w, "  %-24s %6d  e.g. %s\n", k, fc.Count, truncate(fc.Example, 100))
		}
		fmt.Fprintln(w)
	}
	if len(s.ToolErrorKinds) > 0 {
		fmt.Fprintln(w, "tool errors:")
		for _, k := range sortedKeys(s.ToolErrorKinds, func(a, b int) bool { return a > b }) {
			fmt.Fprintf(w, "  %-24s %6d\n", k, s.ToolErrorKinds[k])
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "phases (slowest first):")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  phase\ttotal s\tshare\tp50 ms\tp90 ms\tmax ms\t")
	for _, ph := range s.Phases {
		fmt.Fprintf(tw, "  %s\t%.1f\t%.0f%%\t%.0f\t%.0f\t%.0f\t\n", ph.Name, float64(ph.TotalMS)/1000, 100*ph.Share, ph.P50, ph.P90, ph.Max)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(s.Slowest) > 0 {
		fmt.Fprintln(w, "\nslowest rollouts:")
		for _, r := range s.Slowest {
			fmt.Fprintf(w, "  %8d ms  %s  group %s rollout %d  (%s)\n", r.TotalMS, r.Env, r.GroupID, r.RolloutIndex, r.Status)
		}
	}
	return nil
}

func countsLine(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range sortedKeys(m, func(a, b int) bool { return a > b }) {
		name := k
		if name == "" {
			name = `""`
		}
		parts = append(parts, fmt.Sprintf("%s %d", name, m[k]))
	}
	return strings.Join(parts, ", ")
}

// sortedKeys orders keys by value (less), then by key.
func sortedKeys[V any](m map[string]V, less func(a, b V) bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool {
		va, vb := m[keys[a]], m[keys[b]]
		if less(va, vb) {
			return true
		}
		if less(vb, va) {
			return false
		}
		return keys[a] < keys[b]
	})
	return keys
}

func truncate(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
