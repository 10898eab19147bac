# Two entry points: `make run` (the main job on the embedded demo) and `make test`.
# Both set up what is missing first and are quick when it is already there.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Portable llama.cpp build: the default native build crashes or prints garbage on these CPUs.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
STAMP := $(VENV)/.bridge-installed
DATASET ?= demo
SAMPLE ?=
PYTEST_ARGS ?=
# pytest-xdist workers of `make test` (0: one process, the default until two are measured to pay on
# a quiet machine without pushing the real-LLM end-to-end test past its timeout); tests/conftest.py
# groups what must share one process
TEST_WORKERS ?= 0

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export GX_ANALYTICS_ENABLED := false

.PHONY: setup run test browser ui clean

setup: $(STAMP)

$(STAMP): requirements.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=26"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --progress-bar off -r requirements.txt -c constraints.txt
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/bridge models fetch
	touch $@

# Debian's chromium for the browser tests (Playwright drives the system browser; it never
# downloads one of its own).
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

run: setup
	$(BIN)/bridge run --dataset $(DATASET) $(if $(SAMPLE),--sample $(SAMPLE))

test: setup browser
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# The Dagster UI on http://127.0.0.1:3000, over the same instance `bridge` uses.
ui: setup
	mkdir -p data_lake/dagster_home
	test -f data_lake/dagster_home/dagster.yaml || printf 'telemetry:\n  enabled: false\n' > data_lake/dagster_home/dagster.yaml
	DAGSTER_HOME=$(CURDIR)/data_lake/dagster_home $(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# Deletes what the pipeline rebuilds, in either storage (the DuckLake's SQLite catalog and
# Parquet files, or a DuckDB file); never the votes store (data_lake/annotations/, or
# $BRIDGE_VOTES_DB). A DuckDB lake from before the votes store gets its votes moved out first.
# (A Postgres catalog or object-store data path is not touched: drop those where they live.)
clean:
	if [ -x $(BIN)/bridge ] && [ -f data_lake/bridge.duckdb ]; then BRIDGE_STORAGE=duckdb BRIDGE_DATA_LAKE=$(CURDIR)/data_lake $(BIN)/bridge annotate migrate; fi
	rm -rf data_lake/bridge.duckdb data_lake/bridge.duckdb.wal data_lake/ducklake.sqlite data_lake/ducklake.sqlite-wal data_lake/ducklake.sqlite-shm data_lake/ducklake data_lake/dagster_home data_lake/reports
