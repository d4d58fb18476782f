#!/bin/sh
# ensure-protoc.sh makes sure protoc and grpc_python_plugin are on PATH for
# the Python stubs (buf.gen.python.yaml; `make proto`, `make proto-check`):
# Debian's protobuf-compiler and protobuf-compiler-grpc, installed with
# apt-install.sh when running as root. Without root it says what to install
# and fails: the stubs cannot be checked without them.
set -u
if command -v protoc >/dev/null 2>&1 && command -v grpc_python_plugin >/dev/null 2>&1; then
	exit 0
fi
PKGS="protobuf-compiler protobuf-compiler-grpc"
if [ "$(id -u)" != 0 ]; then
	echo "ensure-protoc: protoc or grpc_python_plugin is missing; install them with:
    sudo apt-get install -y --no-install-recommends $PKGS" >&2
	exit 1
fi
echo "ensure-protoc: installing $PKGS"
# shellcheck disable=SC2086 # PKGS is a list of words
"$(dirname "$0")/apt-install.sh" $PKGS || { echo "ensure-protoc: apt-get could not install $PKGS" >&2; exit 1; }
