# rollout — see README.md. Every target works offline except for the first
# `go mod download` (Go module proxy), and Debian's apt when `make image` or
# `make test` finds mmdebstrap, busybox-static, python3-grpcio or python3-torch
# missing.
GO      ?= go
GOFLAGS ?=
BIN     := bin/rollout
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
# buf is pinned in buildtools/go.mod (not the main go.mod: it needs a newer
# protobuf than the generated code uses). The first run builds it (~2 min),
# later runs come from the Go build cache.
BUF     := $(GO) tool -modfile=buildtools/go.mod buf
LDFLAGS := -X github.com/rollout-rl/rollout/internal/util/version.Version=$(VERSION) -X github.com/rollout-rl/rollout/internal/util/version.Commit=$(COMMIT)

.PHONY: build test test-main lint proto proto-check image engine-image bench demo fuzz-smoke clean k8s-lab k8s-lab-down k8s-lab-test

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/rollout
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/rollout-agent ./sandbox/agent/cmd/rollout-agent

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# test: everything CI checks. ensure-docker.sh (re)starts a missing or hung
# local dockerd as root. Base images are built only when missing or
# stale (a no-op in well under a second otherwise); so is the llama.cpp
# engine image the real-engine tests run against (~1 min cold, from Debian
# sid; docs/real-engines.md). ensure-python-grpc.sh
# installs Debian's python3-grpcio, python3-protobuf, python3-pip,
# python3-setuptools and python3-wheel for the Python package's test
# (python/) and the Python examples, ensure-python-torch.sh python3-torch, python3-numpy and
# python3-matplotlib for the GRPO example's (as root; otherwise they say
# what to install).
# ensure-runc.sh makes sure runc is there for the runc backend's tests
# (Debian's docker.io brings it; apt as root otherwise).
# ensure-runsc.sh installs Debian's runsc and registers it with the engine
# (SIGHUP, no restart) for the gVisor tests (docs/security.md); after it,
# ROLLOUT_REQUIRE_RUNSC=1 makes a missing runsc runtime a test failure, not
# a skip (plain `go test` elsewhere skips them, saying why).
#
# Then the Kubernetes lab (scripts/k8s-lab/ci.sh; docs/kubernetes.md, "The
# lab in make test"): the pinned Kubernetes binaries build in the background
# at nice 19 while test-main runs (from nothing ~12 CPU-minutes; cached by
# version in /var/cache/rollout/k8s), then lab.sh up, every package's
# Kubernetes tests, e2e.sh, the destructive node-loss checks, and lab.sh down
# whatever happens. A failed lab step fails `make test` with the step's name.
# ROLLOUT_SKIP_K8S_LAB=1 skips the lab on a developer's machine (refused
# with CI=true).
test: lint proto-check build
	GO=$(GO) scripts/k8s-lab/ci.sh with-build $(MAKE) --no-print-directory test-main
	GO=$(GO) scripts/k8s-lab/ci.sh run

# test-main: everything but the Kubernetes lab.
test-main:
	scripts/ensure-docker.sh
	scripts/ensure-runc.sh
	scripts/ensure-runsc.sh
	$(BIN) sandbox image build
	$(BIN) sandbox image build --name llamacpp
	$(BIN) sandbox image build --name harness
	scripts/ensure-python-grpc.sh
	scripts/ensure-python-torch.sh
	FUZZTIME=$(FUZZTIME) scripts/fuzz-smoke.sh
	ROLLOUT_REQUIRE_RUNSC=1 $(GO) test -race -count=1 -timeout 30m ./...

# fuzz-smoke runs every parser fuzz target for FUZZTIME (a smoke run in
# `make test`; raise it for a real fuzzing session).
FUZZTIME ?= 1s
fuzz-smoke:
	FUZZTIME=$(FUZZTIME) scripts/fuzz-smoke.sh

# proto regenerates gen/ and the Python stubs in python/rollout/v1 from
# proto/ (offline: local plugins only; the Python ones are Debian's protoc and
# grpc_python_plugin, scripts/ensure-protoc.sh).
proto:
	$(BUF) lint
	$(BUF) generate
	scripts/ensure-protoc.sh
	$(BUF) generate --template buf.gen.python.yaml

# proto-check fails when gen/ or the Python stubs are not what proto/
# generates. It generates into a scratch directory and compares, so it never
# touches the tree.
PY_STUBS := python/rollout/v1
proto-check:
	$(BUF) lint
	scripts/ensure-protoc.sh
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(BUF) generate --output "$$tmp" && \
	if ! diff -r "$$tmp/gen" gen >/dev/null; then \
		diff -ru gen "$$tmp/gen" | head -50; \
		echo "gen/ is out of date with proto/: run 'make proto' and commit gen/"; exit 1; \
	fi && \
	$(BUF) generate --template buf.gen.python.yaml --output "$$tmp" && \
	if ! diff -r -x __init__.py -x __pycache__ "$$tmp/$(PY_STUBS)" $(PY_STUBS) >/dev/null; then \
		diff -ru -x __init__.py -x __pycache__ $(PY_STUBS) "$$tmp/$(PY_STUBS)" | head -50; \
		echo "$(PY_STUBS) is out of date with proto/: run 'make proto' and commit it"; exit 1; \
	fi

# image builds the sandbox base images (rollout-sandbox:bookworm, :busybox)
# from Debian packages; see docs/images.md.
image: build
	$(BIN) sandbox image build

# engine-image builds rollout-llamacpp:sid (llama-server from Debian sid and
# the project's tiny random Qwen3 GGUF); see docs/real-engines.md.
engine-image: build
	$(BIN) sandbox image build --name llamacpp

# demo runs the main job end to end (simulator + real sandboxes) into
# out/demo; the base images are built first when missing.
demo: build
	$(BIN) demo --out out/demo

# bench runs every benchmark suite (docs/performance.md says how the numbers
# are taken), writes out/bench.json and regenerates docs/performance.md from
# it. BENCH_FLAGS=--quick: small counts, under two minutes (CI smoke run).
# A failed suite still gets its rows ("not measured") into the document, and
# then fails the target. The engine and the runtimes are made ready first, as
# for make test, or the runc and runsc rows read "not measured".
BENCH_FLAGS ?=
bench: build
	scripts/ensure-docker.sh
	scripts/ensure-runc.sh
	scripts/ensure-runsc.sh
	@mkdir -p out && rm -f out/bench.json
	$(BIN) bench --json out/bench.json $(BENCH_FLAGS); status=$$?; \
	if [ -f out/bench.json ]; then $(BIN) bench report out/bench.json --out docs/performance.md || exit 1; fi; \
	exit $$status

clean:
	rm -rf bin

# k8s-lab starts the project's Kubernetes cluster (control plane + 2 worker
# nodes and a registry in containers on a private Docker network;
# docs/kubernetes.md). The pinned Kubernetes binaries are built from the Go
# module proxy once and cached under /var/cache/rollout/k8s/<version>; the
# agent-sandbox controller (mode agent-sandbox) likewise under
# /var/cache/rollout/agent-sandbox/<version>, run on the host.
# k8s-lab-test runs the backends' tests and the `rollout run` end-to-end
# check against a lab that is up (no destructive checks; `make test` runs
# those too, on a lab of its own).
k8s-lab: build
	scripts/k8s-lab/lab.sh up
	scripts/k8s-lab/agent-sandbox.sh up

k8s-lab-down:
	scripts/k8s-lab/agent-sandbox.sh down
	scripts/k8s-lab/lab.sh down

k8s-lab-test: build
	eval "$$(scripts/k8s-lab/lab.sh env)" && \
	$(GO) test -count=1 -run 'Kubernetes' ./sandbox/kubernetes/... ./assemble/ ./server/ && \
	scripts/k8s-lab/e2e.sh
