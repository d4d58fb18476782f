#!/bin/sh
# ensure-python-torch.sh makes sure Debian's python3 can import what the
# GRPO example's tests (examples/grpo-cpu) need: PyTorch, numpy and
# matplotlib, besides the gRPC modules that ensure-python-grpc.sh installs
# (ensure-python-modules.sh says how).
exec "$(dirname "$0")/ensure-python-modules.sh" ensure-python-torch \
	"torch numpy matplotlib" "python3-torch python3-numpy python3-matplotlib" \
	"the GRPO example's tests"
