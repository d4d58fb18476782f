#!/usr/bin/env bash
# Makes gVisor (runsc) available as the Docker runtime "runsc", for
# sandbox.runtime: runsc. Idempotent. As root it installs Debian's runsc
# package when missing, adds {"runtimes": {"runsc": {"path": ...}}} to
# /etc/docker/daemon.json (keeping every other key) and reloads dockerd
# with SIGHUP (runtimes are reloadable: no restart, running containers are
# untouched). Checks the result with a busybox container under runsc when
# the image is there. Without root it only checks and says what is missing.
set -euo pipefail

conf=/etc/docker/daemon.json
have_runtime() { timeout 20 docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc":{[^}]*--network=none'; }

if have_runtime; then
	echo "ensure-runsc: the engine already has the runsc runtime" >&2
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "ensure-runsc: the engine has no runsc runtime; as root, run $0 (installs Debian's runsc package and registers it in $conf)" >&2
	exit 1
fi
if [ -n "${DOCKER_HOST:-}" ] && [[ "$DOCKER_HOST" != unix://* ]]; then
	echo "ensure-runsc: DOCKER_HOST=$DOCKER_HOST is remote: register runsc on that host" >&2
	exit 1
fi
if ! command -v runsc >/dev/null; then
	echo "ensure-runsc: installing runsc (apt)" >&2
	"$(dirname "$0")/apt-install.sh" runsc >/dev/null
fi
path=$(command -v runsc)
mkdir -p "$(dirname "$conf")"
[ -s "$conf" ] || echo '{}' >"$conf"
python3 - "$conf" "$path" <<'PY'
import json, os, sys
conf, path = sys.argv[1], sys.argv[2]
with open(conf) as f:
    cfg = json.load(f)
# --network=none: gVisor's own network stack stays off. Sandboxes under
# runsc have no network (the backend refuses runsc with a network): runsc
# refuses to set up interfaces when it cannot tell the container's network
# namespace from the host's, which is the case on VMs whose pid 1 hides its
# namespaces, and the host-firewall isolation of network: bridge would not
# apply to gVisor's stack unchanged.
cfg.setdefault("runtimes", {})["runsc"] = {"path": path, "runtimeArgs": ["--network=none"]}
tmp = conf + ".tmp"
with open(tmp, "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
os.replace(tmp, conf)
PY
# The machine's engine: its pid file, else the oldest dockerd (a second
# daemon, e.g. scripts/overlay2-engine.sh's, must not get the SIGHUP).
pid=$(cat /var/run/docker.pid 2>/dev/null) && kill -0 "$pid" 2>/dev/null ||
	pid=$(pgrep -xo dockerd) || { echo "ensure-runsc: no dockerd running (scripts/ensure-docker.sh starts one)" >&2; exit 1; }
kill -HUP "$pid"
for _ in $(seq 1 20); do
	if have_runtime; then
		echo "ensure-runsc: runsc ($path, $(runsc --version | head -1)) registered with the engine" >&2
		exit 0
	fi
	sleep 1
done
echo "ensure-runsc: dockerd did not pick up the runsc runtime after SIGHUP; see its log" >&2
exit 1
