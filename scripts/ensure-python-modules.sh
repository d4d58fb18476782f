#!/bin/sh
# ensure-python-modules.sh NAME "MODULE..." "PACKAGE..." "WHAT"
# makes sure Debian's python3 can import every MODULE, installing the Debian
# PACKAGEs from apt when one is missing (there is no PyPI here). NAME prefixes
# its messages; WHAT names the tests that need the modules. The callers are
# ensure-python-grpc.sh and ensure-python-torch.sh.
#
# It uses /usr/bin/python3 (override: ROLLOUT_PYTHON), not the first python3
# on PATH: a pyenv or virtualenv python3 does not see Debian's dist-packages.
#
# Missing modules are installed when running as root on a system with
# apt-get; otherwise the script prints what to install and exits 0 (the tests
# then skip, or fail when CI=true). An install that fails is an error only
# when CI=true.
set -u

NAME=$1
MODULES=$2
PKGS=$3
WHAT=$4
PY=${ROLLOUT_PYTHON:-/usr/bin/python3}
IMPORTS=$(echo "$MODULES" | sed 's/ /, /g')

have_modules() {
	[ -x "$PY" ] && "$PY" -c "import $IMPORTS" >/dev/null 2>&1
}

if have_modules; then
	exit 0
fi

fail() {
	echo "$NAME: $*" >&2
	if [ "${CI:-}" = "true" ]; then
		exit 1
	fi
	echo "$NAME: $WHAT will be skipped" >&2
	exit 0
}

if ! command -v apt-get >/dev/null 2>&1; then
	fail "$PY cannot import $IMPORTS and apt-get is not available: install them for $PY"
fi
if [ "$(id -u)" != 0 ]; then
	fail "$PY cannot import $IMPORTS; install them with:
    sudo apt-get install -y --no-install-recommends $PKGS"
fi

echo "$NAME: installing $PKGS for $PY"
# apt-install.sh waits for another apt process's dpkg lock (bounded) and
# updates the lists when the install needs it.
# shellcheck disable=SC2086 # PKGS is a list of words
"$(dirname "$0")/apt-install.sh" $PKGS || fail "apt-get could not install $PKGS"
have_modules || fail "$PKGS are installed but $PY still cannot import $IMPORTS"
