# FreeScale: one command each. `make demo` and `make test` install first when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.install-stamp
BROWSER_STAMP := $(VENV)/.browser-stamp

.PHONY: install browser test test-fast demo screenshots lint format bench clean

install: $(STAMP)

# Pinned CPU set (requirements.txt); torchrec goes in with --no-deps so that its declared
# dependency on the CUDA `fbgemm-gpu` wheel does not overwrite fbgemm-gpu-cpu.
$(STAMP): requirements.txt pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps torchrec==1.9.2
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Headless Chromium for the dashboard's browser tests (tests/integration/dashboard/test_browser.py), from the
# Debian package when it is missing (about 20 s and 480 MB the first time). sudo only when not root.
# Without apt-get (or root / sudo) it says so and the browser tests skip (they fail under CI=true).
browser: $(BROWSER_STAMP)

$(BROWSER_STAMP): $(STAMP)
	@if ! command -v chromium >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; \
	  elif command -v sudo >/dev/null; then SUDO=sudo; \
	  else SUDO=none; fi; \
	  if [ "$$SUDO" = none ] || ! command -v apt-get >/dev/null; then \
	    echo "chromium not found and cannot apt-get it: browser tests will be skipped" >&2; \
	  else \
	    echo "installing chromium (apt-get) for the browser tests ..." >&2; \
	    $$SUDO apt-get update -qq && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends chromium >/dev/null || exit 1; \
	  fi; \
	fi
	@if command -v chromium >/dev/null; then touch $@; fi

test-fast: install
	$(BIN)/python -m pytest -q -n auto tests/unit  # the unit lane: no torchrun, process group, browser or server

# Both lanes on TEST_WORKERS pytest-xdist workers (2: this 2-core kind; the multi-rank tests start
# 2-4 processes each, so more workers than cores oversubscribe them), a module's tests on one
# worker (--dist loadscope: a module's torchrun runs, made once by its fixture, are not made
# again on the other), the slowest 25 named at the end.
TEST_WORKERS ?= 2
test: install browser
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --durations=25

# The main job, measured like the benchmarks: the reference model on 2 gloo ranks in four arms
# (baseline: random split of each global batch; balanced; pec: priority overlap; freescale: every
# toggle, sm_free recorded as not applied without a GPU), all on the same global batches, run as
# 3 interleaved pairs (fsobs/workload/demo.py); then the first baseline analyzed, the cost model
# refit from it and exported, each arm compared with the baseline over the pairs (mean, t
# interval) beside what-if's prediction from the baselines, and one table of it all.
DEMO := out/demo
demo: install
	rm -rf $(DEMO) $(DEMO)-export
	$(BIN)/python -m fsobs.workload.demo --out $(DEMO) --pairs 3 --steps 12 --world-size 2

# The README's screenshots, dashboard/screenshots/*.png (dashboard/screenshots/take.py): the
# dashboard on the demo's store (made first when missing, about 3 minutes) in headless Chromium,
# plus a simulated 64-rank run and a simulated live run (about 2 minutes).
screenshots: install browser
	test -d $(DEMO)/baseline-0 || $(MAKE) demo
	$(BIN)/python -m dashboard.screenshots.take --demo $(DEMO)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install browser
	$(BIN)/python benchmarks/bench_load.py
	$(BIN)/python benchmarks/bench_analyze.py
	$(BIN)/python benchmarks/bench_cost_model.py
	$(BIN)/python benchmarks/bench_profiler_overhead.py
	$(BIN)/python benchmarks/bench_dashboard.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache bench_data *.egg-info
