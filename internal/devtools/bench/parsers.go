package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/rollout-rl/rollout/parsers"
)

// pythonMBs are the Python originals' figures issue 3 quotes (a 2.2 KB
// prose + 3 calls turn on a 2-core machine of this kind). They are
// reference figures, not measured here: Python and vLLM are not
// dependencies of this project.
var pythonMBs = map[string]float64{"hermes": 53, "mistral": 73, "kimi_k2": 95, "glm45": 16, "qwen3_coder": 13}

// defaultCorpus is the repository's parser benchmark corpus, relative to
// the module root.
const defaultCorpus = "parsers/testdata/bench"

// findCorpus looks for the default corpus above the working directory and
// above the executable (bin/rollout in a checkout).
func findCorpus() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		if exe, err := filepath.EvalSymlinks(exe); err == nil {
			starts = append(starts, filepath.Dir(exe))
		}
	}
	for _, dir := range starts {
		for {
			p := filepath.Join(dir, defaultCorpus)
			if st, err := os.Stat(p); err == nil && st.IsDir() {
				return p, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("parser corpus %s not found above the working directory or the executable: run from the source tree or pass --corpus DIR", defaultCorpus)
}

// corpusEntry is one text to time with one parser.
type corpusEntry struct {
	name  string
	text  string
	tools []parsers.ToolSchema
}

// LoadCorpus reads every DIR/<name>.txt whose name is a registered tool
// parser, with the tools of DIR/<name>.tools.json, else DIR/tools.json
// (an OpenAI tools array), when present.
func loadCorpus(dir string) ([]corpusEntry, error) {
	var shared []parsers.ToolSchema
	if raw, err := os.ReadFile(filepath.Join(dir, "tools.json")); err == nil {
		if shared, err = parsers.ToolsFromOpenAI(raw); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "tools.json"), err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var out []corpusEntry
	for _, name := range parsers.Names() {
		data, err := os.ReadFile(filepath.Join(dir, name+".txt"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		e := corpusEntry{name: name, text: string(data), tools: shared}
		tp := filepath.Join(dir, name+".tools.json")
		if raw, err := os.ReadFile(tp); err == nil {
			if e.tools, err = parsers.ToolsFromOpenAI(raw); err != nil {
				return nil, fmt.Errorf("%s: %w", tp, err)
			}
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no <parser>.txt file for a registered parser (%s, ...)", dir, strings.Join(parsers.Names()[:3], ", "))
	}
	return out, nil
}

func runParsers(ctx context.Context, r *runCtx) ([]Measure, error) {
	dir, custom := r.opts.Corpus, r.opts.Corpus != ""
	if !custom {
		var err error
		if dir, err = findCorpus(); err != nil {
			return nil, err
		}
	}
	corpus, err := loadCorpus(dir)
	if err != nil {
		return nil, err
	}
	r.printf("    corpus %s: %d texts", dir, len(corpus))
	// One P for the suite: the throughputs are per core. With more, the
	// runtime runs idle-priority GC mark workers on the other (idle)
	// processors, whose CPU time counts in the process's (the measure's
	// denominator) while the parse itself is no faster, so the figure fell
	// as the machine got quieter (kimi_k2 723 against 1066 MB/s, same
	// binary, minutes apart). On one P every GC cycle's work interleaves
	// with the parse on the same core and is counted once.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	budget := time.Duration(r.n(500, 60)) * time.Millisecond
	var ms []Measure
	for _, e := range corpus {
		if ctx.Err() != nil {
			return ms, ctx.Err()
		}
		p, err := parsers.Get(e.name)
		if err != nil {
			return ms, err
		}
		res := p.Parse(e.text, e.tools)
		note := fmt.Sprintf("%d B, %d calls", len(e.text), len(res.ToolCalls))
		if len(res.Errors) > 0 || len(res.ToolCalls) == 0 {
			if !custom {
				// The repository corpus must parse cleanly, or this would
				// time the error path.
				return ms, fmt.Errorf("corpus %s: %d calls, %d errors", e.name, len(res.ToolCalls), len(res.Errors))
			}
			note += fmt.Sprintf(", %d parse errors", len(res.Errors))
		}
		parse := func() { _ = p.Parse(e.text, e.tools) }
		mbs := throughput(parse, len(e.text), budget)
		note = joinNote(note, fmt.Sprintf("wall-clock %.0f MB/s", mbs.wall))
		m := Measure{Name: "parsers." + e.name + "_mb_s", Unit: "MB/s", Value: ptr(sig(mbs.cpu)), Note: note,
			Description: e.name + ": " + filepath.Base(dir) + "/" + e.name + ".txt, one goroutine, MB per CPU-second"}
		if custom {
			m.Description = e.name + ": " + filepath.Join(dir, e.name+".txt") + ", one goroutine, MB per CPU-second"
		} else {
			m = parserTarget(m, e)
		}
		ms = append(ms, m,
			Measure{Name: "parsers." + e.name + "_allocs", Unit: "allocs/parse", Value: ptr(allocsPerRun(parse)),
				Description: e.name + ": heap allocations per parse"})
	}
	if custom {
		return ms, nil
	}
	// Same-run baselines on the hermes text: the memory-speed floor and a
	// direct port of the upstream algorithm.
	var hermes *corpusEntry
	for i := range corpus {
		if corpus[i].name == "hermes" {
			hermes = &corpus[i]
		}
	}
	if hermes == nil {
		return ms, errors.New("corpus has no hermes.txt")
	}
	text := hermes.text
	scan := throughput(func() { _ = strings.Contains(text, "<absent_marker>") }, len(text), budget)
	port := throughput(func() { _ = regexpPortHermes(text) }, len(text), budget)
	var ours float64
	for _, m := range ms {
		if m.Name == "parsers.hermes_mb_s" {
			ours = *m.Value
		}
	}
	ms = append(ms,
		Measure{Name: "parsers.baseline_scan_mb_s", Unit: "MB/s", Value: ptr(sig(scan.cpu)),
			Description: "memory-speed floor: strings.Contains of an absent marker over the hermes text, MB per CPU-second"},
		Measure{Name: "parsers.baseline_regexp_port_hermes_mb_s", Unit: "MB/s", Value: ptr(sig(port.cpu)),
			Description: "the upstream hermes algorithm ported to Go (lazy DOTALL regexp + encoding/json decode and re-encode), MB per CPU-second"},
		Measure{Name: "parsers.hermes_vs_regexp_port", Unit: "×", Value: ptr(sig(ours / port.cpu)),
			Description: "hermes parser MB/s / regexp-port MB/s, same run"},
	)
	return ms, nil
}

// parserTarget attaches issue 3's target to a family of the repository
// corpus: 10× the Python original where issue 3 gives its figure. For the
// other families issue 3 gives only the range of the Python originals
// (13–136 MB/s), so the target is the floor that range implies: 10× the
// slowest, ≥ 130 MB/s. (Its "about ≥ 500 MB/s for JSON-in-tag families"
// is a rule of thumb, not applied per family.)
func parserTarget(m Measure, e corpusEntry) Measure {
	if py, ok := pythonMBs[e.name]; ok {
		m.Baseline = ptr(py)
		m.BaselineName = "Python original (issue 3's figure, not measured here)"
		return m
	}
	m.Target = ">= 130"
	m.Source = "issue 3 (floor: 10× the slowest Python original)"
	return m
}

var hermesRE = regexp.MustCompile(`(?s)<tool_call>\s*(.*?)\s*</tool_call>|<tool_call>\s*(.*)`)

// regexpPortHermes is the upstream Hermes algorithm written with Go's RE2
// and encoding/json: what a direct port would cost.
func regexpPortHermes(text string) int {
	n := 0
	for _, m := range hermesRE.FindAllStringSubmatch(text, -1) {
		body := m[1]
		if body == "" {
			body = m[2]
		}
		var call struct {
			Name      string         `json:"name"`
			Arguments map[string]any `json:"arguments"`
		}
		if json.Unmarshal([]byte(body), &call) != nil {
			continue
		}
		if _, err := json.Marshal(call.Arguments); err == nil {
			n++
		}
	}
	return n
}

// rate is a measured throughput: per second of wall time, and per second
// of this process's CPU time (all threads, so GC work counts). On a shared
// machine the wall figure also measures how often other jobs took the CPU
// away; the CPU figure does not.
type rate struct{ wall, cpu float64 }

// throughput runs fn repeatedly for about budget and returns MB/s (1 MB =
// 1e6 bytes) for size bytes per call: the medians of five timed batches,
// so that a burst of load from other jobs moves one batch, not the result.
func throughput(fn func(), size int, budget time.Duration) rate {
	fn() // warm caches and lazily built state
	per := budget / 5
	n := 1
	// Calibrate the batch size to about `per`.
	for {
		t := time.Now()
		for range n {
			fn()
		}
		el := time.Since(t)
		if el >= per/4 || n >= 1<<26 {
			n = max(1, int(float64(n)*float64(per)/float64(max(el, time.Microsecond))))
			break
		}
		n *= 4
	}
	var wall, cpu []float64
	for range 5 {
		t, c := time.Now(), processCPU()
		for range n {
			fn()
		}
		el, cel := time.Since(t).Seconds(), (processCPU() - c).Seconds()
		mb := float64(size) * float64(n) / 1e6
		wall = append(wall, mb/el)
		if cel > 0 {
			cpu = append(cpu, mb/cel)
		}
	}
	r := rate{wall: median(wall)}
	if len(cpu) > 0 {
		r.cpu = median(cpu)
	} else {
		r.cpu = r.wall
	}
	return r
}

// allocsPerRun is the average number of heap allocations of fn.
func allocsPerRun(fn func()) float64 {
	const runs = 50
	fn()
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	for range runs {
		fn()
	}
	runtime.ReadMemStats(&b)
	return round(float64(b.Mallocs-a.Mallocs)/runs, 1)
}
