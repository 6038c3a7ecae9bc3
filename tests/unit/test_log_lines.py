"""The log lines the login side reads back: what the batch script's echo lines really print (bash runs them,
as rendered by the real renderer) and what the runtime writes are read back by goodput's parser, field for
field. A template or runtime line reworded without its declaration fails here, not in a report months later."""

from __future__ import annotations

import socket
import subprocess

import pytest

from hpc_train import log_lines
from hpc_train.jobs import goodput
from tests.unit.test_renderer import render_job

SHELL_LINES = {
    log_lines.RUN_BEGINS,
    log_lines.RESTARTING,
    log_lines.REQUEUEING,
    log_lines.NOT_RETRIED,
    log_lines.BUDGET_SPENT,
    log_lines.NOT_STARTED,
}


def _printed_by_the_batch_script(plugins, tmp_path) -> list[str]:
    script = render_job(plugins, "sandbox", nodes=2, spare_nodes=1)
    echoes = [line.strip().removesuffix(">&2").strip() for line in script.splitlines() if 'echo "hpc_train: ' in line]
    why = tmp_path / "no_retry"
    why.write_text("run 3 was a restart and failed without getting past step 100")
    env = {
        "PATH": "/usr/bin:/bin",
        "HPC_TRAIN_RUN": "3",
        "SLURM_JOB_ID": "77",
        "status": "1",
        "HPC_TRAIN_MAX_RESTARTS": "2",
        "HPC_TRAIN_NO_RETRY_FILE": str(why),
    }
    done = subprocess.run(["bash", "-c", "\n".join(echoes)], env=env, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_what_the_batch_script_prints_is_read_back_field_for_field(plugins, tmp_path):
    printed = _printed_by_the_batch_script(plugins, tmp_path)
    read = {line: [decl for decl in log_lines.ALL if decl.parse(line)] for line in printed}
    for line, declared in read.items():
        if line.startswith("hpc_train: run 3 ") or "restart budget" in line:
            assert len(declared) == 1, f"{line!r} is read as {[d.name for d in declared]}"
    found = {decl for declared in read.values() for decl in declared}
    assert found >= SHELL_LINES, f"the script no longer prints {[d.name for d in SHELL_LINES - found]}"
    for line in printed:
        log = goodput.BatchLog()
        goodput.parse_log_line(line, log)
        if log_lines.RUN_BEGINS.parse(line):
            assert log.starts[3][1] == socket.gethostname() and log.starts[3][0] is not None
        elif log_lines.NOT_STARTED.parse(line):
            assert log.not_started == 3
        elif log_lines.NOT_RETRIED.parse(line):
            assert log.failures[3] == (1, "not retried: run 3 was a restart and failed without getting past step 100")
        elif any(failure.parse(line) for failure in log_lines.FAILURES):
            assert log.failures[3][0] == 1 and log.failures[3][1] in {
                "restarted inside the allocation",
                "requeued",
                "not retried: restart budget exhausted",
            }


@pytest.mark.parametrize(
    ("line", "values"),
    [
        (log_lines.SAVED, {"step": 40, "where": "/scratch/job/checkpoints/step-40"}),
        (log_lines.SAVED, {"step": 40, "where": "node-local storage (/tmp/hpc_train-local/77)"}),
        (log_lines.STOPPING, {"run": 2, "step": 120, "reason": "time limit near (SIGUSR1)"}),
    ],
    ids=["saved-shared", "saved-node-local", "stopping"],
)
def test_what_the_runtime_writes_is_read_back(line, values, capsys):
    from hpc_train.runtime.log import log

    log(line.text(**values))
    written = capsys.readouterr().err.strip()
    assert line.parse(written) == values
    batch = goodput.BatchLog()
    goodput.parse_log_line(written, batch)
    if line is log_lines.SAVED:
        assert batch.saves == {40}
    else:
        assert batch.stops[2] == (120, "time limit near (SIGUSR1)")


def test_a_line_whose_words_the_shell_would_expand_is_refused():
    with pytest.raises(ValueError, match="shell would expand"):
        log_lines.LogLine("BAD", 'run {run} "quoted"', run="int")
    with pytest.raises(ValueError, match="disagree"):
        log_lines.LogLine("BAD", "run {run} of {job}", run="int")
