package parsers

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Baselines measured in the same run as the family benchmarks, so that
// results on a loaded, shared machine are read as ratios:
//   - BaselineScan is the memory-speed floor: one strings.Index over the
//     hermes corpus for a marker that is absent;
//   - BaselineRegexpHermes is the upstream algorithm (a lazy DOTALL regexp
//     for the tag pairs, then a full JSON decode and re-encode of every
//     call) written with Go's RE2 and encoding/json — what a direct port
//     would cost.

func benchCorpus(b *testing.B, name string) string {
	data, err := os.ReadFile(filepath.Join("testdata", "bench", name+".txt"))
	if err != nil {
		b.Fatal(err)
	}
	return string(data)
}

func BenchmarkBaselineScan(b *testing.B) {
	text := benchCorpus(b, "hermes")
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	cpu0 := processCPU()
	for b.Loop() {
		if strings.Contains(text, "<absent_marker>") {
			b.Fatal("marker present")
		}
	}
	reportCPUThroughput(b, cpu0, len(text))
}

var baselineHermesRE = regexp.MustCompile(`(?s)<tool_call>\s*(.*?)\s*</tool_call>|<tool_call>\s*(.*)`)

func BenchmarkBaselineRegexpHermes(b *testing.B) {
	text := benchCorpus(b, "hermes")
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	cpu0 := processCPU()
	for b.Loop() {
		n := 0
		for _, m := range baselineHermesRE.FindAllStringSubmatch(text, -1) {
			body := m[1]
			if body == "" {
				body = m[2]
			}
			var call struct {
				Name      string         `json:"name"`
				Arguments map[string]any `json:"arguments"`
			}
			if err := json.Unmarshal([]byte(body), &call); err != nil {
				b.Fatal(err)
			}
			if _, err := json.Marshal(call.Arguments); err != nil {
				b.Fatal(err)
			}
			n++
		}
		if n != 3 {
			b.Fatalf("baseline found %d calls", n)
		}
	}
	reportCPUThroughput(b, cpu0, len(text))
}
