# Offerbus: the two set-up commands are `make run` and `make test` (see README.md).
# Every target installs what it needs, idempotently, on a fresh Debian machine as root.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PROTOS := $(wildcard schemas/*.proto)
PYTEST_ARGS ?=

.PHONY: all system venv proto proto-check lint engine image zk-up zk-down run down test test-fast bench chaos clean

all: test

## system: Debian packages (zookeeper, docker.io, busybox-static, ...), once.
system:
	@bash infra/system.sh

## venv: the project's virtualenv with pinned dev tools.
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e '.[dev]'
	@touch $@

## proto: regenerate schemas/*_pb2.py and type stubs from schemas/*.proto.
proto: venv
	@PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m grpc_tools.protoc -I . --python_out=. --mypy_out=. $(PROTOS) >/dev/null
	@echo "proto: generated $(words $(PROTOS)) schemas"

## proto-check: fail when the committed generated code is stale.
proto-check: venv
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m grpc_tools.protoc -I . --python_out=$$tmp --mypy_out=$$tmp $(PROTOS) >/dev/null; \
	stale=0; for f in $$tmp/schemas/*; do \
	  if ! cmp -s $$f schemas/$$(basename $$f); then echo "stale: schemas/$$(basename $$f) (run make proto)"; stale=1; fi; \
	done; \
	for f in schemas/*_pb2.py schemas/*_pb2.pyi; do \
	  test -e $$tmp/$$f || { echo "stale: $$f has no .proto"; stale=1; }; \
	done; \
	test $$stale = 0 && echo "proto-check: generated code is current"

## lint: ruff and mypy (with the generated stubs).
lint: venv proto-check
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/mypy services frameworks infra bench chaos
	@echo "lint: ok"

## engine / image: dockerd running, and the local test image built (no registry is reachable).
engine: system
	@bash infra/docker-engine.sh
image: engine
	@bash infra/build-image.sh

zk-up: system venv
	@$(PY) -m infra.zookeeper start --dir .run/zk
zk-down: venv
	@$(PY) -m infra.zookeeper stop --dir .run/zk

## run: bring up a local cluster and run the demo; `make down` stops it.
run: system venv image
	@$(PY) -m infra.demo

down: venv
	@$(PY) -m services.cli down

## test: everything, against real ZooKeeper, the real Docker engine and real sockets.
test: system venv image lint
	@$(PY) -m pytest $(PYTEST_ARGS)

## test-fast: pure cores and contracts only (no ZooKeeper, Docker or processes).
test-fast: venv
	@$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

## bench: measured figures (not tests); JSON under bench/results/. Failover: 20 trials per
## kind; a quick look: `make bench BENCH_ARGS="--trials 3 failover"`.
BENCH_ARGS ?=
bench: system venv image
	@$(PY) -m bench $(BENCH_ARGS)

## chaos: the default chaos campaign on a real fleet (agents in network namespaces, a
## ZooKeeper ensemble, Docker tasks): table, JSON and plots under chaos/results/. Another:
## `make chaos CHAOS_SCENARIO=chaos/scenarios/short.toml`; leftovers: `offerbus chaos clean`.
CHAOS_SCENARIO ?= chaos/scenarios/default.toml
chaos: system venv image
	@$(PY) -m services.cli chaos run $(CHAOS_SCENARIO)

clean:
	rm -rf .run bench/results .pytest_cache .mypy_cache .ruff_cache
