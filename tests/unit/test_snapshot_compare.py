"""A job resuming a checkpoint with code other than the code that saved it is told which files differ, before
it is queued; the same code, or a checkpoint that does not say, passes silently. Real snapshots, a real
checkpoint folder as the runtime commits one, the real ``render``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hpc_train import contract
from hpc_train.snapshot.compare import changed_files, resume_warning
from hpc_train.snapshot.take import take
from tests.conftest import REPO, write

MB = 1 << 20


def checkpoint(folder: Path, code: str | None) -> Path:
    step = folder / "step-20"
    loader = {"dataset": 64, "batch_size": 4, "dp": 1, "global_batch": 4, "drop_last": False, "shuffle": True, "seed": 0}
    shape = {"world_size": 1, "backend": "torchrun", "layout": None, "dp": 1, "pp": 1, "state": "replicated", "reshard": None}
    write(step / "shape.json", json.dumps({**shape, "loaders": [loader], "code": code}))
    write(step / contract.COMMIT, "")
    return folder


def test_the_files_that_changed_since_the_checkpoint_are_named(tmp_path):
    script = write(tmp_path / "proj" / "train.py", "print(1)\n")
    write(tmp_path / "proj" / "model.py", "W = 1\n")
    write(tmp_path / "proj" / "data.py", "D = 1\n")
    before = take(str(script), str(tmp_path / "jobs"), MB, with_provenance=False)
    write(tmp_path / "proj" / "model.py", "W = 2\n")
    (tmp_path / "proj" / "data.py").unlink()
    write(tmp_path / "proj" / "loss.py", "L = 1\n")
    after = take(str(script), str(tmp_path / "jobs"), MB, with_provenance=False)
    assert changed_files(Path(before.tree), Path(after.tree)) == ["data.py", "loss.py", "model.py"]
    ckpt = checkpoint(tmp_path / "ckpt", before.tree)
    warning = resume_warning(str(ckpt), after)
    assert warning is not None and "data.py, loss.py, model.py changed since" in warning and after.digest[:12] in warning
    assert resume_warning(str(ckpt), before) is None  # the same code
    assert resume_warning(str(checkpoint(tmp_path / "old", None)), after) is None  # saved in place: nothing to say
    gone = checkpoint(tmp_path / "gone", str(tmp_path / "jobs" / "snapshots" / "trees" / "0123456789abcdef"))
    assert "which is gone from its store" in (resume_warning(str(gone), after) or "")


def test_render_warns_before_a_resume_with_other_code(tmp_path):
    script = write(tmp_path / "proj" / "train.py", "print(1)\n")
    saved = take(str(script), str(tmp_path / "jobs"), MB, with_provenance=False)
    write(tmp_path / "proj" / "train.py", "print(2)\n")
    ckpt = checkpoint(tmp_path / "ckpt", saved.tree)
    args = ["render", "--site", "local", "--job-root", str(tmp_path / "jobs"), "--resume-from", str(ckpt), str(script)]
    out = subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "warning: <job>: resume_from:" in out.stderr and "other code: train.py changed since" in out.stderr
