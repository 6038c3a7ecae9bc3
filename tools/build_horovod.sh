#!/usr/bin/env bash
# Build Horovod 0.28.1 (PyTorch + Gloo + MPI, CPU only) from source into a virtualenv.
#
# Usage: tools/build_horovod.sh [VENV_DIR]      (default: <repo root>/.venv)
#
# Why from source with a patch: Horovod 0.28.1 (the last release) forces C++14 in its CMake
# files, but torch >= 2.1 headers need C++17 (upstream issue horovod#3996; the fix, PR #3998,
# was never released). We download the sdist, switch CMAKE_CXX_STANDARD 14 -> 17 in
# CMakeLists.txt and horovod/torch/CMakeLists.txt (and its flags to -O1 without debug info, below), and build with --no-build-isolation
# against the torch already installed in the venv.
#
# Idempotent: if `import horovod.torch` works and `horovodrun --check-build` shows PyTorch,
# Gloo and MPI, it says so and exits 0 without touching anything.
#
# Preconditions: torch is already installed in VENV_DIR (it is never changed: every pip
# command here is constrained to the installed torch version). Needs g++ and Open MPI
# (openmpi-bin libopenmpi-dev); when they are missing and we are root on a Debian-like
# system they are installed with apt-get (set HOROVOD_BUILD_NO_APT=1 to forbid that).
# CMake >= 3.13 from PATH, else `pip install cmake` into the venv.
#
# A built wheel is kept in HOROVOD_WHEEL_CACHE, keyed by everything the build depends on (Horovod, torch,
# Python, Open MPI, the machine's architecture and CPU): a second venv on the same machine (a fresh clone's
# `make test`) installs it in seconds instead of compiling for minutes; a fresh machine still builds.
#
# Environment knobs:
#   HOROVOD_WHEEL_CACHE  where built wheels are kept (default /var/cache/hpc_train/horovod; "" = none)
#   HOROVOD_BUILD_LOG   build log file (default: VENV_DIR/horovod-build.log)
#   HOROVOD_SDIST       Horovod's sdist fetched earlier (make horovod-sdist, beside make test's other set-up);
#                       unset or missing: downloaded here
#   HOROVOD_BUILD_JOBS  parallel compile jobs, default 2 (Horovod's setup.py would otherwise use -j8)
#   HOROVOD_BUILD_ARCH_FLAGS  passed through if set; unset lets Horovod probe -march=native
#   HOROVOD_BUILD_NO_APT=1    never call apt-get
set -euo pipefail

HOROVOD_VERSION=0.28.1

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(dirname "$SCRIPT_DIR")"
VENV_ARG="${1:-$REPO_ROOT/.venv}"

T_START=$SECONDS
PHASE_NAME=""
PHASE_START=$SECONDS

log() { printf '[build_horovod %4ds] %s\n' "$((SECONDS - T_START))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
phase() {
    if [[ -n "$PHASE_NAME" ]]; then
        log "phase '$PHASE_NAME' done in $((SECONDS - PHASE_START))s"
    fi
    PHASE_NAME="$1"
    PHASE_START=$SECONDS
    log "phase '$PHASE_NAME' ..."
}

[[ -d "$VENV_ARG" ]] || die "venv dir '$VENV_ARG' does not exist (create it and install torch first)"
VENV="$(cd "$VENV_ARG" && pwd)"
PY="$VENV/bin/python"
[[ -x "$PY" ]] || die "$PY is not an executable python"
export PATH="$VENV/bin:$PATH"

# Open MPI refuses to run as root unless told; CI runs as root.
if [[ "$(id -u)" == 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# check_build_ok: 0 when `horovodrun --check-build` marks PyTorch (framework) and MPI and Gloo
# (controllers) with [X]. Prints the check-build output to stderr when $1 == verbose.
check_build_ok() {
    local out
    [[ -x "$VENV/bin/horovodrun" ]] || return 1
    out="$("$VENV/bin/horovodrun" --check-build 2>&1)" || return 1
    if [[ "${1:-}" == verbose ]]; then
        printf '%s\n' "$out" >&2
    fi
    # Only look at the "Available Frameworks" and "Available Controllers" sections.
    printf '%s\n' "$out" | awk '
        /^Available Frameworks:/  { sec = "fw"; next }
        /^Available Controllers:/ { sec = "ctl"; next }
        /^Available/              { sec = ""; next }
        sec == "fw"  && /\[X\] PyTorch[[:space:]]*$/ { fw_torch = 1 }
        sec == "ctl" && /\[X\] MPI[[:space:]]*$/     { ctl_mpi = 1 }
        sec == "ctl" && /\[X\] Gloo[[:space:]]*$/    { ctl_gloo = 1 }
        END { exit !(fw_torch && ctl_mpi && ctl_gloo) }'
}

already_built() {
    "$PY" -c "import horovod.torch" >/dev/null 2>&1 && check_build_ok
}

phase "check existing install"
if already_built; then
    log "horovod is already built with PyTorch, MPI and Gloo in $VENV: nothing to do"
    echo "horovod already built in $VENV ($("$PY" -c 'import horovod; print(horovod.__version__)'))"
    exit 0
fi
log "no working horovod (PyTorch+MPI+Gloo) in $VENV: building $HOROVOD_VERSION"

BUILD_LOG="${HOROVOD_BUILD_LOG:-$VENV/horovod-build.log}"
mkdir -p "$(dirname "$BUILD_LOG")"
: >"$BUILD_LOG"
log "build log: $BUILD_LOG"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/build_horovod.XXXXXX")"
on_exit() {
    local rc=$?
    rm -rf "$WORK"
    if [[ $rc -ne 0 ]]; then
        log "FAILED in phase '$PHASE_NAME' (exit $rc) after $((SECONDS - T_START))s"
        if [[ -s "$BUILD_LOG" ]]; then
            log "last 60 lines of $BUILD_LOG:"
            tail -n 60 "$BUILD_LOG" >&2
        fi
    fi
}
trap on_exit EXIT

# run_logged CMD...: run with output appended to the build log (the tail is shown on failure).
run_logged() {
    printf '\n+ %s\n' "$*" >>"$BUILD_LOG"
    "$@" >>"$BUILD_LOG" 2>&1
}

phase "check toolchain"
TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" \
    || die "torch is not importable from $PY: install torch (e.g. torch==2.13.0) first"
log "torch $TORCH_VERSION in $VENV (pinned for every pip command below)"
CONSTRAINTS="$WORK/constraints.txt"
echo "torch==$TORCH_VERSION" >"$CONSTRAINTS"
# PIP_CONSTRAINT (not -c) so the pin also reaches pip's own sub-invocations.
export PIP_CONSTRAINT="$CONSTRAINTS"
PIP=("$PY" -m pip --disable-pip-version-check)

missing_pkgs=()
command -v g++ >/dev/null 2>&1 || missing_pkgs+=(g++)
command -v make >/dev/null 2>&1 || missing_pkgs+=(make)
{ command -v mpirun >/dev/null 2>&1 && command -v mpicxx >/dev/null 2>&1; } \
    || missing_pkgs+=(openmpi-bin libopenmpi-dev)
if ((${#missing_pkgs[@]})); then
    if [[ "$(id -u)" == 0 && "${HOROVOD_BUILD_NO_APT:-0}" != 1 ]] && command -v apt-get >/dev/null 2>&1; then
        log "installing system packages: ${missing_pkgs[*]}"
        run_logged apt-get update
        DEBIAN_FRONTEND=noninteractive run_logged apt-get install -y --no-install-recommends "${missing_pkgs[@]}"
    else
        die "missing system packages: ${missing_pkgs[*]} (apt-get install ${missing_pkgs[*]})"
    fi
fi

cmake_ok() {
    local v
    v="$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')"
    [[ -n "$v" ]] || return 1
    # need >= 3.13
    [[ "${v%%.*}" -gt 3 || ( "${v%%.*}" -eq 3 && "${v#*.}" -ge 13 ) ]]
}

phase "look for a cached wheel"
CACHE_ROOT="${HOROVOD_WHEEL_CACHE-/var/cache/hpc_train/horovod}"
cache_key() {
    {
        echo "horovod $HOROVOD_VERSION torch $TORCH_VERSION"
        "$PY" -c 'import sys, sysconfig; print(sys.version, sysconfig.get_platform())'
        mpirun --version 2>/dev/null | head -n1
        uname -m
        grep -m1 -E '^(model name|flags)' /proc/cpuinfo || true
        sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1  # this recipe (the patch, the flags)
    } | sha256sum | cut -c1-16
}
CACHE_DIR=""
if [[ -n "$CACHE_ROOT" ]]; then
    CACHE_DIR="$CACHE_ROOT/$(cache_key)"
    wheel="$(ls "$CACHE_DIR"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
    if [[ -n "$wheel" ]]; then
        log "installing the wheel built earlier on this machine: $wheel"
        if run_logged "${PIP[@]}" install --no-deps "$wheel" && run_logged "${PIP[@]}" install cloudpickle psutil pyyaml packaging cffi "torch==$TORCH_VERSION" \
            && "$PY" -c "import horovod.torch" >/dev/null 2>&1 && check_build_ok; then
            log "horovod $HOROVOD_VERSION installed from the cache in $((SECONDS - T_START))s"
            echo "horovod $HOROVOD_VERSION installed from $wheel"
            exit 0
        fi
        log "the cached wheel does not work here: building again"
        rm -f "$wheel"
    fi
fi

phase "install build deps"
BUILD_DEPS=(packaging psutil cloudpickle pyyaml cffi)
if cmake_ok; then
    log "using $(command -v cmake) ($(cmake --version | head -n1))"
else
    log "no cmake >= 3.13 on PATH: installing cmake from PyPI into the venv"
    BUILD_DEPS+=(cmake)
fi
run_logged "${PIP[@]}" install "${BUILD_DEPS[@]}" "torch==$TORCH_VERSION"
cmake_ok || die "cmake still not usable after installing build deps"

phase "download sdist"
SDIST="$WORK/horovod-$HOROVOD_VERSION.tar.gz"
if [[ -f "${HOROVOD_SDIST:-}" && "$(basename "$HOROVOD_SDIST")" == "horovod-$HOROVOD_VERSION.tar.gz" ]]; then
    cp "$HOROVOD_SDIST" "$SDIST" && log "sdist fetched earlier: $HOROVOD_SDIST"
else
    run_logged "${PIP[@]}" download --no-deps --no-binary :all: -d "$WORK" "horovod==$HOROVOD_VERSION"
fi
[[ -f "$SDIST" ]] || die "sdist $SDIST not found after pip download"
tar -xzf "$SDIST" -C "$WORK"
SRC="$WORK/horovod-$HOROVOD_VERSION"
[[ -f "$SRC/setup.py" ]] || die "unpacked sdist has no setup.py at $SRC"

phase "patch C++ standard 14 -> 17"
for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
    path="$SRC/$f"
    n14="$(grep -c 'set(CMAKE_CXX_STANDARD 14)' "$path" || true)"
    [[ "$n14" -ge 1 ]] || die "pattern 'set(CMAKE_CXX_STANDARD 14)' not found in $f: the sdist changed, refusing to build unpatched"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/g' "$path"
    if grep -q 'set(CMAKE_CXX_STANDARD 14)' "$path" || ! grep -q 'set(CMAKE_CXX_STANDARD 17)' "$path"; then
        die "patching $f failed"
    fi
    log "patched $f ($n14 occurrence(s))"
done

phase "compile flags: -O1, no debug info"
# Horovod builds RelWithDebInfo, made -O3 -g by its CMakeLists: the torch headers' debug info and -O3 made
# most of the compile (fresh machine, 2 cores: 139 s; -O1 without -g: 94 s). What the tests ask of Horovod
# (tiny all-reduces, its process model) does not need either; a user's cluster build is theirs to tune.
# after the line that makes them -O3, before any target or subproject reads them
"$PY" - "$SRC/CMakeLists.txt" <<'PATCH' || die "setting the compile flags in CMakeLists.txt failed: the sdist changed"
import sys
path = sys.argv[1]
text = open(path).read()
anchor = 'string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")\n'
assert text.count(anchor) == 1, f"{anchor!r} not found once"
flags = 'set(CMAKE_C_FLAGS_RELWITHDEBINFO "-O1 -DNDEBUG")\nset(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O1 -DNDEBUG")\n'
open(path, "w").write(text.replace(anchor, anchor + flags))
PATCH

phase "build and install horovod (takes a few minutes)"
# not ${MAKEFLAGS:-...}: under make (make horovod) MAKEFLAGS is make's own ("w -- VAR=..."), without -j
export MAKEFLAGS="-j${HOROVOD_BUILD_JOBS:-2}"
log "MAKEFLAGS=$MAKEFLAGS HOROVOD_BUILD_ARCH_FLAGS=${HOROVOD_BUILD_ARCH_FLAGS-<auto: probe -march=native>}"
HOROVOD_WITH_PYTORCH=1 \
HOROVOD_WITHOUT_TENSORFLOW=1 \
HOROVOD_WITHOUT_MXNET=1 \
HOROVOD_WITH_GLOO=1 \
HOROVOD_WITH_MPI=1 \
HOROVOD_CPU_OPERATIONS=gloo \
    run_logged "${PIP[@]}" wheel --no-build-isolation --no-deps --no-cache-dir -w "$WORK/wheel" "$SRC"
built="$(ls "$WORK"/wheel/horovod-*.whl)"
run_logged "${PIP[@]}" install "$built" "torch==$TORCH_VERSION"

phase "verify"
after="$("$PY" -c 'import torch; print(torch.__version__)')"
[[ "$after" == "$TORCH_VERSION" ]] || die "torch changed from $TORCH_VERSION to $after"
"$PY" -c "import horovod.torch" || die "import horovod.torch fails after install"
check_build_ok verbose || die "horovodrun --check-build does not show PyTorch, MPI and Gloo"
size="$("$PY" -c "import horovod.torch as hvd; hvd.init(); print(hvd.size())" 2>>"$BUILD_LOG" | tail -n1)" \
    || die "hvd.init() failed (see $BUILD_LOG)"
[[ "$size" == 1 ]] || die "hvd.init(); hvd.size() printed '$size', expected 1"
log "hvd.init() ok, size=$size"

if [[ -n "$CACHE_DIR" ]] && mkdir -p "$CACHE_DIR" 2>/dev/null; then
    # copied under a temporary name and renamed: a build killed halfway never leaves a wheel to reuse
    cp "$built" "$CACHE_DIR/.partial" && mv "$CACHE_DIR/.partial" "$CACHE_DIR/$(basename "$built")" \
        && log "wheel kept for the next venv on this machine: $CACHE_DIR/$(basename "$built")"
fi

phase "done"
log "horovod $HOROVOD_VERSION built into $VENV in $((SECONDS - T_START))s"
echo "horovod $HOROVOD_VERSION built and verified in $VENV"
