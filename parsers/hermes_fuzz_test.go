package parsers

import "testing"

func FuzzHermes(f *testing.F)       { fuzzFamily(f, "hermes") }
func FuzzQwen(f *testing.F)         { fuzzFamily(f, "qwen") }
func FuzzLongcat(f *testing.F)      { fuzzFamily(f, "longcat") }
func FuzzMistral(f *testing.F)      { fuzzFamily(f, "mistral") }
func FuzzLlama3JSON(f *testing.F)   { fuzzFamily(f, "llama3_json") }
func FuzzLlama4JSON(f *testing.F)   { fuzzFamily(f, "llama4_json") }
func FuzzDeepseekV3(f *testing.F)   { fuzzFamily(f, "deepseek_v3") }
func FuzzDeepseekV3_1(f *testing.F) { fuzzFamily(f, "deepseek_v3_1") }
func FuzzDeepseekV31(f *testing.F)  { fuzzFamily(f, "deepseek_v31") }
func FuzzKimiK2(f *testing.F)       { fuzzFamily(f, "kimi_k2") }
func FuzzGlm45(f *testing.F)        { fuzzFamily(f, "glm45") }
func FuzzGlm47(f *testing.F)        { fuzzFamily(f, "glm47") }
func FuzzQwen3Coder(f *testing.F)   { fuzzFamily(f, "qwen3_coder") }

func BenchmarkHermes(b *testing.B)       { benchFamily(b, "hermes") }
func BenchmarkQwen(b *testing.B)         { benchFamily(b, "qwen") }
func BenchmarkLongcat(b *testing.B)      { benchFamily(b, "longcat") }
func BenchmarkMistral(b *testing.B)      { benchFamily(b, "mistral") }
func BenchmarkLlama3JSON(b *testing.B)   { benchFamily(b, "llama3_json") }
func BenchmarkLlama4JSON(b *testing.B)   { benchFamily(b, "llama4_json") }
func BenchmarkDeepseekV3(b *testing.B)   { benchFamily(b, "deepseek_v3") }
func BenchmarkDeepseekV3_1(b *testing.B) { benchFamily(b, "deepseek_v3_1") }
func BenchmarkDeepseekV31(b *testing.B)  { benchFamily(b, "deepseek_v31") }
func BenchmarkKimiK2(b *testing.B)       { benchFamily(b, "kimi_k2") }
func BenchmarkGlm45(b *testing.B)        { benchFamily(b, "glm45") }
func BenchmarkGlm47(b *testing.B)        { benchFamily(b, "glm47") }
func BenchmarkQwen3Coder(b *testing.B)   { benchFamily(b, "qwen3_coder") }
