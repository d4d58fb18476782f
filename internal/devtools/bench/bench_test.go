package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMeets(t *testing.T) {
	for _, c := range []struct {
		v      float64
		target string
		want   bool
		bad    bool
	}{
		{4.9, "<= 5", true, false},
		{5, "<= 5", true, false},
		{5.1, "<= 5", false, false},
		{0.25, "< 0.25", false, false},
		{0.24, "<0.25", true, false},
		{200, ">= 200", true, false},
		{199, ">= 200", false, false},
		{201, "> 200", true, false},
		{0, "== 0", true, false},
		{1, "== 0", false, false},
		{1, "about 5", false, true},
		{1, "<= five", false, true},
	} {
		got, err := Meets(c.v, c.target)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("Meets(%v, %q) = %v, %v; want %v, error %v", c.v, c.target, got, err, c.want, c.bad)
		}
	}
}

// The names issue 10 fixes must stay in the catalogue, so that every run
// reports them (measured or not) and results compare across versions.
func TestCatalogHasIssueNames(t *testing.T) {
	for _, n := range []string{"parsers.hermes_mb_s", "parsers.qwen3_coder_mb_s", "sandbox.exec_p50_ms", "sandbox.exec_p99_ms",
		"sandbox.exec_vs_docker_cli_ratio", "sandbox.cold_start_p50_ms", "sandbox.cold_start_vs_docker_run_ratio",
		"sandbox.pool_acquire_p50_ms", "sandbox.max_concurrent", "inference.overhead_p50_us", "loop.overhead_p50_us",
		"loop.cpu_4k_loops_cores", "loop.rss_4k_loops_mb", "runner.rollouts_per_s", "runner.cpu_s_per_rollout",
		"output.parquet_write_mb_s", "output.size_vs_atropos_jsonl_gz", "service.groups_per_s", "service.size_vs_atropos_json"} {
		c, ok := catalogByName[n]
		if !ok {
			t.Errorf("%s missing from the catalogue", n)
			continue
		}
		if _, ok := suiteFuncs[c.suite]; !ok {
			t.Errorf("%s: unknown suite %q", n, c.suite)
		}
	}
	for _, c := range catalog {
		if c.target != "" {
			if _, err := Meets(1, c.target); err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
		}
	}
}

func TestCheckSuites(t *testing.T) {
	got, err := CheckSuites([]string{"output", "parsers"})
	if err != nil || strings.Join(got, ",") != "parsers,output" {
		t.Fatalf("got %v, %v", got, err)
	}
	if all, _ := CheckSuites(nil); len(all) != len(Suites) {
		t.Fatalf("default suites %v", all)
	}
	if _, err := CheckSuites([]string{"nope"}); err == nil {
		t.Fatal("unknown suite accepted")
	}
}

func TestCompleteFillsCatalogue(t *testing.T) {
	ms := complete("sandbox", []Measure{
		{Name: "sandbox.exec_p50_ms", Value: ptr(0.8), Baseline: ptr(80.0)},
		{Name: "sandbox.pool_acquire_p50_ms", Value: ptr(12.0)},
		{Name: "sandbox.extra", Unit: "ms", Value: ptr(1.0)},
	}, errors.New("engine went away\ndetails"), true)
	ix := newIndex(ms)
	exec := ix["sandbox.exec_p50_ms"]
	if exec.Target != "<= 1" || exec.Met == nil || !*exec.Met || exec.Unit != "ms" || exec.Source == "" || exec.Description == "" {
		t.Errorf("exec: %+v", exec)
	}
	if exec.Ratio == nil || *exec.Ratio != 0.01 {
		t.Errorf("exec ratio %v", exec.Ratio)
	}
	if acq := ix["sandbox.pool_acquire_p50_ms"]; acq.Met == nil || *acq.Met {
		t.Errorf("acquire 12 ms met <= 10: %+v", acq)
	}
	if x := ix["sandbox.extra"]; x.Met != nil || x.Target != "" {
		t.Errorf("measure without target: %+v", x)
	}
	peak, ok := ix["sandbox.max_concurrent"]
	if !ok || peak.Value != nil || peak.Met == nil || *peak.Met || peak.Target != ">= 1000" ||
		peak.Note != "not measured: suite failed: engine went away" {
		t.Errorf("unproduced catalogue measure: %+v", peak)
	}
	// Every catalogue entry of the suite is present exactly once.
	n := 0
	for _, c := range catalog {
		if c.suite == "sandbox" {
			n++
			if _, ok := ix[c.name]; !ok {
				t.Errorf("%s missing", c.name)
			}
		}
	}
	if len(ms) != n+1 {
		t.Errorf("%d measures, want %d", len(ms), n+1)
	}
}

// A custom parser corpus gets no targets and no placeholders.
func TestCompleteWithoutCatalogue(t *testing.T) {
	ms := complete("parsers", []Measure{{Name: "parsers.hermes_mb_s", Unit: "MB/s", Value: ptr(100.0)}}, nil, false)
	if len(ms) != 1 || ms[0].Target != "" || ms[0].Met != nil {
		t.Fatalf("%+v", ms)
	}
}

func sampleReport() Report {
	ms := []Measure{
		{Name: "parsers.hermes_mb_s", Value: ptr(600.0), Baseline: ptr(53.0)},
		{Name: "parsers.hermes_allocs", Unit: "allocs/parse", Value: ptr(11.0)},
		{Name: "parsers.pythonic_mb_s", Unit: "MB/s", Value: ptr(90.0), Target: ">= 130"},
		{Name: "sandbox.exec_p50_ms", Value: ptr(0.6), Baseline: ptr(60.0)},
		{Name: "sandbox.exec_1mb_p50_ms", Value: ptr(20.0)},
		{Name: "sandbox.cold_start_p50_ms", Value: ptr(400.0), Baseline: ptr(350.0)},
		{Name: "sandbox.pool_acquire_p50_ms", Value: ptr(0.01)},
		{Name: "inference.overhead_p50_us", Value: ptr(80.0)},
		{Name: "inference.client_p50_us", Value: ptr(500.0), Baseline: ptr(420.0)},
		{Name: "loop.overhead_p50_us", Value: ptr(40.0)},
		{Name: "runner.phase_total_ms", Unit: "ms", Value: ptr(1000.0)},
		{Name: "runner.phase_sandbox_start_ms", Unit: "ms", Value: ptr(600.0)},
		{Name: "runner.phase_generation_ms", Unit: "ms", Value: ptr(200.0)},
		{Name: "runner.cpu_s_per_rollout", Value: ptr(0.05)},
		NotMeasured("service.groups_per_s", "the server is not wired"),
	}
	for i := range ms {
		ms[i] = finish(ms[i], true)
	}
	return Report{
		Machine: Machine{CPUModel: "Test CPU | 2 GHz", Cores: 2, MemoryMB: 24 << 10, OS: "linux/amd64", GoVersion: "go1.26", DockerVersion: "20.10"},
		Run: RunInfo{Version: "v0.0.0-test", Commit: "0123456789abcdef", Started: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC),
			ElapsedS: 12.5, Suites: Suites},
		Measures: ms,
	}
}

func TestReportJSONShape(t *testing.T) {
	rep := sampleReport()
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Machine  map[string]any   `json:"machine"`
		Measures []map[string]any `json:"measures"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"cpu_model", "cores", "memory_mb", "docker_version"} {
		if _, ok := doc.Machine[k]; !ok {
			t.Errorf("machine.%s missing", k)
		}
	}
	for _, m := range doc.Measures {
		for _, k := range []string{"name", "unit", "value"} {
			if _, ok := m[k]; !ok {
				t.Errorf("%v: %s missing", m["name"], k)
			}
		}
		if _, hasTarget := m["target"]; hasTarget {
			if _, ok := m["met"].(bool); !ok {
				t.Errorf("%v: target without a boolean met", m["name"])
			}
		}
		if m["name"] == "sandbox.exec_p50_ms" && (m["baseline"] != 60.0 || m["ratio"] != 0.01 || m["met"] != true) {
			t.Errorf("exec: %v", m)
		}
		if m["name"] == "service.groups_per_s" && (m["value"] != nil || m["met"] != false) {
			t.Errorf("unmeasured: %v", m)
		}
	}
	// Round trip through a file, as `rollout bench report` reads it.
	path := filepath.Join(t.TempDir(), "bench.json")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	back, err := ReadReport(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Measures) != len(rep.Measures) || back.Machine.CPUModel != rep.Machine.CPUModel || *back.Measures[0].Value != 600 {
		t.Fatalf("round trip: %+v", back)
	}
}

func TestWriteMarkdown(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteMarkdown(&buf, sampleReport()); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	for _, want := range []string{
		"# Performance",
		"Do not edit by hand",
		"| CPU | Test CPU \\| 2 GHz, 2 cores |",
		"| Docker engine | 20.10 |",
		"make bench",
		"**5 targets met, 1 not met, 1 not measured.**",
		"| `sandbox.exec_p50_ms` | exec round trip of `true` through the agent channel (the socket channel on a local engine), p50 | <= 1 | 0.6 ms | 60 ms | 0.01 | yes | issue 20 (issue 4: ≤ 5) |",
		"| `service.groups_per_s` |",
		"- `service.groups_per_s`: the server is not wired",
		"## What dominates cost",
		"**One turn with model time excluded**",
		"sandbox acquisition takes 600 ms (60%)",
		"| hermes | 600 | 11 | 53 | 11.3 | >= 530 | yes |",
		"| pythonic | 90 | — |  |  | >= 130 | **no** |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	// Families without a Python figure are in the parsers table only.
	if strings.Contains(md, "| `parsers.pythonic_mb_s` | ") && strings.Index(md, "| `parsers.pythonic_mb_s` |") < strings.Index(md, "## What dominates cost") {
		t.Error("pythonic in the targets table")
	}
	if strings.Contains(md, "%!") {
		t.Errorf("formatting error in:\n%s", md)
	}
}

// The parsers suite on a custom corpus: registered names only, tools from
// tools.json, no targets. Functional, not a timing check.
func TestParsersCustomCorpus(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("hermes.txt", "Let me look.\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>")
	write("not_a_parser.txt", "ignored")
	write("tools.json", `[{"type":"function","function":{"name":"read","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}]`)
	var log bytes.Buffer
	rep, err := Run(context.Background(), Options{Suites: []string{"parsers"}, Quick: true, Corpus: dir, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	ix := newIndex(rep.Measures)
	m, ok := ix["parsers.hermes_mb_s"]
	if !ok || m.Value == nil || *m.Value <= 0 || m.Target != "" {
		t.Fatalf("hermes: %+v\n%s", m, log.String())
	}
	if _, ok := ix["parsers.hermes_allocs"]; !ok {
		t.Error("no allocs measure")
	}
	if len(rep.Measures) != 2 {
		t.Errorf("measures: %+v", rep.Measures)
	}
	if rep.Run.Corpus != dir || len(rep.Run.Errors) != 0 {
		t.Errorf("run: %+v", rep.Run)
	}
}

func TestFindCorpus(t *testing.T) {
	dir, err := findCorpus()
	if err != nil {
		t.Fatal(err)
	}
	entries, err := loadCorpus(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range entries {
		names[e.name] = true
	}
	for f := range pythonMBs {
		if !names[f] {
			t.Errorf("repository corpus lacks %s.txt", f)
		}
	}
}

func TestFormatNumber(t *testing.T) {
	for x, want := range map[float64]string{0: "0", 12: "12", 1234.6: "1235", 12.345: "12.3", 0.0312: "0.0312", 0.000271: "0.000271"} {
		if got := FormatNumber(x); got != want {
			t.Errorf("FormatNumber(%v) = %q, want %q", x, got, want)
		}
	}
	if got := sig(0.00012345); got != 0.0001235 && got != 0.0001234 {
		t.Errorf("sig = %v", got)
	}
}

// The per-turn cost of the llamacpp backend is measured beside the vllm
// one on the same workload; the llama.cpp path needs more requests per
// turn (template and tokenisation are separate routes, and the text comes
// from /detokenize).
func TestTurnCostBackends(t *testing.T) {
	r := &runCtx{logger: slog.New(slog.DiscardHandler)}
	v, err := turnCost(context.Background(), r, inference.BackendVLLM, sim.EngineVLLM, 40)
	if err != nil {
		t.Fatal(err)
	}
	l, err := turnCost(context.Background(), r, inference.BackendLlamaCpp, sim.EngineLlamaCpp, 40)
	if err != nil {
		t.Fatal(err)
	}
	if v.turns < 40 || l.turns < 40 || v.p50 <= 0 || l.p50 <= 0 {
		t.Fatalf("vllm %+v, llamacpp %+v", v, l)
	}
	t.Logf("vllm p50 %v p99 %v %.1f req/turn; llamacpp p50 %v p99 %v %.1f req/turn", v.p50, v.p99, v.reqPerTurn, l.p50, l.p99, l.reqPerTurn)
	if l.reqPerTurn <= v.reqPerTurn {
		t.Fatalf("requests per turn: llamacpp %.1f, vllm %.1f", l.reqPerTurn, v.reqPerTurn)
	}
}

// The output suite, quick: every catalogue row is measured, and Parquet
// gains when a group's rollouts share their prompt (the _grpo row).
func TestOutputSuiteQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("writes ~60 MB of Parquet and JSONL")
	}
	rep, err := Run(context.Background(), Options{Suites: []string{"output"}, Quick: true})
	if err != nil {
		t.Fatal(err)
	}
	ix := newIndex(rep.Measures)
	for _, c := range catalog {
		if c.suite == "output" {
			if m, ok := ix[c.name]; !ok || m.Value == nil {
				t.Errorf("%s not measured: %+v", c.name, m)
			}
		}
	}
	plain, grpo := ix["output.size_vs_atropos_jsonl_gz"], ix["output.size_vs_atropos_jsonl_gz_grpo"]
	if plain.Value != nil && grpo.Value != nil && *grpo.Value >= *plain.Value {
		t.Errorf("shared prompts %.3f×, own prompts %.3f×: Parquet did not gain from the repeat", *grpo.Value, *plain.Value)
	}
}

// The notes name a measure's baseline once: from its description when it
// names one there, else from the measure's own BaselineName.
func TestReportNamesBaselineOnce(t *testing.T) {
	rep := Report{Machine: Machine{Cores: 2}, Run: RunInfo{Suites: Suites}, Measures: []Measure{
		{Name: "sandbox.runsc_exec_p50_ms", Unit: "ms", Value: ptr(18.0), Baseline: ptr(2.4),
			Description: "exec under runsc; baseline: runc, same run", BaselineName: "runc exec `true`, same run"},
		{Name: "sandbox.exec_attach_p50_ms", Unit: "ms", Value: ptr(3.0), Baseline: ptr(2.7),
			Description: "exec over the attach stream", BaselineName: "the socket channel, same run"},
	}}
	var buf bytes.Buffer
	if err := WriteMarkdown(&buf, rep); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	for _, want := range []string{"exec under runsc; baseline: runc, same run", "exec over the attach stream; baseline: the socket channel, same run"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(md, "runc exec `true`, same run") {
		t.Error("a baseline named in the description is named again")
	}
}
