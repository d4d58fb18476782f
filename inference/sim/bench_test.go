package sim

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

// BenchmarkThroughput measures requests/s per route against a zero-latency
// simulator over keep-alive connections. "health" is the baseline: the
// ratio route/health is the simulator's own cost per request.
func BenchmarkThroughput(b *testing.B) {
	srv := startSim(b, Config{Family: "hermes", Reasoning: true})
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	prompt := `[257,117,115,101,114,10,104,105,258,10,257,97,115,115,105,115,116,97,110,116,10]`
	routes := []struct{ name, method, path, body string }{
		{"health", "GET", "/health", ""},
		{"tokenize", "POST", "/tokenize", `{"messages":[{"role":"user","content":"list the files"}],"tools":[` + terminalTool + `]}`},
		{"generate", "POST", "/inference/v1/generate", `{"token_ids":` + prompt + `,"sampling_params":{"logprobs":0,"max_tokens":64}}`},
		{"completions", "POST", "/v1/completions", `{"prompt":` + prompt + `,"max_tokens":64,"logprobs":0,"return_token_ids":true}`},
		{"chat_tools", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"list the files"}],"tools":[` + terminalTool + `],"return_token_ids":true,"logprobs":true}`},
		{"chat_stream", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"list the files"}],"tools":[` + terminalTool + `],"stream":true}`},
	}
	for _, rt := range routes {
		b.Run(rt.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest(rt.method, srv.URL+rt.path, bytes.NewBufferString(rt.body))
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}
