"""Who is behind in a hang, and which node a crash points at (hpc_train.runtime.supervise.hang_report)."""

from __future__ import annotations

import faulthandler
import threading

from hpc_train.runtime.supervise.hang_report import behind, cpu_seconds, first_failures, main_stack, waiting

WAITING_STACK = """Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/site/hpc_train/runtime/lifecycle/heartbeat.py", line 90 in _loop

Current thread 0x00007f02 (most recent call first):
  File "/site/hpc_train/runtime/lifecycle/heartbeat.py", line 120 in _dump

Thread 0x00007f00 (most recent call first):
  File "/site/torch/autograd/graph.py", line 824 in _engine_run_backward
  File "/site/torch/_tensor.py", line 630 in backward
  File "/jobs/train.py", line 50 in main
  File "/jobs/train.py", line 80 in <module>
"""
SLEEPING_STACK = """Thread 0x00007f00 (most recent call first):
  File "/jobs/train.py", line 44 in main
  File "/jobs/train.py", line 80 in <module>
"""


def beat(rank: int, host: str, steps: int = 120, state: str = "training", at: float = 100.0, error: str | None = None):
    return {"rank": rank, "host": host, "steps": steps, "state": state, "at": at, "error": error}


def test_the_main_thread_is_the_one_that_runs_the_module():
    frames = main_stack(WAITING_STACK)
    assert frames[0].endswith("in _engine_run_backward") and frames[-1].endswith("in <module>")
    assert waiting(frames) and not waiting(main_stack(SLEEPING_STACK))


def test_a_real_dump_names_the_main_thread_among_others(tmp_path):
    done = threading.Event()
    helper = threading.Thread(target=done.wait)
    helper.start()
    with open(tmp_path / "dump.txt", "w+") as out:
        faulthandler.dump_traceback(out, all_threads=True)
    done.set()
    helper.join()
    text = (tmp_path / "dump.txt").read_text()
    frames = main_stack(text)
    assert text.count("hread 0x") >= 2 and any("test_a_real_dump_names_the_main_thread" in f for f in frames)
    assert not any(f.endswith("in wait") for f in frames[:1])  # the helper's stack is not the main one


def test_fewer_steps_than_the_others_is_behind():
    beats = {0: beat(0, "n1", 121), 1: beat(1, "n2", 120), 2: beat(2, "n3", 121)}
    [culprit] = behind(beats, 3, {})
    assert (culprit.rank, culprit.host) == (1, "n2") and "step 120" in culprit.reason and "121" in culprit.reason


def test_a_rank_that_never_beat_is_behind():
    [culprit] = behind({0: beat(0, "n1")}, 2, {})
    assert culprit.rank == 1 and "never started" in culprit.reason


def test_with_equal_steps_the_rank_that_does_not_answer_is_behind():
    beats = {0: beat(0, "n1"), 1: beat(1, "n2")}
    [culprit] = behind(beats, 2, {0: WAITING_STACK})
    assert culprit.rank == 1 and "did not answer" in culprit.reason


def test_with_equal_steps_the_rank_outside_the_collective_is_behind():
    beats = {0: beat(0, "n1"), 1: beat(1, "n2"), 2: beat(2, "n3")}
    [culprit] = behind(beats, 3, {0: WAITING_STACK, 1: SLEEPING_STACK, 2: WAITING_STACK})
    assert culprit.rank == 1 and "not inside the collective" in culprit.reason
    assert culprit.top[0].endswith("line 44 in main")


def test_when_everyone_waits_nobody_is_named():
    beats = {0: beat(0, "n1"), 1: beat(1, "n2")}
    assert behind(beats, 2, {0: WAITING_STACK, 1: WAITING_STACK}) == []


def test_a_crash_on_one_node_names_it_not_the_peers_that_lost_it():
    beats = {
        0: beat(0, "n1", state="failed", at=100.2, error="DistBackendError: Connection closed by peer"),
        1: beat(1, "n2", state="failed", at=100.0, error="RuntimeError: CUDA error: uncorrectable ECC error"),
        2: beat(2, "n3", state="failed", at=100.3, error="RuntimeError: [../gloo/transport] Connection reset"),
    }
    [culprit] = first_failures(beats)
    assert (culprit.rank, culprit.host) == (1, "n2") and "ECC" in culprit.reason


def test_a_bug_on_every_rank_names_no_node():
    beats = {r: beat(r, f"n{r + 1}", state="failed", at=100.0 + r / 10, error="KeyError: 'lr'") for r in range(3)}
    assert first_failures(beats) == []


def test_no_failure_names_no_node():
    assert first_failures({0: beat(0, "n1"), 1: beat(1, "n2", state="finishing")}) == []


def test_a_lone_host_is_not_blamed_for_its_own_job():
    beats = {0: beat(0, "n1", state="failed", at=1.0, error="RuntimeError: x"), 1: beat(1, "n1", at=2.0)}
    assert first_failures(beats) == []


def _record(*entries: tuple[str, int, str]) -> dict:
    return {
        "entries": [
            {"process_group": [group, "pg"], "collective_seq_id": seq, "profiling_name": name, "is_p2p": False}
            for group, seq, name in entries
        ]
    }


def test_the_flight_recorder_names_ranks_behind_in_one_process_group():
    from hpc_train.runtime.supervise.hang_report import behind_in_collectives

    flight = {
        0: _record(("0", 41, "nccl:all_reduce"), ("1", 7, "nccl:all_gather")),
        1: _record(("0", 41, "nccl:all_reduce"), ("1", 6, "nccl:all_gather")),
        2: _record(("0", 41, "nccl:all_reduce")),
    }  # not in group 1 at all: not compared there
    assert behind_in_collectives(flight) == {
        1: "has not entered collective #7 (nccl:all_gather, process group 1) that the others wait in; its last was #6"
    }


def test_equal_flight_records_or_point_to_point_only_name_nobody():
    from hpc_train.runtime.supervise.hang_report import behind_in_collectives

    assert behind_in_collectives({0: _record(("0", 9, "a")), 1: _record(("0", 9, "a"))}) == {}
    p2p = {"entries": [{"process_group": ["0", "pg"], "collective_seq_id": 0, "is_p2p": True, "p2p_seq_id": 3}]}
    assert behind_in_collectives({0: p2p, 1: _record(("0", 2, "a"))}) == {}
    assert behind_in_collectives({}) == {}


def test_a_dump_says_the_cpu_its_process_had_used():
    header = "rank 1 on n2 (pid 77), 0 steps this run, last at 03:20:23, cpu 12.500 s\n"
    assert cpu_seconds(header + SLEEPING_STACK) == 12.5
    assert cpu_seconds("rank 1 on n2 (pid 77), 0 steps this run, last at 03:20:23\n" + SLEEPING_STACK) is None  # older ranks
    assert cpu_seconds(SLEEPING_STACK) is None  # py-spy's, read from outside
