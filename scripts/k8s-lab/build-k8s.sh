#!/usr/bin/env bash
# build-k8s.sh VERSION — builds the Kubernetes server binaries the lab needs
# (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet) from the
# Go module proxy, cached by version under $K8S_LAB_CACHE/<version>/bin.
# A second run with the same version is a no-op.
#
# k8s.io/kubernetes replaces its staging modules (k8s.io/api, client-go, …)
# with local directories, so `go install k8s.io/kubernetes/cmd/x@v` fails.
# We write a tiny module that requires k8s.io/kubernetes and replaces every
# staging module with its published v0.<minor>.<patch> twin, read from the
# upstream go.mod.
set -euo pipefail
VERSION=${1:?usage: build-k8s.sh vX.Y.Z}
CACHE=${K8S_LAB_CACHE:-/var/cache/rollout/k8s}
OUT=$CACHE/$VERSION/bin
BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet)

have_all() { for b in "${BINS[@]}"; do [ -x "$OUT/$b" ] || return 1; done; }
if have_all; then
	echo "k8s $VERSION binaries cached in $OUT"
	exit 0
fi
# One build per version at a time: a second run (e.g. `make test`'s lab step
# while its background build still runs) waits for the first, then finds the
# binaries cached.
mkdir -p "$CACHE/$VERSION"
exec 9>"$CACHE/$VERSION/.build.lock"
if ! flock -n 9; then
	echo "k8s $VERSION: another build is running; waiting for it" >&2
	flock 9
fi
if have_all; then
	echo "k8s $VERSION binaries cached in $OUT (built by the other run)"
	exit 0
fi

start=$(date +%s)
SRC=$CACHE/$VERSION/src
mkdir -p "$SRC" "$OUT"
cd "$SRC"
staging_v="v0.${VERSION#v1.}"
# The upstream go.mod lists the staging replaces.
gomod=$(go mod download -json "k8s.io/kubernetes@$VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[ -f "$gomod" ] || { echo "could not download k8s.io/kubernetes@$VERSION" >&2; exit 1; }
{
	echo "module rollout.local/k8slab"
	echo
	echo "go 1.26"
	echo
	echo "require k8s.io/kubernetes $VERSION"
	echo
	echo "replace ("
	grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk '{print $1}' | grep -v '/sample-' |
		while read -r m; do echo "	$m => $m $staging_v"; done
	echo ")"
} >go.mod
# A blank-import file pins the commands so `go mod tidy` keeps them.
{
	echo "//go:build tools"
	echo
	echo "package k8slab"
	echo
	echo "import ("
	for b in "${BINS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$b\""; done
	echo ")"
} >tools.go
export GOFLAGS=-mod=mod CGO_ENABLED=0
go mod tidy >/dev/null 2>&1 || true
ld="-s -w -X k8s.io/component-base/version.gitVersion=$VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$VERSION" | cut -d. -f2)"
for b in "${BINS[@]}"; do
	[ -x "$OUT/$b" ] && continue
	t=$(date +%s)
	nice -n 19 go build -trimpath -ldflags "$ld" -o "$OUT/$b.tmp" "k8s.io/kubernetes/cmd/$b"
	mv "$OUT/$b.tmp" "$OUT/$b"
	echo "built $b in $(($(date +%s) - t)) s"
done
echo "k8s $VERSION binaries built in $(($(date +%s) - start)) s into $OUT"
