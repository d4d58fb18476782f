#!/bin/sh
# ensure-python-grpc.sh makes sure the Python gRPC modules that the Python
# example's test (examples/python) needs are importable by Debian's python3:
# python3-grpcio and python3-grpc-tools (ensure-python-modules.sh says how).
exec "$(dirname "$0")/ensure-python-modules.sh" ensure-python-grpc \
	"grpc grpc_tools" "python3-grpcio python3-grpc-tools" \
	"the Python example's test"
