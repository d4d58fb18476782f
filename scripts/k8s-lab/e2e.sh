#!/usr/bin/env bash
# e2e.sh [--kill-node] — `rollout run` of terminal-tasks (GROUPS items × G 4)
# with its sandboxes on the lab cluster (lab.sh up first), against the
# simulator as the policy. Checks: every group written, every rollout ok
# (infra failures retried), sandboxes spread over >= 2 nodes, 0 pods and 0
# leases left afterwards. With --kill-node, the last worker node is killed
# (docker kill) once it runs sandboxes: its rollouts must be retried on the
# surviving nodes with nothing lost or duplicated. Destructive: run
# `lab.sh down && lab.sh up` afterwards. E2E_MODE=agent-sandbox (with
# E2E_WARM_POOL replicas) runs the sandboxes as SandboxClaims of the
# agent-sandbox controller, which must be installed (docs/kubernetes.md).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
KC=${ROLLOUT_K8S_LAB_KUBECONFIG:?set ROLLOUT_K8S_LAB_KUBECONFIG (eval \$(scripts/k8s-lab/lab.sh env))}
ROLLOUT=${ROLLOUT:-$ROOT/bin/rollout}
LAB=${K8S_LAB_NAME:-rollout-k8s-lab}
NODES=${K8S_LAB_NODES:-2}
NGROUPS=${GROUPS_N:-20}
IMAGE=${E2E_IMAGE:-rollout-sandbox:bookworm}
MODE=${E2E_MODE:-pods}
WARM=${E2E_WARM_POOL:-0}
KILL=0
[ "${1:-}" = "--kill-node" ] && KILL=1
kc() { kubectl --kubeconfig "$KC" "$@"; }
die() { echo "e2e: FAIL: $*" >&2; exit 1; }

work=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
"$ROLLOUT" sim --env terminal-tasks --success-prob 0.7 --host 127.0.0.1 --port "$port" --ttft 150ms --per-token 1ms --seed 5 \
	>"$work/sim.log" 2>&1 &
sim=$!
trap 'kill $sim 2>/dev/null || true; wait $sim 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
cat >"$work/run.yaml" <<EOF
env: terminal-tasks
groups: $NGROUPS
group_size: 4
seed: 3
inference: {backend: vllm, endpoints: [http://127.0.0.1:$port]}
parser: hermes
sandbox:
  image: $IMAGE
  memory_mb: 512
  backend: kubernetes
  kubernetes:
    kubeconfig: $KC
    namespace: default
    image_pull_policy: Never
    mode: $MODE
    agent_sandbox: {warm_pool: $WARM}
limits: {rollouts_in_flight: 32, sandboxes: 32}
output: {dir: $work/out}
EOF
# The lab's agent: the one loaded into the nodes.
export ROLLOUT_AGENT=$(dirname "$KC")/rollout-agent

# Watch where sandboxes run (and kill a node once it has some).
victim="$LAB-w$NODES"
(
	killed=0
	while sleep 0.5; do
		kc get pods -l io.rollout.managed=true --no-headers -o custom-columns=N:.spec.nodeName 2>/dev/null | sort -u >>"$work/nodes.seen" || true
		if [ "$KILL" = 1 ] && [ "$killed" = 0 ] &&
			[ "$(kc get pods -l io.rollout.managed=true --field-selector spec.nodeName="$victim",status.phase=Running --no-headers 2>/dev/null | wc -l)" -ge 4 ]; then
			echo "e2e: killing node $victim at $(date +%T)" >&2
			docker kill "$victim" >/dev/null
			killed=1
			echo "$victim" >"$work/killed"
		fi
	done
) &
watcher=$!
trap 'kill $watcher 2>/dev/null || true; kill $sim 2>/dev/null || true; wait 2>/dev/null || true' EXIT

t0=$(date +%s)
"$ROLLOUT" run -c "$work/run.yaml" >"$work/summary.txt" 2>"$work/run.log" || { tail -20 "$work/run.log"; die "rollout run failed"; }
elapsed=$(($(date +%s) - t0))
kill $watcher 2>/dev/null || true
cat "$work/summary.txt"
echo "e2e: run took ${elapsed}s"

sort -u "$work/nodes.seen" | grep -v '^<none>$' | grep . >"$work/nodes.txt" || true
nodes=$(wc -l <"$work/nodes.txt")
echo "e2e: sandboxes ran on $nodes node(s): $(tr '\n' ' ' <"$work/nodes.txt")"
[ "$nodes" -ge 2 ] || die "sandboxes on fewer than 2 nodes"
grep -q "^groups: *$NGROUPS written" "$work/summary.txt" || die "not every group written"
want=$((NGROUPS * 4))
grep -Eq "^rollouts: *$want \($want ok, 0 infra-failed" "$work/summary.txt" || die "rollouts lost or failed"
if [ "$KILL" = 1 ]; then
	[ -f "$work/killed" ] || die "the node was never killed (run too short?)"
	retries=$(sed -n 's/.* \([0-9]*\) retries).*/\1/p' "$work/summary.txt")
	echo "e2e: $retries rollouts retried after the node loss"
	[ "${retries:-0}" -ge 1 ] || die "no retries after killing $victim"
fi
# Nothing duplicated: every (group, index) once in the written trajectories.
"$ROLLOUT" inspect "$work/out" >"$work/inspect.txt" 2>&1 || true
rows=$(sed -n 's/^rollouts *\([0-9]*\) .*/\1/p' "$work/inspect.txt" | head -1)
echo "e2e: $rows trajectory rows written"
[ "$rows" = "$want" ] || die "$rows trajectory rows written, want $want (lost or duplicated)"
# The garbage collector removes what the closed backend's owners held (in
# mode agent-sandbox: the warm pools' Sandboxes and pods) within seconds.
for _ in $(seq 30); do
	left=$(kc get pods -l io.rollout.managed=true --no-headers 2>/dev/null | wc -l)
	[ "$left" = 0 ] && break
	sleep 1
done
leases=$(kc get leases -l io.rollout.managed=true --no-headers 2>/dev/null | wc -l)
claims=0
[ "$MODE" = agent-sandbox ] && claims=$(kc get sandboxclaims,sandboxwarmpools,sandboxtemplates -l io.rollout.managed=true --no-headers 2>/dev/null | wc -l)
echo "e2e: pods left $left, leases left $leases, agent-sandbox objects left $claims"
[ "$left" = 0 ] || die "$left pods left"
[ "$leases" = 0 ] || die "$leases leases left"
[ "$claims" = 0 ] || die "$claims agent-sandbox objects left"
echo "e2e: PASS (out: $work/out)"
