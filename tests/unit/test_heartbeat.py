"""The rank's side of hang detection: its heartbeat file, and its answer to the watchdog's request."""

from __future__ import annotations

import json
import time

from hpc_train.runtime.lifecycle.heartbeat import FAST_POLL_S, QUIET_S, REQUEST, Heartbeat, dump_folder


def wait_for(condition, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_training_rank_writes_its_steps_and_answers_at_its_own_pace(tmp_path):
    dumps = dump_folder(tmp_path, 1)
    beat = Heartbeat(tmp_path / "heartbeats", 3, 1, dumps, poll_s=0.2)
    try:
        beat.beat()
        beat.beat()
        path = tmp_path / "heartbeats" / "rank-3.json"
        assert wait_for(lambda: json.loads(path.read_text())["steps"] == 2, 10)
        assert json.loads(path.read_text())["state"] == "training"
    finally:
        beat.close()


def test_a_quiet_rank_answers_the_request_without_waiting_out_its_poll(tmp_path):
    dumps = dump_folder(tmp_path, 1)
    dumps.mkdir(parents=True)
    # a poll far longer than the test: only the quiet rank's quick look can answer in time
    beat = Heartbeat(tmp_path / "heartbeats", 0, 1, dumps, poll_s=3600)
    try:
        beat.at = time.time() - QUIET_S - 1  # its last step long ago: it waits in a collective, or is stuck
        (dumps / REQUEST).touch()
        assert wait_for((dumps / "rank-0.txt").exists, QUIET_S + 5)  # an hour with the regular poll
        text = (dumps / "rank-0.txt").read_text()
        assert text.startswith("rank 0 on ") and "hpc_train-heartbeat" not in text.splitlines()[0]
        assert "Thread" in text or "Current thread" in text  # faulthandler's stacks of every thread
        assert not list(dumps.glob(".*.tmp"))  # written aside and renamed: never seen half-written
    finally:
        beat._closed.set()


def test_a_rank_with_long_steps_is_not_quiet_between_them(tmp_path):
    beat = Heartbeat(tmp_path / "heartbeats", 0, 1, dump_folder(tmp_path, 1), poll_s=2.0)
    beat.close()  # its thread stopped: the test drives the decision itself
    now = time.time()
    beat.at, beat._seen_at = now - 6, now - 14  # steps 8 s apart, the last 6 s ago
    assert beat._next_wait() > 1.0  # not quiet (quiet after 3 x 8 s): the regular poll
    beat.at = beat._seen_at = now - 30  # nothing for 30 s
    assert beat._next_wait() == FAST_POLL_S  # quiet: looks often
