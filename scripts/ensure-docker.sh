#!/usr/bin/env bash
# Makes sure a responsive Docker engine is there before the integration
# tests. Docker 20.10's daemon can deadlock under heavy container churn
# (moby/moby#42545, not in Debian's 20.10.24): API calls then hang forever.
# As root, a missing or hung local dockerd is (re)started; otherwise this
# says what is wrong and fails.
set -uo pipefail

# A daemon wedged on one container's lock still answers `docker info` and
# `docker ps`, while inspect, stop and rm of that container hang (seen with
# a bench's sandboxes on 2026-11-27): every container is inspected too, and
# only a timeout counts (a container removed meanwhile is not a hang).
responsive() {
	timeout 20 docker info >/dev/null 2>&1 || return 1
	local ids
	ids=$(timeout 20 docker ps -aq 2>/dev/null) || return 1
	[ -z "$ids" ] && return 0
	# shellcheck disable=SC2086 # one argument per id
	timeout 60 docker inspect $ids >/dev/null 2>&1
	[ $? -ne 124 ]
}

if responsive; then
	exit 0
fi
if [ -n "${DOCKER_HOST:-}" ] && [[ "$DOCKER_HOST" != unix://* ]]; then
	echo "ensure-docker: the engine at DOCKER_HOST=$DOCKER_HOST does not answer 'docker info' within 20 s, or its containers 'docker inspect' within 60 s" >&2
	exit 1
fi
if [ "$(id -u)" != 0 ] || [ ! -x /usr/sbin/dockerd ]; then
	echo "ensure-docker: the local Docker engine does not answer 'docker info' within 20 s, or its containers 'docker inspect' within 60 s; (re)start it (e.g. 'sudo service docker restart')" >&2
	exit 1
fi
if pid=$(pgrep -x dockerd); then
	echo "ensure-docker: dockerd (pid $pid) does not answer; restarting it" >&2
	kill -TERM $pid 2>/dev/null
	for _ in $(seq 1 30); do pgrep -x dockerd >/dev/null || break; sleep 1; done
	pkill -KILL -x dockerd 2>/dev/null
	pkill -KILL -x containerd 2>/dev/null
	# A wedged daemon leaves its containers' storage mounts behind.
	pkill -x fuse-overlayfs 2>/dev/null
	sleep 1
else
	echo "ensure-docker: no dockerd running; starting it" >&2
fi
(cd / && setsid nohup /usr/sbin/dockerd >/var/log/dockerd.log 2>&1 </dev/null &)
for _ in $(seq 1 60); do
	if responsive; then
		echo "ensure-docker: dockerd is up" >&2
		exit 0
	fi
	sleep 1
done
echo "ensure-docker: dockerd did not come up within 60 s; see /var/log/dockerd.log" >&2
tail -20 /var/log/dockerd.log >&2
exit 1
