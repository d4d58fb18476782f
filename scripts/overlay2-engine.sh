#!/usr/bin/env bash
# Starts a second Docker daemon on this host, the machine's own dockerd
# binary with the overlay2 storage driver (the machine's engine is set to
# fuse-overlayfs), so that `rollout bench sandbox` can measure the Docker
# backend on the storage most engines use, as a local engine: bind delivery
# and the socket channel, as on the machine's engine. As root. Idempotent.
#
#   scripts/overlay2-engine.sh [start]   start it, load rollout-sandbox:busybox, print DOCKER_HOST=...
#   scripts/overlay2-engine.sh stop      stop it and remove its data
#
# Then: DOCKER_HOST=unix:///run/rollout-engine-overlay2/docker.sock bin/rollout bench sandbox --json out/sandbox-overlay2.json
#
# Every command a sandbox runs is read from the container's root: on
# fuse-overlayfs each spawn goes through the FUSE daemon (~0.3 ms here),
# on overlay2 through the kernel (sandbox/README.md, "Exec and the storage
# driver"). The daemon has its own data root, exec root, containerd and
# bridge (rollout-ov2br, no iptables rules: sandboxes run with --network
# none). Not "bridge": "none": a dockerd started so deletes the host's
# docker0, which the machine's engine needs.
set -euo pipefail

run=/run/rollout-engine-overlay2
data=/var/lib/rollout/engine-overlay2
sock=unix://$run/docker.sock
br=rollout-ov2br

stop() {
	if [ -f "$run/dockerd.pid" ]; then
		pid=$(cat "$run/dockerd.pid")
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
	fi
	rm -rf "$run"
	ip link del "$br" 2>/dev/null || true
	if [ -d "$data" ]; then
		# Mounts the daemon left (a killed daemon's overlay2 layers).
		grep -o " $data[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
		rm -rf "$data"
	fi
}

case "${1:-start}" in
stop)
	stop
	exit 0
	;;
start) ;;
*)
	echo "usage: $0 [start|stop]" >&2
	exit 2
	;;
esac

[ "$(id -u)" = 0 ] || { echo "overlay2-engine: needs root (a second dockerd)" >&2; exit 1; }
if ! DOCKER_HOST=$sock timeout 5 docker version >/dev/null 2>&1; then
	mkdir -p "$run" "$data"
	ip link show "$br" >/dev/null 2>&1 || ip link add "$br" type bridge
	# A config file of its own: the machine's /etc/docker/daemon.json sets
	# the storage driver, and a flag may not repeat what a file sets.
	cat >"$run/daemon.json" <<EOF
{"data-root": "$data", "storage-driver": "overlay2", "log-driver": "none", "bridge": "$br", "iptables": false, "ip6tables": false}
EOF
	setsid dockerd --config-file "$run/daemon.json" --exec-root "$run" -H "$sock" \
		--pidfile "$run/dockerd.pid" >"$run/dockerd.log" 2>&1 </dev/null &
	for _ in $(seq 60); do
		DOCKER_HOST=$sock timeout 5 docker version >/dev/null 2>&1 && break
		sleep 0.5
	done
fi
DOCKER_HOST=$sock docker info --format 'overlay2-engine: {{.ServerVersion}}, storage {{.Driver}}' >&2 ||
	{ echo "overlay2-engine: the daemon did not start; $run/dockerd.log:" >&2; tail -5 "$run/dockerd.log" >&2; exit 1; }
if ! DOCKER_HOST=$sock docker image inspect rollout-sandbox:busybox >/dev/null 2>&1; then
	docker save rollout-sandbox:busybox | DOCKER_HOST=$sock docker load >/dev/null
fi
echo "DOCKER_HOST=$sock"
