#!/usr/bin/env bash
# Starts a current Docker Engine (Debian trixie's docker.io by default) in a
# container of the machine's engine, on a private internal network, so that
# `rollout bench sandbox` can measure churn, cold start and density on a
# current engine as well as on the machine's (issue 20). Idempotent.
#
#   scripts/current-engine.sh [start]   build the image if missing, start the engine,
#                                       load rollout-sandbox:busybox, print DOCKER_HOST=...
#   scripts/current-engine.sh stop      remove the engine container, its volume and network
#
# Then: DOCKER_HOST=tcp://IP:2375 ROLLOUT_AGENT=bin/rollout-agent bin/rollout bench sandbox --json out/sandbox-current.json
#
# The engine listens without TLS on the internal network only (no route to
# the outside, nothing published on the host's interfaces). --privileged
# fails on these hosts (no CAP_SYS_RESOURCE in the VM's bounding set), so
# the container gets every other capability, unconfined seccomp/apparmor/
# system paths, all devices and the host's cgroup hierarchy read-write
# (/work/shared/reference/kubernetes-lab.md). /var/lib/docker is a volume,
# so the inner engine uses overlay2 (the outer one here: fuse-overlayfs).
set -euo pipefail

suite=${ENGINE_SUITE:-trixie}
image=rollout-lab/docker-$suite:1
name=rollout-lab-dockerd-$suite
net=rollout-lab-engines
vol=rollout-lab-dockerd-$suite

case "${1:-start}" in
stop)
	docker rm -f "$name" >/dev/null 2>&1 || true
	docker volume rm "$vol" >/dev/null 2>&1 || true
	docker network rm "$net" >/dev/null 2>&1 || true
	exit 0
	;;
start) ;;
*)
	echo "usage: $0 [start|stop]" >&2
	exit 2
	;;
esac

if ! docker image inspect "$image" >/dev/null 2>&1; then
	command -v mmdebstrap >/dev/null || { echo "current-engine: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	echo "current-engine: building $image with mmdebstrap ($suite, docker.io; a few minutes)" >&2
	aptopt=()
	[ "$suite" = sid ] && aptopt=(--aptopt='Acquire::Check-Valid-Until "false"')
	mmdebstrap --variant=minbase "${aptopt[@]}" --include=docker.io,ca-certificates,iptables,procps "$suite" "$tmp/rootfs.tar" >&2
	docker import -c 'CMD ["/usr/sbin/dockerd"]' "$tmp/rootfs.tar" "$image" >/dev/null
fi
docker network inspect "$net" >/dev/null 2>&1 || docker network create --internal "$net" >/dev/null
if [ "$(docker inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" != true ]; then
	docker rm -f "$name" >/dev/null 2>&1 || true
	docker run -d --name "$name" --label io.rollout.lab=engine --network "$net" \
		--cap-add ALL --cap-drop SYS_RESOURCE \
		--security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt systempaths=unconfined \
		--device-cgroup-rule 'a *:* rwm' -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
		-v "$vol":/var/lib/docker --tmpfs /run \
		"$image" dockerd -H tcp://0.0.0.0:2375 --iptables=false --ip6tables=false >/dev/null
fi
ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$name")
host=tcp://$ip:2375
for _ in $(seq 60); do
	DOCKER_HOST=$host timeout 5 docker version >/dev/null 2>&1 && break
	sleep 1
done
DOCKER_HOST=$host docker version --format 'current-engine: {{.Server.Version}} (API {{.Server.APIVersion}})' >&2
if ! DOCKER_HOST=$host docker image inspect rollout-sandbox:busybox >/dev/null 2>&1; then
	if docker image inspect rollout-sandbox:busybox >/dev/null 2>&1; then
		docker save rollout-sandbox:busybox | DOCKER_HOST=$host docker load >/dev/null
	else
		echo "current-engine: rollout-sandbox:busybox is not on the machine's engine; bench builds it on first use" >&2
	fi
fi
echo "DOCKER_HOST=$host"
