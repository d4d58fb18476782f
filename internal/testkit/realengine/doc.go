// Package realengine is the real-engine suite: its tests run the rollout
// binary (`rollout chat`, `rollout run`) against llama.cpp's llama-server
// serving the project's tiny random-weight Qwen3 model
// (internal/testkit/llamacpptest), with real Docker sandboxes, and check what the
// simulator cannot show: that a misbehaving model never becomes an
// infrastructure failure, that trained tokens are exactly what the server
// sampled, and that the server samples with the sampler configured. The
// package has no non-test code; docs/real-engines.md describes the suite.
package realengine
