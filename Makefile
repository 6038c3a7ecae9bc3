# hpc_train — the README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch is pinned: an unpinned torch pulls a multi-GB CUDA build
TORCH := torch==2.13.0
PYTEST_ARGS ?=
# pytest-xdist workers for make test: they share one sandbox, whose tests mostly wait on the scheduler
PYTEST_WORKERS ?= 4
# Python keeps the bytecode of what it imports, as on any login node or cluster: where the environment says
# not to (this machine's does, and CI runs on the same image), each of make test's ~1,400 processes (ranks,
# launchers, CLI calls, pytest's workers) compiled every hpc_train module it imported, and each worker rewrote
# every test module: 61 ms more per rank, 0.08 s per CLI call, 2.6 s per collection of the suite
# (make test-unit's pytest: cores busy 400 s with, 351 s without)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help venv install backends backend-packages horovod horovod-sdist deepspeed-ops system-deps demo lint lint-checks test test-unit soak test-gpu scenarios test-e2e cluster-up cluster-down cluster-status bench bench-cluster clean

help:
	@echo "make demo          set up .venv, install, run a 2-process DDP job on the local site"
	@echo "make lint          ruff and mypy (make test runs them first)"
	@echo "make test          install everything (Slurm, MPI, torch, ...), start the sandbox cluster, run all tests"
	@echo "make cluster-up    start the multi-node Slurm sandbox (prints SLURM_CONF=...)"
	@echo "make cluster-down  stop it"
	@echo "make bench         benchmarks (ratios against baselines in the same run)"
	@echo "make bench-cluster the sweep benchmark on the Slurm sandbox"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

venv: $(PY)

# editable install plus the job-side dependencies (torch pinned first so nothing pulls another build). A stamp:
# backends, horovod, lint, ... each need install, and make test's set-up ran the same two pips three times
# (about 20 s); it is redone when setup.cfg or pyproject.toml changes, or after make clean
INSTALLED := $(VENV)/.installed
install: $(INSTALLED)

$(INSTALLED): setup.cfg pyproject.toml | $(PY)
	$(PIP) install -q "$(TORCH)" numpy
	$(PIP) install -q -e ".[test,runtime,report]" "$(TORCH)"
	touch $@

# the backends' frameworks: DeepSpeed and mpi4py from PyPI (torch pinned), Horovod built against our torch
# Horovod (built from source on a fresh machine, else its cached wheel) beside DeepSpeed's op (a compile
# of its own): neither reads what the other writes, and each alone leaves a core idle
backends: backend-packages
	$(MAKE) -j2 horovod deepspeed-ops

# the backends' Python packages alone (no apt: mpi4py is a wheel, which needs Open MPI's library only when
# imported): make test type-checks after them (mpi4py ships type stubs) while apt still installs
backend-packages: install
	$(PIP) install -q deepspeed mpi4py "$(TORCH)"

# DeepSpeed's CPU all-reduce op, compiled once where the tests and their jobs look for it (tests/conftest.py):
# the clone's own .venv/torch_extensions. Not a per-machine cache: torch compiles with the venv's absolute
# paths, so another clone rebuilt it there anyway, and a build killed there (at a session's end) left torch's
# lock file behind, on which every later load in every clone waited forever: stop 39's CI, on this machine,
# waited in `make backends` for 90 minutes. Nothing else uses the folder while make builds it, so a lock
# found here is stale; and the build gets 15 minutes, not forever.
deepspeed-ops:
	@dir="$${TORCH_EXTENSIONS_DIR:-$(CURDIR)/$(VENV)/torch_extensions}"; \
	if [ -L "$$dir" ]; then rm "$$dir"; echo "deepspeed-ops: $$dir is a folder of this clone's again, not a link"; fi; \
	for lock in "$$dir"/*/lock; do if [ -e "$$lock" ]; then echo "deepspeed-ops: removing a stale $$lock"; rm -f "$$lock"; fi; done; \
	TORCH_EXTENSIONS_DIR="$$dir" timeout 900 $(PY) -c "from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder as B; B().load(verbose=False)"

# the version tools/build_horovod.sh builds (it ignores a source of another version)
HOROVOD_SDIST := build/horovod-0.28.1.tar.gz
horovod: install system-deps
	HOROVOD_SDIST="$(CURDIR)/$(HOROVOD_SDIST)" bash tools/build_horovod.sh $(VENV)

# Horovod's source, fetched with the system's pip before the venv exists: make test fetches it beside the
# apt and pip installs (a fresh machine spent 11-17 s downloading it between them and the compile). Written
# under a temporary name: a fetch cut short never looks complete
horovod-sdist: $(HOROVOD_SDIST)
$(HOROVOD_SDIST):
	mkdir -p build/.horovod-sdist
	$(PYTHON) -m pip download -q --no-deps --no-binary :all: -d build/.horovod-sdist horovod==0.28.1
	mv build/.horovod-sdist/horovod-0.28.1.tar.gz $@

system-deps:
	bash tests/cluster/install-deps.sh

demo: install
	@echo "== a 2-process DDP job on the local site (no cluster needed) =="
	cd examples && ../$(PY) -m hpc_train submit --site local --procs-per-node 2 --follow train_ddp.py -- --steps 60

# fast, first: lint and types (configured in pyproject.toml)
lint: install lint-checks

lint-checks:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# set-up (apt beside pip, the sandbox's start beside lint), then every test on $(PYTEST_WORKERS) workers;
# prints each phase's time, the ten slowest tests and the total (tools/make_test.sh)
test:
	@bash tools/make_test.sh $(PYTEST_WORKERS) $(PYTEST_ARGS)

# no cluster, no backend frameworks: what needs those lives in tests/backends, tests/e2e, tests/cluster, or is marked frameworks
# three workers on two cores: with two, the cores sat idle 18% of the time while tests' ranks waited (a hang
# being watched for, a rendezvous), and a third worker fills it; one test at a time per worker, the longest
# first (tests/conftest.py)
test-unit: install lint
	@start=$$(date +%s); $(PY) -m pytest tests/unit -n 4 --maxschedchunk 1 -m "not soak and not gpu and not frameworks" --durations=10 --durations-min=1 $(PYTEST_ARGS); \
	rc=$$?; echo "make test-unit: pytest $$(( $$(date +%s) - start )) s, exit $$rc"; exit $$rc

# the soak runs: the cluster's interruptions and repetitions, the same assertions many times over
soak: install system-deps backends
	$(PY) -m pytest tests -m soak $(PYTEST_ARGS)

# tests/SCENARIOS.md's "Now" table, from the suite as it is (test_scenarios.py checks it)
scenarios: install
	bash tools/scenarios_now.sh

# what only a CUDA GPU can check (tests/gpu); without one, each test is skipped with its reason
test-gpu: install
	$(PY) -m pytest tests/gpu -m gpu -rs $(PYTEST_ARGS)

test-e2e: system-deps install backends
	$(PY) -m pytest tests/e2e tests/cluster $(PYTEST_ARGS)

cluster-up: system-deps
	@bash tests/cluster/sandbox.sh up

cluster-down:
	@bash tests/cluster/sandbox.sh down

cluster-status:
	@bash tests/cluster/sandbox.sh status

bench: install
	$(PY) bench/cli_latency.py
	$(PY) bench/rank_start.py
	$(PY) bench/runtime_overhead.py
	$(PY) bench/runtime_overhead.py --hidden 1024
	$(PY) bench/runtime_overhead.py --procs 1
	$(PY) bench/numerics.py --procs 1
	$(PY) bench/profiling.py
	$(PY) bench/checkpoint.py
	$(PY) bench/metrics_overhead.py
	$(PY) bench/flight_recorder.py
	$(PY) bench/snapshot.py

# benchmarks that need the Slurm sandbox (started here, left up)
bench-cluster: system-deps install
	@bash tests/cluster/sandbox.sh up
	SLURM_CONF=/tmp/hpc_train-sandbox/etc/slurm.conf $(PY) bench/sweep.py
	SLURM_CONF=/tmp/hpc_train-sandbox/etc/slurm.conf $(PY) bench/remote.py
	SLURM_CONF=/tmp/hpc_train-sandbox/etc/slurm.conf $(PY) bench/failover.py --hold
	SLURM_CONF=/tmp/hpc_train-sandbox/etc/slurm.conf $(PY) bench/failover.py --no-agent

clean:
	rm -rf build dist *.egg-info .pytest_cache $(INSTALLED)
