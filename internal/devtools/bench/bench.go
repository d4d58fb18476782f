// Package bench is the benchmark harness behind `rollout bench` and `make
// bench`. It runs the measurement functions (sandbox.Measure*, and its own
// sub-packages: inferencebench, loopbench, trajbench over synth's records),
// the parsers and the end-to-end
// runner, each next to a baseline measured in the same process, compares
// every result with the target its capability issue names, and produces
// the JSON report that docs/performance.md is generated from (Markdown).
//
// The machines this runs on are shared and noisy: absolute times drift, so
// wherever a baseline exists the measure carries it and the ratio. Nothing
// here asserts on timing; a target that is not met is a row in the report,
// not an error.
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/internal/util/version"
)

// Report is the JSON document `rollout bench --json` writes.
type Report struct {
	Machine  Machine   `json:"machine"`
	Run      RunInfo   `json:"run"`
	Measures []Measure `json:"measures"`
}

// RunInfo describes the benchmark run itself.
type RunInfo struct {
	Version  string    `json:"version"`
	Commit   string    `json:"commit"`
	Started  time.Time `json:"started"`
	ElapsedS float64   `json:"elapsed_s"`
	Quick    bool      `json:"quick"`
	Suites   []string  `json:"suites"`
	// Corpus is the parsers corpus directory when --corpus was given.
	Corpus string `json:"corpus,omitempty"`
	// SettleS is the time spent before suites waiting for the machine to
	// settle (an earlier suite's teardown; settle.go).
	SettleS float64 `json:"settle_s,omitempty"`
	// Errors holds, by suite, why a suite stopped early: its remaining
	// measures are listed as not measured.
	Errors map[string]string `json:"errors,omitempty"`
}

// Measure is one row of the report. Value is null when the measure could
// not be taken (Note says why). Ratio is Value/Baseline. Target is an
// inequality such as "<= 5"; Met is set whenever there is a target (false
// when not measured) and absent otherwise.
type Measure struct {
	Name     string   `json:"name"`
	Unit     string   `json:"unit"`
	Value    *float64 `json:"value"`
	Baseline *float64 `json:"baseline,omitempty"`
	Ratio    *float64 `json:"ratio,omitempty"`
	Target   string   `json:"target,omitempty"`
	Met      *bool    `json:"met,omitempty"`
	// Description says what is measured; BaselineName what the baseline is.
	Description  string `json:"description,omitempty"`
	BaselineName string `json:"baseline_name,omitempty"`
	// Source is where the target comes from (e.g. "issue 4").
	Source string `json:"source,omitempty"`
	Note   string `json:"note,omitempty"`
}

// Measured reports whether the measure has a value.
func (m Measure) Measured() bool { return m.Value != nil }

// Suites are the suite names in the order they run and are reported.
var Suites = []string{"parsers", "sandbox", "inference", "loop", "gateway", "runner", "output"}

// Options configure a run.
type Options struct {
	// Suites to run (default: all, in Suites order).
	Suites []string
	// Quick uses small counts so that every suite finishes in under two
	// minutes in total (CI smoke runs: crashes, not numbers).
	Quick bool
	// Corpus is a directory of <parser>.txt files for the parsers suite
	// (default: the repository's parsers/testdata/bench).
	Corpus string
	// Kubeconfig, when set, adds the Kubernetes backend's rows
	// (sandbox.k8s.*) to the sandbox suite, measured on that cluster in
	// the same run as the Docker rows (docs/kubernetes.md).
	Kubeconfig string
	// SimBinary is the rollout executable whose `sim` command serves the
	// simulator for measures that keep it out of this process (the loop
	// suite's *_client_* measures). Default: this executable, unless it is
	// a test binary, in which case those measures are not taken.
	SimBinary string
	// Log receives progress lines (nil: discarded).
	Log io.Writer
	// Logger is handed to the components under test and is the default
	// logger during the run (nil: discarded, so that their logging does
	// not count against them).
	Logger *slog.Logger
}

// suiteFunc measures one suite. It returns what it measured even when it
// fails part-way; measures of the catalogue it did not produce are listed
// as not measured with the error as the reason.
type suiteFunc func(ctx context.Context, r *runCtx) ([]Measure, error)

var suiteFuncs = map[string]suiteFunc{
	"parsers":   runParsers,
	"sandbox":   runSandbox,
	"inference": runInference,
	"loop":      runLoop,
	"gateway":   runGateway,
	"runner":    runRunner,
	"output":    runOutput,
}

// runCtx is what suites share.
type runCtx struct {
	opts Options
	log  io.Writer
	// logger is passed to the components under test.
	logger *slog.Logger
}

func (r *runCtx) quick() bool { return r.opts.Quick }

// n picks the count for the run mode.
func (r *runCtx) n(full, quick int) int {
	if r.opts.Quick {
		return quick
	}
	return full
}

func (r *runCtx) printf(format string, args ...any) {
	fmt.Fprintf(r.log, format+"\n", args...)
}

// CheckSuites validates suite names (empty: all) and returns them in run
// order.
func CheckSuites(names []string) ([]string, error) {
	if len(names) == 0 {
		return slices.Clone(Suites), nil
	}
	want := map[string]bool{}
	for _, n := range names {
		if _, ok := suiteFuncs[n]; !ok {
			return nil, fmt.Errorf("unknown suite %q (suites: %s)", n, strings.Join(Suites, ", "))
		}
		want[n] = true
	}
	var out []string
	for _, s := range Suites {
		if want[s] {
			out = append(out, s)
		}
	}
	return out, nil
}

// Run measures the selected suites. A suite that fails does not stop the
// others: its measures are reported as not measured, with the error.
func Run(ctx context.Context, opts Options) (Report, error) {
	suites, err := CheckSuites(opts.Suites)
	if err != nil {
		return Report{}, err
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	v := version.Get()
	rep := Report{Run: RunInfo{Version: v.Version, Commit: v.Commit, Started: time.Now().UTC().Truncate(time.Second),
		Quick: opts.Quick, Suites: suites, Corpus: opts.Corpus}}
	rep.Machine = CollectMachine(ctx)
	// Components that log to the default logger (the Parquet writer, the
	// simulator) would otherwise interleave with the progress lines and
	// pay for it inside the measurements.
	prev := slog.Default()
	slog.SetDefault(opts.Logger)
	defer slog.SetDefault(prev)
	r := &runCtx{opts: opts, log: opts.Log, logger: opts.Logger}
	start := time.Now()
	for _, name := range suites {
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		r.printf("==> %s", name)
		w, err := r.settleBefore(ctx, name)
		rep.Run.SettleS += round(w.Seconds(), 1)
		if err != nil {
			return rep, err
		}
		t0 := time.Now()
		ms, err := runSuite(ctx, r, name)
		if err != nil {
			r.printf("    %s: %v", name, err)
			if rep.Run.Errors == nil {
				rep.Run.Errors = map[string]string{}
			}
			rep.Run.Errors[name] = err.Error()
		}
		// A custom parser corpus is not the one the targets were set on.
		ms = complete(name, ms, err, !(name == "parsers" && opts.Corpus != ""))
		for _, m := range ms {
			r.printf("    %s", m.Line())
		}
		r.printf("    (%s)", time.Since(t0).Round(100*time.Millisecond))
		rep.Measures = append(rep.Measures, ms...)
		// Leave the next suite a clean heap: RSS and CPU measures are
		// process-wide.
		runtime.GC()
		debug.FreeOSMemory()
	}
	rep.Run.ElapsedS = round(time.Since(start).Seconds(), 1)
	rep.Machine.LoadAvgEnd = loadAvg()
	return rep, ctx.Err()
}

// runSuite runs one suite, turning a panic into an error so one broken
// suite cannot take the report down.
func runSuite(ctx context.Context, r *runCtx, name string) (ms []Measure, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	return suiteFuncs[name](ctx, r)
}

// complete fills targets, ratios and met from the catalogue (when
// useCatalog), and adds the catalogue's measures the suite did not produce
// as not measured.
func complete(suite string, ms []Measure, suiteErr error, useCatalog bool) []Measure {
	have := map[string]bool{}
	for _, m := range ms {
		have[m.Name] = true
	}
	for _, c := range catalog {
		if !useCatalog || c.suite != suite || have[c.name] {
			continue
		}
		reason := "not produced by the suite"
		if suiteErr != nil {
			reason = "suite failed: " + firstLine(suiteErr.Error())
		}
		ms = append(ms, NotMeasured(c.name, reason))
	}
	for i := range ms {
		ms[i] = finish(ms[i], useCatalog)
	}
	return ms
}

// finish applies the catalogue entry of m (unit, target, source,
// description where m has none), then computes Ratio and Met.
func finish(m Measure, useCatalog bool) Measure {
	if c, ok := catalogByName[m.Name]; ok && useCatalog {
		if m.Unit == "" {
			m.Unit = c.unit
		}
		if m.Target == "" {
			m.Target = c.target
		}
		if m.Source == "" {
			m.Source = c.source
		}
		if m.Description == "" {
			m.Description = c.desc
		}
	}
	if m.Value != nil && m.Baseline != nil && m.Ratio == nil && *m.Baseline != 0 {
		m.Ratio = ptr(sig(*m.Value / *m.Baseline))
	}
	if m.Target != "" {
		met := false
		if m.Value != nil {
			ok, err := Meets(*m.Value, m.Target)
			if err != nil {
				m.Note = joinNote(m.Note, "bad target: "+err.Error())
			}
			met = ok
		}
		m.Met = &met
	}
	return m
}

// NotMeasured is a measure that could not be taken, with the reason.
func NotMeasured(name, reason string) Measure {
	return Measure{Name: name, Note: "not measured: " + reason}
}

// Line is the one-line progress form of m.
func (m Measure) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-42s ", m.Name)
	if m.Value == nil {
		b.WriteString("—")
	} else {
		fmt.Fprintf(&b, "%s %s", FormatNumber(*m.Value), m.Unit)
	}
	if m.Baseline != nil {
		fmt.Fprintf(&b, "  (baseline %s", FormatNumber(*m.Baseline))
		if m.Ratio != nil {
			fmt.Fprintf(&b, ", ratio %s", FormatNumber(*m.Ratio))
		}
		b.WriteString(")")
	}
	if m.Target != "" {
		mark := "met"
		switch {
		case m.Value == nil:
			mark = "NOT MEASURED"
		case m.Met == nil || !*m.Met:
			mark = "NOT MET"
		}
		fmt.Fprintf(&b, "  target %s: %s", m.Target, mark)
	}
	if m.Note != "" {
		fmt.Fprintf(&b, "  [%s]", firstLine(m.Note))
	}
	return b.String()
}

func joinNote(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

func ptr[T any](v T) *T { return &v }
