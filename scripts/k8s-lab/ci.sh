#!/usr/bin/env bash
# ci.sh — the Kubernetes lab's part of `make test` (docs/kubernetes.md,
# "The lab in make test").
#
#   ci.sh with-build CMD...  start the pinned Kubernetes binaries' build and
#                            then the agent-sandbox controller's in the
#                            background at the lowest CPU priority (nice
#                            19: it takes only the CPU the rest of the test
#                            run leaves idle) when they are not cached, then
#                            run CMD. If CMD fails the build is stopped.
#   ci.sh run                the lab checks, in order: lab.sh up (waits for
#                            the build), the agent-sandbox controller and
#                            CRDs (agent-sandbox.sh up), the Kubernetes Go
#                            tests of every package (race detector; mode
#                            agent-sandbox's among them), e2e.sh
#                            (terminal-tasks 20 x 4) in mode pods and in mode
#                            agent-sandbox, the controller stopped, then the
#                            destructive ones: a frozen node
#                            (TestKubernetesNodeLoss) and e2e.sh --kill-node.
#                            lab.sh down always runs at the end. Prints the
#                            time of every step; a failed step fails with its
#                            name.
#
# ROLLOUT_SKIP_K8S_LAB=1 skips both (a developer's `make test` without the
# lab); with CI=true it is refused: CI runs the lab, and a lab that does not
# come up is a failure, never a skip.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VERSION=${K8S_VERSION:-v1.37.2}
CACHE=${K8S_LAB_CACHE:-/var/cache/rollout/k8s}
LOGS=${K8S_LAB_CI_LOGS:-$ROOT/out/k8s-lab}
GO=${GO:-go}

log() { echo "k8s-lab-ci: $*" >&2; }

skipped() {
	[ "${ROLLOUT_SKIP_K8S_LAB:-}" = 1 ] || return 1
	if [ "${CI:-}" = true ]; then
		log "FAIL: ROLLOUT_SKIP_K8S_LAB=1 with CI=true: CI must run the Kubernetes lab"
		exit 1
	fi
	return 0
}

with_build() {
	[ $# -gt 0 ] || { log "usage: ci.sh with-build CMD..."; exit 2; }
	if skipped; then
		"$@"
		return
	fi
	mkdir -p "$LOGS"
	local pid=""
	# build-k8s.sh returns at once when the binaries are cached and takes a
	# lock, so the lab step's own call waits for this one.
	setsid nice -n 19 sh -c '"$1/build-k8s.sh" "$2" && "$1/build-agent-sandbox.sh"' sh "$HERE" "$VERSION" >"$LOGS/build-k8s.log" 2>&1 &
	pid=$!
	log "building kubernetes $VERSION in the background (nice 19, pid $pid, log $LOGS/build-k8s.log)"
	local status=0
	"$@" || status=$?
	if [ "$status" != 0 ]; then
		if kill -0 "$pid" 2>/dev/null; then
			log "stopping the background kubernetes build (the tests failed)"
			kill -- -"$pid" 2>/dev/null || true
		fi
		wait "$pid" 2>/dev/null || true
		exit "$status"
	fi
	# Still running: the lab step waits for it (build-k8s.sh's lock).
}

step=""
times=()
begin() {
	step=$1
	stepStart=$(date +%s)
	log "== $step"
}
end() {
	local d=$(($(date +%s) - stepStart))
	times+=("$(printf '%-44s %5d s' "$step" "$d")")
	log "== $step: ok in ${d}s"
	step=""
}

dump_lab() {
	local lab=${K8S_LAB_NAME:-rollout-k8s-lab} c
	for c in $(docker ps -a --filter label=io.rollout.lab="$lab" --format '{{.Names}}' 2>/dev/null); do
		echo "--- $c" >&2
		docker exec "$c" sh -c 'tail -n 15 /var/log/lab/*.log' >&2 2>/dev/null || true
	done
}

finish() {
	local status=$?
	if [ -n "$step" ]; then
		log "FAIL: the Kubernetes lab step \"$step\" failed (exit $status); node logs follow, step output is above"
		dump_lab
		[ "$status" = 0 ] && status=1
	fi
	if [ "${lab_up:-0}" = 1 ]; then
		"$HERE/agent-sandbox.sh" down || log "agent-sandbox.sh down failed"
		"$HERE/lab.sh" down || log "lab.sh down failed"
	fi
	if [ "${#times[@]}" -gt 0 ]; then
		log "step times:"
		printf '  %s\n' "${times[@]}" >&2
		printf '%s\n' "${times[@]}" >"$LOGS/times.txt"
	fi
	exit "$status"
}

run() {
	if skipped; then
		log "skipped (ROLLOUT_SKIP_K8S_LAB=1): the Kubernetes backend's lab tests did not run"
		return 0
	fi
	mkdir -p "$LOGS"
	local lab=${K8S_LAB_NAME:-rollout-k8s-lab}
	if docker inspect "$lab-cp" >/dev/null 2>&1; then
		log "FAIL: a lab named $lab is already up: take it down (scripts/k8s-lab/lab.sh down) or set K8S_LAB_NAME"
		exit 1
	fi
	trap finish EXIT
	local t0
	t0=$(date +%s)
	begin "lab up (kubernetes $VERSION build or cache)"
	lab_up=1 # a half-started lab is taken down too
	"$HERE/lab.sh" up >/dev/null
	end
	eval "$("$HERE/lab.sh" env)"
	export ROLLOUT_K8S_LAB_KUBECONFIG ROLLOUT_K8S_LAB_REGISTRY
	begin "agent-sandbox controller up (build or cache)"
	"$HERE/agent-sandbox.sh" up
	# The KubernetesAgentSandbox tests fail, not skip, without the CRDs.
	export ROLLOUT_K8S_LAB_AGENT_SANDBOX=1
	end
	begin "go test -race -run Kubernetes (lab tests)"
	# The packages holding Kubernetes tests; a package that lists none is a
	# failure (a moved test must not turn this step into a silent no-op).
	local pkgs="./sandbox/kubernetes/... ./assemble/ ./server/"
	(cd "$ROOT" && for p in $pkgs; do
		# The list is read whole first: grep -q closing the pipe early would
		# fail the pipeline under pipefail.
		list=$("$GO" test -list Kubernetes "$p") || exit 1
		if ! grep -q '^Test' <<<"$list"; then
			log "FAIL: $p lists no Kubernetes test"
			exit 1
		fi
	done)
	(cd "$ROOT" && "$GO" test -race -count=1 -timeout 20m -run Kubernetes $pkgs)
	end
	begin "e2e.sh (rollout run terminal-tasks 20x4)"
	"$HERE/e2e.sh"
	end
	begin "e2e.sh mode agent-sandbox (20x4, warm pool 4)"
	E2E_MODE=agent-sandbox E2E_WARM_POOL=4 "$HERE/e2e.sh"
	end
	# The destructive checks run in mode pods; the controller would only
	# compete with them for the CPU.
	"$HERE/agent-sandbox.sh" down
	begin "node loss (TestKubernetesNodeLoss, destructive)"
	local list
	list=$(cd "$ROOT" && "$GO" test -list 'KubernetesNodeLoss$' ./sandbox/kubernetes/)
	grep -qx TestKubernetesNodeLoss <<<"$list" || { log "FAIL: ./sandbox/kubernetes/ has no TestKubernetesNodeLoss"; exit 1; }
	(cd "$ROOT" && ROLLOUT_K8S_LAB_DESTRUCTIVE=1 "$GO" test -race -count=1 -timeout 10m -run 'KubernetesNodeLoss$' ./sandbox/kubernetes/)
	# The frozen node was unpaused: both nodes Ready again before the last check.
	local n=${K8S_LAB_NODES:-2} waited=0
	until [ "$(kubectl --kubeconfig "$ROLLOUT_K8S_LAB_KUBECONFIG" get nodes --no-headers 2>/dev/null | grep -c ' Ready')" -ge "$n" ]; do
		waited=$((waited + 1))
		[ "$waited" -le 120 ] || { log "the nodes did not all become Ready again after the node-loss test"; exit 1; }
		sleep 1
	done
	end
	begin "e2e.sh --kill-node (destructive)"
	"$HERE/e2e.sh" --kill-node
	end
	times+=("$(printf '%-44s %5d s' "total" "$(($(date +%s) - t0))")")
}

case ${1:-} in
with-build) shift; with_build "$@" ;;
run) run ;;
*) log "usage: ci.sh with-build CMD... | run"; exit 2 ;;
esac
