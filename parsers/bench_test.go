package parsers

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// benchFamily parses testdata/bench/<name>.txt — a realistic turn of about
// 2 KB of prose and 1–4 calls — and reports throughput and allocations.
// testdata/bench/<name>.tools.json, when present, is the OpenAI tools array
// the turn is parsed with (schema-typed families).
func benchFamily(b *testing.B, name string) {
	p, err := Get(name)
	if err != nil {
		b.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join("testdata", "bench", name+".txt"))
	if err != nil {
		b.Fatalf("family %s has no bench corpus: %v", name, err)
	}
	var tools []ToolSchema
	if raw, err := os.ReadFile(filepath.Join("testdata", "bench", name+".tools.json")); err == nil {
		if tools, err = ToolsFromOpenAI(raw); err != nil {
			b.Fatal(err)
		}
	}
	text := string(data)
	// A corpus that does not parse cleanly would measure the error path.
	if r := p.Parse(text, tools); len(r.ToolCalls) == 0 || len(r.Errors) > 0 {
		b.Fatalf("bench corpus for %s: %d calls, errors %+v", name, len(r.ToolCalls), r.Errors)
	}
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	cpu0 := processCPU()
	for b.Loop() {
		_ = p.Parse(text, tools)
	}
	reportCPUThroughput(b, cpu0, len(text))
}

// processCPU is the CPU time this process has used. On a shared machine
// wall-clock MB/s swings with other jobs' load; CPU time per byte does not,
// so benchmarks also report cpu-MB/s (it includes GC work, which is part of
// the cost).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPUThroughput(b *testing.B, cpu0 time.Duration, size int) {
	cpu := processCPU() - cpu0
	if cpu <= 0 || b.N == 0 {
		return
	}
	b.ReportMetric(float64(size)*float64(b.N)/cpu.Seconds()/1e6, "cpu-MB/s")
}
