"""Replicated state saved in shares, one per rank: real gloo (torchrun) and MPI ranks, real files.

Each multi-process test starts 2 ranks that train a small model and save; a fresh world (of 2, or of
1 process) restores it and must find the very same parameters and optimizer state.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpc_train import contract
from hpc_train.resume_shape import SHAPE
from hpc_train.runtime.checkpoint import shares as shard_save
from hpc_train.runtime.checkpoint.manager import COMMIT, STATE_FILE
from tests.conftest import REPO, free_port
from tests.rank_launcher import World, run_world
from tests.unit.test_checkpoint import make, tiny_filesystem  # noqa: F401  (a fixture)

TORCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


SCRIPT = """\
import json, sys, time
from pathlib import Path
import torch
from hpc_train.runtime.context import init
from hpc_train.runtime.checkpoint.manager import CheckpointError

folder, backend, spec = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
ctx = init(backend)
torch.manual_seed(0)
width = spec.get("width", 64)
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
if spec.get("table"):  # a buffer larger than one rank's share of the state: written in pieces
    model[0].register_buffer("table", torch.arange(float(spec["table"])))
model, opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
ckpt = ctx.checkpointer(spec.get("ckpt") or folder / "ckpt", every=spec.get("every", 0), keep=spec.get("keep", 2),
                        async_save=spec.get("async", False))
ckpt.writers = spec.get("writers")
state = lambda: {"params": [p.detach().reshape(-1).tolist() for p in ctx.unwrap(model).parameters()],
                 "momentum": [v["momentum_buffer"].reshape(-1).tolist() for v in opt.state_dict()["state"].values()],
                 "buffers": [b.reshape(-1).tolist() for b in ctx.unwrap(model).buffers()]}
out = {"rank": ctx.rank}
if spec["mode"] == "train":
    for step in range(1, spec["steps"] + 1):
        torch.manual_seed(step)
        ctx.backward(model(torch.randn(8, width)).pow(2).mean())
        ctx.step()
        try:
            ckpt.step(step)
        except CheckpointError as exc:
            out["error"] = str(exc)
            break
        if step == spec["steps"]:
            out["saved"] = state()
            with torch.no_grad():  # the background writer must have copied the state already
                for p in model.parameters():
                    p.zero_()
    ckpt.close()
elif spec["mode"] == "forever":
    (folder / f"pid{ctx.rank}").write_text(str(__import__("os").getpid()))
    for step in range(1, 100000):
        ckpt.save(step)
else:
    out["step"] = ckpt.restore()
    out["restored"] = state()
(folder / f"rank{ctx.rank}-{spec['mode']}.json").write_text(json.dumps(out))
ctx.shutdown()
"""


def command(tmp_path: Path, spec: dict, backend: str = "torchrun", ranks: int = 2) -> tuple[list[str], dict[str, str]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    environ = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "PYTHONPATH": str(REPO),
        contract.ENV_STOP_FILE: str(tmp_path / "no-stop-file"),
        contract.ENV_NO_RETRY_FILE: str(tmp_path / contract.NO_RETRY),
    }
    for name in (*TORCH_ENV, contract.ENV_JOB_FOLDER, contract.ENV_METRICS, contract.ENV_LAUNCHER, "SLURM_JOB_ID"):
        environ.pop(name, None)
    args = [str(script), str(tmp_path), backend, json.dumps(spec)]
    if backend != "torchrun":  # mpi, horovod
        return ["mpirun", "--oversubscribe", "-np", str(ranks), sys.executable, *args], environ
    return args, environ  # the ranks forked as torchrun's launch without an agent starts them (rank_launcher)


def run(tmp_path: Path, spec: dict, backend: str = "torchrun", ranks: int = 2) -> list[dict]:
    args, environ = command(tmp_path, spec, backend, ranks)
    if backend == "torchrun":
        done = run_world(args, environ, REPO, nproc=ranks, timeout=240, out_dir=tmp_path / "out")
    else:
        done = subprocess.run(args, cwd=REPO, env=environ, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}-{spec['mode']}.json").read_text()) for r in range(ranks)]


def committed_files(folder: Path) -> dict[str, int]:
    return json.loads((folder / COMMIT).read_text())["files"]


# -- the split, in one process ---------------------------------------------------------------------------
def test_tensors_are_split_into_shares_of_about_equal_bytes():
    sizes = [400, 300, 300, 200, 100, 100, 1]
    owners = shard_save.assign(sizes, 3)
    load = [sum(s for s, o in zip(sizes, owners) if o == r) for r in range(3)]
    assert sorted(load) == [401, 500, 500] and owners[0] != owners[1]  # within one tensor of even
    assert shard_save.assign(sizes, 1) == [0] * len(sizes)


def test_a_skeleton_filled_from_the_shares_is_the_state_again():
    state = {"model": {"w": torch.arange(6.0).view(2, 3), "b": torch.ones(2)}, "opt": [{"lr": 0.1, "t": torch.zeros(1)}]}
    found = shard_save.tensors(state)
    bones = shard_save.skeleton(state)
    assert bones["model"]["w"] == {shard_save.PLACEHOLDER: 0} and bones["opt"][0]["lr"] == 0.1
    back = shard_save.fill(bones, dict(enumerate(found)))
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and torch.equal(back["opt"][0]["t"], torch.zeros(1))
    structure = shard_save.split(state, 1, 2).fingerprint
    other = {"model": {"w": torch.zeros(3, 2), "b": torch.ones(2)}, "opt": [{"t": torch.zeros(1)}]}
    assert shard_save.split(other, 1, 2).fingerprint != structure  # a different shape: not the same split


def write_shares(folder: Path, state: dict, ranks: int) -> list[int]:
    """Every rank's share of ``state`` written as a checkpoint would; each rank's bytes, in rank order."""
    splits = [shard_save.split(state, r, ranks) for r in range(ranks)]
    names = [shard_save.shard_name(r) for r in splits[0].writers]
    payload = {"runtime": shard_save.skeleton(state), shard_save.SHARDS: names, shard_save.PIECES: splits[0].pieces}
    torch.save(payload, folder / STATE_FILE)
    for r, found in enumerate(splits):
        if found.mine:
            shard_save.write_file(folder / shard_save.shard_name(r), found.mine, "sha256")
    return [sum(shard_save.nbytes(t) for t in found.mine.values()) for found in splits]


def read_back(folder: Path) -> dict:
    return shard_save.assemble(torch.load(folder / STATE_FILE, weights_only=True), folder)["runtime"]


def test_every_rank_together_writes_the_whole_state_once(tmp_path):
    state = {"model": {"w": torch.arange(6.0).view(2, 3), "b": torch.ones(2)}, "opt": [{"lr": 0.1, "t": torch.zeros(1)}]}
    write_shares(tmp_path, state, 2)
    back = read_back(tmp_path)
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and back["opt"][0]["lr"] == 0.1


def test_a_tensor_larger_than_one_share_is_cut_so_every_rank_writes_about_as_much(tmp_path):
    # an embedding table of 80 % of the state: whole, one rank would write 4/5 of it and the others wait
    table = torch.randn(200, 40, dtype=torch.float64)
    state = {"emb": table, "head": torch.randn(50, 40, dtype=torch.float64), "step": torch.tensor(3)}
    loads = write_shares(tmp_path, state, 4)
    total = sum(shard_save.nbytes(t) for t in shard_save.tensors(state))
    assert max(loads) <= 1.1 * total / 4 and sum(loads) == total, loads
    pieces = shard_save.split(state, 0, 4).pieces
    assert list(pieces) == [0] and pieces[0][0] == [200, 40] and 4 <= pieces[0][1] <= 5  # the table cut; the head fits
    back = read_back(tmp_path)
    assert torch.equal(back["emb"], table) and back["emb"].shape == (200, 40) and back["step"] == 3
    # each piece is written without the table's whole storage
    assert max(p.stat().st_size for p in tmp_path.glob("shard-*.pt")) < 0.4 * table.numel() * 8


def test_a_view_is_written_without_its_whole_buffer(tmp_path):
    big = torch.zeros(1_000_000)
    mine = shard_save.split({"w": big[:10]}, 0, 1).mine
    size, _ = shard_save.write_file(tmp_path / "s.pt", mine, "sha256")
    assert size < 10_000  # not the 4 MB storage the view points into


# -- real ranks ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["torchrun", *(pytest.param(b, marks=pytest.mark.frameworks) for b in ("horovod", "mpi"))])
def test_every_rank_writes_its_share_and_any_world_size_restores_it(tmp_path, backend):
    ranks = run(tmp_path, {"mode": "train", "steps": 4, "every": 4}, backend)
    path = tmp_path / "ckpt" / "step-00000004"
    files = committed_files(path)
    assert set(files) == {STATE_FILE, SHAPE, "shard-00000.pt", "shard-00001.pt"}
    assert files[STATE_FILE] < min(files["shard-00000.pt"], files["shard-00001.pt"])  # the tensors are in the shards
    assert abs(files["shard-00000.pt"] - files["shard-00001.pt"]) < 0.5 * files["shard-00000.pt"]
    two = run(tmp_path, {"mode": "restore"}, backend)
    # a world of 1 reads both shares (once: the other backends read them the same way)
    one = run(tmp_path, {"mode": "restore"}, backend, ranks=1) if backend == "torchrun" else []
    for restored in (*two, *one):
        assert restored["step"] == 4 and restored["restored"] == ranks[0]["saved"]


def test_an_async_sharded_save_writes_the_state_of_its_step(tmp_path):
    saved = run(tmp_path, {"mode": "train", "steps": 6, "every": 3, "async": True, "width": 256})
    assert saved[0]["saved"] == saved[1]["saved"]
    # the parameters were zeroed right after step 6's save started: the shares hold step 6, not zeros
    restored = run(tmp_path, {"mode": "restore", "width": 256})
    assert all(r["step"] == 6 and r["restored"] == saved[0]["saved"] for r in restored)
    assert {"shard-00000.pt", "shard-00001.pt"} <= set(committed_files(tmp_path / "ckpt" / "step-00000006"))


def test_an_async_save_of_a_tensor_larger_than_a_share_writes_it_in_pieces_and_restores_it(tmp_path):
    saved = run(tmp_path, {"mode": "train", "steps": 3, "every": 3, "async": True, "table": 100_000})
    files = committed_files(tmp_path / "ckpt" / "step-00000003")
    shares = [files[name] for name in ("shard-00000.pt", "shard-00001.pt")]
    assert abs(shares[0] - shares[1]) < 0.1 * max(shares), files  # the table in two halves, not on one rank
    restored = run(tmp_path, {"mode": "restore", "table": 100_000}, ranks=1)
    assert restored[0]["step"] == 3 and restored[0]["restored"] == saved[0]["saved"]
    assert restored[0]["restored"]["buffers"][0][-1] == 99_999.0


def test_rank_0_alone_still_writes_and_restores_the_old_way(tmp_path):
    saved = run(tmp_path, {"mode": "train", "steps": 2, "every": 2, "writers": 1})
    assert set(committed_files(tmp_path / "ckpt" / "step-00000002")) == {STATE_FILE, SHAPE}
    restored = run(tmp_path, {"mode": "restore"})
    assert all(r["step"] == 2 and r["restored"] == saved[0]["saved"] for r in restored)


def test_kill_9_during_a_sharded_save_keeps_the_previous_checkpoint(tmp_path):
    args, environ = command(tmp_path, {"mode": "forever", "width": 700, "keep": 1})
    proc = World(args, environ, REPO, tmp_path / "out", nproc=2, port=free_port())
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (
            list((tmp_path / "ckpt").glob("step-*/COMMIT")) and list((tmp_path / "ckpt").glob("step-*.tmp-*/shard-*"))
        ):
            time.sleep(0.002)
    finally:
        for pid in tmp_path.glob("pid*"):  # every rank (torchrun gives each its own session), mid-save
            os.kill(int(pid.read_text()), signal.SIGKILL)
        proc.kill()
        proc.wait()
    assert list((tmp_path / "ckpt").glob("step-*.tmp-*")), "it did not die mid-write"
    _, _, ckpt = make(tmp_path / "ckpt")  # one process checks every file of the newest committed one
    step = ckpt.complete()[0][0]
    assert step >= 1 and ckpt.verify(tmp_path / "ckpt" / f"step-{step:08d}") is None
    restored = run(tmp_path, {"mode": "restore", "width": 700})
    assert [r["step"] for r in restored] == [step, step]


def test_a_full_disk_under_shares_is_a_clear_error_on_every_rank(tiny_filesystem):  # noqa: F811
    # 4 x Linear(200, 200) with momentum: ~1.3 MB a checkpoint; the 2 MiB filesystem holds one, not two
    spec = {"steps": 2, "every": 1, "width": 200, "keep": 5, "ckpt": str(tiny_filesystem)}
    ranks = run(tiny_filesystem.parent, {**spec, "mode": "train"})  # the job's own files on a disk with room
    for rank in ranks:
        message = rank["error"]
        assert "saving step 2 failed (rank " in message and "writing its share): no space left on device" in message
        assert "checkpoint step 1 is intact" in message and "MiB free in" in message
    assert ranks[0]["error"] == ranks[1]["error"]
    assert not list(tiny_filesystem.glob("step-*.tmp-*"))  # the partial write was removed
    restored = run(tiny_filesystem.parent, {**spec, "mode": "restore"})
    assert all(r["step"] == 1 for r in restored)
