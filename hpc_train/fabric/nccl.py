"""NCCL profiles: the catalogue of real variable names, inheritance, the debug overlay, validation.

NCCL and PyTorch read their settings from the environment and ignore names they do not know, so
``NCCL_IB_HAC=mlx5`` does nothing at all: the job runs, slowly, over TCP. Every name a site or a
job sets under a fabric prefix is therefore checked against the catalogue below.

A profile is a mapping of variables; ``extends: other`` inherits another profile's variables
(the child's win). ``nccl_profile: "ib-hdr+debug"`` stacks overlays on a profile; ``+debug``
alone stacks them on the partition's default. The ``debug`` overlay is the site's profile of
that name, else :data:`DEBUG_OVERLAY`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpc_train.errors import Problem

EXTENDS = "extends"  # the one key in a profile that is not a variable
DEBUG = "debug"

# From the NCCL environment-variable reference (2.18-2.26) and the NCCL plugin docs.
# one long string, split: a list literal of 150 names would be five times as tall
NCCL_NAMES = frozenset(
    """
NCCL_ALGO NCCL_BUFFSIZE NCCL_CGA_CLUSTER_SIZE NCCL_CHECK_POINTERS NCCL_CHECKS_DISABLE NCCL_COLLNET_ENABLE
NCCL_COLLNET_NODE_THRESHOLD NCCL_COMM_BLOCKING NCCL_COMM_ID NCCL_COMM_SPLIT_SHARE_RESOURCES NCCL_CONF_FILE
NCCL_CREATE_THREAD_CONTEXT NCCL_CROSS_NIC NCCL_CTA_POLICY NCCL_CUMEM_ENABLE NCCL_CUMEM_HOST_ENABLE NCCL_DEBUG
NCCL_DEBUG_FILE NCCL_DEBUG_SUBSYS NCCL_DEBUG_TIMESTAMP_FORMAT NCCL_DEBUG_TIMESTAMP_LEVELS NCCL_DMABUF_ENABLE
NCCL_GDRCOPY_ENABLE NCCL_GDRCOPY_FLUSH_ENABLE NCCL_GDRCOPY_SYNC_ENABLE NCCL_GRAPH_DUMP_FILE NCCL_GRAPH_FILE
NCCL_GRAPH_MIXING_SUPPORT NCCL_GRAPH_REGISTER NCCL_HOSTID NCCL_IB_ADAPTIVE_ROUTING NCCL_IB_ADDR_FAMILY
NCCL_IB_ADDR_RANGE NCCL_IB_AR_THRESHOLD NCCL_IB_CUDA_SUPPORT NCCL_IB_DISABLE NCCL_IB_ECE_ENABLE NCCL_IB_FIFO_TC
NCCL_IB_GDR_LEVEL NCCL_IB_GID_INDEX NCCL_IB_HCA NCCL_IB_MERGE_NICS NCCL_IB_MERGE_VFS NCCL_IB_MQP_RETRY_ALL
NCCL_IB_MQP_RETRY_CNT NCCL_IB_MQP_RETRY_SLEEP_MSEC NCCL_IB_PCI_RELAXED_ORDERING NCCL_IB_QPS_PER_CONNECTION
NCCL_IB_RETRY_CNT NCCL_IB_RETURN_ASYNC_EVENTS NCCL_IB_ROCE_VERSION_NUM NCCL_IB_SL NCCL_IB_SPLIT_DATA_ON_QPS
NCCL_IB_TC NCCL_IB_TIMEOUT NCCL_IB_USE_INLINE NCCL_IGNORE_CPU_AFFINITY NCCL_IGNORE_DISABLED_P2P
NCCL_LAUNCH_MODE NCCL_LL128_BUFFSIZE NCCL_LL128_NTHREADS NCCL_LL_BUFFSIZE NCCL_LL_THRESHOLD NCCL_LOCAL_REGISTER
NCCL_MAX_CTAS NCCL_MAX_NCHANNELS NCCL_MAX_NRINGS NCCL_MAX_P2P_NCHANNELS NCCL_MEM_SYNC_DOMAIN NCCL_MIN_CTAS
NCCL_MIN_NCHANNELS NCCL_MIN_NRINGS NCCL_MIN_P2P_NCHANNELS NCCL_MNNVL_ENABLE NCCL_NCHANNELS_PER_NET_PEER
NCCL_NET NCCL_NET_DISABLE_INTRA NCCL_NET_FORCE_FLUSH NCCL_NET_GDR_C2C NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ
NCCL_NET_MERGE_LEVEL NCCL_NET_OVERHEAD NCCL_NET_PLUGIN NCCL_NET_SHARED_BUFFERS NCCL_NET_SHARED_COMMS
NCCL_NSOCKS_PERTHREAD NCCL_NTHREADS NCCL_NVB_DISABLE NCCL_NVLS_CHUNKSIZE NCCL_NVLS_ENABLE NCCL_NVLS_NCHANNELS
NCCL_NVLSTREE_MAX_CHUNKSIZE NCCL_OOB_NET_ENABLE NCCL_OOB_NET_IFNAME NCCL_P2P_DIRECT_DISABLE NCCL_P2P_DISABLE
NCCL_P2P_LEVEL NCCL_P2P_LL_THRESHOLD NCCL_P2P_NET_CHUNKSIZE NCCL_P2P_NVL_CHUNKSIZE NCCL_P2P_PCI_CHUNKSIZE
NCCL_P2P_PXN_LEVEL NCCL_P2P_READ_ENABLE NCCL_P2P_USE_CUDA_MEMCPY NCCL_PROFILER_PLUGIN NCCL_PROGRESS_APPENDOP_FREQ
NCCL_PROTO NCCL_PROXY_APPEND_BATCH_SIZE NCCL_PXN_DISABLE NCCL_RAS_ADDR NCCL_RAS_ENABLE NCCL_RAS_TIMEOUT_FACTOR
NCCL_RUNTIME_CONNECT NCCL_SET_STACK_SIZE NCCL_SET_THREAD_NAME NCCL_SHARP_DISABLE NCCL_SHM_DISABLE
NCCL_SHM_USE_CUDA_MEMCPY NCCL_SINGLE_RING_THRESHOLD NCCL_SOCKET_FAMILY NCCL_SOCKET_IFNAME NCCL_SOCKET_NTHREADS
NCCL_SOCKET_RETRY_CNT NCCL_SOCKET_RETRY_SLEEP_MSEC NCCL_TOPO_DUMP_FILE NCCL_TOPO_FILE NCCL_TREE_THRESHOLD
NCCL_TUNER_PLUGIN NCCL_UID_STAGGER_RATE NCCL_UID_STAGGER_THRESHOLD NCCL_WARN_ENABLE_DEBUG_INFO
NCCL_WORK_FIFO_DEPTH
NCCL_ASYNC_ERROR_HANDLING NCCL_BLOCKING_WAIT NCCL_DESYNC_DEBUG
""".split()
)

# PyTorch's ProcessGroupNCCL and c10d (2.2 onwards; the NCCL_ASYNC_ERROR_HANDLING-style names above
# are the deprecated spellings torch still reads).
TORCH_NAMES = frozenset(
    """
TORCH_NCCL_ABORT_IN_DESTROY_PG TORCH_NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_AVOID_RECORD_STREAMS
TORCH_NCCL_BLOCKING_WAIT TORCH_NCCL_COORD_CHECK_MILSEC TORCH_NCCL_CUDA_EVENT_CACHE
TORCH_NCCL_DEBUG_INFO_PIPE_FILE TORCH_NCCL_DEBUG_INFO_TEMP_FILE TORCH_NCCL_DESYNC_DEBUG TORCH_NCCL_DUMP_ON_TIMEOUT
TORCH_NCCL_ENABLE_MONITORING TORCH_NCCL_ENABLE_TIMING TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC TORCH_NCCL_HIGH_PRIORITY
TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN TORCH_NCCL_NAN_CHECK TORCH_NCCL_PROPAGATE_ERROR
TORCH_NCCL_RETHROW_CUDA_ERRORS TORCH_NCCL_TRACE_BUFFER_SIZE TORCH_NCCL_TRACE_CPP_STACK
TORCH_NCCL_USE_COMM_NONBLOCKING TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC
TORCH_DISTRIBUTED_DEBUG TORCH_CPP_LOG_LEVEL TORCH_SHOW_CPP_STACKTRACES TORCH_FR_BUFFER_SIZE
TORCH_FR_DUMP_TEMP_FILE TORCH_FR_CPP_STACK TORCH_DIST_INIT_BARRIER
""".split()
)

KNOWN = NCCL_NAMES | TORCH_NAMES
CHECKED_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCH_FR_")

# Names that cost time or disk on every collective, or dump on every timeout: for debugging only.
DEBUG_ONLY = frozenset(
    {
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE",
        "NCCL_GRAPH_DUMP_FILE",
        "NCCL_TOPO_DUMP_FILE",
        "TORCH_NCCL_DESYNC_DEBUG",
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_NCCL_TRACE_CPP_STACK",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "TORCH_FR_BUFFER_SIZE",
        "TORCH_FR_DUMP_TEMP_FILE",
        "TORCH_FR_CPP_STACK",
        "NCCL_DESYNC_DEBUG",
    }
)
# ... and names whose *value* decides: NCCL_DEBUG=WARN is fine in production, INFO is not.
DEBUG_VALUES = {
    "NCCL_DEBUG": {"INFO", "TRACE"},
    "TORCH_DISTRIBUTED_DEBUG": {"INFO", "DETAIL"},
    "TORCH_CPP_LOG_LEVEL": {"INFO"},
    "TORCH_SHOW_CPP_STACKTRACES": {"1"},
}

# Used when a site defines no `debug` profile of its own: NCCL's init and network choices, c10d's
# consistency checks, and the flight recorder dumping each rank's last collectives on a timeout.
DEBUG_OVERLAY: dict[str, str] = {
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_CPP_LOG_LEVEL": "INFO",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_NCCL_DESYNC_DEBUG": "1",
}


def is_checked(name: str) -> bool:
    return name.startswith(CHECKED_PREFIXES)


def closest(name: str) -> str | None:
    """The catalogue name a misspelling most likely meant (None when nothing is close)."""
    pool = [n for n in KNOWN if n.split("_", 1)[0] == name.split("_", 1)[0]] or list(KNOWN)
    close = difflib.get_close_matches(name, pool, n=1, cutoff=0.75)
    return close[0] if close else None


def is_debug_only(name: str, value: str) -> bool:
    if name in DEBUG_ONLY:
        return value not in ("", "0")
    allowed = DEBUG_VALUES.get(name)
    return allowed is not None and str(value).upper() in allowed


@dataclass(frozen=True)
class NameIssue:
    """One questionable variable name: an error when it is a likely typo, a warning otherwise."""

    name: str
    error: bool
    message: str
    hint: str | None = None


def check_name(name: str) -> NameIssue | None:
    if not is_checked(name) or name in KNOWN:
        return None
    guess = closest(name)
    if guess is not None:
        return NameIssue(name, True, f"{name} is not an NCCL/PyTorch variable; NCCL would ignore it", f"did you mean {guess!r}?")
    return NameIssue(
        name,
        False,
        f"{name} is not in hpc_train's catalogue of NCCL/PyTorch variables",
        "NCCL ignores names it does not know; check the spelling against your NCCL version's docs",
    )


def profile_errors(profiles: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """{profile: message} for broken inheritance (unknown parent, cycle); checked when a site loads."""
    errors: dict[str, str] = {}
    for name, values in profiles.items():
        parent = values.get(EXTENDS)
        if parent is None:
            continue
        if parent not in profiles:
            close = difflib.get_close_matches(parent, list(profiles), n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            errors[name] = f"extends unknown NCCL profile {parent!r}{hint}"
            continue
        seen = [name]
        while parent is not None and parent in profiles:
            if parent in seen:
                errors[name] = "inheritance cycle: " + " -> ".join(seen + [parent])
                break
            seen.append(parent)
            parent = profiles[parent].get(EXTENDS)
    return errors


@dataclass(frozen=True)
class ProfileVar:
    name: str
    value: str
    profile: str  # the profile (or overlay) whose mapping set it


def resolve(profiles: Mapping[str, Mapping[str, str]], name: str) -> list[ProfileVar]:
    """A profile's variables after inheritance (the parent's first, the child's override them)."""
    merged: dict[str, ProfileVar] = {}
    for owner in reversed(_chain(profiles, name)):
        for key, value in profiles[owner].items():
            if key != EXTENDS:
                merged[key] = ProfileVar(key, value, owner)
    return list(merged.values())


def split_selection(selection: str | None) -> tuple[str | None, list[str]]:
    """``"ib-hdr+debug"`` -> ("ib-hdr", ["debug"]); ``"+debug"`` -> (None, ["debug"])."""
    if not selection:
        return None, []
    base, *overlays = selection.split("+")
    return base or None, [o for o in overlays if o]


def overlay_values(profiles: Mapping[str, Mapping[str, str]], name: str) -> list[ProfileVar] | None:
    if name in profiles:
        return resolve(profiles, name)
    if name == DEBUG:
        return [ProfileVar(k, v, "debug (built-in)") for k, v in DEBUG_OVERLAY.items()]
    return None


def is_debug_profile(profiles: Mapping[str, Mapping[str, str]], name: str) -> bool:
    """A profile meant for debugging: named debug*, or inheriting from one."""
    seen: set[str] = set()
    current: str | None = name
    while current is not None and current not in seen:
        if current == DEBUG or current.startswith(DEBUG + "-") or current.endswith("-" + DEBUG):
            return True
        seen.add(current)
        current = profiles.get(current, {}).get(EXTENDS)
    return False


@dataclass(frozen=True)
class Finding:
    """A warning about a site's fabric settings, with the dotted key it is about."""

    key: str
    message: str
    hint: str | None = None


def site_findings(env_maps: Mapping[str, Mapping[str, str]], profiles: Mapping[str, Mapping[str, str]]) -> list[Finding]:
    """Warnings for a whole site: unknown-but-not-misspelt names, debug variables left on.

    ``env_maps`` maps a dotted key prefix (``env``, ``partitions.a100.env``) to its variables.
    """
    out: list[Finding] = []
    maps = dict(env_maps)
    maps.update({f"nccl_profiles.{name}": values for name, values in profiles.items()})
    for prefix, values in maps.items():
        profile = prefix.split(".", 1)[1] if prefix.startswith("nccl_profiles.") else None
        for key, value in values.items():
            if key == EXTENDS and profile is not None:
                continue
            issue = check_name(key)
            if issue is not None and not issue.error:
                out.append(Finding(f"{prefix}.{key}", issue.message, issue.hint))
            if is_debug_only(key, value) and not (profile and is_debug_profile(profiles, profile)):
                where = f"profile {profile!r}" if profile else f"'{prefix}'"
                out.append(
                    Finding(
                        f"{prefix}.{key}",
                        f"debug-only {key}={value} left on in {where}",
                        "it slows every job or fills the disk; move it to the debug profile (jobs opt in with --nccl-debug)",
                    )
                )
    return out


@dataclass(frozen=True)
class Selection:
    """The profile a job runs with: its label (``ib-hdr+debug``) and each variable with its source."""

    label: str | None
    variables: list[tuple[str, str, str]]  # (name, value, source for render's comment)
    problems: list[tuple[str, str | None]]  # (message, hint): the job asked for something unknown


def select(profiles: Mapping[str, Mapping[str, str]], asked: str | None, default: str | None, site: str) -> Selection:
    """Resolve ``--nccl-profile`` (or the partition's default) plus ``+overlay`` parts."""
    base, overlays = split_selection(asked)
    problems: list[tuple[str, str | None]] = []
    if base is None:
        base = default  # nothing asked, or "+debug": the partition's default (with the overlay on top)
    if base is not None and base not in profiles:
        problems.append((f"site {site!r} has no NCCL profile {base!r}", _hint(base, profiles)))
        return Selection(base, [], problems)
    variables: dict[str, tuple[str, str, str]] = {}
    if base is not None:
        for var in resolve(profiles, base):
            via = "" if var.profile == base else f" (from {var.profile})"
            variables[var.name] = (var.name, var.value, f"nccl profile {base}{via}")
    for name in overlays:
        values = overlay_values(profiles, name)
        if values is None:
            problems.append((f"site {site!r} has no NCCL profile {name!r} to overlay", _hint(name, profiles)))
            continue
        for var in values:
            variables[var.name] = (var.name, var.value, f"nccl overlay {name}")
    label = "+".join([base or ""] + overlays) if overlays else base
    return Selection(label, list(variables.values()), problems)


def _hint(name: str | None, profiles: Mapping[str, Mapping[str, str]]) -> str:
    known = sorted(profiles)
    close = difflib.get_close_matches(name or "", known, n=3, cutoff=0.5)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    return ("known profiles: " + ", ".join(known)) if known else "the site defines no NCCL profiles"


def job_findings(
    env_maps: Mapping[str, Mapping[str, str]], profiles: Mapping[str, Mapping[str, str]], label: str | None
) -> list[Finding]:
    """Warnings for one job: only what it will actually run with (the chosen profile, site/partition env)."""
    base, overlays = split_selection(label)
    chain = set(_chain(profiles, base))
    found = site_findings(env_maps, {})
    for finding in site_findings({}, profiles):
        profile = finding.key.split(".")[1]
        # a debug variable in the base profile is no news when the job asked for debugging anyway
        if profile in chain and not (overlays and finding.message.startswith("debug-only")):
            found.append(finding)
    return found


def _chain(profiles: Mapping[str, Mapping[str, str]], name: str | None) -> list[str]:
    """The profile, its parent, the parent's parent ... (stops at a cycle; loading reports those)."""
    chain: list[str] = []
    while name is not None and name in profiles and name not in chain:
        chain.append(name)
        name = profiles[name].get(EXTENDS)
    return chain


def job_warnings(
    selection: Selection, site: Any, partition: str | None, provenance: Mapping[str, tuple[str, int | None]], site_file: str
) -> list[Problem]:
    """job_findings as Problems that say file:line (``site`` is a SiteConfig)."""
    env_maps: dict[str, Mapping[str, str]] = {"env": site.env}
    if partition and partition in site.partitions:
        env_maps[f"partitions.{partition}.env"] = site.partitions[partition].env
    out = []
    for finding in job_findings(env_maps, site.nccl_profiles, selection.label):
        source, line = provenance.get(finding.key, (site_file, None))
        out.append(Problem(source or site_file, finding.key, finding.message, line, finding.hint))
    return out
