"""Two real processes per backend: the per-step flags agree in one collective, and every rank
restores the same checkpoint even when only one rank's share of the files is damaged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, free_port

SCRIPT = """\
import json, sys
from pathlib import Path
import torch
from hpc_train.runtime.context import init

folder, backend = Path(sys.argv[1]), sys.argv[2]
ctx = init(backend, metrics=False)
flags = ctx.runtime.any_ranks((ctx.rank == 1, False, True, ctx.rank == 0))
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
model, optimizer = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
ckpt = ctx.checkpointer(folder / "ckpt", keep=3)
ckpt.track("blob", {"data": torch.arange(4096.0)})
ckpt.save(10)
ctx.backward(model(torch.randn(4, 8)).pow(2).mean())
ctx.step()
ckpt.save(20)
ckpt.close()
if ctx.is_main:  # 256 bytes of tensor data, same size: loads silently; only the rank checking hpc_train.pt can tell
    state = folder / "ckpt" / "step-00000020" / "hpc_train.pt"
    data = bytearray(state.read_bytes())
    at = data.index(torch.arange(4096.0).numpy().tobytes()[:64]) + 64
    data[at:at + 256] = bytes(256)
    state.write_bytes(bytes(data))
ctx.barrier()
step = ctx.checkpointer(folder / "ckpt").restore()
Path(folder, f"rank{ctx.rank}.json").write_text(json.dumps({"flags": flags, "step": step}))
ctx.shutdown()
"""


def launch(backend: str, script: str, folder: str) -> list[str]:
    if backend == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            script,
            folder,
            backend,
        ]
    return ["mpirun", "--oversubscribe", "-np", "2", sys.executable, script, folder, backend]


@pytest.mark.parametrize("backend", ["torchrun", "mpi", "horovod"])
def test_flags_agree_in_one_collective_and_ranks_restore_the_same_step(tmp_path, backend):
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        launch(backend, str(script), str(tmp_path)), cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["flags"] for r in results] == [[True, False, True, True]] * 2
    # rank 1 checked no file (two ranks, one file): alone it would have loaded step 20
    assert [r["step"] for r in results] == [10, 10], out.stderr[-3000:]
    assert "step-00000020 is unreadable (hpc_train.pt digest mismatch" in out.stderr


SHARDED = """\
import json, sys
from pathlib import Path
import torch
from hpc_train.runtime.context import init

folder = Path(sys.argv[1])
ctx = init("torchrun", metrics=False)  # HPC_TRAIN_PARALLEL: torch.distributed.checkpoint writes engine/
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
model, _ = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
ckpt = ctx.checkpointer(folder / "ckpt", keep=3)
ckpt.save(10)
ctx.backward(model(torch.randn(4, 64)).pow(2).mean())
ctx.step()
ckpt.save(20)
ckpt.close()
commit = json.loads((folder / "ckpt" / "step-00000020" / "COMMIT").read_text())
shard = max((n for n in commit["files"] if n.startswith("engine/")), key=lambda n: commit["files"][n])
path = folder / "ckpt" / "step-00000020" / shard
data = bytearray(path.read_bytes())
data[100:356] = bytes(b ^ 0xFF for b in data[100:356])
path.write_bytes(bytes(data))
step = ctx.checkpointer(folder / "ckpt").restore()
Path(folder, "result.json").write_text(json.dumps({"step": step, "shard": shard, "digests": sorted(commit["digests"])}))
ctx.shutdown()
"""


def test_files_an_engine_writes_are_digested_and_checked(tmp_path):
    script = tmp_path / "sharded.py"
    script.write_text(SHARDED)
    env = {
        **os.environ,
        "HPC_TRAIN_PARALLEL": "dp=1,tp=1,pp=1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["step"] == 10
    assert "hpc_train.pt" in result["digests"] and any(n.startswith("engine/") for n in result["digests"])
    assert f"{result['shard']} digest mismatch" in out.stderr
