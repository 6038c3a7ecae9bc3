"""The CPU a test spends in the pytest worker itself, for tools/test_cpu.py's per-test report: its sampler sees
only the processes a test starts, and an in-process test starts none. Active under make test's
HPC_TRAIN_TEST_CPU=1 (tools/make_test.sh names the file); otherwise nothing is measured or written."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    out = os.environ.get("HPC_TRAIN_TEST_CPU_INPROC")
    start = time.process_time()
    try:
        return (yield)
    finally:
        if out:  # one short line per test, appended: the workers' lines do not interleave
            with open(out, "a") as f:
                f.write(json.dumps([item.nodeid, round(time.process_time() - start, 3)]) + "\n")
