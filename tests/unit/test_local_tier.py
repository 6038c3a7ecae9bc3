"""The node-local tier: real gloo ranks on two (or three) "nodes" (each with its own local folder, its
ranks started as torchrun's launch without an agent starts them: tests/rank_launcher.py), real TCP between
them, real files; shared storage is a folder they all see.

Each node's local folder is ``local/<name>``: the job's HPC_TRAIN_LOCAL_CHECKPOINT_DIR is
``.../local/$NODE_NAME``, expanded on each node as a site's ``$SLURM_TMPDIR`` would be.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from hpc_train import contract
from hpc_train.runtime.checkpoint.local import peer_copy
from hpc_train.runtime.checkpoint.local import tier as local_tier
from hpc_train.runtime.checkpoint.manager import COMMIT
from tests.conftest import REPO, free_port
from tests.rank_launcher import World
from tests.unit.test_checkpoint import tiny_filesystem  # noqa: F401  (a fixture)
from tests.unit.test_checkpoint_shares import SCRIPT, TORCH_ENV


def launch(tmp_path: Path, spec: dict, names: tuple[str, ...] = ("a", "b"), procs: int = 1, missing: str = "") -> list[World]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    port = free_port()
    started = []
    for node, name in enumerate(names):
        if name != missing:
            (tmp_path / "local" / name).mkdir(parents=True, exist_ok=True)
        environ = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
            "NODE_NAME": name,
            contract.ENV_LOCAL_CHECKPOINT_DIR: f"{tmp_path}/local/$NODE_NAME",
            contract.ENV_STOP_FILE: str(tmp_path / "no-stop-file"),
            contract.ENV_NO_RETRY_FILE: str(tmp_path / contract.NO_RETRY),
        }
        for variable in (*TORCH_ENV, contract.ENV_JOB_FOLDER, contract.ENV_METRICS, contract.ENV_LAUNCHER, "SLURM_JOB_ID"):
            environ.pop(variable, None)
        args = [str(script), str(tmp_path), "torchrun", json.dumps(spec)]
        world = World(
            args, environ, REPO, tmp_path / "out", nproc=procs, port=port, nnodes=len(names), node_rank=node, merge=True
        )
        started.append(world)
    return started


def run(
    tmp_path: Path, spec: dict, names: tuple[str, ...] = ("a", "b"), procs: int = 1, fails: bool = False, missing: str = ""
) -> tuple[list[dict], str]:
    started = launch(tmp_path, spec, names, procs, missing)
    outputs = [p.communicate(timeout=240)[0] for p in started]
    log = "\n".join(outputs)
    if fails:
        assert all(p.returncode != 0 for p in started), log[-4000:]
        return [], log
    assert all(p.returncode == 0 for p in started), log[-4000:]
    ranks = len(names) * procs
    return [json.loads((tmp_path / f"rank{r}-{spec['mode']}.json").read_text()) for r in range(ranks)], log


def node_root(tmp_path: Path, name: str) -> Path:
    """The job's folder on one node (no SLURM_JOB_ID, no job folder: the job is "job")."""
    identity = json.loads((tmp_path / "ckpt" / contract.LOCAL_TIER_ID).read_text())["id"]
    return tmp_path / "local" / name / f"hpc_train-job-{identity}"


def held(folder: Path) -> dict:
    return json.loads((folder / peer_copy.HELD).read_text())


STEP2 = "step-00000002"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two nodes of one rank each trained 2 steps and saved step 2 through the tier; its copies, kept."""
    tmp_path = tmp_path_factory.mktemp("tier")
    ranks, log = run(tmp_path, {"mode": "train", "steps": 2, "every": 2})
    return tmp_path, ranks[0]["saved"], log


def fresh_copy(saved_tmp: Path, tmp_path: Path) -> Path:
    """The saved job's local folders and shared checkpoints in a test's own folder (tests change them)."""
    for name in ("local", "ckpt"):
        shutil.copytree(saved_tmp / name, tmp_path / name)
    return tmp_path


def test_a_save_is_committed_on_each_node_its_partner_and_shared_storage(saved):
    tmp_path, _, log = saved
    a, b = node_root(tmp_path, "a"), node_root(tmp_path, "b")
    own_a, own_b = held(a / STEP2), held(b / STEP2)
    assert set(own_a["held"]) == {"hpc_train.pt", "shape.json", "shard-00000.pt"}
    assert own_b["held"] == ["shard-00001.pt"]
    # each node holds its partner's files too (node 0's partner is node 1, and back)
    assert held(b / "from-node0" / STEP2)["held"] == own_a["held"]
    assert held(a / "from-node1" / STEP2)["held"] == own_b["held"]
    assert (b / "from-node0" / STEP2 / "hpc_train.pt").read_bytes() == (a / STEP2 / "hpc_train.pt").read_bytes()
    # drained: committed on shared storage with the very digests every node recorded
    shared = json.loads((tmp_path / "ckpt" / STEP2 / COMMIT).read_text())
    assert shared["digests"] == own_a["digests"] == own_b["digests"]
    assert set(shared["files"]) == set(own_a["held"]) | set(own_b["held"])
    assert contract.newest_step(tmp_path / "ckpt") == 2
    assert "saved step 2 to node-local storage" in log and "drained step 2 to" in log


def test_a_restart_on_the_same_nodes_restores_from_their_own_disks(saved, tmp_path):
    saved_tmp, state, _ = saved
    fresh_copy(saved_tmp, tmp_path)
    shutil.rmtree(tmp_path / "ckpt" / STEP2)  # the drain never got there: only the nodes hold step 2
    ranks, log = run(tmp_path, {"mode": "restore"})
    assert [r["step"] for r in ranks] == [2, 2]
    assert all(r["restored"] == state for r in ranks)
    assert "restored step 2 from node-local storage" in log
    # with two nodes each holds its own files and its partner's: all four, on both
    assert "(8 files on their own node, 0 from other nodes, 0 from" in log
    # and the drain that was cut off is made now: step 2 is on shared storage again, with the same digests
    assert "drained step 2 to" in log
    shared = json.loads((tmp_path / "ckpt" / STEP2 / COMMIT).read_text())
    assert shared["digests"] == held(node_root(tmp_path, "a") / STEP2)["digests"]
    assert not list((tmp_path / "ckpt").glob("step-*.tmp-*"))


def test_a_restart_with_a_node_replaced_takes_its_files_from_the_partner_copy(saved, tmp_path):
    saved_tmp, state, _ = saved
    fresh_copy(saved_tmp, tmp_path)
    shutil.rmtree(tmp_path / "ckpt" / STEP2)
    ranks, log = run(tmp_path, {"mode": "restore"}, names=("a", "c"))  # b is gone; c is a new, empty node
    assert [r["step"] for r in ranks] == [2, 2]
    assert all(r["restored"] == state for r in ranks)
    # a had all four (its own and b's partner copy); c took all four from a
    assert "(4 files on their own node, 4 from other nodes, 0 from" in log
    assert set(held(node_root(tmp_path, "c") / STEP2)["held"]) == set(held(node_root(tmp_path, "a") / STEP2)["files"])


def test_with_every_node_replaced_the_shared_copy_is_restored(saved, tmp_path):
    saved_tmp, state, _ = saved
    fresh_copy(saved_tmp, tmp_path)
    ranks, log = run(tmp_path, {"mode": "restore"}, names=("c", "d"))
    assert [r["step"] for r in ranks] == [2, 2] and all(r["restored"] == state for r in ranks)
    assert "from node-local storage" not in log and f"restored step 2 from {tmp_path / 'ckpt' / STEP2}" in log


def test_a_later_job_with_a_recycled_id_does_not_restore_the_nodes_copies(saved, tmp_path):
    saved_tmp, _, _ = saved
    shutil.copytree(saved_tmp / "local", tmp_path / "local")  # the same nodes, the same job id: a new job folder
    ranks, log = run(tmp_path, {"mode": "restore"})
    assert [r["step"] for r in ranks] == [0, 0] and "from node-local storage" not in log


def test_a_damaged_node_copy_is_not_loaded_and_the_shared_copy_is(saved, tmp_path):
    saved_tmp, state, _ = saved
    fresh_copy(saved_tmp, tmp_path)
    shard = node_root(tmp_path, "b") / STEP2 / "shard-00001.pt"
    shard.write_bytes(b"x" * shard.stat().st_size)  # same size, other bytes
    ranks, log = run(tmp_path, {"mode": "restore"})
    assert [r["step"] for r in ranks] == [2, 2] and all(r["restored"] == state for r in ranks)
    assert "the node-local copies of step 2 do not load (shard-00001.pt digest mismatch" in log


def test_kill_9_during_the_partner_copy_or_drain_keeps_a_checkpoint_that_loads(tmp_path):
    started = launch(tmp_path, {"mode": "forever", "width": 400, "keep": 1})
    ckpt = tmp_path / "ckpt"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (list(ckpt.glob("step-*/COMMIT")) and list(ckpt.glob("step-*.tmp-*/shard-*"))):
            time.sleep(0.002)
    finally:
        for pid in tmp_path.glob("pid*"):
            os.kill(int(pid.read_text()), signal.SIGKILL)
        for proc in started:
            proc.kill()
            proc.communicate()
    assert list(ckpt.glob("step-*.tmp-*")), "it did not die mid-drain"
    ranks, log = run(tmp_path, {"mode": "restore", "width": 400})
    steps = {r["step"] for r in ranks}
    assert len(steps) == 1 and steps.pop() >= 1, log[-3000:]


def test_a_full_shared_disk_is_a_clear_error_and_the_node_copies_are_kept(tiny_filesystem, tmp_path):  # noqa: F811
    # 4 x Linear(200, 200) with momentum: ~1.3 MB a checkpoint; the 2 MiB shared disk holds one, not two
    spec = {"steps": 3, "every": 1, "width": 200, "keep": 5, "ckpt": str(tiny_filesystem)}
    ranks, _ = run(tmp_path, {**spec, "mode": "train"})
    for rank in ranks:
        message = rank["error"]
        assert "copying step 2 from " in message and f"to its partner node or to {tiny_filesystem} failed" in message
        assert "No space left on device" in message and "step 2 is committed on node-local storage" in message
        assert f"{tiny_filesystem}: step 1 is the newest there" in message
    assert ranks[0]["error"] == ranks[1]["error"]
    # the restart restores step 2 from the nodes; its drain to the full disk fails again, and says so
    _, log = run(tmp_path, {**spec, "mode": "restore"}, fails=True)
    restored = [json.loads((tmp_path / f"rank{r}-restore.json").read_text()) for r in (0, 1)]
    assert [r["step"] for r in restored] == [2, 2] and "restored step 2 from node-local storage" in log
    assert "No space left on device; step 2 is committed on node-local storage" in log
    assert len(list((tmp_path / "local").glob(f"*/hpc_train-job-*/{STEP2}/{peer_copy.HELD}"))) == 2  # kept, both nodes


def small_disk(tmp_path: Path, size: str) -> Path:
    """Both nodes' local folders on one small tmpfs (unmounted by the caller's ``finally``)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True, text=True)
    assert out.returncode == 0, f"cannot mount a small tmpfs (needs root): {out.stderr}"
    (tmp_path / "local").mkdir()
    for name in ("a", "b"):
        (mount / name).mkdir()
        os.symlink(mount / name, tmp_path / "local" / name)
    return mount


@pytest.mark.parametrize(
    ("size", "failed"),
    [
        # a checkpoint is ~0.65 MB a node; each node keeps its own files and its partner's: 2.6 MB a step
        ("2m", "copying step 1 from "),  # the partner copies of step 1 do not fit
        ("3m", "saving step 2 failed (rank "),  # step 1 fits whole; step 2's own files do not
    ],
)
def test_a_full_node_local_disk_is_a_clear_error_and_nothing_committed_is_lost(tmp_path, size, failed):
    mount = small_disk(tmp_path, size)
    try:
        spec = {"steps": 2, "every": 1, "width": 200, "keep": 5}
        ranks, _ = run(tmp_path, {**spec, "mode": "train"})
        for rank in ranks:
            message = rank["error"]
            assert message.startswith(failed) and "o space left on device" in message, message
        assert ranks[0]["error"] == ranks[1]["error"]
        if size == "2m":  # the restart needs each node to hold the files it lacks: they do not fit either
            _, log = run(tmp_path, {**spec, "mode": "restore"}, fails=True)
            assert "(step 1: its node-local copies: " in log and "No space left on device" in log
            assert "not starting over from step 0 on its own" in log
            assert all(held(node_root(tmp_path, n) / "step-00000001") for n in ("a", "b"))  # still committed
        else:
            restored, log = run(tmp_path, {**spec, "mode": "restore"})
            assert [r["step"] for r in restored] == [1, 1], log[-2000:]
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_node_without_the_node_local_folder_stops_every_rank_with_its_name(tmp_path):
    _, log = run(tmp_path, {"mode": "train", "steps": 1}, fails=True, missing="b")
    assert "the node-local checkpoint folder (HPC_TRAIN_LOCAL_CHECKPOINT_DIR) cannot be used: " in log
    assert f"{tmp_path}/local/b does not exist on this node" in log
    assert log.count("cannot be used") >= 2  # both ranks: neither waits for the other


# -- the parts, in one process --------------------------------------------------------------------------


def holding(step: int, held: list[str], files: list[str]) -> local_tier.Holding:
    marker = {"files": {f: 1 for f in files}, "digests": {f: "d" for f in files}, "digest": "sha256"}
    return local_tier.Holding(step, f"step-{step:08d}", tuple(held), marker)


def test_the_newest_step_the_nodes_hold_between_them_is_chosen():
    files = ["a", "b"]
    reports = [(0, [holding(4, ["a"], files), holding(2, ["a"], files)]), None, (1, [holding(2, ["b"], files)])]
    choice = local_tier.choose(reports, shared_steps=[])
    assert choice is not None and choice.step == 2  # step 4 lacks b everywhere
    assert choice.holders == {"a": [(0, "step-00000002")], "b": [(1, "step-00000002")]}
    assert local_tier.choose(reports, shared_steps=[4]).step == 4  # what no node holds comes from shared
    assert local_tier.choose(reports, shared_steps=[6]) is None  # shared storage has a newer one


def test_a_node_local_folder_the_node_cannot_use_is_named(tmp_path):
    env = {contract.ENV_LOCAL_CHECKPOINT_DIR: "$HPC_TRAIN_TEST_UNSET_VAR/ckpt"}
    with pytest.raises(ValueError, match="names a variable this node does not set"):
        local_tier.local_base(env)
    with pytest.raises(ValueError, match="does not exist on this node"):
        local_tier.local_base({contract.ENV_LOCAL_CHECKPOINT_DIR: str(tmp_path / "missing")})
    assert local_tier.local_base({contract.ENV_LOCAL_CHECKPOINT_DIR: str(tmp_path)}) == tmp_path
    assert local_tier.local_base({}) is None


@pytest.fixture
def server(tmp_path):
    served = peer_copy.Server(tmp_path / "served", "secret")
    (tmp_path / "served").mkdir()
    yield served, peer_copy.Client(("127.0.0.1", served.port), "secret")
    served.close()


def digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_a_file_is_put_and_got_back_whole(server, tmp_path):
    served, client = server
    source = tmp_path / "source.bin"
    source.write_bytes(os.urandom(3 << 20))
    client.put("step-1.tmp/x.bin", source, digest(source.read_bytes()), "sha256")
    client.seal("step-1.tmp", "step-1", {"held": ["x.bin"]})
    assert (served.root / "step-1" / "x.bin").read_bytes() == source.read_bytes()
    assert held(served.root / "step-1") == {"held": ["x.bin"]}
    client.get("step-1/x.bin", tmp_path / "back.bin", digest(source.read_bytes()), "sha256")
    assert (tmp_path / "back.bin").read_bytes() == source.read_bytes()
    for step in (2, 3):  # a partner keeps the newest copies the sender asks it to keep
        client.put(f"step-{step}.tmp/x.bin", source, digest(source.read_bytes()), "sha256")
        client.seal(f"step-{step}.tmp", f"step-{step}", {"held": ["x.bin"]}, keep=2)
    assert sorted(p.name for p in served.root.iterdir()) == ["step-2", "step-3"]


def test_a_file_of_a_copy_being_re_sealed_is_served_once_it_is_back(server, tmp_path):
    # what a node's leader does to a copy it serves while gathering at a restore: step-N renamed aside for
    # an instant (here 0.3 s), a new step-N of the same files renamed in
    served, client = server
    (served.root / "step-1").mkdir()
    (served.root / "step-1" / "x.bin").write_bytes(b"abc")
    (served.root / "step-1").rename(served.root / "step-1.old")
    back = threading.Timer(0.3, lambda: (served.root / "step-1.old").rename(served.root / "step-1"))
    back.start()
    client.get("step-1/x.bin", tmp_path / "back.bin", digest(b"abc"), "sha256")
    back.join()
    assert (tmp_path / "back.bin").read_bytes() == b"abc"
    with pytest.raises(peer_copy.PeerError, match="No such file"):  # one that does not come back: the reason
        client.get("step-1/y.bin", tmp_path / "none.bin", digest(b"abc"), "sha256")


def test_a_copy_with_other_bytes_than_its_digest_is_refused_and_leaves_nothing(server, tmp_path):
    served, client = server
    source = tmp_path / "source.bin"
    source.write_bytes(b"abc")
    with pytest.raises(peer_copy.PeerError, match="do not have the digest"):
        client.put("x.bin", source, digest(b"abd"), "sha256")
    assert list(served.root.iterdir()) == []


def test_another_jobs_token_and_paths_outside_the_folder_are_refused(server, tmp_path):
    served, client = server
    source = tmp_path / "source.bin"
    source.write_bytes(b"abc")
    with pytest.raises(peer_copy.PeerError, match="wrong token"):
        peer_copy.Client(client.address, "guess").put("x.bin", source, digest(b"abc"), "sha256")
    for path in ("../x.bin", "/etc/x.bin", "a/../../x.bin"):
        with pytest.raises(peer_copy.PeerError, match="not a path inside the checkpoint folder"):
            client.put(path, source, digest(b"abc"), "sha256")
    assert not (tmp_path / "x.bin").exists() and list(served.root.iterdir()) == []


def test_a_partner_that_stops_taking_a_large_file_says_why_not_a_broken_pipe(tmp_path):
    # the file is far larger than the socket buffers: the sender is still sending when the partner fails
    mount = tmp_path / "disk"
    mount.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True)
    assert out.returncode == 0, f"cannot mount a small tmpfs (needs root): {out.stderr}"
    served = peer_copy.Server(mount, "secret")
    try:
        source = tmp_path / "source.bin"
        source.write_bytes(os.urandom(32 << 20))
        checksum = digest(source.read_bytes())
        with pytest.raises(peer_copy.PeerError, match="No space left on device"):
            peer_copy.Client(("127.0.0.1", served.port), "secret").put("x.bin", source, checksum, "sha256")
        assert list(mount.iterdir()) == []  # the part that arrived is gone
        with pytest.raises(peer_copy.PeerError, match="wrong token"):
            peer_copy.Client(("127.0.0.1", served.port), "guess").put("x.bin", source, checksum, "sha256")
    finally:
        served.close()
        subprocess.run(["umount", str(mount)], check=False)
