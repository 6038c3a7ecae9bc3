"""What keeps `make test` fast: a test that runs over LIMIT_S and is not marked
``@pytest.mark.slow(reason="...")`` (at most MAX_SLOW of those, each saying why it cannot be shorter) is
listed at the end of the run, or fails under HPC_TRAIN_SPEED_GUARD=fail.

A test over the limit is a design question (one cluster job per situation, fewer steps, a faster tier), not
a timing one. It only warns by default: under make test's four workers on two cores a test's time varies up
to 5x with the machine's load (46 s and 268 s for the same test in two runs), and a limit that fails on load
alone is a flake. The time counted is the test's own set-up, call and tear-down; the first test of a worker
to use the cluster is not charged for starting it.
"""

from __future__ import annotations

import os

import pytest

LIMIT_S = 60.0
MAX_SLOW = 5

_spent: dict[str, float] = {}
_over: list[str] = []


def _failing() -> bool:
    return os.environ.get("HPC_TRAIN_SPEED_GUARD", "warn") == "fail"


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
    if call.when == "setup" and any(name in getattr(item, "fixturenames", ()) for name in _SESSION_FIXTURES):
        _spent[item.nodeid] = 0.0  # the first user of the cluster pays its start: not the test's time
        if not getattr(item.session, "_hpc_cluster_charged", False):
            item.session._hpc_cluster_charged = True  # type: ignore[attr-defined]
            return
    _spent[item.nodeid] = _spent.get(item.nodeid, 0.0) + report.duration
    if call.when != "teardown" or not report.passed:
        return
    spent = _spent.pop(item.nodeid, 0.0)
    if spent > LIMIT_S and slow_reason(item) is None:
        if not _failing():
            report.user_properties.append(("over_limit_s", spent))  # reaches the xdist controller with the report
            return
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {spent:.0f} s, over the {LIMIT_S:.0f} s limit (tests/speed_guard.py): make it shorter "
            f"(fewer steps, one cluster job for several assertions, a faster tier) or mark it "
            f"@pytest.mark.slow(reason=...), at most {MAX_SLOW} tests"
        )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == "over_limit_s" and report.when == "teardown":
            _over.append(f"{value:5.0f} s  {report.nodeid}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _over and not _failing():
        terminalreporter.section(f"over the {LIMIT_S:.0f} s limit, not marked slow (tests/speed_guard.py)")
        for line in _over:
            terminalreporter.write_line(line)
