#!/usr/bin/env bash
# make test: set up what the suite needs, start the sandbox, run every test; print each phase's time,
# the ten slowest tests and the total.
#
# The phases overlap where nothing they share can race: the apt packages beside the Python packages (they
# write different trees), Horovod's source download, lint and DeepSpeed's op; Horovod's compile beside the
# sandbox's start (the cluster reads no site-packages; lint writes nothing and reads only typed packages,
# installed before). The Python packages are installed one pip at a time.
#
# Usage: tools/make_test.sh WORKERS [PYTEST_ARGS...]     (the Makefile passes $(PYTEST_WORKERS), $(PYTEST_ARGS))
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
WORKERS=${1:-4}
shift || true
T0=$SECONDS
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/hpc_train-make-test.XXXXXX")

say() { printf '[make test %4ds] %s\n' "$((SECONDS - T0))" "$*"; }
fail() {
    say "FAILED: $1 (log: $2)"
    tail -n 60 "$2"
    exit 1
}
# The longest each set-up phase may take on a fresh machine, several times what it takes (a fresh machine:
# apt and pip a minute or two each, Horovod compiled in about five). A phase that hangs (a stalled download,
# a prompt) fails with its log and what it was still running, instead of holding CI until CI's own limit
# ends it with nothing said: stop 39's CI printed "set-up" and then nothing for 90 minutes.
declare -A LIMIT=([system-deps]=1200 [install]=900 [fetch]=120 [packages]=900 [op]=900 [horovod]=1800 [cluster]=300 [lint]=600)

# phase NAME CMD...: run CMD (stdin closed: nothing may wait for an answer) in a process group of its own,
# with its output in a log; say when it starts and ends; past its limit, show what it was running and stop it
phase() {
    local name=$1 start=$SECONDS limit=${LIMIT[$1]} pid
    shift
    say "  $name ..."
    setsid "$@" </dev/null >"$LOGS/$name.log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS - start > limit)); then
            say "$name: still running after $limit s; what it runs:"
            ps -o pid,etime,time,stat,args --forest -g "$pid" | cut -c1-240
            kill -TERM -- "-$pid" 2>/dev/null
            sleep 5
            kill -KILL -- "-$pid" 2>/dev/null
            wait "$pid"
            fail "$name (timed out)" "$LOGS/$name.log"
        fi
        sleep 1
    done
    wait "$pid" || fail "$name" "$LOGS/$name.log"
    say "  $name done in $((SECONDS - start)) s"
}

say "set-up (logs in $LOGS)"
# 1. the Debian packages (Slurm, munge, MariaDB, Open MPI) beside everything that needs none of them: the
# venv and its Python packages (DeepSpeed; mpi4py is a wheel, which needs Open MPI's library only when
# imported), lint, and DeepSpeed's op (a shared-memory all-reduce: g++ and torch); Horovod's source (a
# download) beside both. On a fresh machine apt is the longest of these; where it is already done (a second
# clone) the order changes nothing
phase system-deps make --no-print-directory system-deps &
apt=$!
phase fetch make --no-print-directory horovod-sdist &
fetch=$!
phase install make --no-print-directory install
# mypy reads mpi4py's type stubs: lint after the backends' packages. The compiles take what lint's CPU leaves
phase packages make --no-print-directory backend-packages
phase op make --no-print-directory deepspeed-ops &
op=$!
phase lint make --no-print-directory lint-checks &
lint=$!
wait "$apt" || exit 1
# a fetch that failed costs nothing more: build_horovod.sh downloads the source itself when it needs it
wait "$fetch" || say "  (fetch failed: Horovod's build downloads its source itself)"
# 2. what needs apt's packages: Horovod's compile (Open MPI's headers; unless a build is cached) beside the
# sandbox's start (Slurm)
if [ "${HPC_TRAIN_SANDBOX_KEEP:-}" = 1 ]; then
    keep=1
else
    keep=0
fi
phase horovod make --no-print-directory horovod &
horovod=$!
phase cluster bash tests/cluster/sandbox.sh up &
cluster=$!
for pid in "$lint" "$op" "$cluster" "$horovod"; do
    wait "$pid" || exit 1
done

# DeepSpeed's CPU op, compiled by `make backends`, for every process of the run: the conftest sets it per test,
# but a process outside a test (collection, a job whose environment was not the test's) compiled it again
# into ~/.cache (61 s of CPU, seen with process accounting)
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.venv/torch_extensions}"
# the tests' own mpiruns on two cores (the sandbox's jobs get it from site_configs/sandbox.yaml): a rank
# waiting in a collective yields its core to the rank it waits for instead of polling on it
export OMPI_MCA_mpi_yield_when_idle=1
# and the same transports and crash reports as the sandbox's jobs (site_configs/sandbox.yaml says why)
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_opal_signal='' PYTHONFAULTHANDLER=1
say "pytest -n $WORKERS (one sandbox for every worker), then the serial tests alone"
start=$SECONDS
# how busy the cores were: make test is CPU-bound here, so CPU seconds are what a test costs the run
read -r _ u0 n0 s0 i0 _ </proc/stat
if [ -n "${HPC_TRAIN_TEST_CPU:-}" ]; then  # per test, from the processes each one started (tools/test_cpu.py)
    export HPC_TRAIN_TEST_CPU_MARKS="$LOGS/forked-ranks" HPC_TRAIN_TEST_CPU_INPROC="$LOGS/test_cpu_inproc.jsonl"
    mkdir -p "$HPC_TRAIN_TEST_CPU_MARKS"
    .venv/bin/python tools/test_cpu.py sample "$LOGS/test_cpu.json" &
    sampler=$!
fi
# --maxschedchunk 1: a worker holds at most two tests it has not started, so the longest, which come first
# (tests/conftest.py), spread over every worker, and an idle worker always finds one to take
HPC_TRAIN_SANDBOX_KEEP=1 .venv/bin/python -m pytest tests -n "$WORKERS" --maxschedchunk 1 --durations=10 --durations-min=1 \
    -m "not soak and not gpu and not serial" "$@"
rc=$?
HPC_TRAIN_SANDBOX_KEEP=1 .venv/bin/python -m pytest tests --durations=5 --durations-min=1 -m "serial and not soak and not gpu" "$@"
serial_rc=$?
[ "$rc" = 0 ] && rc=$serial_rc
say "pytest: $((SECONDS - start)) s"
read -r _ u1 n1 s1 i1 _ </proc/stat
tck=$(getconf CLK_TCK)
say "  CPU: $(( (u1 + n1 + s1 - u0 - n0 - s0) / tck )) s busy, $(( (i1 - i0) / tck )) s idle, over $(nproc) cores"
if [ -n "${sampler:-}" ]; then
    kill "$sampler" && wait "$sampler"
    .venv/bin/python tools/test_cpu.py report "$LOGS/test_cpu.json" 20
fi
[ "$keep" = 1 ] || bash tests/cluster/sandbox.sh down >/dev/null 2>&1 || say "WARNING: sandbox.sh down failed"
say "total $((SECONDS - T0)) s ($(((SECONDS - T0) / 60)) min $(((SECONDS - T0) % 60)) s), pytest exit $rc"
exit "$rc"
