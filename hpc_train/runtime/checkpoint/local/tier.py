"""The node-local tier: saves go to each node's own disk first, are copied to a partner node and
drained to shared storage in the background; a restart restores the newest checkpoint committed
anywhere, from the nodes' copies where it can.

On each node (``$HPC_TRAIN_LOCAL_CHECKPOINT_DIR`` as the node expands it, then one folder per job)::

    hpc_train-<job>/step-00000120/               this node's ranks' files of step 120, and HELD
    hpc_train-<job>/step-00000180.tmp-<job>/     being written; ignored by restore
    hpc_train-<job>/from-node1/step-00000120/    node 1's files of step 120 (this is its partner), and HELD

``HELD`` is the node-local COMMIT: the whole checkpoint's sizes and digests (as COMMIT records
them) and the names the folder holds. The ranks write HELD only once every rank's files are durable
on its own node (the collective a shared commit waits in too), so a HELD on any node means the
checkpoint was written completely; whether it can be restored depends on which nodes are still
there. Node K's partner is node K+1 (mod the nodes). The drain copies each node's own files into the
shared checkpoint's ``.tmp-`` folder; once every node's drain is done (the ranks learn it in the
per-step collective, as for an async save), rank 0 commits it there with COMMIT, as without the tier.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train import contract
from hpc_train.runtime.checkpoint import commit as commit_marker
from hpc_train.runtime.checkpoint.local.peer_copy import HELD, Client, PeerError, Server, own_address, receive_file, seal
from hpc_train.runtime.log import log

if TYPE_CHECKING:
    from hpc_train.runtime.views import ContextView


def local_base(environ: Mapping[str, str]) -> Path | None:
    """The site's node-local folder as this node expands it; None without the tier. Raises ValueError
    for a folder this node cannot use (a variable unset here, a path that is not there)."""
    raw = environ.get(contract.ENV_LOCAL_CHECKPOINT_DIR)
    if not raw:
        return None
    expanded = os.path.expanduser(os.path.expandvars(raw))
    if "$" in expanded:
        raise ValueError(f"{raw!r} names a variable this node does not set ({expanded!r})")
    path = Path(expanded)
    if not path.is_absolute():
        raise ValueError(f"{raw!r} is not an absolute path on this node ({expanded!r})")
    if not path.is_dir():
        raise ValueError(f"{expanded} does not exist on this node")
    return path


def job_folder_name(environ: Mapping[str, str], shared: Path) -> str:
    """One folder per job: a requeued job finds its own copies again, and a later job that Slurm gives a
    recycled id does not (rank 0 calls it: the identity is kept beside the job's shared checkpoints)."""
    job = environ.get("SLURM_JOB_ID") or Path(environ.get(contract.ENV_JOB_FOLDER) or "job").name
    record = shared / contract.LOCAL_TIER_ID
    try:
        identity = str(json.loads(record.read_text())["id"])
    except (OSError, ValueError, KeyError, TypeError):
        identity = secrets.token_hex(4)
        commit_marker.write_json(record, {"id": identity})
    return f"hpc_train-{job}-{identity}"


@dataclass(frozen=True)
class Holding:
    """One committed node-local folder: which step, where under the node's root, and what it holds."""

    step: int
    relative: str  # "step-00000120" or "from-node1/step-00000120"
    held: tuple[str, ...]
    marker: dict[str, Any] = field(compare=False)


def holdings(root: Path) -> list[Holding]:
    """The committed folders under one node's root (its own and its partners' copies)."""
    found = []
    for folder in [root, *sorted(root.glob("from-node*"))]:
        for path in folder.glob("step-*"):
            if "." in path.name:
                continue
            try:
                marker = json.loads((path / HELD).read_text())
                found.append(Holding(int(path.name[5:]), str(path.relative_to(root)), tuple(marker["held"]), marker))
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return found


@dataclass(frozen=True)
class Choice:
    """The checkpoint a restart restores, and where each node finds its files."""

    step: int
    marker: dict[str, Any]
    holders: dict[str, list[tuple[int, str]]]  # file -> (node, folder relative to that node's root)
    on_shared: bool  # committed on shared storage too: a file no node holds is copied from there


def choose(reports: list[Any], shared_steps: list[int]) -> Choice | None:
    """The newest step whose files the nodes (or the shared copy) hold between them, unless the
    shared storage has a newer one. ``reports``: each rank's ``(node, holdings)`` (None off the leaders)."""
    by_step: dict[int, list[tuple[int, Holding]]] = {}
    for report in reports:
        if report is not None:
            node, found = report
            for holding in found:
                by_step.setdefault(holding.step, []).append((node, holding))
    newest_shared = max(shared_steps, default=-1)
    for step in sorted(by_step, reverse=True):
        if step < newest_shared:
            return None
        marker = by_step[step][0][1].marker
        holders: dict[str, list[tuple[int, str]]] = {}
        for node, holding in by_step[step]:
            for name in holding.held:
                holders.setdefault(name, []).append((node, holding.relative))
        on_shared = step in shared_steps
        if on_shared or set(marker["files"]) <= set(holders):
            return Choice(step, marker, holders, on_shared)
    return None


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _copy(source: Path, target: Path, digest: str, algorithm: str) -> None:
    with open(source, "rb") as f:
        receive_file(f, target, source.stat().st_size, digest, algorithm)


class Tier:
    """One rank's part of the node-local tier (the node's first rank does the node's file work)."""

    def __init__(self, ctx: ContextView, base: Path, shared: Path, keep: int) -> None:
        """Every rank calls it (a collective): the node leaders start their servers and trade addresses."""
        self.ctx = ctx
        named: tuple[str, str] = ("", "")
        if ctx.is_main:
            try:
                named = (job_folder_name(os.environ, shared), "")
            except OSError as exc:  # said on every rank: the others wait for the name
                named = ("", f"{shared}: {exc}")
        name, problem = ctx.runtime.gather_object(named)[0]
        if problem:
            raise ValueError(problem)
        self.root = base / name
        self.shared = shared
        self.keep = keep
        self.leader = ctx.local_rank == 0
        self.error: Exception | None = None
        self.pending: tuple[int, Path] | None = None  # a committed step and its shared .tmp- folder, drained or draining
        self._thread: threading.Thread | None = None
        self._server: Server | None = None
        token = ctx.runtime.gather_object(secrets.token_hex(16) if ctx.is_main else None)[0]
        self.token = token
        address, problem = None, None
        if self.leader:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                self._server = Server(self.root, token)
                address = (own_address(ctx.env.master_addr, ctx.env.master_port), self._server.port)
            except OSError as exc:  # every rank must hear of it: the others would wait for this node
                problem = f"{socket.gethostname()}: {exc}"
        reports = [r for r in ctx.runtime.gather_object((ctx.node_rank, address, problem) if self.leader else None) if r]
        problems = [p for _, _, p in reports if p]
        if problems:
            self.close()
            raise ValueError("; ".join(problems))
        self.peers = {node: tuple(addr) for node, addr, _ in reports}

    @property
    def nodes(self) -> int:
        return len(self.peers)

    def final(self, step: int) -> Path:
        return self.root / f"step-{step:08d}"

    def tmp(self, step: int, suffix: str) -> Path:
        return self.root / f"step-{step:08d}.tmp-{suffix}"

    # -- saving -------------------------------------------------------------------------------------
    def commit(self, step: int, tmp: Path, sizes: dict[str, int], digests: dict[str, str], algorithm: str) -> None:
        """The node's leader: ``tmp`` sealed as ``step-N`` with HELD. Raises what went wrong (tmp removed)."""
        if not self.leader:
            return
        try:
            held = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
            unknown = [name for name in held if name not in sizes]
            if unknown:
                raise RuntimeError(f"{', '.join(unknown[:3])} in {tmp} is in no rank's report")
            marker = {"step": step, "files": sizes, "digest": algorithm, "digests": digests, "held": held}
            seal(tmp, self.final(step), marker)
        except Exception:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()

    def start_drain(self, step: int, suffix: str, *, restored: bool = False) -> None:
        """The partner copy and the drain to shared storage of committed ``step``, in a thread (leaders).

        ``restored``: a step restored from the nodes' copies alone (its drain was cut off). Every node now
        holds all of it, so node 0 alone copies it to shared storage, and no partner copy is made."""
        self.error = None
        self.pending = (step, self.shared / f"step-{step:08d}.tmp-{suffix}")
        if self.leader and not (restored and self.ctx.node_rank != 0):
            args = (*self.pending, not restored)
            self._thread = threading.Thread(target=self._drain, args=args, name="hpc_train-checkpoint-drain", daemon=True)
            self._thread.start()

    @property
    def draining(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _drain(self, step: int, shared_tmp: Path, partner: bool) -> None:
        try:
            final = self.final(step)
            marker = json.loads((final / HELD).read_text())
            if partner:
                self._to_partner(final, marker)
            shared_tmp.mkdir(parents=True, exist_ok=True)
            for name in marker["held"]:
                _copy(final / name, shared_tmp / name, marker["digests"][name], marker["digest"])
            commit_marker.fsync_tree_dirs(shared_tmp)
        except Exception as exc:  # reaches the training loop at its next step
            self.error = exc

    def _to_partner(self, final: Path, marker: dict[str, Any]) -> None:
        node = self.ctx.node_rank
        if self.nodes < 2:
            return
        partner = Client(self.peers[(node + 1) % self.nodes], self.token)
        where = f"from-node{node}"
        tmp = f"{where}/{final.name}.tmp"
        for name in marker["held"]:
            partner.put(f"{tmp}/{name}", final / name, marker["digests"][name], marker["digest"])
        partner.seal(tmp, f"{where}/{final.name}", marker, self.keep)

    def commit_shared(self) -> None:
        """Rank 0, once every node drained the pending step: committed on shared storage, older ones pruned."""
        assert self.pending is not None
        step, shared_tmp = self.pending
        marker = json.loads((self.final(step) / HELD).read_text())
        final = self.shared / f"step-{step:08d}"
        try:
            commit_marker.commit(shared_tmp, final, step, marker["files"], marker["digests"])
        except Exception:
            shutil.rmtree(shared_tmp, ignore_errors=True)
            raise
        for _, path in contract.committed(self.shared)[self.keep :]:
            shutil.rmtree(path, ignore_errors=True)
        for path in self.shared.glob("step-*.tmp-*"):
            shutil.rmtree(path, ignore_errors=True)
        log(f"drained step {step} to {final}")

    def _prune(self) -> None:
        """Keep the newest ``keep`` of this node's own and partners' copies; remove what killed writers
        left behind (older than the newest copy, so never a copy still arriving)."""
        by_folder: dict[Path, list[tuple[int, Path]]] = {}
        for holding in holdings(self.root):
            path = self.root / holding.relative
            by_folder.setdefault(path.parent, []).append((holding.step, path))
        for folder, found in by_folder.items():
            found.sort()
            for _, path in found[: -self.keep]:
                shutil.rmtree(path, ignore_errors=True)
            for path in folder.glob("step-*.*"):
                step = _step_of(path.name)
                if step is not None and step <= found[-1][0]:
                    shutil.rmtree(path, ignore_errors=True)

    def clear_leftovers(self) -> None:
        """The node's leader, while nothing writes: the ``.tmp`` folders of writers that were killed."""
        if self.leader:
            for folder in [self.root, *self.root.glob("from-node*")]:
                for path in folder.glob("step-*.*"):
                    shutil.rmtree(path, ignore_errors=True)

    # -- restoring ----------------------------------------------------------------------------------
    def report(self) -> Any:
        """What this node holds (its leader's answer; None from the other ranks)."""
        return (self.ctx.node_rank, holdings(self.root)) if self.leader else None

    def gather_here(self, choice: Choice) -> dict[str, int]:
        """The node's leader: every file of ``choice`` into this node's ``step-N`` folder, from this
        node's copies (hard links), the other nodes, or the shared copy; how many came from where."""
        counts = {"here": 0, "nodes": 0, "shared": 0}
        if not self.leader:
            return counts
        step, marker = choice.step, choice.marker
        final = self.final(step)
        tmp = self.root / f"{final.name}.tmp-restore"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        node = self.ctx.node_rank
        for name in marker["files"]:
            digest = marker["digests"][name]
            holders = choice.holders.get(name, [])
            mine = [relative for holder, relative in holders if holder == node]
            if mine:
                _link(self.root / mine[0] / name, tmp / name)
                counts["here"] += 1
            else:
                counts[self._fetch(name, digest, marker["digest"], tmp, holders, choice.on_shared)] += 1
        seal(tmp, final, {**marker, "held": sorted(marker["files"])})
        return counts

    def _fetch(self, name: str, digest: str, algorithm: str, tmp: Path, holders: list[tuple[int, str]], on_shared: bool) -> str:
        """One file this node lacks, from the first node whose copy arrives whole, else the shared copy."""
        error: Exception | None = None
        for holder, relative in holders:
            try:
                Client(self.peers[holder], self.token).get(f"{relative}/{name}", tmp / name, digest, algorithm)
                return "nodes"
            except (OSError, PeerError) as exc:  # a damaged copy there: another node's, or the shared one
                error = exc
        if not on_shared and error is not None:
            raise error
        _copy(self.shared / tmp.name.split(".", 1)[0] / name, tmp / name, digest, algorithm)
        return "shared"

    def close(self) -> None:
        self.join()
        if self._server is not None:
            self._server.close()


def _step_of(name: str) -> int | None:
    try:
        return int(name[5:].split(".", 1)[0])
    except ValueError:
        return None
