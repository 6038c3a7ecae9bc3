"""The MPI runtime on two real mpirun processes: a rank that fails while the other waits in a collective."""

from __future__ import annotations

import subprocess
import sys
import time

SCRIPT = """\
import sys, time
import torch
from hpc_train.runtime.context import init

ctx = init("mpi", metrics=False)
if ctx.rank == 1:
    raise RuntimeError("rank 1 fails")
ctx.all_reduce(torch.ones(4))  # rank 0 waits here for a rank that is gone: MPI has no timeout
print("rank 0 was not stopped", flush=True)
"""


def test_a_failing_rank_aborts_the_world_instead_of_leaving_it_waiting(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(SCRIPT)
    started = time.time()
    out = subprocess.run(
        ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,  # without the abort: rank 0 in its Allreduce and rank 1 in MPI_Finalize, for ever
    )
    assert out.returncode != 0 and "rank 1 fails" in out.stderr, out.stdout + out.stderr
    assert "rank 0 was not stopped" not in out.stdout
    assert time.time() - started < 60
