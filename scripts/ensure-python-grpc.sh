#!/bin/sh
# ensure-python-grpc.sh makes sure Debian's python3 has what the Python
# package's test (python/, docs/python.md) and the Python examples need:
# python3-grpcio and python3-protobuf (the package's dependencies),
# python3-pip, python3-setuptools and python3-wheel (`pip install
# --no-index --no-build-isolation ./python` into a virtual environment,
# without PyPI).
# ensure-python-modules.sh says how.
exec "$(dirname "$0")/ensure-python-modules.sh" ensure-python-grpc \
	"grpc google.protobuf venv setuptools wheel pip" \
	"python3-grpcio python3-protobuf python3-pip python3-setuptools python3-wheel" \
	"the Python package's test and the Python examples"
