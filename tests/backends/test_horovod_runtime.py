"""The Horovod runtime's collectives, on two real Horovod processes (mpirun, CPU)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

SCRIPT = """\
import sys
from pathlib import Path
from hpc_train.runtime.context import init
ctx = init("horovod", metrics=False)
# ranks disagree on the type: one has seen the stop request, the other not yet
obj = None if ctx.rank == 0 else "stop requested"
Path(sys.argv[1], f"rank{ctx.rank}.txt").write_text(repr(ctx.runtime.gather_object(obj)))
ctx.shutdown()
"""


def test_gather_object_of_different_types_does_not_deadlock(tmp_path):
    script = tmp_path / "gather.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    out = subprocess.run(
        ["mpirun", "--oversubscribe", "-np", "2", sys.executable, str(script), str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "[None, 'stop requested']"
