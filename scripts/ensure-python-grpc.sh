#!/bin/sh
# ensure-python-grpc.sh makes sure the Python gRPC modules that the Python
# example's test (examples/python) needs are importable by Debian's python3:
# python3-grpcio and python3-grpc-tools, from apt (there is no PyPI here).
#
# It uses /usr/bin/python3 (override: ROLLOUT_PYTHON), not the first python3
# on PATH: a pyenv or virtualenv python3 does not see Debian's dist-packages.
#
# Missing modules are installed when running as root on a system with
# apt-get; otherwise the script prints what to install and exits 0 (the test
# then skips, or fails when CI=true). An install that fails is an error only
# when CI=true.
set -u

PY=${ROLLOUT_PYTHON:-/usr/bin/python3}
PKGS="python3-grpcio python3-grpc-tools"

have_modules() {
	[ -x "$PY" ] && "$PY" -c 'import grpc, grpc_tools' >/dev/null 2>&1
}

if have_modules; then
	exit 0
fi

fail() {
	echo "ensure-python-grpc: $*" >&2
	if [ "${CI:-}" = "true" ]; then
		exit 1
	fi
	echo "ensure-python-grpc: the Python example's test will be skipped" >&2
	exit 0
}

if ! command -v apt-get >/dev/null 2>&1; then
	fail "$PY cannot import grpc and grpc_tools and apt-get is not available: install grpcio and grpcio-tools for $PY"
fi
if [ "$(id -u)" != 0 ]; then
	fail "$PY cannot import grpc and grpc_tools; install them with:
    sudo apt-get install -y --no-install-recommends $PKGS"
fi

echo "ensure-python-grpc: installing $PKGS for $PY"
install() {
	# shellcheck disable=SC2086 # PKGS is a list of words
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $PKGS
}
if ! install; then
	# Usually a fresh image without package lists.
	apt-get update && install || fail "apt-get could not install $PKGS"
fi
have_modules || fail "$PKGS are installed but $PY still cannot import grpc and grpc_tools"
