#!/bin/sh
# ensure-python-torch.sh makes sure Debian's python3 can import what the
# GRPO example's tests (examples/grpo-cpu) need: PyTorch, numpy and
# matplotlib (python3-torch, python3-numpy, python3-matplotlib), besides the
# gRPC modules that ensure-python-grpc.sh installs. From apt: there is no
# PyPI here.
#
# It uses /usr/bin/python3 (override: ROLLOUT_PYTHON), not the first python3
# on PATH: a pyenv or virtualenv python3 does not see Debian's dist-packages.
#
# Missing modules are installed when running as root on a system with
# apt-get; otherwise the script prints what to install and exits 0 (the tests
# then skip, or fail when CI=true). An install that fails is an error only
# when CI=true.
set -u

PY=${ROLLOUT_PYTHON:-/usr/bin/python3}
PKGS="python3-torch python3-numpy python3-matplotlib"

have_modules() {
	[ -x "$PY" ] && "$PY" -c 'import torch, numpy, matplotlib' >/dev/null 2>&1
}

if have_modules; then
	exit 0
fi

fail() {
	echo "ensure-python-torch: $*" >&2
	if [ "${CI:-}" = "true" ]; then
		exit 1
	fi
	echo "ensure-python-torch: the GRPO example's tests will be skipped" >&2
	exit 0
}

if ! command -v apt-get >/dev/null 2>&1; then
	fail "$PY cannot import torch, numpy and matplotlib and apt-get is not available: install them for $PY"
fi
if [ "$(id -u)" != 0 ]; then
	fail "$PY cannot import torch, numpy and matplotlib; install them with:
    sudo apt-get install -y --no-install-recommends $PKGS"
fi

echo "ensure-python-torch: installing $PKGS for $PY"
install() {
	# shellcheck disable=SC2086 # PKGS is a list of words
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $PKGS
}
if ! install; then
	# Usually a fresh image without package lists.
	apt-get update && install || fail "apt-get could not install $PKGS"
fi
have_modules || fail "$PKGS are installed but $PY still cannot import torch, numpy and matplotlib"
