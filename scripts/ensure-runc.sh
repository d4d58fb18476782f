#!/usr/bin/env bash
# Makes sure runc is on the host for the runc sandbox backend's tests
# (sandbox.backend runc; sandbox/README.md). Debian's docker.io depends on
# it, so it is normally there; as root a missing one is installed with apt,
# otherwise this says what to install and fails.
set -euo pipefail
if command -v runc >/dev/null 2>&1; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "ensure-runc: runc is not installed: 'sudo apt-get install runc' (the runc backend's tests need it)" >&2
	exit 1
fi
echo "ensure-runc: installing runc" >&2
"$(dirname "$0")/apt-install.sh" runc >/dev/null
command -v runc >/dev/null
