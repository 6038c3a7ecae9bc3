"""The restore side of the checkpointer: which checkpoint a run continues from, verified and loaded on every
rank or on none.

Every rank tries the same checkpoints (rank 0's listing) and they agree before and after loading each: one
rank falling back alone would train from another step, or hang in DeepSpeed's collective load. Where the
nodes hold copies of their own (the node-local tier), the newest of those is tried first; a checkpoint that
does not load is set aside, never deleted. When checkpoints exist and none loads, every rank raises (training
silently from step 0 would throw the run away), unless the job asked to restart from scratch.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train import contract
from hpc_train.contract import COMMIT, committed
from hpc_train.runtime.checkpoint import commit as commit_marker
from hpc_train.runtime.checkpoint import files as checkpoint_files
from hpc_train.runtime.checkpoint import reshape, shares
from hpc_train.runtime.checkpoint import rng as rng_state
from hpc_train.runtime.checkpoint.failures import CheckpointError
from hpc_train.runtime.checkpoint.local import tier as local_tier
from hpc_train.runtime.lifecycle.no_retry import refuse_retry
from hpc_train.runtime.log import log

if TYPE_CHECKING:
    from hpc_train.runtime.views import ContextView

STATE_FILE, ENGINE_DIR = checkpoint_files.STATE_FILE, checkpoint_files.ENGINE_DIR

Failed = list[tuple[int, Path, str]]  # (step, where, what was wrong): what did not load, for the error if nothing does


class Restorer:
    """Finds and loads the checkpoint to continue from; a ``CheckpointerView`` for the reshaper."""

    def __init__(self, ctx: ContextView, folder: Path, tracked: dict[str, Any], tier: local_tier.Tier | None) -> None:
        env = os.environ
        self.ctx, self.folder, self.tracked, self.tier = ctx, folder, tracked, tier
        self.run = int(env.get(contract.ENV_RUN) or 1)
        self.restart_from_scratch = env.get(contract.ENV_RESTART_FROM_SCRATCH) == "1"
        self.no_retry_file = env.get(contract.ENV_NO_RETRY_FILE) or None
        self.own: int | None = None  # the step of this job's own checkpoint that restore() loaded

    def complete(self) -> list[tuple[int, Path]]:
        """Committed checkpoints, newest first."""
        return committed(self.folder)

    def restore(self) -> int:
        """The step to continue from: 0 on a fresh job, else the newest checkpoint that loads (a collective)."""
        runtime = self.ctx.runtime
        failed: Failed = []
        self.own = None
        if self.tier is not None:
            step = self._restore_local(failed)
            if step is not None:
                return step
        # --resume-from, until this job has a checkpoint of its own (rank 0 decides: all ranks go one way)
        other = runtime.gather_object(reshape.source(self) if self.ctx.is_main and not failed else None)[0]
        if other is not None:
            return reshape.restore_from(self, other)
        candidates = runtime.gather_object(self.complete() if self.ctx.is_main else None)[0]
        for index, (step, path) in enumerate(candidates):
            problem = self.loads(path)
            if problem is None:
                self._set_aside(failed)
                return self._restored(step, path)
            if self.ctx.is_main:
                then = "trying the one before" if index + 1 < len(candidates) else "it was the oldest"
                log(f"warning: checkpoint {path} is unreadable ({problem}); {then}")
            failed.append((step, path, problem))
        if failed:
            return self._none_loads(failed)
        if self.ctx.is_main:
            log(f"run {self.run}: no checkpoint in {self.folder}; starting from step 0")
        return 0

    def _restored(self, step: int, path: Path) -> int:
        reshape.adapt(self.ctx, path)  # a resumed run's global batch, after a requeue too
        self.own = step
        if self.ctx.is_main:
            log(f"run {self.run}: restored step {step} from {path}")
        return step

    def _restore_local(self, failed: Failed) -> int | None:
        """The newest checkpoint the nodes hold between them, gathered into every node's own folder and
        loaded from there; None when the shared folder has a newer one, or the copies do not load
        (added to ``failed``: the shared folder's checkpoints are tried next)."""
        assert self.tier is not None
        runtime, started = self.ctx.runtime, time.monotonic()
        shared = runtime.gather_object([s for s, _ in self.complete()] if self.ctx.is_main else None)[0]
        choice = local_tier.choose(runtime.gather_object(self.tier.report()), shared)
        if choice is None:
            return None
        self.tier.clear_leftovers()  # nothing writes now: what a killed writer left only takes room
        counts: dict[str, int] = {}
        try:
            counts = self.tier.gather_here(choice)
            problem = None
        except Exception as exc:  # a peer gone, a full local disk: the shared copy may still do
            problem = f"{socket.gethostname()}: {type(exc).__name__}: {exc}"
        path = self.tier.final(choice.step)
        problem = self._agreed(problem)  # the same on every rank: all load, or none
        if problem is None:
            problem = self.loads(path, local_tier.HELD)
        if problem is not None:
            if self.ctx.is_main:
                log(f"warning: the node-local copies of step {choice.step} do not load ({problem}); trying {self.folder}")
            failed.append((choice.step, path, f"its node-local copies: {problem}"))
            return None
        reshape.adapt(self.ctx, path)
        self.own = choice.step
        self._say_where(choice.step, runtime.gather_object(counts), started)
        if not choice.on_shared:  # its drain was cut off: finished now, or a move to other nodes would lose it
            self.tier.start_drain(choice.step, f"restored-{self.run}", restored=True)
        return choice.step

    def _say_where(self, step: int, found: list[dict[str, int]], started: float) -> None:
        if not self.ctx.is_main:
            return
        where = {k: sum(c.get(k, 0) for c in found) for k in ("here", "nodes", "shared")}
        log(
            f"run {self.run}: restored step {step} from node-local storage in "
            f"{time.monotonic() - started:.1f} s ({where['here']} files on their own node, {where['nodes']} "
            f"from other nodes, {where['shared']} from {self.folder})"
        )

    def verify(self, path: Path, marker: str = COMMIT) -> str | None:
        """What is wrong with checkpoint ``path`` (sizes and digests against its COMMIT), or None.

        Every rank checks its own share of the files; combine the answers with gather_object. A
        node-local copy (``marker`` HELD) is checked by its node's ranks: each node reads its own.
        """
        try:
            commit = json.loads((path / marker).read_text())
            sizes: dict[str, int] = commit["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"its {COMMIT} marker is unreadable ({type(exc).__name__}: {exc})"
        digests: dict[str, str] = commit.get("digests") or {}  # markers before digests: sizes only
        algorithm = commit.get("digest", commit_marker.DIGEST)
        local = marker != COMMIT
        ranks, rank = (self.ctx.local_world_size, self.ctx.local_rank) if local else (self.ctx.world_size, self.ctx.rank)
        share = checkpoint_files.shares(sizes, ranks)[rank]
        problems = [
            p for name in share if (p := checkpoint_files.check_file(path, name, sizes[name], digests.get(name), algorithm))
        ]
        return ", ".join(problems) or None

    def loads(self, path: Path, marker: str = COMMIT) -> str | None:
        """Checkpoint ``path`` verified against its ``marker`` and loaded, every rank agreeing after each:
        None once it loaded on every rank, else what was wrong (the same text on every rank). A
        collective; a checkpoint that fails on one rank is loaded on none."""
        problem = self._agreed(self.verify(path, marker))  # a damaged file is never loaded
        return problem if problem is not None else self._agreed(self._try_load(path))

    def _agreed(self, problem: str | None) -> str | None:
        """Every rank's problems with one checkpoint, the same text on every rank; None if none had any."""
        problems = [p for p in self.ctx.runtime.gather_object(problem) if p]
        return ", ".join(dict.fromkeys(problems)) or None

    def _try_load(self, path: Path) -> str | None:
        try:
            self._load(path)
        except Exception as exc:  # a damaged checkpoint must not end the run: the caller falls back
            lines = str(exc).strip().splitlines()
            return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        return None

    def _set_aside(self, failed: Failed) -> None:
        """Rename checkpoints that did not load so they are never tried (or pruned in place of new
        ones) again; kept on disk for a look, and named in the log."""
        if not self.ctx.is_main:
            return
        for _, path, _ in failed:
            if path.parent != self.folder:
                continue  # a node-local copy: the next save supersedes it, and the shared copy stays the record
            aside = path.with_name(f"{path.name}.damaged-{self.run}")
            try:
                os.replace(path, aside)
                log(f"set {path.name} aside as {aside.name} (delete it when you no longer need it)")
            except OSError as exc:
                log(f"could not set {path} aside ({exc}); it will be tried again next run")

    def _none_loads(self, failed: Failed) -> int:
        listing = "; ".join(f"step {step}: {problem}" for step, _, problem in failed)
        if self.restart_from_scratch:
            if self.ctx.is_main:
                log(
                    f"run {self.run}: no checkpoint in {self.folder} loads ({listing}); "
                    "restart from scratch requested: starting over from step 0"
                )
            self._set_aside(failed)
            return 0
        message = (
            f"no checkpoint in {self.folder} loads ({listing}); not starting over from step 0 on "
            "its own: repair or remove them, or resubmit with --restart-from-scratch "
            f"({contract.ENV_RESTART_FROM_SCRATCH}=1) to set them aside and train from step 0"
        )
        if self.ctx.is_main:
            log(message)
            refuse_retry(self.no_retry_file, message)
        raise CheckpointError(message, repeats=True)

    def _load(self, path: Path) -> None:
        import torch

        payload = shares.assemble(torch.load(path / STATE_FILE, map_location="cpu", weights_only=True), path)
        self.ctx.runtime.load_checkpoint_state(payload["runtime"], str(path / ENGINE_DIR))
        for name, obj in self.tracked.items():
            state = payload["tracked"].get(name)
            if state is None:
                continue
            if hasattr(obj, "load_state_dict"):
                obj.load_state_dict(state)
            else:
                obj.clear()
                obj.update(state)
        rng = payload.get("rng") or []
        if len(rng) == self.ctx.world_size:
            rng_state.restore(rng[self.ctx.rank])
        else:
            log(f"checkpoint was saved by {len(rng)} ranks, this job has {self.ctx.world_size}: RNG streams restart")
