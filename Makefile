# shardline: build, demo, lint, test, bench. `make help` lists the targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MATURIN := VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/maturin

.PHONY: help demo test lint pytest soak-tests cargo-test bench servers clean

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/maturin:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip maturin

demo: $(BIN)/maturin ## Install shardline (release build) and run `shardline demo`
	$(MATURIN) develop --release --extras grpc,etcd --quiet
	$(BIN)/shardline demo

test: $(BIN)/maturin servers ## Install everything the tests need, lint, and run every test (pytest and cargo test)
	$(MATURIN) develop --extras test --quiet
	$(MAKE) lint pytest cargo-test

lint: ## cargo fmt/clippy, ruff, mypy --strict, stubtest against _core.pyi
	cargo fmt --check
	cargo clippy --all-targets --quiet -- -D warnings
	$(BIN)/ruff check python tests benches
	$(BIN)/ruff format --check python tests benches
	$(BIN)/mypy --strict python/shardline
	$(BIN)/python -m mypy.stubtest shardline._core

pytest: ## Run the Python test suite
	$(BIN)/pytest -q

soak-tests: ## Run the Python suite RUNS times (default 20) with every core busy; stops at the first failure
	PYTHON=$(BIN)/python RUNS=$(or $(RUNS),20) tests/soak.sh $(PYTEST_ARGS)

cargo-test: ## Run the Rust unit tests
	cargo test --quiet

bench: $(BIN)/maturin ## Benchmarks against the floor and picopyn (release build); rewrites benches/RESULTS.md
	$(MATURIN) develop --release --extras bench --quiet
	PYTHON=$(BIN)/python RUNS=$(or $(RUNS),1) benches/run.sh

servers: ## Install the servers the tests start on loopback (etcd, PostgreSQL) from Debian's packages
	@command -v etcd >/dev/null && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive \
			$$SUDO apt-get install -y -q etcd-server postgresql; }

clean: ## Remove the virtualenv and build products
	rm -rf $(VENV) target
