// Package sim is a faithful vLLM simulator: the same HTTP routes and shapes
// as vLLM (and SGLang and the Atropos generate server), a deterministic
// byte-level tokenizer, chat templates modelled on real ones (so the
// token-drift cases of multi-turn RL are real), a scripted policy that emits
// tool calls in a chosen family's native syntax, a latency model and seeded
// fault injection.
//
// Start runs it on a real listener for tests and benchmarks; NewHandler
// embeds it; `rollout sim` serves it by hand. Chat responses are parsed with
// this project's parsers, exactly as vLLM would with --tool-call-parser and
// --reasoning-parser. See docs/simulator.md.
package sim
