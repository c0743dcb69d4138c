# Course toolchain. The two commands you need:
#   make lab    set up what is missing, then open JupyterLab on your workspace (a copy of labs/ kept apart)
#   make test   set up what is missing, then run the whole CPU test suite
# Learner:    make progress [PROGRESS_ARGS="--lab 02"] | make grade NB=workspace/02_paged_kv_cache/02_paged_kv_cache.ipynb
# Instructor: make release | make grade NB=path.ipynb | make autograde | make feedback | make export
#             make hub [HUB_ARGS="--students 20 --port 8000"]  (a class on JupyterHub on this machine, as root)
# Machine:    make doctor | make calibrate | make gpu-check [CALIBRATE=1] | make data | make models
# Speed:      make bench [BENCH_ARGS=--quick] [GRADING_BENCH_ARGS=--quick]  (decode ... overheads:
#             data/bench/ledger.json; seconds to grade each lab and a class of 30: data/bench/grading.json)
# Practice:   make interview [INTERVIEW_ARGS="--seed 7 -n 5"]  (interview questions with fresh numbers)
# Serving:    make serve [SERVE_ARGS="--checkpoint draft --engine naive --port 8001"]  (OpenAI-compatible, loopback)
# Checks:     make mutation LAB=00 [MUTATION_ARGS="--sample 10"]  (wrong implementations the checks let through; LAB=all)

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON3 ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# Course-wide JupyterLab settings (no "official Jupyter news?" prompt), installed into the venv's app settings.
LAB_OVERRIDES := config/jupyterlab_overrides.json
# The course kernel's IPython settings (sharp inline figures), installed into the venv's etc/ipython.
KERNEL_CONFIG := config/ipython_kernel_config.py
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
# The learner's workspace: copied from labs/ on first use, never overwritten (git-ignored).
WORKSPACE ?= workspace
PROGRESS_ARGS ?=
SERVE_ARGS ?=
INTERVIEW_ARGS ?=
CHROMIUM ?= /usr/bin/chromium
# JupyterHub's proxy (configurable-http-proxy, from npm), installed beside the venv by `make hub-deps`.
HUB_PROXY := $(VENV)/hub-proxy/node_modules/.bin/configurable-http-proxy
HUB_ARGS ?=
BWRAP ?= /usr/bin/bwrap
# make autograde JOBS=8 | AUTOGRADE_ARGS="--scheduler tcp://host:8786" | AUTOGRADE_ARGS=--unsafe (no sandbox)
JOBS ?=
AUTOGRADE_ARGS ?=
NB ?=
CPYTHON_LIB ?=

# Mutation testing of a lab's checks: make mutation LAB=00 [MUTATION_ARGS="--sample 10"]
LAB ?=
MUTATION_ARGS ?=
mutation: setup
	@test -n "$(LAB)" || { echo "make mutation LAB=NN (00-11, or all)"; exit 2; }
	OMP_NUM_THREADS=1 MPLBACKEND=Agg $(PY) -m autograder mutation --lab $(LAB) $(MUTATION_ARGS)

.PHONY: bytecode bench hub hub-deps mutation serve interview progress help setup lab test browser-deps sandbox-deps release grade autograde feedback export similarity doctor calibrate gpu-check models data normalize check-normalized

help:
	@sed -n '1,12p' Makefile | sed 's/^# \{0,1\}//'

# ---------------------------------------------------------------- environment (idempotent; fast when done)
$(STAMP): requirements.txt pyproject.toml $(LAB_OVERRIDES) $(KERNEL_CONFIG)
	@test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -r requirements.txt
	@# jupyter-events asks for jsonschema[format-nongpl], whose rfc3987-syntax builds 38 Lark parsers whenever jsonschema
	@# is imported: 2-3 s in every process that imports nbformat (each nbgrader run and its alembic, each Jupyter
	@# server). Nothing of nbformat, Jupyter or the course checks the iri formats it serves (jsonschema skips them
	@# without it): removed (config/z2jh/Dockerfile too).
	$(PY) -m pip uninstall -y -q rfc3987-syntax
	$(PY) -m pip install -e . --no-deps
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (course)"
	mkdir -p $(VENV)/share/jupyter/lab/settings && cp $(LAB_OVERRIDES) $(VENV)/share/jupyter/lab/settings/overrides.json
	mkdir -p $(VENV)/etc/ipython && cp $(KERNEL_CONFIG) $(VENV)/etc/ipython/ipython_kernel_config.py
	@$(VENV)/bin/jupyter labextension list 2>&1 | grep -q "@jupyter/nbgrader" \
	  || { echo "nbgrader's JupyterLab extension is missing from $(VENV)"; exit 1; }
	@$(VENV)/bin/jupyter labextension list 2>&1 | grep -q "@jupyter-widgets/jupyterlab-manager" \
	  || { echo "ipywidgets' JupyterLab extension is missing from $(VENV)"; exit 1; }
	touch $@

# An environment this account cannot write (a class's, installed by root for everyone: docs/hub.md) is used as it
# is: its owner updates it. Make says so and goes on, instead of running pip into a folder it cannot change.
SHARED_VENV := $(shell [ -x $(PY) ] && [ ! -w "$$(readlink -f $(VENV))" ] && readlink -f $(VENV))
ifneq ($(SHARED_VENV),)
setup:
	@echo "make: $(VENV) is $(SHARED_VENV), an environment you cannot change: using it as installed (its owner updates it)"
else
setup: $(STAMP)
endif

# $(call apt-install,PATH,PACKAGE,WHAT FOR,WHAT HAPPENS WITHOUT IT): Debian's PACKAGE where PATH is missing, with apt
# as root or through sudo. Without either (or if apt fails) it says so and make goes on; in CI ($CI set) that fails.
define apt-install
	@if [ ! -x "$(1)" ]; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else SUDO=none; fi; \
	  if [ "$$SUDO" != none ] && echo "installing Debian's $(2) ($(3))" \
	     && $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y $(2); then :; \
	  else \
	    echo "make: could not install Debian's $(2) ($(3)): it needs root or sudo (apt-get install $(2))."; \
	    if [ -n "$$CI" ]; then echo "make: CI requires it"; exit 1; fi; \
	    echo "make: $(4)"; \
	  fi; \
	fi
endef

browser-deps:
	$(call apt-install,$(CHROMIUM),chromium,for the JupyterLab browser tests,the browser tests (tests/browser) will be skipped; everything else runs.)

sandbox-deps:
	$(call apt-install,$(BWRAP),bubblewrap,the sandbox submissions are graded in,make autograde refuses to run without it (--unsafe overrides) and the sandbox tests will be skipped.)

hub-deps: setup
	@if [ ! -x "$(HUB_PROXY)" ]; then \
	  if command -v npm >/dev/null && npm install --silent --prefix "$(VENV)/hub-proxy" configurable-http-proxy@4.6.3; then :; \
	  else echo "make: could not install configurable-http-proxy (JupyterHub's proxy) with npm: make hub needs it and the hub tests will be skipped."; \
	    if [ -n "$$CI" ]; then echo "make: CI requires it"; exit 1; fi; fi; \
	fi

# ---------------------------------------------------------------- learner
lab: setup
	@$(PY) -m autograder workspace --dir "$(WORKSPACE)"
	JUPYTER_CONFIG_PATH="$(CURDIR)/config/learner$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	  $(VENV)/bin/jupyter lab --ServerApp.root_dir="$(WORKSPACE)" $(ALLOW_ROOT) $(LAB_ARGS)

progress: setup
	@$(PY) -m autograder progress --dir "$(WORKSPACE)" $(PROGRESS_ARGS)

# The course's own modules compiled ahead (__pycache__, ignored by git): the sandboxed kernels, judges and nbgrader runs
# cannot write bytecode (read-only package, PYTHONDONTWRITEBYTECODE) and compiled every module they imported, in every
# process. Python checks each file's time and size, so a file changed later is read from its source. Quiet and never
# fatal: a checkout this account cannot write is used as it is.
bytecode:
	@$(PY) -m compileall -q -j 0 shared autograder >/dev/null 2>&1 || true

test: setup browser-deps sandbox-deps hub-deps bytecode
	@rc=0; OMP_NUM_THREADS=$(TEST_THREADS) OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest --timeout=$(PYTEST_TIMEOUT) -n $(PYTEST_WORKERS) --dist loadscope --durations=25 $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests; that is a failure"; fi; \
	exit $$rc

serve: setup
	$(PY) -m minigpt.serving $(SERVE_ARGS)

interview: setup
	@$(PY) -m autograder interview $(INTERVIEW_ARGS)

# In the bubblewrap sandbox where it can start (installed by `make sandbox-deps`), without it elsewhere.
grade: setup
	@test -n "$(NB)" || { echo "usage: make grade NB=path/to/notebook.ipynb"; exit 2; }
	$(PY) -m autograder grade "$(NB)"

# ---------------------------------------------------------------- instructor
release: setup
	$(PY) -m autograder release

hub: setup hub-deps sandbox-deps
	@$(PY) -m autograder hub status >/dev/null 2>&1 || $(PY) -m autograder hub setup $(HUB_ARGS)
	$(PY) -m autograder hub start $(HUB_ARGS)

autograde: setup sandbox-deps bytecode
	$(PY) -m autograder autograde $(if $(JOBS),--jobs $(JOBS)) $(AUTOGRADE_ARGS)

feedback: setup
	$(PY) -m autograder feedback

export: setup
	$(PY) -m autograder export

similarity: setup
	@test -n "$(A)" || { echo "usage: make similarity A=NN_topic   (an assignment under submitted/<student>/)"; exit 2; }
	$(PY) -m autograder similarity --assignment "$(A)" --csv similarity-$(A).csv --html similarity-$(A).html

normalize: setup
	$(PY) -m autograder normalize

check-normalized: setup
	$(PY) -m autograder normalize --check

# ---------------------------------------------------------------- machine and data
doctor: setup
	@$(PY) -m autograder doctor

# Speed thresholds from measurements on this machine: every speed check of this device class (the GPU tier on a GPU,
# the CPU tier otherwise), reference vs plausible slow implementations, written to autograder/calibration/.
# CALIBRATE_ARGS="--lab 04 --runs 7" narrows or lengthens it.
CALIBRATE_ARGS ?=
calibrate: $(if $(GPU_PYTHON),,setup)
	@$(if $(GPU_PYTHON),PYTHONPATH="$(CURDIR)/shared:$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PYTHON),$(PY)) -m autograder calibrate $(CALIBRATE_ARGS)

# The GPU tier in one command (resumes a run that did not finish; GPU_CHECK_ARGS=--fresh starts over).
# CALIBRATE=1 calibrates this GPU's thresholds first. On a GPU machine that already has torch/triton and no network,
# run it with that python instead of the CPU venv:  make gpu-check GPU_PYTHON=python3
GPU_PYTHON ?=
CALIBRATE ?=
GPU_CHECK_ARGS ?=
gpu-check: $(if $(GPU_PYTHON),,setup)
	@$(if $(GPU_PYTHON),PYTHONPATH="$(CURDIR)/shared:$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PYTHON),$(PY)) -m autograder gpu-check \
	  $(if $(filter 1 yes true,$(CALIBRATE)),--calibrate) $(GPU_CHECK_ARGS)

data: setup
	@if [ -n "$(CPYTHON_LIB)" ]; then $(PY) scripts/build_corpus.py "$(CPYTHON_LIB)"; \
	else echo "corpus: using the committed data/corpus (CPYTHON_LIB=/path/to/cpython-3.11.7/Lib rebuilds it)"; fi
	$(PY) -m minigpt.training.bpe

# One benchmark run (interleaved, medians): the ledger, its table and plot under data/bench/; README's table from it;
# then grading's own benchmark (autograder grading-bench) and its README table.
BENCH_ARGS ?=
# Grading's speed (each lab's solution, a class of 30 lab-05 submissions, --jobs 2): data/bench/grading.json.
GRADING_BENCH_ARGS ?=
bench: setup
	$(PY) -m minigpt.bench $(BENCH_ARGS)
	$(PY) -m minigpt.bench --readme
	$(PY) -m autograder grading-bench $(GRADING_BENCH_ARGS)
	$(PY) -m autograder grading-bench --readme

models: setup
	$(PY) -m minigpt.training.train target draft target-long
	$(PY) -m minigpt.training.draft_head
	$(PY) -m minigpt.longctx.retrieval
	$(PY) -m minigpt.moe.course_model
