"""Generated gRPC stubs of rollout.v1 (buf.gen.python.yaml; `make proto`)."""
