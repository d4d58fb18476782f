#!/usr/bin/env bash
# build-agent-sandbox.sh [VERSION] — builds the kubernetes-sigs/agent-sandbox
# controller (module sigs.k8s.io/agent-sandbox, from the Go module proxy) and
# copies its four CRDs out of the module, cached by version under
# $AGENT_SANDBOX_CACHE/<version>/{bin,crds} like build-k8s.sh's binaries.
# A second run with the same version is a no-op. The lab step of `make test`
# runs the controller on the host against the lab's API server
# (agent-sandbox.sh up; docs/kubernetes.md, "Mode agent-sandbox").
#
# The CRDs are copied with their `conversion:` blocks removed: they name a
# webhook the lab does not run, and only v1beta1 is used, so the default
# (None) is enough.
set -euo pipefail
VERSION=${1:-${AGENT_SANDBOX_VERSION:-v0.5.6}}
CACHE=${AGENT_SANDBOX_CACHE:-/var/cache/rollout/agent-sandbox}
GO=${GO:-go}
DIR=$CACHE/$VERSION
BIN=$DIR/bin/agent-sandbox-controller
CRDS=(agents.x-k8s.io_sandboxes.yaml extensions.agents.x-k8s.io_sandboxclaims.yaml
	extensions.agents.x-k8s.io_sandboxtemplates.yaml extensions.agents.x-k8s.io_sandboxwarmpools.yaml)

have_all() {
	[ -x "$BIN" ] || return 1
	local c
	for c in "${CRDS[@]}"; do [ -s "$DIR/crds/$c" ] || return 1; done
}
if have_all; then
	echo "agent-sandbox $VERSION cached in $DIR"
	exit 0
fi
mkdir -p "$DIR"
exec 9>"$DIR/.build.lock"
if ! flock -n 9; then
	echo "agent-sandbox $VERSION: another build is running; waiting for it" >&2
	flock 9
fi
if have_all; then
	echo "agent-sandbox $VERSION cached in $DIR (built by the other run)"
	exit 0
fi
start=$(date +%s)
SRC=$DIR/src
mkdir -p "$SRC" "$DIR/bin" "$DIR/crds"
cd "$SRC"
moddir=$("$GO" mod download -json "sigs.k8s.io/agent-sandbox@$VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[ -d "$moddir" ] || { echo "could not download sigs.k8s.io/agent-sandbox@$VERSION from the Go module proxy" >&2; exit 1; }
# Build inside the module's own tree (a copy: the module cache is
# read-only) so its go.mod and go.sum pin every dependency as upstream does.
rm -rf "$SRC/mod"
cp -r "$moddir" "$SRC/mod"
chmod -R u+w "$SRC/mod"
(cd "$SRC/mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 19 "$GO" build -trimpath -ldflags "-s -w" \
	-o "$BIN.tmp" ./cmd/agent-sandbox-controller)
mv "$BIN.tmp" "$BIN"
for c in "${CRDS[@]}"; do
	[ -f "$moddir/k8s/crds/$c" ] || { echo "$c is not in sigs.k8s.io/agent-sandbox@$VERSION's k8s/crds" >&2; exit 1; }
	# Drop the spec.conversion block (two-space indented key and everything
	# indented deeper below it).
	awk '
		/^  conversion:/ { skip = 1; next }
		skip && /^   / { next }
		{ skip = 0; print }
	' "$moddir/k8s/crds/$c" >"$DIR/crds/$c.tmp"
	mv "$DIR/crds/$c.tmp" "$DIR/crds/$c"
done
rm -rf "$SRC/mod"
echo "agent-sandbox $VERSION built in $(($(date +%s) - start)) s into $DIR"
