package inference_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/rollout-rl/rollout/inference"
	"github.com/rollout-rl/rollout/inference/sim"
)

// BenchmarkClientCompletion and BenchmarkRawCompletion are the same call
// with and without this package, for `go test -bench` ratio comparisons.
func BenchmarkClientCompletion(b *testing.B) {
	srv := startSim(b, sim.Config{Family: "hermes"})
	p, err := inference.NewPool(inference.PoolConfig{Endpoints: []string{srv.URL}})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	req := benchRequest()
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, _, err := p.Completion(ctx, inference.CallOptions{}, req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(p.NewConns()), "dials")
}

func BenchmarkRawCompletion(b *testing.B) {
	srv := startSim(b, sim.Config{Family: "hermes"})
	body, _ := json.Marshal(benchRequest())
	hc := &http.Client{}
	defer hc.CloseIdleConnections()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := hc.Post(srv.URL+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func benchRequest() *inference.CompletionRequest {
	prompt := make([]int32, 512)
	for i := range prompt {
		prompt[i] = int32(32 + i%90)
	}
	zero := 0
	r := &inference.CompletionRequest{Model: "rollout-sim", Prompt: prompt, Logprobs: &zero, ReturnTokenIDs: true, ReturnTokensAsTokenIDs: true}
	r.MaxTokens = 16
	return r
}
