"""The rendezvous port a batch script picks (templates/sbatch/base.sh.j2's hpc_train_port), run by bash:
a block of 4 per job, the next one for each restart inside the allocation, a port in use passed over."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "sandbox-torchrun.sh"  # the renderer's output (test_renderer)


def port(job_id: int, run: int, base: int = 29500) -> int:
    text = GOLDEN.read_text()
    function = text[text.index("hpc_train_port() {") :]
    function = function[: function.index("\n}\n") + 3].replace("29500", str(base))
    out = subprocess.run(["bash", "-c", f"{function}\nhpc_train_port {run}"], env={"SLURM_JOB_ID": str(job_id)},
                         capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    return int(out.stdout)


def test_each_job_has_its_own_block_and_each_run_the_next_port_of_it():
    runs = [port(7, run) for run in range(6)]
    assert runs == [29528, 29529, 29530, 29531, 29528, 29529]
    # the next job's first port is past every port of this one's restarts (the collision seen on the sandbox)
    assert port(8, 0) == 29532 and port(507, 0) == 29528


def test_a_port_something_listens_on_is_passed_over():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        base = taken.getsockname()[1] - 7 % 500 * 4  # so that job 7's first port is the one in use
        assert port(7, 0, base) == base + 28 + 1
        assert port(7, 3, base) == base + 28 + 3  # only the port in use is skipped
