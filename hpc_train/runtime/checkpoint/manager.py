"""Requeue-aware checkpoints: saved atomically, found again after a requeue, never half-loaded.

Layout of the job's checkpoint folder (``$HPC_TRAIN_CHECKPOINT_DIR``, one per job)::

    step-00000120/            a complete checkpoint: hpc_train.pt (+ shard-R.pt, one per rank, of
                              replicated state; + engine/ for DeepSpeed and sharded layouts) + COMMIT
    step-00000180.tmp-4242/   being written; ignored by restore, removed by the next save
    step-00000100.damaged-2/  did not load in run 2; set aside (never deleted) so it is not tried again

A checkpoint is complete when its COMMIT marker exists; the marker is written last, after the
data is fsynced and the folder renamed into place, and records each file's size and SHA-256
digest, so a truncated or overwritten file is caught before loading. Older checkpoints are
deleted only after a newer one is committed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train import contract, log_lines
from hpc_train.contract import COMMIT, committed
from hpc_train.runtime.checkpoint import commit as commit_marker
from hpc_train.runtime.checkpoint import files as checkpoint_files
from hpc_train.runtime.checkpoint import reshape
from hpc_train.runtime.checkpoint import rng as rng_state
from hpc_train.runtime.checkpoint import shares as shard_save
from hpc_train.runtime.checkpoint.events import CheckpointObserver
from hpc_train.runtime.checkpoint.local import tier as local_tier
from hpc_train.runtime.lifecycle.no_retry import refuse_retry
from hpc_train.runtime.lifecycle.preemption import StopWatcher, requeue
from hpc_train.runtime.log import log
from hpc_train.runtime.supervise import retries

if TYPE_CHECKING:
    from hpc_train.runtime.views import ContextView

STATE_FILE = "hpc_train.pt"
ENGINE_DIR = checkpoint_files.ENGINE_DIR
EXIT_STOPPED = 3  # stopped for a time limit or preemption without a requeue: resubmit to continue
# Measured with bench/checkpoint.py (x86-64 with SHA-NI): sha256 1.2-1.75 GB/s, blake2b 0.8-1.1 GB/s.
# CPUs without SHA extensions reverse that; sha256 is also what `sha256sum` checks by hand.
DIGEST = commit_marker.DIGEST
_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed", "failed writing")  # torch's own writer's words


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (the previous one is untouched), or none could be loaded.

    ``repeats``: running again would fail the same way (a full disk; no checkpoint loads), so the
    batch script must not requeue it (``--on-failure requeue``).
    """

    def __init__(self, message: str, *, repeats: bool = False) -> None:
        super().__init__(message)
        self.repeats = repeats


class Checkpointer:
    """Save every N steps and when the job must stop; restore the newest complete checkpoint."""

    def __init__(
        self,
        ctx: ContextView,
        folder: str | os.PathLike[str] | None = None,
        every: int | None = None,
        keep: int | None = None,
        async_save: bool | None = None,
        restart_from_scratch: bool | None = None,
        writers: int | None = None,
    ) -> None:
        """``writers``: how many ranks split the writing of replicated state (default: all; 1 is rank 0
        alone, the old way, kept as the benchmark's baseline)."""
        env = os.environ
        self.ctx = ctx
        self.folder = Path(folder or env.get(contract.ENV_CHECKPOINT_DIR) or contract.CHECKPOINTS)
        self.every = every if every is not None else int(env.get(contract.ENV_CHECKPOINT_EVERY) or 0)
        self.keep = max(1, keep if keep is not None else int(env.get(contract.ENV_KEEP_CHECKPOINTS) or 2))
        self.async_save = async_save if async_save is not None else env.get(contract.ENV_ASYNC_CHECKPOINT) == "1"
        self.restart_from_scratch = (
            restart_from_scratch if restart_from_scratch is not None else env.get(contract.ENV_RESTART_FROM_SCRATCH) == "1"
        )
        self.run = int(env.get(contract.ENV_RUN) or 1)
        self.max_restarts = int(env[contract.ENV_MAX_RESTARTS]) if env.get(contract.ENV_MAX_RESTARTS) else None
        self.no_retry_file = env.get(contract.ENV_NO_RETRY_FILE) or None
        self.tracked: dict[str, Any] = {}
        self.watcher = StopWatcher().start()
        self.last_saved: int | None = None
        self.writers = writers
        self._pending: shard_save.Share | None = None  # a save whose shares are not all committed yet
        self._observers: list[CheckpointObserver] = []  # metrics, the profiler: subscribe()
        self._writer: threading.Thread | None = None  # this rank's background write of it
        self._staging: dict[tuple[Any, ...], Any] = {}
        if ctx.is_main:
            self.folder.mkdir(parents=True, exist_ok=True)
        self.tier = self._start_tier()

    def _start_tier(self) -> local_tier.Tier | None:
        """The node-local tier, where the site names a node-local folder (a collective: every rank or none)."""
        if not os.environ.get(contract.ENV_LOCAL_CHECKPOINT_DIR):
            return None  # the job's environment is every rank's: none of them asks the others
        problem = None
        try:
            base = local_tier.local_base(os.environ)
        except ValueError as exc:
            base, problem = None, f"{socket.gethostname()}: {exc}"
        problems = [p for p in self.ctx.runtime.gather_object(problem) if p]
        try:
            if problems or base is None:
                raise ValueError("; ".join(problems))
            return local_tier.Tier(self.ctx, base, self.folder, self.keep)
        except ValueError as exc:
            raise CheckpointError(
                f"the node-local checkpoint folder ({contract.ENV_LOCAL_CHECKPOINT_DIR}) cannot be used: {exc}",
                repeats=True,
            ) from None

    # -- what is saved --------------------------------------------------------------------------
    def track(self, name: str, obj: Any) -> Any:
        """Save and restore ``obj`` too: anything with state_dict()/load_state_dict(), or a dict (restored in place)."""
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")) and not isinstance(obj, dict):
            raise TypeError(f"cannot track {name!r}: give an object with state_dict()/load_state_dict() or a dict")
        self.tracked[name] = obj
        return obj

    def _payload(self, step: int) -> dict[str, Any]:
        rng = self.ctx.runtime.gather_object(rng_state.capture())
        payload = {
            "step": step,
            "world_size": self.ctx.world_size,
            "backend": self.ctx.backend,
            "saved_at": time.time(),
            "run": self.run,
            "rng": rng,
            "runtime": self.ctx.runtime.checkpoint_state(),
            "tracked": {
                name: (obj.state_dict() if hasattr(obj, "state_dict") else dict(obj)) for name, obj in self.tracked.items()
            },
        }
        return payload

    # -- finding checkpoints ----------------------------------------------------------------------
    def complete(self) -> list[tuple[int, Path]]:
        """Committed checkpoints, newest first."""
        return committed(self.folder)

    def subscribe(self, observer: CheckpointObserver) -> None:
        """``observer`` hears of this checkpointer's saves, commits and restores from now on."""
        self._observers.append(observer)

    def restore(self) -> int:
        """The step to continue from: 0 on a fresh job, else the newest checkpoint that loads (observers
        hear of it: ``after_restore``)."""
        step = self._restore()
        self._announce("after_restore", step)
        return step

    def _announce(self, event: str, step: int) -> None:
        for observer in self._observers:
            getattr(observer, event)(step)

    def _restore(self) -> int:
        """Every rank tries the same checkpoints (rank 0's listing) and they agree before and after
        loading each: one rank falling back alone would train from another step, or hang in
        DeepSpeed's collective load. When checkpoints exist and none loads, every rank raises
        (training silently from step 0 would throw the run away), unless restart_from_scratch.
        """
        runtime = self.ctx.runtime
        failed: list[tuple[int, Path, str]] = []  # what did not load, for the error if nothing does
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
                reshape.adapt(self.ctx, path)  # a resumed run's global batch, after a requeue too
                self.last_saved = step
                if self.ctx.is_main:
                    log(f"run {self.run}: restored step {step} from {path}")
                return step
            if self.ctx.is_main:
                then = "trying the one before" if index + 1 < len(candidates) else "it was the oldest"
                log(f"warning: checkpoint {path} is unreadable ({problem}); {then}")
            failed.append((step, path, problem))
        if failed:
            return self._none_loads(failed)
        if self.ctx.is_main:
            log(f"run {self.run}: no checkpoint in {self.folder}; starting from step 0")
        return 0

    def _restore_local(self, failed: list[tuple[int, Path, str]]) -> int | None:
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
        self.last_saved = choice.step
        found = runtime.gather_object(counts)
        if self.ctx.is_main:
            where = {k: sum(c.get(k, 0) for c in found) for k in ("here", "nodes", "shared")}
            log(
                f"run {self.run}: restored step {choice.step} from node-local storage in "
                f"{time.monotonic() - started:.1f} s ({where['here']} files on their own node, {where['nodes']} "
                f"from other nodes, {where['shared']} from {self.folder})"
            )
        if not choice.on_shared:  # its drain was cut off: finished now, or a move to other nodes would lose it
            self.tier.start_drain(choice.step, f"restored-{self.run}", restored=True)
        return choice.step

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
        algorithm = commit.get("digest", DIGEST)
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

    def _set_aside(self, failed: list[tuple[int, Path, str]]) -> None:
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

    def _none_loads(self, failed: list[tuple[int, Path, str]]) -> int:
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

        payload = shard_save.assemble(torch.load(path / STATE_FILE, map_location="cpu", weights_only=True), path)
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

    # -- saving -----------------------------------------------------------------------------------
    def save(self, step: int, *, wait: bool | None = None) -> None:
        """Save ``step`` now (observers hear ``before_save`` and ``after_save``); every rank must call it.
        See ``_save``."""
        self._announce("before_save", step)
        try:
            self._save(step, wait)
        finally:
            self._announce("after_save", step)

    def _save(self, step: int, wait: bool | None) -> None:
        """Save ``step`` now; every rank must call it. Each rank writes its share of replicated state
        (rank 0 also the rest); with async saving on, in a background thread after copying its share
        (the only part that blocks training), unless ``wait``. Committed once every share is durable:
        at once without async, else by the first ``step()``, ``wait()`` or ``save()`` after that."""
        runtime = self.ctx.runtime
        self._finish_pending()  # the next save waits for the previous one: committed, or raised everywhere
        self._finish_drain()
        # every rank writes into it (its share, engine or sharded state): all must name the same folder
        suffix = str(os.environ.get("SLURM_JOB_ID") or runtime.gather_object(os.getpid())[0])
        tmp, final = self._folders(step, suffix)
        if self._writes_folder:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        if self.ctx.is_main:
            reshape.write_shape(tmp, self.ctx)  # a later job may resume it at another shape
        runtime.barrier()
        background = self.async_save if wait is None else not wait
        engine_error: Exception | None = None
        engine_wait = None
        try:  # in the background only where the runtime can (DCP's async save)
            if background:
                engine_wait = runtime.start_engine_state(str(tmp / ENGINE_DIR))
            else:
                runtime.write_engine_state(str(tmp / ENGINE_DIR))
        except Exception as exc:
            engine_error = exc
        payload = self._payload(step)  # a collective: every rank gets here
        if runtime.any_rank(engine_error is not None):
            who = f"rank {self.ctx.rank} writing its engine state"
            self._abandon(tmp, step, engine_error, checkpoint_files.tensor_bytes(payload), who)
        share = self._share(step, tmp, final, payload, background)
        share.before = engine_wait
        self._pending = share
        share.start(background)
        self._writer = share.thread
        if not background:
            self._finish_pending()
        self.last_saved = step

    def _folders(self, step: int, suffix: str) -> tuple[Path, Path]:
        """Where this rank writes ``step`` and where it is committed: the shared folder, or this node's own."""
        if self.tier is not None:
            return self.tier.tmp(step, suffix), self.tier.final(step)
        return self.folder / f"step-{step:08d}.tmp-{suffix}", self.folder / f"step-{step:08d}"

    @property
    def _writes_folder(self) -> bool:
        """Whether this rank creates, hashes and removes the save's folder: rank 0, or each node's first rank."""
        return self.ctx.is_main if self.tier is None else self.tier.leader

    def _share(self, step: int, tmp: Path, final: Path, payload: dict[str, Any], background: bool) -> shard_save.Share:
        """What this rank writes of ``payload``: its share of the replicated state; rank 0 also the rest.

        Only replicated state is split (``checkpoint_state()`` is the same on every rank); a backend
        that writes its own state on every rank (``write_engine_state``) has none, and rank 0 writes
        hpc_train.pt alone, as it does with one writer.
        """
        state = payload["runtime"]
        writers = min(self.writers or self.ctx.world_size, self.ctx.world_size)
        files: dict[str, Any] = {}
        structure = ""
        needed = checkpoint_files.tensor_bytes(payload)  # every rank holds the whole replicated state: the whole size
        if state is not None and writers > 1:
            # in the background the snapshot below copies every tensor: no copy of its own first
            found = shard_save.split(state, self.ctx.rank, writers, own=not background)
            if found.mine:
                files[shard_save.shard_name(self.ctx.rank)] = found.mine
            structure, names = found.fingerprint, [shard_save.shard_name(r) for r in found.writers]
            payload = {**payload, "runtime": shard_save.skeleton(state), shard_save.SHARDS: names}
            if found.pieces:
                payload[shard_save.PIECES] = found.pieces
        if self.ctx.is_main:
            files = {STATE_FILE: payload, **files}
        if background:  # training goes on changing the live tensors
            files = shard_save.snapshot(files, self._staging)
        more = (lambda digests: checkpoint_files.folder_files(tmp, digests, self.ctx.is_main)) if self._writes_folder else None
        return shard_save.Share(step, tmp, final, files, DIGEST, structure, needed, more)

    def _finish_pending(self) -> None:
        """Wait for this rank's share of the last save; when every rank's is durable, rank 0 commits.

        A collective (every rank calls it): any rank's failure is raised on every rank, once.
        """
        share, self._pending, self._writer = self._pending, None, None
        if share is None:
            return
        share.join()
        runtime = self.ctx.runtime
        if runtime.any_rank(share.error is not None):
            who = f"rank {self.ctx.rank} writing its share" if self.ctx.world_size > 1 else ""
            self._abandon(share.tmp, share.step, share.error, share.needed, who)
        reports = runtime.gather_object((share.sizes, share.digests, share.fingerprint))
        if self.tier is not None:
            self._commit_local(share, reports)
        else:
            self._agree_on(self._commit(share, reports) if self.ctx.is_main else None)
        self._announce("after_commit", share.step)

    def _abandon(self, tmp: Path, step: int, error: Exception | None, needed: int, who: str) -> None:
        """Raise the first failing rank's error on every rank, after the partial write was removed
        (a collective, once any rank failed; ``error`` is None on the ranks that did not fail)."""
        if self._writes_folder:
            shutil.rmtree(tmp, ignore_errors=True)
        self.ctx.runtime.barrier()  # so that a rank's report of free space counts the partial write as gone
        failure = None if error is None else self._failure(step, error, self._needed(needed), who)
        self._raise_agreed(failure)

    def _commit(self, share: shard_save.Share, reports: list[Any]) -> CheckpointError | None:
        """Rank 0, once every rank's share is fsynced: the folder renamed into place, then COMMIT."""
        tmp, final, step = share.tmp, share.final, share.step
        try:
            sizes, digests = checkpoint_files.manifest(reports)
            commit_marker.commit(tmp, final, step, sizes, digests)
        except Exception as exc:  # ENOSPC on the marker, a rename refused
            shutil.rmtree(tmp, ignore_errors=True)
            if final.exists() and not (final / COMMIT).exists():
                shutil.rmtree(final, ignore_errors=True)
            return self._failure(step, exc, self._needed(share.needed))
        self._prune()
        log(log_lines.SAVED.text(step=step, where=final))
        return None

    def _commit_local(self, share: shard_save.Share, reports: list[Any]) -> None:
        """Every node's leader seals its part of the save with HELD; then the partner copy and the drain
        start in the background. A collective: a node's failure is raised on every rank."""
        failure = None
        try:
            sizes, digests = checkpoint_files.manifest(reports)
            assert self.tier is not None
            self.tier.commit(share.step, share.tmp, sizes, digests, DIGEST)
        except Exception as exc:
            failure = self._failure(share.step, exc, self._needed(share.needed), f"on {socket.gethostname()}")
        self._agree_on(failure)
        if self.ctx.is_main:
            log(log_lines.SAVED.text(step=share.step, where=f"node-local storage ({self.tier.root if self.tier else ''})"))
            commit_marker.write_json(self.folder / contract.LOCAL_NEWEST, {"step": share.step})
        assert self.tier is not None
        self.tier.start_drain(share.step, share.tmp.name.rsplit(".tmp-", 1)[1])

    def _finish_drain(self) -> None:
        """Wait for the last save's partner copy and drain, then rank 0 commits it on shared storage;
        a collective, raising any node's failure everywhere."""
        tier = self.tier
        if tier is None or tier.pending is None:
            return
        tier.join()
        error, tier.error = tier.error, None
        step = tier.pending[0]
        failure = None if error is None else self._drain_failure(error, step)
        if self.ctx.runtime.any_rank(failure is not None):
            tier.pending = None
            self._raise_agreed(failure)
        if self.ctx.is_main:
            try:
                tier.commit_shared()
            except Exception as exc:
                failure = self._drain_failure(exc, step)
        tier.pending = None
        self._agree_on(failure)

    def _drain_failure(self, error: BaseException, step: int) -> CheckpointError:
        """A partner copy or drain that failed: the step is still committed on the nodes' own storage."""
        previous = self.complete()
        kept = f"step {previous[0][0]} is the newest there" if previous else "it holds no checkpoint yet"
        detail = (str(error).splitlines() or [type(error).__name__])[0]
        return CheckpointError(
            f"copying step {step} from {socket.gethostname()} to its partner node or to {self.folder} "
            f"failed: {detail}; step {step} is committed on node-local storage, and {self.folder}: {kept}",
            repeats=checkpoint_files.no_space(error),
        )

    def wait(self) -> None:
        """Block until an async save is written and committed, on shared storage too (every rank must call it)."""
        self._finish_pending()
        self._finish_drain()

    def _agree_on(self, failure: CheckpointError | None) -> None:
        """Every rank raises if any rank failed (one rank raising alone would hang the others)."""
        if self.ctx.runtime.any_rank(failure is not None):
            self._raise_agreed(failure)

    def _raise_agreed(self, failure: CheckpointError | None) -> None:
        """Raise the first failing rank's error on every rank; a collective, once any rank failed."""
        reports = self.ctx.runtime.gather_object(None if failure is None else (str(failure), failure.repeats))
        message, repeats = next(r for r in reports if r is not None)
        if repeats and self.ctx.is_main:
            refuse_retry(self.no_retry_file, message)
        raise CheckpointError(message, repeats=repeats)

    def _needed(self, tensor_bytes: int) -> int:
        """About how many bytes a checkpoint takes: its tensors, or the last one's files if more
        (a DeepSpeed engine's state is not in the payload)."""
        previous = 0
        for _, path in self.complete()[:1]:
            try:
                previous = sum(json.loads((path / COMMIT).read_text())["files"].values())
            except (OSError, ValueError, KeyError, TypeError):
                pass
        return max(tensor_bytes, previous)

    def _failure(self, step: int, exc: BaseException, needed: int, who: str = "", folder: Path | None = None) -> CheckpointError:
        """The error for a failed save; call it after the partial write is removed (its free space counts).
        ``folder``: where it was written (default: where saves go first, this node's own with the tier)."""
        folder = folder or (self.tier.root if self.tier is not None else self.folder)
        try:
            free: float | None = shutil.disk_usage(folder).free / 2**20
        except OSError:
            free = None
        previous = self.complete()
        kept = f"checkpoint step {previous[0][0]} is intact" if previous else "no earlier checkpoint exists"
        what = f"saving step {step} failed" + (f" ({who})" if who else "")
        # torch's own writer hides the errno ("unexpected pos ..."): a write that failed where the
        # space left is less than the checkpoint needs is the same full disk
        write_failed = any(m in str(exc) for m in _TORCH_WRITE_FAILED)
        full = checkpoint_files.no_space(exc) or (write_failed and free is not None and free * 2**20 < needed)
        if full:
            space = f"{free:.1f} MiB free in {folder} after removing the partial write" if free is not None else ""
            need = f"the checkpoint needs about {needed / 2**20:.1f} MiB" if needed else ""
            detail = "no space left on device" + (": " if space or need else "") + ", ".join(filter(None, (space, need)))
            return CheckpointError(f"{what}: {detail}; {kept}", repeats=True)
        detail = getattr(exc, "strerror", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        if free is not None:
            detail += f" ({free:.1f} MiB free in {folder})"
        return CheckpointError(f"{what}: {detail}; {kept}")

    def _prune(self) -> None:
        for _, path in self.complete()[self.keep :]:
            shutil.rmtree(path, ignore_errors=True)
        for path in self.folder.glob("step-*.tmp-*"):
            shutil.rmtree(path, ignore_errors=True)  # left by a writer that died; the new one is committed

    # -- the training loop's one call -----------------------------------------------------------------
    def step(self, step: int) -> None:
        """Call after every step: saves when due; when the job must stop, saves, requeues and exits.

        Commits a background save at the first step after every rank's share is durable; raises
        CheckpointError on every rank once any rank's background write has failed: at the step
        after, not at the next save many steps later.
        """
        runtime = self.ctx.runtime
        share = self._pending
        # one small collective per step answers all three questions
        tier = self.tier
        stop, write_failed, writing, drain_failed, draining = runtime.any_ranks(
            (
                self.watcher.requested,
                share is not None and share.error is not None,
                share is not None and share.running,
                tier is not None and tier.error is not None,
                tier is not None and tier.draining,
            )
        )
        if write_failed or (share is not None and not writing):
            self._finish_pending()
        if tier is not None and tier.pending is not None and (drain_failed or not draining):
            self._finish_drain()
        if not runtime.at_accumulation_boundary:
            return  # never save half an accumulated step
        if stop:
            self._stop(step)
        if self.every and step % self.every == 0 and step != self.last_saved:
            self.save(step)

    def _stop(self, step: int) -> None:
        # say why, whichever rank noticed first
        reasons = [r for r in self.ctx.runtime.gather_object(self.watcher.reason) if r]
        reason = reasons[0] if reasons else "stop requested"
        if step != self.last_saved:
            self.save(step, wait=True)
        self.wait()  # on shared storage too: the requeued job may start on other nodes
        code = 0
        if self.ctx.is_main:
            log(log_lines.STOPPING.text(run=self.run, step=step, reason=reason))
            if self.max_restarts is not None and self.run > self.max_restarts:
                message = (
                    f"restart budget exhausted ({self.max_restarts} restarts); step {step} is saved in {self.folder}, "
                    "resubmit to continue"
                )
                log(message)
                code = EXIT_STOPPED
                retries.record_here(code, "not_retried", "restart_budget", message)
            else:
                done, message = requeue()
                log(message)
                code = 0 if done else EXIT_STOPPED
                marker = os.environ.get(contract.ENV_REQUEUED_FILE)
                if done and marker:  # the batch script then waits for Slurm instead of ending the job
                    Path(marker).touch()
                # the batch script decides only after a failure: a stopped run's decision is rank 0's
                if done:
                    retries.record_here(code, "requeued", "stopped", reason)
                else:
                    retries.record_here(code, "not_retried", "requeue_failed", message)
        code = self.ctx.runtime.gather_object(code)[0]  # rank 0 decided for everyone
        self.watcher.close()
        self.ctx.end_run(code)

    def close(self) -> None:
        self.wait()
        self.watcher.close()
        if self.tier is not None:
            self.tier.close()

    def __iter__(self) -> Iterator[tuple[int, Path]]:
        return iter(self.complete())
