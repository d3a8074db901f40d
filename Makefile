# FreeScale: one command each. `make demo` and `make test` install first when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.install-stamp
BROWSER_STAMP := $(VENV)/.browser-stamp

.PHONY: install browser test demo lint format bench clean

install: $(STAMP)

# Pinned CPU set (requirements.txt); torchrec goes in with --no-deps so that its declared
# dependency on the CUDA `fbgemm-gpu` wheel does not overwrite fbgemm-gpu-cpu.
$(STAMP): requirements.txt pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps torchrec==1.9.2
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Headless Chromium for the dashboard's browser tests (tests/dashboard/test_browser.py), from the
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

test: install browser
	$(BIN)/python -m pytest -q

# The main job, an A/B/C: the reference model on 2 gloo ranks, first the baseline (random split
# of each global batch), then with the balance toggle, then with every toggle (balance,
# priority_overlap; sm_free is requested and recorded as not applied: no GPU here), all on the
# same global batches; each run is analyzed, the cost model refit from the baseline, and both
# runs compared with the baseline.
DEMO := out/demo
demo: install
	rm -rf $(DEMO) $(DEMO)-export
	$(BIN)/fsobs run --world-size 2 --steps 20 --item-popularity 1.1 --out $(DEMO)/baseline
	$(BIN)/fsobs run --world-size 2 --steps 20 --item-popularity 1.1 --out $(DEMO)/balanced \
	    --balance
	$(BIN)/fsobs run --world-size 2 --steps 20 --item-popularity 1.1 --out $(DEMO)/pec \
	    --priority-overlap
	$(BIN)/fsobs run --world-size 2 --steps 20 --item-popularity 1.1 --out $(DEMO)/freescale \
	    --balance --priority-overlap --sm-free --sync-gc
	$(BIN)/fsobs analyze $(DEMO)/baseline
	$(BIN)/fsobs fit-cost $(DEMO)/baseline
	$(BIN)/fsobs export $(DEMO)/baseline $(DEMO)-export
	$(BIN)/fsobs compare $(DEMO)/baseline $(DEMO)/balanced $(DEMO)/pec $(DEMO)/freescale
	@echo
	@echo "Explore both runs in the dashboard: $(BIN)/fsobs dashboard --store $(DEMO)"

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
