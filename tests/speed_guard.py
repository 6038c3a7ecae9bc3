"""What keeps `make test` fast: a test that takes over LIMIT_S of a core's time and is not marked
``@pytest.mark.slow(reason="...")`` (at most MAX_SLOW of those, each saying why it cannot be shorter) fails,
and the run ends with the ten tests closest to the limit (HPC_TRAIN_SPEED_GUARD=warn only lists them).

A test over the limit is a design question (one cluster job per situation, fewer steps, a faster tier), not
a timing one. Its wall time is not its cost: under make test's four workers on two cores the same test took
46 s in one run and 268 s in another, because every core was shared with the other workers' jobs. So the
time counted is the test's wall time scaled by the share of a core it could have had: ``wall * cores / load``
while the machine's load is above its cores, the wall time itself when it is not. The load is the number of
runnable tasks, sampled each second while the test ran (the 1-minute load average, read at a test's start and
end, lags a minute behind the load a test meets: x67 charged a DeepSpeed test of 257 s with 61 s); the cores are those the
hypervisor left to the machine (its steal time over the test taken off). A test that takes 70 s alone fails
alone and under load alike; one that takes 30 s alone passes under a load of four times the cores. The time
is the test's own set-up, call and tear-down; the first test of a worker to use the cluster is not charged
for starting it.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

import pytest

LIMIT_S = 60.0
MAX_SLOW = 5

_spent: dict[str, float] = {}
_over: list[tuple[float, float, float, bool, str]] = []  # core s, wall s, load, slow, id


def _failing() -> bool:
    return os.environ.get("HPC_TRAIN_SPEED_GUARD", "fail") != "warn"


def core_seconds(wall_s: float, load: float, cores: int) -> float:
    """A test's wall time as the time it would have taken with a core to itself: the machine's load, above its
    cores, shared each core among that many runnable tasks."""
    share = max(load, cores)
    return wall_s * cores / share if share > 0 else wall_s


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def runnable(loadavg: str) -> int:
    """The tasks running or waiting for a core, from /proc/loadavg's "running/total" field, less the one
    reading it."""
    return max(int(loadavg.split()[3].split("/")[0]) - 1, 0)


# /proc/stat counts in ticks of 10 ms per core: over a few ticks the steal's share is noise (a test of
# milliseconds read 3 of 3 ticks stolen, no cores left, and the guard divided by zero)
MIN_TICKS = 100


def stolen(stat_before: str, stat_after: str) -> float:
    """The share of the machine's time the hypervisor took between two reads of /proc/stat's first line
    (none when too few ticks passed to tell)."""
    before, after = ([int(n) for n in line.split()[1:9]] for line in (stat_before, stat_after))
    total = sum(after) - sum(before)
    return (after[7] - before[7]) / total if total >= MIN_TICKS else 0.0


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.readline()
    except OSError:  # no /proc (not Linux): no load known, the wall time counts whole
        return ""


class _Load:
    """The machine's runnable tasks, sampled each second by a daemon thread of this pytest process."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque(maxlen=6 * 3600)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the sampler appends while a test's end reads

    def start(self) -> None:
        if self._thread is None and _read("/proc/loadavg"):
            self._thread = threading.Thread(target=self._sample, name="speed-guard-load", daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        while True:
            self.add(time.monotonic(), runnable(_read("/proc/loadavg")))
            time.sleep(1.0)

    def add(self, at: float, tasks: int) -> None:
        with self._lock:
            self.samples.append((at, tasks))

    def mean(self, since: float) -> float:
        with self._lock:
            seen = [n for t, n in self.samples if t >= since]
        return sum(seen) / len(seen) if seen else 0.0


_load = _Load()
_started: dict[str, tuple[float, str]] = {}  # nodeid: (monotonic start, /proc/stat's first line)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow(reason): may run over the 60 s limit; the reason says why (at most five)")


def slow_reason(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("slow")
    if mark is None:
        return None
    return str(mark.kwargs.get("reason") or (mark.args[0] if mark.args else ""))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = {item.nodeid.split("[")[0] for item in items if item.get_closest_marker("slow")}
    unexplained = sorted({item.nodeid for item in items if item.get_closest_marker("slow") and not slow_reason(item)})
    if unexplained:
        raise pytest.UsageError(f"@pytest.mark.slow needs reason='why it cannot be shorter': {', '.join(unexplained)}")
    if len(marked) > MAX_SLOW:
        raise pytest.UsageError(f"{len(marked)} tests are marked slow, at most {MAX_SLOW} may be: {', '.join(sorted(marked))}")


# a long session-scoped fixture (the sandbox's start) is set up inside the first test that asks for it
_SESSION_FIXTURES = ("slurm_cluster",)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if call.when == "setup":
        _load.start()
        _started[item.nodeid] = (time.monotonic() - report.duration, _read("/proc/stat"))
    if call.when == "setup" and any(name in getattr(item, "fixturenames", ()) for name in _SESSION_FIXTURES):
        _spent[item.nodeid] = 0.0  # the first user of the cluster pays its start: not the test's time
        if not getattr(item.session, "_hpc_cluster_charged", False):
            item.session._hpc_cluster_charged = True  # type: ignore[attr-defined]
            return
    _spent[item.nodeid] = _spent.get(item.nodeid, 0.0) + report.duration
    if call.when != "teardown" or not report.passed:
        return
    spent = _spent.pop(item.nodeid, 0.0)
    since, stat = _started.pop(item.nodeid, (time.monotonic(), ""))
    load = _load.mean(since)
    cores = _cores() * (1 - stolen(stat, _read("/proc/stat"))) if stat else _cores()
    alone = core_seconds(spent, load, cores)
    if alone > LIMIT_S / 2:  # the closest to the limit, listed at the end of the run (on the xdist controller)
        report.user_properties.append(("core_s", (alone, spent, load, slow_reason(item) is not None)))
    if alone > LIMIT_S and slow_reason(item) is None and _failing():
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {spent:.0f} s under a load of {load:.1f} on {cores:.1f} cores: {alone:.0f} s of a core's "
            f"time, over the {LIMIT_S:.0f} s limit (tests/speed_guard.py): make it shorter (fewer steps, one cluster job "
            f"for several assertions, a faster tier) or mark it @pytest.mark.slow(reason=...), at most {MAX_SLOW} tests"
        )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == "core_s" and report.when == "teardown":
            _over.append((*value, report.nodeid))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _over:
        return
    terminalreporter.section(f"the tests closest to the {LIMIT_S:.0f} s limit of a core's time (tests/speed_guard.py)")
    for alone, wall, load, slow, nodeid in sorted(_over, reverse=True)[:10]:
        verdict = "marked slow" if slow else "OVER" if alone > LIMIT_S else ""
        terminalreporter.write_line(f"{alone:5.0f} s  ({wall:5.0f} s at load {load:4.1f})  {verdict:11}  {nodeid}")
