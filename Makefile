# TAS-MoE Lab. `make run` and `make test` work on a fresh machine with only Python 3.11 and make.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9
STAMP := $(VENV)/.synced

.PHONY: help venv kernels browser run quick test test-fast lint openapi settings-docs bench cluster cluster-down clean docs

help:
	@echo "make run          set up .venv and run the main job (embedded mode)"
	@echo "make quick        the quick look: the default experiment cut to 1 s of arrivals (a check, not a result)"
	@echo "make test         set up .venv (and Chromium, as root with apt-get) and run the whole test suite"
	@echo "make lint         ruff + mypy --strict"
	@echo "make openapi      write openapi/<service>.json"
	@echo "make settings-docs  write docs/settings.md from the settings models"
	@echo "make docs         copy the experiments' summary files to docs/results/ and render docs/results.md (and docs/settings.md)"
	@echo "make bench        run the benchmarks and write BENCHMARKS.md"
	@echo "make cluster      start the local cluster (6 uvicorn services + Celery worker); make cluster-down"

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH (or make PYTHON=python3)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(BIN)/uv: | $(BIN)/python
	$(BIN)/python -m pip install --quiet "uv==$(UV_VERSION)"

# --compile-bytecode: the dependencies' .pyc files are written once here (~15 s); an environment with
# PYTHONDONTWRITEBYTECODE=1 (CI images) otherwise recompiles numpy/scipy/fastapi/... from source at every start (~3 s
# of every `make run`, every test subprocess).
$(STAMP): pyproject.toml uv.lock Makefile | $(BIN)/uv
	UV_PROJECT_ENVIRONMENT=$(VENV) $(BIN)/uv sync --frozen --inexact --compile-bytecode --python $(BIN)/python
	$(MAKE) --no-print-directory kernels
	@touch $(STAMP)

# The thermal service's numba kernels compiled into numba's cache (services/thermal/__pycache__) at install time, so
# that no user's first `tasmoe hotspot -o ...`, `make run` or `make cluster` pays the compilation (~30-60 s).
kernels: | $(BIN)/uv
	$(BIN)/python -m services.thermal.spectral_kernels
	$(BIN)/python -m services.thermal.exp_kernels
	$(BIN)/python -m services.thermal.window_kernels

venv: $(STAMP)

run: venv
	$(BIN)/python -m scripts.main_job

quick: venv
	$(BIN)/tasmoe run --quick --quiet

# Chromium for the browser tests (tests/platform/test_docs_browser.py, test_dashboard_browser.py): Debian's package,
# installed as .ci/run does when apt-get can (root); otherwise one line says those tests will skip.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing Chromium (Debian package chromium) for the browser tests"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	      || echo "make: Chromium could not be installed: the browser tests will skip"; \
	  else \
	    echo "make: no Chromium (apt-get install chromium, as root): the browser tests will skip"; \
	  fi; }

# The suite on every core (pytest-xdist, one worker per core; TEST_WORKERS=0 runs it in this process): tests of one
# module on one worker, the tests that start processes, servers or browsers on one worker in turn
# (tests/conftest.py, pytest_collection_modifyitems).
TEST_WORKERS ?= auto
test: venv browser
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=15 $(PYTEST_ARGS)

test-fast: venv
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not cluster and not slow" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy .

# docs/results.md from the experiments' results folders: their summary files are copied to docs/results/<experiment>/
# and their figures to docs/figures/<experiment>/ (a folder not there keeps its committed copy), then rendered.
DOCS_EXPERIMENTS ?= default flatout reference quick
docs: venv settings-docs
	$(BIN)/python -m scripts.render_results --collect $(DOCS_EXPERIMENTS)

openapi: venv
	$(BIN)/tasmoe openapi --out openapi

settings-docs: venv
	$(BIN)/python -m scripts.settings_reference

bench: venv
	$(BIN)/python -m scripts.bench

cluster: venv
	$(BIN)/python -m scripts.cluster up

cluster-down: venv
	$(BIN)/python -m scripts.cluster down

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
