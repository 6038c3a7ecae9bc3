"""The speed guard's measure (tests/speed_guard.py): a test's wall time as a core's time, by the machine's load."""

from __future__ import annotations

import threading
import time

import pytest

from tests import speed_guard


@pytest.mark.parametrize(
    ("wall", "load", "cores", "alone"),
    [
        (70.0, 0.5, 2, 70.0),  # an idle machine: the wall time is the test's own
        (70.0, 2.0, 2, 70.0),  # every core busy, none shared
        (120.0, 8.0, 2, 30.0),  # four runnable tasks a core: a quarter of one
        (268.0, 6.0, 2, 268.0 / 3),
    ],
    ids=["idle", "every-core-busy", "four-a-core", "three-a-core"],
)
def test_a_test_s_time_is_scaled_by_the_share_of_a_core_it_had(wall, load, cores, alone):
    assert speed_guard.core_seconds(wall, load, cores) == pytest.approx(alone)


def test_the_guard_fails_by_default_and_only_lists_when_asked(monkeypatch):
    monkeypatch.delenv("HPC_TRAIN_SPEED_GUARD", raising=False)
    assert speed_guard._failing()
    monkeypatch.setenv("HPC_TRAIN_SPEED_GUARD", "warn")
    assert not speed_guard._failing()


def test_the_load_is_the_runnable_tasks_but_the_reader():
    assert speed_guard.runnable("6.10 7.02 6.55 9/812 4711\n") == 8
    assert speed_guard.runnable("0.00 0.01 0.05 1/90 12\n") == 0


def test_the_hypervisor_s_steal_is_taken_off_the_cores():
    before = "cpu  1000 0 200 500 10 0 5 100 0 0"
    after = "cpu  1250 0 250 600 10 0 5 200 0 0"  # 100 of the 500 ticks in between stolen
    assert speed_guard.stolen(before, after) == pytest.approx(0.2)
    assert speed_guard.stolen(before, before) == 0.0
    # a test of milliseconds: 3 ticks, all stolen, is noise, not a machine without cores
    assert speed_guard.stolen(before, "cpu  1000 0 200 500 10 0 5 103 0 0") == 0.0
    assert speed_guard.core_seconds(0.004, 0.0, 0.0) == 0.004  # and no share at all divides nothing


def test_a_test_s_load_is_the_mean_of_the_samples_taken_while_it_ran():
    load = speed_guard._Load()
    now = time.monotonic()
    load.samples.extend([(now - 100, 20), (now - 10, 4), (now - 5, 8), (now, 6)])
    assert load.mean(now - 30) == pytest.approx(6.0)  # not the sample before it started
    assert load.mean(now + 1) == 0.0  # none taken: the wall time counts whole


def test_the_sampler_reads_this_machine_s_load():
    load = speed_guard._Load()
    load.start()
    deadline = time.monotonic() + 5
    while not load.samples and time.monotonic() < deadline:
        time.sleep(0.05)
    assert load.samples and load.samples[0][1] >= 0


def test_the_mean_is_read_while_the_sampler_appends():
    """The sampler thread appends while a test's end reads the mean: make test-unit beside x77 died of
    'deque mutated during iteration' (an INTERNALERROR of its worker)."""
    load = speed_guard._Load()
    done = threading.Event()

    def append() -> None:
        while not done.is_set():
            load.add(time.monotonic(), 3)

    writer = threading.Thread(target=append)
    writer.start()
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert load.mean(0.0) == 3.0 or not load.samples
    finally:
        done.set()
        writer.join()
