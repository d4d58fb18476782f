#!/usr/bin/env bash
# agent-sandbox.sh up|down — the kubernetes-sigs/agent-sandbox controller on
# the lab (docs/kubernetes.md, "Mode agent-sandbox"), for mode agent-sandbox's
# tests and `rollout run` in `make test` (ci.sh).
#
#   up    build the pinned controller and take its CRDs
#         (build-agent-sandbox.sh, cached by version), apply the four CRDs
#         to the lab (server-side: the template CRD is too big for a
#         client-side apply), wait until they are Established, then start
#         the controller as a process on the host against the lab's API
#         server (no image, no registry, no webhook) and wait until its
#         claim controller runs. Its log: $STATE/agent-sandbox.log.
#   down  stop that controller (the lab's own `down` removes the CRDs with
#         the cluster).
#
# Needs the lab up (lab.sh up). The controller process is the only thing on
# the host; its pid is kept in $STATE/agent-sandbox.pid.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
LAB=${K8S_LAB_NAME:-rollout-k8s-lab}
STATE=${K8S_LAB_STATE:-/var/cache/rollout/k8s-lab/$LAB}
VERSION=${AGENT_SANDBOX_VERSION:-v0.5.6}
CACHE=${AGENT_SANDBOX_CACHE:-/var/cache/rollout/agent-sandbox}
PIDFILE=$STATE/agent-sandbox.pid
LOG=$STATE/agent-sandbox.log

log() { echo "agent-sandbox: $*" >&2; }
die() { echo "agent-sandbox: $*" >&2; exit 1; }

down() {
	[ -f "$PIDFILE" ] || return 0
	local pid
	pid=$(cat "$PIDFILE")
	# Only the process this script started: its pid and its binary.
	if kill -0 "$pid" 2>/dev/null && grep -q agent-sandbox-controller "/proc/$pid/cmdline" 2>/dev/null; then
		kill "$pid"
		local i
		for i in $(seq 1 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -9 "$pid" 2>/dev/null || true
		log "controller (pid $pid) stopped"
	fi
	rm -f "$PIDFILE"
}

up() {
	local t0
	t0=$(date +%s)
	"$HERE/build-agent-sandbox.sh" "$VERSION" >&2
	local dir=$CACHE/$VERSION
	eval "$("$HERE/lab.sh" env)"
	local kc=${ROLLOUT_K8S_LAB_KUBECONFIG:?lab.sh env gave no kubeconfig: is the lab up?}
	[ -f "$kc" ] || die "the lab's kubeconfig $kc does not exist: start the lab first (lab.sh up)"
	down # a controller left by an earlier up
	local f
	for f in "$dir"/crds/*.yaml; do
		kubectl --kubeconfig "$kc" apply --server-side --force-conflicts -f "$f" >/dev/null
	done
	kubectl --kubeconfig "$kc" wait --for condition=Established --timeout 60s \
		crd/sandboxes.agents.x-k8s.io crd/sandboxclaims.extensions.agents.x-k8s.io \
		crd/sandboxtemplates.extensions.agents.x-k8s.io crd/sandboxwarmpools.extensions.agents.x-k8s.io >/dev/null
	mkdir -p "$STATE"
	# setsid: the controller outlives this script (ci.sh stops it with down).
	KUBECONFIG=$kc setsid "$dir/bin/agent-sandbox-controller" --extensions --leader-elect=false \
		--enable-webhook=false --metrics-bind-address=0 --health-probe-bind-address=0 \
		>"$LOG" 2>&1 </dev/null &
	echo $! >"$PIDFILE"
	# Ready when the claim controller's workers run (controller-runtime logs
	# "Starting workers" once per controller: sandbox, claim, template, pool).
	local waited=0
	until [ "$(grep -c 'Starting workers' "$LOG" 2>/dev/null)" -ge 4 ]; do
		kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { tail -n 20 "$LOG" >&2; rm -f "$PIDFILE"; die "the controller exited (log above, $LOG)"; }
		waited=$((waited + 1))
		[ "$waited" -le 120 ] || { tail -n 20 "$LOG" >&2; down; die "the controller's workers did not start within 60 s (log above)"; }
		sleep 0.5
	done
	log "controller $VERSION up (pid $(cat "$PIDFILE"), log $LOG) in $(($(date +%s) - t0)) s"
}

case ${1:-} in
up) up ;;
down) down ;;
*) die "usage: agent-sandbox.sh up|down" ;;
esac
