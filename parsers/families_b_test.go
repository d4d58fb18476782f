package parsers

// Fuzz targets and benchmarks for the non-Hermes vLLM families; the
// properties and the corpus loading live in fuzz_test.go and bench_test.go.

import (
	"strings"
	"testing"
)

func FuzzPythonic(f *testing.F)       { fuzzFamily(f, "pythonic") }
func FuzzLlama4Pythonic(f *testing.F) { fuzzFamily(f, "llama4_pythonic") }
func FuzzOlmo3(f *testing.F)          { fuzzFamily(f, "olmo3") }
func FuzzGranite(f *testing.F)        { fuzzFamily(f, "granite") }
func FuzzGranite20bFc(f *testing.F)   { fuzzFamily(f, "granite-20b-fc") }
func FuzzGranite4(f *testing.F)       { fuzzFamily(f, "granite4") }
func FuzzInternlm(f *testing.F)       { fuzzFamily(f, "internlm") }
func FuzzJamba(f *testing.F)          { fuzzFamily(f, "jamba") }
func FuzzPhi4MiniJson(f *testing.F)   { fuzzFamily(f, "phi4_mini_json") }
func FuzzXlam(f *testing.F)           { fuzzFamily(f, "xlam") }
func FuzzDeepseekV32(f *testing.F)    { fuzzFamily(f, "deepseek_v32") }
func FuzzDeepseekV4(f *testing.F)     { fuzzFamily(f, "deepseek_v4") }
func FuzzPoolsideV1(f *testing.F)     { fuzzFamily(f, "poolside_v1") }
func FuzzQwen3Xml(f *testing.F)       { fuzzFamily(f, "qwen3_xml") }
func FuzzMimo(f *testing.F)           { fuzzFamily(f, "mimo") }
func FuzzStep3p5(f *testing.F)        { fuzzFamily(f, "step3p5") }
func FuzzSeedOss(f *testing.F)        { fuzzFamily(f, "seed_oss") }
func FuzzMinimax(f *testing.F)        { fuzzFamily(f, "minimax") }
func FuzzMinimaxM2(f *testing.F)      { fuzzFamily(f, "minimax_m2") }
func FuzzStep3(f *testing.F)          { fuzzFamily(f, "step3") }
func FuzzOpenai(f *testing.F)         { fuzzFamily(f, "openai") }
func FuzzHunyuanA13b(f *testing.F)    { fuzzFamily(f, "hunyuan_a13b") }
func FuzzHyV3(f *testing.F)           { fuzzFamily(f, "hy_v3") }
func FuzzErnie45(f *testing.F)        { fuzzFamily(f, "ernie45") }
func FuzzGigachat3(f *testing.F)      { fuzzFamily(f, "gigachat3") }
func FuzzFunctiongemma(f *testing.F)  { fuzzFamily(f, "functiongemma") }
func FuzzGemma4(f *testing.F)         { fuzzFamily(f, "gemma4") }
func FuzzApertus(f *testing.F)        { fuzzFamily(f, "apertus") }
func FuzzLfm2(f *testing.F)           { fuzzFamily(f, "lfm2") }
func FuzzMinicpm5(f *testing.F)       { fuzzFamily(f, "minicpm5") }
func FuzzCohereCommand3(f *testing.F) { fuzzFamily(f, "cohere_command3") }
func FuzzCohereCommand4(f *testing.F) { fuzzFamily(f, "cohere_command4") }

func BenchmarkPythonic(b *testing.B)       { benchFamily(b, "pythonic") }
func BenchmarkLlama4Pythonic(b *testing.B) { benchFamily(b, "llama4_pythonic") }
func BenchmarkOlmo3(b *testing.B)          { benchFamily(b, "olmo3") }
func BenchmarkGranite(b *testing.B)        { benchFamily(b, "granite") }
func BenchmarkGranite20bFc(b *testing.B)   { benchFamily(b, "granite-20b-fc") }
func BenchmarkGranite4(b *testing.B)       { benchFamily(b, "granite4") }
func BenchmarkInternlm(b *testing.B)       { benchFamily(b, "internlm") }
func BenchmarkJamba(b *testing.B)          { benchFamily(b, "jamba") }
func BenchmarkPhi4MiniJson(b *testing.B)   { benchFamily(b, "phi4_mini_json") }
func BenchmarkXlam(b *testing.B)           { benchFamily(b, "xlam") }
func BenchmarkDeepseekV32(b *testing.B)    { benchFamily(b, "deepseek_v32") }
func BenchmarkDeepseekV4(b *testing.B)     { benchFamily(b, "deepseek_v4") }
func BenchmarkPoolsideV1(b *testing.B)     { benchFamily(b, "poolside_v1") }
func BenchmarkQwen3Xml(b *testing.B)       { benchFamily(b, "qwen3_xml") }
func BenchmarkMimo(b *testing.B)           { benchFamily(b, "mimo") }
func BenchmarkStep3p5(b *testing.B)        { benchFamily(b, "step3p5") }
func BenchmarkSeedOss(b *testing.B)        { benchFamily(b, "seed_oss") }
func BenchmarkMinimax(b *testing.B)        { benchFamily(b, "minimax") }
func BenchmarkMinimaxM2(b *testing.B)      { benchFamily(b, "minimax_m2") }
func BenchmarkStep3(b *testing.B)          { benchFamily(b, "step3") }
func BenchmarkOpenai(b *testing.B)         { benchFamily(b, "openai") }
func BenchmarkHunyuanA13b(b *testing.B)    { benchFamily(b, "hunyuan_a13b") }
func BenchmarkHyV3(b *testing.B)           { benchFamily(b, "hy_v3") }
func BenchmarkErnie45(b *testing.B)        { benchFamily(b, "ernie45") }
func BenchmarkGigachat3(b *testing.B)      { benchFamily(b, "gigachat3") }
func BenchmarkFunctiongemma(b *testing.B)  { benchFamily(b, "functiongemma") }
func BenchmarkGemma4(b *testing.B)         { benchFamily(b, "gemma4") }
func BenchmarkApertus(b *testing.B)        { benchFamily(b, "apertus") }
func BenchmarkLfm2(b *testing.B)           { benchFamily(b, "lfm2") }
func BenchmarkMinicpm5(b *testing.B)       { benchFamily(b, "minicpm5") }
func BenchmarkCohereCommand3(b *testing.B) { benchFamily(b, "cohere_command3") }
func BenchmarkCohereCommand4(b *testing.B) { benchFamily(b, "cohere_command4") }

// otherFamilies are the names registered by the family_*.go files.
var otherFamilies = []string{"pythonic", "llama4_pythonic", "olmo3", "granite", "granite-20b-fc", "granite4",
	"internlm", "jamba", "phi4_mini_json", "xlam", "deepseek_v32", "deepseek_v4", "poolside_v1", "qwen3_xml",
	"mimo", "step3p5", "seed_oss", "minimax", "minimax_m2", "step3", "openai", "hunyuan_a13b", "hy_v3", "ernie45",
	"gigachat3", "functiongemma", "gemma4", "apertus", "lfm2", "minicpm5", "cohere_command3", "cohere_command4"}

// TestOtherFamiliesInvariants checks, over every golden input, what the
// golden tables do not spell out: Raw is the call's exact text, calls and
// errors share one index sequence, and the content does not repeat a call.
func TestOtherFamiliesInvariants(t *testing.T) {
	for _, name := range otherFamilies {
		p, err := Get(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range goldenCases(t, name) {
			var tools []ToolSchema
			if len(c.Tools) > 0 {
				if tools, err = ToolsFromOpenAI(c.Tools); err != nil {
					t.Fatal(err)
				}
			}
			r := p.Parse(c.Input, tools)
			for _, tc := range r.ToolCalls {
				if name != "minicpm5" && !strings.Contains(c.Input, tc.Raw) {
					t.Errorf("%s/%s: Raw %q is not a substring of the input", name, c.Name, tc.Raw)
				}
				if tc.Raw == "" {
					t.Errorf("%s/%s: empty Raw", name, c.Name)
				}
			}
			seen := map[int]bool{}
			for _, e := range r.Errors {
				if e.Index < 0 || e.Index >= len(r.ToolCalls)+len(r.Errors) || seen[e.Index] {
					t.Errorf("%s/%s: error index %d out of range or repeated", name, c.Name, e.Index)
				}
				seen[e.Index] = true
			}
			if r.Content != nil {
				if again := p.Parse(*r.Content, tools); len(again.ToolCalls) > 0 {
					t.Errorf("%s/%s: content still holds a call", name, c.Name)
				}
			}
		}
	}
	if len(otherFamilies) != 32 {
		t.Fatalf("expected 32 names, have %d", len(otherFamilies))
	}
}
