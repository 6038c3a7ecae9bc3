"""Reading --profile's output on the login side: traces found by run and rank, self times from the nesting of
spans on each thread, communication told apart from compute (on the device's time when there is a GPU)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from hpc_train.jobs import traces


def span(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}


def write_trace(path: Path, events: list[dict], gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"schemaVersion": 1, "traceEvents": [{"ph": "M", "name": "process_name", "pid": 7}, *events]})
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


CPU_STEP = [
    span("ProfilerStep#7", 0, 1000, cat="user_annotation"),
    span("aten::linear", 10, 300),  # its children take 250: self 50
    span("aten::addmm", 20, 200),
    span("aten::t", 230, 50),
    span("c10d::allreduce_", 400, 100),
    span("gloo:all_reduce", 400, 400, cat="user_annotation", tid=2),  # the collective on its own thread
    span("DistributedDataParallel.forward", 5, 500, cat="user_annotation"),  # not an operator: no effect
]


def test_self_time_is_a_span_less_its_direct_children_on_its_thread():
    own = {e["name"]: t for e, t in traces.self_times(CPU_STEP)}
    assert own == {"aten::linear": 50, "aten::addmm": 200, "aten::t": 50, "c10d::allreduce_": 100, "gloo:all_reduce": 400}


def test_a_cpu_trace_splits_operator_self_time_into_communication_and_compute(tmp_path):
    path = write_trace(tmp_path / "rank-0.1.pt.trace.json", CPU_STEP)
    s = traces.summarize_trace(path)
    assert s["steps"] == [7] and s["basis"] == "CPU operators"
    assert (s["comm_ms"], s["compute_ms"], s["comm_share"]) == (0.5, 0.3, 0.625)


def test_on_a_gpu_the_split_is_the_kernels_time(tmp_path):
    events = [
        span("aten::mm", 0, 50),
        span("ampere_sgemm_128x64_nn", 100, 300, cat="kernel", tid=20),
        span("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 400, 100, cat="kernel", tid=21),
        span("Memcpy HtoD (Pageable -> Device)", 500, 100, cat="gpu_memcpy", tid=20),
    ]
    s = traces.summarize_trace(write_trace(tmp_path / "rank-0.1.pt.trace.json", events))
    assert s["basis"] == "GPU kernels" and s["comm_share"] == 0.2 and "aten::mm" not in s["operators"]


def test_the_job_folders_profiles_by_run_and_rank_and_the_newest_runs_top_operators(tmp_path):
    profile = tmp_path / "profile"
    write_trace(profile / "run-1" / "rank-0.5.pt.trace.json", CPU_STEP)
    write_trace(profile / "run-2" / "rank-0.6.pt.trace.json", CPU_STEP, gz=False)
    write_trace(profile / "run-2" / "rank-3.6.pt.trace.json.gz", [*CPU_STEP, span("aten::t", 900, 50)], gz=True)
    (profile / "run-2" / "rank-3.nsys-rep").write_bytes(b"\0")
    (profile / "run-2" / "rank-4.9.pt.trace.json").write_text('{"traceEvents": [')  # cut short
    (profile / "run-2" / "notes.txt").write_text("")
    s = traces.summary(tmp_path, top=3)
    assert s is not None
    assert [(t["run"], t["rank"]) for t in s["traces"]] == [(1, 0), (2, 0), (2, 3)]
    assert s["nsys"] == [{"path": str(profile / "run-2" / "rank-3.nsys-rep"), "run": 2, "rank": 3}]
    assert s["top_of"] == {"run": 2, "ranks": [0, 3], "basis": "CPU operators"}
    # per step of one rank: run 2 has two ranks of one step each
    assert s["top"][0] == {"name": "gloo:all_reduce", "self_ms_per_step": 0.4, "calls_per_step": 1.0}
    assert [op["name"] for op in s["top"]] == ["gloo:all_reduce", "aten::addmm", "c10d::allreduce_"]
    assert len(s["problems"]) == 1 and "rank-4.9.pt.trace.json: not readable" in s["problems"][0]
    text = "\n".join(traces.format_lines(s))
    assert "run 2 rank 3: step 7, communication 58.8%, compute 41.2% of CPU operators' self time" in text
    assert "Nsight Systems report" in text and "gloo:all_reduce" in text


def test_no_profile_folder_is_no_profile_section(tmp_path):
    assert traces.summary(tmp_path) is None
