# Course toolchain. The two commands you need:
#   make lab    set up what is missing, then open JupyterLab on labs/
#   make test   set up what is missing, then run the whole CPU test suite
# Instructor: make release | make grade NB=path.ipynb | make autograde | make feedback | make export
# Machine:    make doctor | make gpu-check | make data | make models
# Serving:    make serve [SERVE_ARGS="--checkpoint draft --engine naive --port 8001"]  (OpenAI-compatible, loopback)

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON3 ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# Course-wide JupyterLab settings (no "official Jupyter news?" prompt), installed into the venv's app settings.
LAB_OVERRIDES := config/jupyterlab_overrides.json
# JupyterLab refuses to start as root unless told; containers, cloud VMs and CI images often run as root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
# nbgrader shells out to `alembic`, and the notebooks' kernels must be the venv's python.
export PATH := $(abspath $(VENV))/bin:$(PATH)

PYTEST_ARGS ?=
# Two pytest-xdist workers; a module's (or a class's) tests stay on one, with their fixtures. 0 = no workers.
# Each worker (and each notebook kernel it starts) gets one torch thread: two workers with two threads each on
# two cores would oversubscribe them, and OpenMP threads spinning at barriers make that many times slower.
PYTEST_WORKERS ?= 2
TEST_THREADS ?= 1
PYTEST_TIMEOUT ?= 900
LAB_ARGS ?=
SERVE_ARGS ?=
CHROMIUM ?= /usr/bin/chromium
BWRAP ?= /usr/bin/bwrap
# make autograde JOBS=8 | AUTOGRADE_ARGS="--scheduler tcp://host:8786" | AUTOGRADE_ARGS=--unsafe (no sandbox)
JOBS ?=
AUTOGRADE_ARGS ?=
NB ?=
CPYTHON_LIB ?=

.PHONY: serve help setup lab test browser-deps sandbox-deps release grade autograde feedback export doctor gpu-check models data normalize check-normalized

help:
	@sed -n '1,6p' Makefile | sed 's/^# \{0,1\}//'

# ---------------------------------------------------------------- environment (idempotent; fast when done)
$(STAMP): requirements.txt pyproject.toml $(LAB_OVERRIDES)
	@test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install -e . --no-deps
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (course)"
	mkdir -p $(VENV)/share/jupyter/lab/settings && cp $(LAB_OVERRIDES) $(VENV)/share/jupyter/lab/settings/overrides.json
	@$(VENV)/bin/jupyter labextension list 2>&1 | grep -q "@jupyter/nbgrader" \
	  || { echo "nbgrader's JupyterLab extension is missing from $(VENV)"; exit 1; }
	@$(VENV)/bin/jupyter labextension list 2>&1 | grep -q "@jupyter-widgets/jupyterlab-manager" \
	  || { echo "ipywidgets' JupyterLab extension is missing from $(VENV)"; exit 1; }
	touch $@

setup: $(STAMP)

browser-deps:
	@if [ ! -x "$(CHROMIUM)" ]; then \
	  echo "installing Debian's chromium (for the JupyterLab browser test)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y chromium; \
	fi

# The grading sandbox: Debian's bubblewrap (one namespace sandbox per submission, no daemon).
sandbox-deps:
	@if [ ! -x "$(BWRAP)" ]; then \
	  echo "installing Debian's bubblewrap (the sandbox submissions are graded in)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y bubblewrap; \
	fi

# ---------------------------------------------------------------- learner
lab: setup
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=labs $(ALLOW_ROOT) $(LAB_ARGS)

test: setup browser-deps sandbox-deps
	@rc=0; OMP_NUM_THREADS=$(TEST_THREADS) OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest --timeout=$(PYTEST_TIMEOUT) -n $(PYTEST_WORKERS) --dist loadscope --durations=25 $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests; that is a failure"; fi; \
	exit $$rc

serve: setup
	$(PY) -m minigpt.serving $(SERVE_ARGS)

# In the bubblewrap sandbox where it can start (installed by `make sandbox-deps`), without it elsewhere.
grade: setup
	@test -n "$(NB)" || { echo "usage: make grade NB=path/to/notebook.ipynb"; exit 2; }
	$(PY) -m autograder grade "$(NB)"

# ---------------------------------------------------------------- instructor
release: setup
	$(PY) -m autograder release

autograde: setup sandbox-deps
	$(PY) -m autograder autograde $(if $(JOBS),--jobs $(JOBS)) $(AUTOGRADE_ARGS)

feedback: setup
	$(PY) -m autograder feedback

export: setup
	$(PY) -m autograder export

normalize: setup
	$(PY) -m autograder normalize

check-normalized: setup
	$(PY) -m autograder normalize --check

# ---------------------------------------------------------------- machine and data
doctor: setup
	@$(PY) -m autograder doctor

# The GPU tier in one command. On a GPU machine that already has torch/triton and no network, run it with
# that python instead of the CPU venv:  make gpu-check GPU_PYTHON=python3
GPU_PYTHON ?=
gpu-check: $(if $(GPU_PYTHON),,setup)
	@$(if $(GPU_PYTHON),PYTHONPATH="$(CURDIR)/shared:$(CURDIR)" $(GPU_PYTHON),$(PY)) -m autograder gpu-check

data: setup
	@if [ -n "$(CPYTHON_LIB)" ]; then $(PY) scripts/build_corpus.py "$(CPYTHON_LIB)"; \
	else echo "corpus: using the committed data/corpus (CPYTHON_LIB=/path/to/cpython-3.11.7/Lib rebuilds it)"; fi
	$(PY) -m minigpt.training.bpe

models: setup
	$(PY) -m minigpt.training.train target draft
