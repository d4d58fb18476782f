// Package sandboxbench measures sandboxes for `rollout bench` and the
// backends' benchmarks: exec round trips, creates, pools, churn and the
// per-call baselines (docker exec, kubectl-style exec) they are held
// against. Measurement code lives here, never in the product packages.
package sandboxbench
