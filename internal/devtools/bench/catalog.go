package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// entry is a measure every run of its suite reports, measured or not: the
// names issue 10 fixes (so results stay comparable across versions) and
// every target the capability issues name.
type entry struct {
	suite, name, unit, target, source, desc string
}

// catalog lists them in report order.
var catalog = []entry{
	{"parsers", "parsers.hermes_mb_s", "MB/s", ">= 530", "issue 3 (10× Python 53 MB/s)", "hermes: realistic turn (2 KB prose + 3 calls), single core"},
	{"parsers", "parsers.mistral_mb_s", "MB/s", ">= 730", "issue 3 (10× Python 73 MB/s)", "mistral: realistic turn, single core"},
	{"parsers", "parsers.kimi_k2_mb_s", "MB/s", ">= 950", "issue 3 (10× Python 95 MB/s)", "kimi_k2: realistic turn, single core"},
	{"parsers", "parsers.glm45_mb_s", "MB/s", ">= 160", "issue 3 (10× Python 16 MB/s)", "glm45: realistic turn, single core"},
	{"parsers", "parsers.qwen3_coder_mb_s", "MB/s", ">= 130", "issue 3 (10× Python 13 MB/s)", "qwen3_coder: realistic turn, single core"},

	{"sandbox", "sandbox.exec_p50_ms", "ms", "<= 1", "issue 20 (issue 4: ≤ 5)", "exec round trip of `true` through the agent channel (the socket channel on a local engine), p50"},
	{"sandbox", "sandbox.exec_p90_ms", "ms", "", "", "exec round trip of `true` through the agent channel, p90"},
	{"sandbox", "sandbox.exec_p99_ms", "ms", "", "", "exec round trip of `true` through the agent channel, p99"},
	{"sandbox", "sandbox.exec_agent_p50_ms", "ms", "", "issue 20 (reported)", "the agent's own time for `true` within those round trips (spawn, run, reap, inside the sandbox), p50: the rest is the channel"},
	{"sandbox", "sandbox.exec_vs_docker_cli_ratio", "×", "<= 0.0111", "issue 20 (≥ 90× faster)", "channel p50 / `docker exec CID true` p50"},
	{"sandbox", "sandbox.exec_channel_p50_ms", "ms", "", "issue 20 (reported)", "the channel's own share of an exec round trip of `true` (round trip less the agent's own time, per call), p50"},
	{"sandbox", "sandbox.spawn_floor_p50_ms", "ms", "", "issue 20 (reported)", "the machine's floor under every exec: the image's static busybox spawned as `true` by this process on the host (own process group, output piped, reaped), no sandbox, p50"},
	{"sandbox", "sandbox.exec_attach_p50_ms", "ms", "", "issue 20 (reported)", "exec round trip of `true` over the attach stream only (through dockerd), p50; baseline: the socket channel, same run"},
	{"sandbox", "sandbox.exec_socket_vs_attach_ratio", "×", "", "issue 20 (reported)", "socket channel p50 / attach stream p50"},
	{"sandbox", "sandbox.exec_1mb_p50_ms", "ms", "", "", "exec of a command printing 1 MiB through the channel, p50"},
	{"sandbox", "sandbox.exec_1mb_p99_ms", "ms", "", "", "exec of a command printing 1 MiB through the channel, p99"},
	{"sandbox", "sandbox.exec_1mb_vs_docker_cli_ratio", "×", "", "", "channel p50 / `docker exec` p50, 1 MiB of output"},
	{"sandbox", "sandbox.cold_start_p50_ms", "ms", "", "", "cold sandbox create + start + agent handshake, p50"},
	{"sandbox", "sandbox.cold_start_p99_ms", "ms", "", "", "cold sandbox create + start + agent handshake, p99"},
	{"sandbox", "sandbox.cold_start_vs_docker_run_ratio", "×", "", "issue 20 (the Docker backend: met by the runc backend, sandbox.runc.cold_start_vs_docker_run_ratio)", "cold start p50 / `docker run -d` p50, the Docker backend: the engine's own start bounds it"},
	{"sandbox", "sandbox.pool_acquire_p50_ms", "ms", "<= 10", "issue 4", "acquire from a warm pool, p50"},
	{"sandbox", "sandbox.pool_acquire_p99_ms", "ms", "", "", "acquire from a warm pool, p99"},
	{"sandbox", "sandbox.churn_per_s", "sandboxes/s", "", "", "sandboxes created, used for one `true` and removed per second, at the best concurrency of a curve (1, 2, 4; to 16 on engines ≥ 23)"},
	{"sandbox", "sandbox.churn_vs_docker_run_ratio", "×", "", "", "churn at its best concurrency / a `docker run -d … && docker rm -f` loop at its best concurrency: a new container every time, bound by the engine's own create and remove (sandbox/README.md)"},
	{"sandbox", "sandbox.churn_reset_per_s", "sandboxes/s", "", "", "fresh sandboxes handed out, used for one `true` and given back per second when the pool resets them in place (sandbox.reuse, read-only root), at the best concurrency of the same curve"},
	{"sandbox", "sandbox.churn_reset_vs_docker_run_ratio", "×", ">= 2", "issue 20", "churn with reset in place at its best concurrency / a `docker run -d … && docker rm -f` loop at its best concurrency"},
	{"sandbox", "sandbox.max_concurrent", "sandboxes", ">= 1000", "issue 20 (issue 4: ≥ 200)", "busybox sandboxes alive and answering an exec at the same time"},
	{"sandbox", "sandbox.mem_per_sandbox_mib", "MiB", "", "issue 20 (reported)", "drop of the host's MemAvailable per live idle sandbox (shared machine: other jobs' memory moves it too)"},
	{"sandbox", "sandbox.pss_per_sandbox_mib", "MiB", "", "issue 20 (reported)", "PSS of one idle sandbox's own processes (docker-init, agent) plus its containerd shim"},
	{"sandbox", "sandbox.runc.cold_start_p50_ms", "ms", "", "issue 20 (reported)", "the runc backend (sandbox.backend runc: runc directly, no engine daemon): cold create + start + agent handshake, p50; baseline: `docker run -d`, same run"},
	{"sandbox", "sandbox.runc.cold_start_p99_ms", "ms", "", "", "the runc backend: cold start, p99"},
	{"sandbox", "sandbox.runc.cold_start_vs_docker_run_ratio", "×", "<= 0.5", "issue 20", "the runc backend: cold start p50 / `docker run -d` p50 of the same image"},
	{"sandbox", "sandbox.runc.cold_start_vs_docker_backend_ratio", "×", "", "issue 20 (reported)", "the runc backend's cold start p50 / the Docker backend's, alternating"},
	{"sandbox", "sandbox.runc.exec_p50_ms", "ms", "<= 1", "issue 20", "the runc backend: exec round trip of `true`, p50; baseline: the Docker backend's channel, same run"},
	{"sandbox", "sandbox.runc.exec_p99_ms", "ms", "", "", "the runc backend: exec round trip of `true`, p99"},
	{"sandbox", "sandbox.runc.exec_agent_p50_ms", "ms", "", "issue 20 (reported)", "the runc backend: the agent's own time for `true` within those round trips, p50"},
	{"sandbox", "sandbox.runc.exec_vs_docker_cli_ratio", "×", "<= 0.0111", "issue 20 (≥ 90× faster)", "the runc backend's exec p50 / `docker exec CID true` p50 (the Docker sandbox's, same run)"},
	{"sandbox", "sandbox.runc.exec_channel_p50_ms", "ms", "", "issue 20 (reported)", "the runc backend: the channel's own share of an exec round trip of `true` (round trip less the agent's own time, per call), p50"},
	{"sandbox", "sandbox.runc.churn_per_s", "sandboxes/s", "", "issue 20 (reported)", "the runc backend: single-use sandboxes created, used for one `true` and removed per second at the best of 1–16 at a time; baseline: the `docker run -d … && docker rm -f` loop at its best"},
	{"sandbox", "sandbox.runc.churn_vs_docker_run_ratio", "×", ">= 2", "issue 20", "the runc backend's churn at its best concurrency (single-use, no reuse) / the `docker run -d … && docker rm -f` loop at its best"},
	{"sandbox", "sandbox.runc.max_concurrent", "sandboxes", ">= 1000", "issue 20", "the runc backend: busybox sandboxes alive and answering an exec at the same time"},
	{"sandbox", "sandbox.runc.mem_per_sandbox_mib", "MiB", "", "issue 20 (reported)", "the runc backend: drop of the host's MemAvailable per live idle sandbox"},
	{"sandbox", "sandbox.runc.pss_per_sandbox_mib", "MiB", "", "issue 20 (reported)", "the runc backend: PSS of one idle sandbox's processes (no shim)"},
	{"sandbox", "sandbox.runsc_cold_start_p50_ms", "ms", "", "issue 16 (reported)", "cold sandbox start under gVisor (runsc), p50; baseline: runc, same run"},
	{"sandbox", "sandbox.runsc_exec_p50_ms", "ms", "", "issue 16 (reported)", "exec round trip of `true` under gVisor (runsc), p50; baseline: runc, same run"},
	{"sandbox", "sandbox.runsc_exec_p99_ms", "ms", "", "", "exec round trip of `true` under gVisor (runsc), p99; baseline: runc, same run"},
	{"sandbox", "sandbox.k8s.exec_p50_ms", "ms", "<= 5", "issue 18", "Kubernetes (with --kubeconfig): exec of `true` through the persistent exec stream, p50"},
	{"sandbox", "sandbox.k8s.exec_p99_ms", "ms", "", "", "Kubernetes: exec through the persistent stream, p99"},
	{"sandbox", "sandbox.k8s.exec_vs_spawn_ratio", "×", "<= 0.05", "issue 18 (≥ 20× faster)", "Kubernetes: persistent stream p50 / a new exec stream through the API server per call p50"},
	{"sandbox", "sandbox.k8s.cold_start_p50_ms", "ms", "", "issue 18 (reported)", "Kubernetes: pod create → agent handshake, p50"},
	{"sandbox", "sandbox.k8s.cold_start_p99_ms", "ms", "", "", "Kubernetes: pod create → agent handshake, p99"},
	{"sandbox", "sandbox.k8s.pool_claim_p50_ms", "ms", "<= 100", "issue 18", "Kubernetes: claim a warm pod from the pool, p50"},
	{"sandbox", "sandbox.k8s.pool_claim_p99_ms", "ms", "", "", "Kubernetes: claim a warm pod from the pool, p99"},
	{"sandbox", "sandbox.k8s.agentsandbox_claim_p50_ms", "ms", "", "issue 18 (reported)", "Kubernetes mode agent-sandbox (when the cluster has its CRDs): SandboxClaim on a warm SandboxWarmPool → Ready → agent handshake, p50; baseline: cold pod start of mode pods, same run"},
	{"sandbox", "sandbox.k8s.max_concurrent", "pods", ">= 200", "issue 18", "Kubernetes: busybox sandbox pods alive and answering an exec at the same time, across the cluster's nodes"},

	{"inference", "inference.overhead_p50_us", "µs", "<= 100", "issue 5", "client-side cost of one tokens-mode generation (client p50 − bare POST p50 through the same transport), zero-latency simulator"},
	{"inference", "inference.client_p50_us", "µs", "", "", "full tokens-mode generation call against the zero-latency simulator, p50"},
	{"inference", "inference.client_p99_us", "µs", "", "", "full tokens-mode generation call against the zero-latency simulator, p99"},
	{"inference", "inference.burst_4096_errors", "requests", "== 0", "issue 5", "failed requests in two bursts of 4,096 concurrent generations"},
	{"inference", "inference.burst_4096_closed_conns", "connections", "== 0", "issue 5 (no connection churn)", "connections closed during the two bursts"},
	{"inference", "inference.burst_4096_new_conns", "connections", "", "", "connections dialled during the second burst (pool growth past the first burst's peak)"},
	{"inference", "inference.burst_4096_requests_per_s", "req/s", "", "", "generations per second in the second burst of 4,096"},
	{"inference", "inference.turn_vllm_p50_us", "µs", "", "", "one tokens-mode turn (Episode.Generate: segment renders, generation, decode) with the vllm backend on the zero-latency in-process simulator, simulator time included, p50"},
	{"inference", "inference.turn_llamacpp_p50_us", "µs", "", "issue 14 (reported beside vllm)", "as inference.turn_vllm_p50_us with the llamacpp backend on the simulator's llama.cpp flavour (/apply-template + /tokenize per render, /completion, /detokenize); baseline: the vllm turn, same run"},
	{"inference", "inference.update_pause_resume_p50_ms", "ms", "", "issue 17 (reported)", "one in-flight policy update through the service (BeginUpdate in abort mode + EndUpdate: admission gate, /pause and /resume on every engine), concurrent episodes generating, p50; baseline: the engine's own /pause + /resume called directly, same run"},
	{"inference", "inference.throughput_during_updates_turns_per_s", "turns/s", "", "issue 17 (reported)", "generation turns per second of concurrent episodes while a policy update (abort mode, partial rollouts continued) happens every 250 ms; baseline: the same workload without updates, same run"},
	{"inference", "inference.turn_llamacpp_p99_us", "µs", "", "", "llamacpp backend turn, p99 (baseline: vllm p99, same run)"},

	{"loop", "loop.overhead_p50_us", "µs", "<= 200", "issue 6", "orchestration per turn (parse, dispatch of a no-op tool, budgets, bookkeeping), zero-latency simulator, p50"},
	{"loop", "loop.overhead_p99_us", "µs", "", "", "orchestration per turn, p99"},
	{"loop", "loop.cpu_1k_loops_cores", "cores", "", "", "as loop.cpu_4k_loops_cores with 1,024 loops"},
	{"loop", "loop.rss_1k_loops_mb", "MiB", "", "", "peak process RSS with 1,024 concurrent loops"},
	{"loop", "loop.cpu_4k_loops_cores", "cores", "< 0.25", "issue 6", "process CPU with 4,096 concurrent loops at 1 s generation latency (fake in-process timer policy: no inference client), on schedule: CPU per turn × 4,096 turns per second (= CPU / wall when every turn takes its 1 s; CPU / wall in the note)"},
	{"loop", "loop.rss_4k_loops_mb", "MiB", "< 2048", "issue 6", "peak process RSS with 4,096 concurrent loops"},
	{"loop", "loop.cpu_1k_loops_client_cores", "cores", "", "", "as loop.cpu_4k_loops_client_cores with 1,024 loops"},
	{"loop", "loop.rss_1k_loops_client_mb", "MiB", "", "", "peak RSS of this process (loops + client) with 1,024 concurrent loops through the real client; the simulator runs in a child process"},
	{"loop", "loop.cpu_4k_loops_client_cores", "cores", "< 0.25", "issue 6 (with the real client)", "as loop.cpu_4k_loops_cores, through the real tokens-mode client (vllm backend: HTTP, JSON, /tokenize) on `rollout sim` in a child process at 1 s TTFT: loops + client CPU on schedule (CPU per turn × 4,096 turns per second; CPU / wall, which reads low when the machine falls behind and turns stretch past 1 s, in the note), simulator not counted"},
	{"loop", "loop.rss_4k_loops_client_mb", "MiB", "< 2048", "issue 6 (with the real client)", "peak RSS of this process (loops + client) with 4,096 concurrent loops through the real client; the simulator runs in a child process"},
	{"loop", "loop.cpu_per_turn_client_us", "µs", "", "", "CPU of this process per loop turn (one generation), 4,096 loops through the real client; unlike CPU / wall, independent of how long turns took"},
	{"loop", "loop.cpu_4k_http_floor_cores", "cores", "", "", "the floor under loop.cpu_4k_loops_client_cores: as many loops, each turn one minimal POST /v1/completions through bare net/http (no JSON work) on the same simulator at 1 s TTFT: process CPU on schedule (CPU per request × 4,096 requests per second)"},
	{"loop", "loop.cpu_per_request_http_floor_us", "µs", "", "", "CPU of this process per request of loop.cpu_4k_http_floor_cores"},
	{"loop", "loop.cpu_per_request_direct_floor_us", "µs", "", "", "as loop.cpu_per_request_http_floor_us, through the real client's own transport (the direct HTTP/1.1 path, inference/direct.go) instead of bare net/http"},
	{"loop", "loop.cpu_per_turn_vllm_one_render_us", "µs", "", "issue 37", "CPU per turn of the real client (backend vllm) against the simulator process at 1 s TTFT, one render per later turn; baseline: the same loops with two_render_segments (two renders per later turn), same run"},
	{"loop", "loop.cpu_per_turn_vllm_generate_one_render_us", "µs", "", "issue 37", "as loop.cpu_per_turn_vllm_one_render_us with backend vllm-generate (/inference/v1/generate, which returns no text: one /detokenize per turn)"},

	{"gateway", "gateway.overhead_p50_us", "µs", "<= 100", "issue 35", "the gateway's overhead per call over the engine's own latency: p50 of a call through the gateway (OpenAI Chat door, vllm tokens backend rendering in-process from the model's files — local_render, the simulator's Hugging Face model directory — then generate from ids, parse, record) less the engine's time within it − p50 of the same call through a plain Go reverse proxy to the same simulator less the engine's time within it; the same multi-turn tool conversation, zero-latency in-process simulator, the engine's time its handlers' wall time"},
	{"gateway", "gateway.overhead_raw_p50_us", "µs", "", "issue 35 (reported)", "as gateway.overhead_p50_us with the engine's time left in: the gateway's engine generates from ids (and renders the shapes local_render still checks), the proxy's renders and parses in one request"},
	{"gateway", "gateway.call_p50_us", "µs", "", "issue 35 (reported)", "one call through the gateway (vllm tokens backend, local_render), zero-latency simulator, p50; baseline: the reverse proxy, same run"},
	{"gateway", "gateway.call_p90_us", "µs", "", "", "one call through the gateway (vllm tokens backend, local_render), p90; baseline: the reverse proxy's p90, same run"},
	{"gateway", "gateway.engine_requests_per_call", "requests", "", "issue 35 (reported)", "engine requests per gateway call with the vllm backend and local_render (generation through /v1/completions; /tokenize only where local_render checks itself against the engine); baseline: the reverse proxy's one /v1/chat/completions"},
	{"gateway", "gateway.server_render_overhead_p50_us", "µs", "", "issue 35 (reported)", "as gateway.overhead_p50_us with the engine rendering (no local_render: /tokenize then /v1/completions per call)"},
	{"gateway", "gateway.server_render_overhead_raw_p50_us", "µs", "", "", "as gateway.overhead_raw_p50_us with the engine rendering"},
	{"gateway", "gateway.server_render_call_p50_us", "µs", "", "", "one call through the gateway, vllm backend, the engine rendering, p50; baseline: the reverse proxy, same run"},
	{"gateway", "gateway.server_render_call_p90_us", "µs", "", "", "one call through the gateway, vllm backend, the engine rendering, p90; baseline: the reverse proxy's p90, same run"},
	{"gateway", "gateway.server_render_engine_requests_per_call", "requests", "", "issue 35 (reported)", "engine requests per gateway call with the vllm backend, the engine rendering (/tokenize, /v1/completions); baseline: the reverse proxy's one"},
	{"gateway", "gateway.llamacpp_local_render_overhead_p50_us", "µs", "", "issue 35 (reported)", "as gateway.overhead_p50_us with the llamacpp backend on the simulator's llama.cpp flavour, rendering in-process (local_render): /completion only, once the shapes are checked"},
	{"gateway", "gateway.llamacpp_local_render_overhead_raw_p50_us", "µs", "", "", "as gateway.overhead_raw_p50_us with the llamacpp backend and local_render"},
	{"gateway", "gateway.llamacpp_local_render_call_p50_us", "µs", "", "", "one call through the gateway, llamacpp backend, local_render, p50; baseline: the reverse proxy to the same simulator, same run"},
	{"gateway", "gateway.llamacpp_local_render_call_p90_us", "µs", "", "", "one call through the gateway, llamacpp backend, local_render, p90; baseline: the reverse proxy's p90, same run"},
	{"gateway", "gateway.llamacpp_local_render_engine_requests_per_call", "requests", "", "issue 35 (reported)", "engine requests per gateway call with the llamacpp backend and local_render; baseline: the reverse proxy's one"},
	{"gateway", "gateway.long_history_overhead_p50_us", "µs", "", "issue 35 (reported)", "as gateway.overhead_p50_us (vllm, local_render) on a long history: 20 tool calls, each result a 2.4 kB directory listing (~50 kB of messages re-sent by the last call), p50 over every call of the conversation"},
	{"gateway", "gateway.long_history_overhead_raw_p50_us", "µs", "", "", "as gateway.long_history_overhead_p50_us with the engine's time left in"},
	{"gateway", "gateway.long_history_call_p50_us", "µs", "", "", "one call of the long-history conversation through the gateway (vllm, local_render), p50; baseline: the reverse proxy, same run"},
	{"gateway", "gateway.long_history_call_p90_us", "µs", "", "", "one call of the long-history conversation through the gateway, p90; baseline: the reverse proxy's p90, same run"},
	{"gateway", "gateway.long_history_engine_requests_per_call", "requests", "", "", "engine requests per gateway call of the long-history conversation (vllm, local_render); baseline: the reverse proxy's one"},
	{"gateway", "gateway.llamacpp_overhead_p50_us", "µs", "", "issue 35 (reported)", "as gateway.overhead_p50_us with the llamacpp backend on the simulator's llama.cpp flavour (/apply-template + /tokenize per render, /completion)"},
	{"gateway", "gateway.llamacpp_overhead_raw_p50_us", "µs", "", "", "as gateway.overhead_raw_p50_us with the llamacpp backend"},
	{"gateway", "gateway.llamacpp_call_p50_us", "µs", "", "", "one call through the gateway, llamacpp backend, p50; baseline: the reverse proxy to the same simulator, same run"},
	{"gateway", "gateway.llamacpp_call_p90_us", "µs", "", "", "one call through the gateway, llamacpp backend, p90; baseline: the reverse proxy's p90, same run"},
	{"gateway", "gateway.llamacpp_engine_requests_per_call", "requests", "", "issue 35 (reported)", "engine requests per gateway call with the llamacpp backend; baseline: the reverse proxy's one"},
	{"gateway", "gateway.cpu_10k_sessions_cores", "cores", "< 0.5", "issue 35", "CPU of the gateway's own process (`rollout bench gateway-serve`, rendering in-process: local_render; harnesses and simulator in other processes) with 10,000 sessions held at once, each making 3 calls at 1 s engine latency (TTFT), on schedule: CPU per call × 10,000 calls per second; baseline: a plain reverse proxy process (`gateway-serve --proxy`) under the same load, same run"},
	{"gateway", "gateway.cpu_per_call_10k_us", "µs", "", "issue 35 (reported)", "the gateway process's CPU per call in the 10,000-session run (opening and closing the sessions included); baseline: the reverse proxy process's"},
	{"gateway", "gateway.rss_10k_sessions_mb", "MiB", "< 4096", "issue 35", "peak RSS (VmHWM) of the gateway process in the 10,000-session run; baseline: the reverse proxy process's"},

	{"runner", "runner.rollouts_per_s", "rollouts/s", "", "issue 7 (reported)", "terminal-tasks on busybox, simulator at zero latency, end to end"},
	{"runner", "runner.cpu_s_per_rollout", "CPU-s", "", "issue 7 (reported)", "this process's CPU per rollout at zero latency (includes the in-process simulator; Docker excluded)"},
	{"runner", "runner.phase_sandbox_share", "×", "", "", "sandbox acquisition / total wall per rollout, zero latency (runner.phase_sandbox_start_ms / runner.phase_total_ms): single-use sandboxes, every one a new container"},
	{"runner", "runner.runc_rollouts_per_s", "rollouts/s", "", "issue 20 (reported)", "the zero-latency run on the runc backend (sandbox.backend runc): single-use sandboxes started by runc without the engine daemon"},
	{"runner", "runner.runc_phase_sandbox_share", "×", "", "issue 20 (reported)", "sandbox acquisition / total wall per rollout of runner.runc_rollouts_per_s's run (single-use sandboxes, every one a new container)"},
	{"runner", "runner.reuse_rollouts_per_s", "rollouts/s", "", "", "terminal-tasks on busybox at zero latency with a read-only root and sandboxes reset in place (sandbox.reuse)"},
	{"runner", "runner.reuse_phase_sandbox_share", "×", "", "", "sandbox acquisition / total wall per rollout, zero latency, sandboxes reset in place (runner.reuse_phase_sandbox_start_ms / runner.reuse_phase_total_ms), over the whole run: its first wave (8 groups × 4) creates every sandbox cold"},
	{"runner", "runner.reuse_steady_sandbox_share", "×", "< 0.25", "issue 20", "as runner.reuse_phase_sandbox_share over the rollouts that started after the first rollout ended (a long run's steady state: only they can find a sandbox given back and reset)"},
	{"runner", "runner.serve_cold_rollouts_per_s", "rollouts/s", "", "", "the reuse run's env and groups through rollout serve's shared Docker backend without a warm pool (--warm-sandboxes 0): every sandbox created on demand and single-use, as serve ran them before it had a pool"},
	{"runner", "runner.serve_reuse_rollouts_per_s", "rollouts/s", "", "", "the same through the shared backend's warm pool (--warm-sandboxes 64) with sandbox.reuse: the job's groups started ahead, its sandboxes reset in place for its own next rollouts"},
	{"runner", "runner.serve_reuse_sandbox_share", "×", "", "", "sandbox acquisition / total wall per rollout of runner.serve_reuse_rollouts_per_s's run, whole run"},
	{"runner", "runner.docker_cpu_s_per_rollout", "CPU-s", "", "", "dockerd + containerd CPU per rollout at zero latency"},
	{"runner", "runner.durable_groups_per_s", "groups/s", "", "issue 15 (reported)", "terminal-tasks on busybox, zero-latency simulator, with durability on (every group fsynced before it is announced)"},
	{"runner", "runner.durable_throughput_ratio", "×", ">= 0.95", "issue 15", "end-to-end groups/s with durability on / off, same bench run"},
	{"runner", "runner.durable_wait_ms_mean", "ms", "", "issue 15 (reported)", "the durability runs' own cost: mean time a group waited in WriteGroup for its journal frame to be fsynced (rollout_trajectory_group_durable_seconds), against the mean wall of those runs"},
	{"runner", "runner.realistic_rollouts_per_s", "rollouts/s", "", "", "the same with TTFT 200 ms + 30 ms/token"},
	{"runner", "runner.realistic_cpu_s_per_rollout", "CPU-s", "", "", "this process's CPU per rollout with TTFT 200 ms + 30 ms/token"},

	{"output", "output.parquet_write_mb_s", "MB/s", "", "issue 8 (reported)", "Parquet write of 8k-token trajectories, MB/s of raw token-column data (13 B/position)"},
	{"output", "output.parquet_write_rows_per_s", "rows/s", "", "issue 8 (reported)", "Parquet write of 8k-token trajectories, rows/s"},
	{"output", "output.size_vs_atropos_jsonl_gz", "×", "<= 0.5", "issue 8, 20", "Parquet bytes / the same records as Atropos JSONL gzip (this data's information floor with masks stored: 0.55×, docs/trajectory-schema.md §7)"},
	{"output", "output.parquet_mb_per_1k", "MB", "", "", "Parquet size per 1,000 trajectories of 8k tokens"},
	{"output", "output.size_vs_atropos_jsonl_gz_grpo", "×", "", "", "as output.size_vs_atropos_jsonl_gz, with the 8 rollouts of each group sharing their prompt (1,024 ids, system and user messages) as a GRPO group's do"},
	{"output", "output.durable_groups_per_s", "groups/s", "", "issue 15 (reported)", "groups of 8 × 8k tokens written with durability on (journal fsynced before WriteGroup returns), 8 concurrent writers"},
	{"output", "output.durable_throughput_ratio", "×", "", "issue 15 (reported: worst case)", "writer alone, nothing else running: groups/s with durability on / off, same run"},
	{"output", "output.durable_extra_bytes_ratio", "×", "", "issue 15 (reported)", "journal bytes written / Parquet bytes, the extra writes durability costs"},
	{"output", "service.groups_per_s", "groups/s", ">= 200", "issue 9", "groups of 8 × 8k tokens streamed over gRPC CollectGroups to a local client"},
	{"output", "service.size_vs_atropos_json", "×", "<= 0.3", "issue 9, 20", "serialized Group message (compact token layout, as the repository's trainers request it) / the same group as Atropos JSON"},
}

var catalogByName = func() map[string]entry {
	m := map[string]entry{}
	for _, c := range catalog {
		if _, dup := m[c.name]; dup {
			panic("bench: duplicate catalogue entry " + c.name)
		}
		m[c.name] = c
	}
	return m
}()

// Meets evaluates value against a target "OP NUMBER" with OP one of <=,
// <, >=, >, ==.
func Meets(value float64, target string) (bool, error) {
	t := strings.TrimSpace(target)
	var op string
	for _, o := range []string{"<=", ">=", "==", "<", ">"} {
		if strings.HasPrefix(t, o) {
			op = o
			break
		}
	}
	if op == "" {
		return false, fmt.Errorf("target %q: want <=, <, >=, > or == and a number", target)
	}
	x, err := strconv.ParseFloat(strings.TrimSpace(t[len(op):]), 64)
	if err != nil {
		return false, fmt.Errorf("target %q: %w", target, err)
	}
	switch op {
	case "<=":
		return value <= x, nil
	case "<":
		return value < x, nil
	case ">=":
		return value >= x, nil
	case ">":
		return value > x, nil
	}
	return value == x, nil
}

// round keeps d decimal places.
func round(x float64, d int) float64 {
	p := math.Pow(10, float64(d))
	return math.Round(x*p) / p
}

// sig rounds to 4 significant digits: what a noisy measurement supports.
func sig(x float64) float64 {
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	d := 3 - int(math.Floor(math.Log10(math.Abs(x))))
	if d < 0 {
		p := math.Pow(10, float64(-d))
		return math.Round(x/p) * p
	}
	return round(x, d)
}

// FormatNumber prints a measured number compactly (3 significant digits,
// integers as integers).
func FormatNumber(x float64) string {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return fmt.Sprint(x)
	case x == math.Trunc(x) && math.Abs(x) < 1e15:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case math.Abs(x) >= 100:
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}
