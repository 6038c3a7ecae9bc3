"""Writes tests/SCENARIOS.md's list from the suite itself: one line per collected test, what it asserts
(its docstring's first sentence, else its name in words) and where it runs (which make target).

    python -m pytest tests -p tests.scenarios --collect-only -q      # prints the list to stdout

The tier comes from the markers: `soak` runs in `make soak`, `gpu` in `make test-gpu`, the rest in
`make test` (`unit` ones also in `make test-unit`). test_scenarios.py checks that every line of the
list in SCENARIOS.md is still collected, so a scenario cannot be dropped by deleting its test.
"""

from __future__ import annotations

import inspect
import re

import pytest

HEADER = "| test | tier | what it checks |\n|---|---|---|"


def tier(item: pytest.Item) -> str:
    if item.get_closest_marker("soak"):
        return "soak"
    if item.get_closest_marker("gpu") or item.nodeid.startswith("tests/gpu/"):
        return "gpu"
    if item.nodeid.startswith("tests/unit/"):
        return "unit"
    return "cluster" if item.nodeid.startswith(("tests/e2e/", "tests/cluster/")) else "backends"


def what(item: pytest.Item) -> str:
    function = getattr(item, "function", None)
    doc = inspect.getdoc(function) if function is not None else None
    if doc:
        text = " ".join(doc.split("\n\n")[0].split())
    else:
        text = re.sub(r"^test_", "", getattr(item, "originalname", item.name)).replace("_", " ")
    params = getattr(item, "callspec", None)
    if params is not None:
        text += f" [{params.id}]"
    return text.replace("|", "\\|")


def lines(items: list[pytest.Item]) -> list[str]:
    return [f"| `{item.nodeid}` | {tier(item)} | {what(item)} |" for item in items]


def pytest_collection_finish(session: pytest.Session) -> None:
    print("\n" + HEADER)
    for line in lines(session.items):
        print(line)
