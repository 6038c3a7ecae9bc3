"""The speed guard's measure (tests/speed_guard.py): a test's wall time as a core's time, by the machine's load."""

from __future__ import annotations

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


def test_the_guard_lists_by_default_and_fails_when_asked(monkeypatch):
    monkeypatch.delenv("HPC_TRAIN_SPEED_GUARD", raising=False)
    assert not speed_guard._failing()
    monkeypatch.setenv("HPC_TRAIN_SPEED_GUARD", "fail")
    assert speed_guard._failing()
