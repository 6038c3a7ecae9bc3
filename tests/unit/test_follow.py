"""Following logs: every rank prefixed, lines kept whole, a log started over read again."""

from __future__ import annotations

import io

from hpc_train.jobs.follow import _Source, print_logs, task_ranks
from hpc_train.jobs.handle import JobHandle, JobRecord


def handle_for(folder, nodes=2, procs=2, tasks=1) -> JobHandle:
    return JobHandle(
        JobRecord(
            job_id="5",
            folder=str(folder),
            scheduler="slurm",
            kind="script",
            site="s",
            backend="torchrun",
            nodes=nodes,
            procs_per_node=procs,
            tasks_per_node=tasks,
            job_name="j",
        )
    )


def test_prefix_names_the_ranks_a_task_runs():
    assert task_ranks(handle_for("/x", procs=2, tasks=1), 1) == "ranks 2-3"  # torchrun: one task per node
    assert task_ranks(handle_for("/x", procs=2, tasks=2), 3) == "rank 3"  # srun/mpirun: one task per rank


def test_a_prefixed_source_holds_back_an_unfinished_line_and_restarts_after_truncation(tmp_path):
    log = tmp_path / "log"
    log.write_text("one\ntw")
    source = _Source(log, "rank 0")
    assert source.read() == "[rank 0] one\n"
    with log.open("a") as f:
        f.write("o\n")
    assert source.read() == "[rank 0] two\n" and source.read() == ""
    log.write_text("new\n")  # shorter than what was read: the log was started over
    assert source.read() == "[rank 0] new\n"
    log.write_text("new\nlast words")
    assert source.rest() == "[rank 0] last words\n"


def test_print_logs_prefixes_every_task(tmp_path):
    handle = handle_for(tmp_path)
    (tmp_path / "5_0_log.out").write_text("hello from n1\n")
    (tmp_path / "5_1_log.out").write_text("hello from n2\n")
    out = io.StringIO()
    assert print_logs(handle, out=out) == 2
    assert out.getvalue() == "[ranks 0-1] hello from n1\n[ranks 2-3] hello from n2\n"
