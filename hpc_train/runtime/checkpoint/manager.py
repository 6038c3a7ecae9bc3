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
from hpc_train.runtime.checkpoint import failures, reshape
from hpc_train.runtime.checkpoint import files as checkpoint_files
from hpc_train.runtime.checkpoint import rng as rng_state
from hpc_train.runtime.checkpoint import shares as shard_save
from hpc_train.runtime.checkpoint.events import CheckpointObserver
from hpc_train.runtime.checkpoint.failures import CheckpointError
from hpc_train.runtime.checkpoint.local import tier as local_tier
from hpc_train.runtime.checkpoint.restore import Restorer
from hpc_train.runtime.checkpoint.stop import EXIT_STOPPED, requeue_or_stop
from hpc_train.runtime.lifecycle.no_retry import refuse_retry
from hpc_train.runtime.lifecycle.preemption import StopWatcher
from hpc_train.runtime.log import log

if TYPE_CHECKING:
    from hpc_train.runtime.views import ContextView

STATE_FILE, ENGINE_DIR = checkpoint_files.STATE_FILE, checkpoint_files.ENGINE_DIR
# Measured with bench/checkpoint.py (x86-64 with SHA-NI): sha256 1.2-1.75 GB/s, blake2b 0.8-1.1 GB/s.
# CPUs without SHA extensions reverse that; sha256 is also what `sha256sum` checks by hand.
DIGEST = commit_marker.DIGEST
__all__ = ["EXIT_STOPPED", "CheckpointError", "Checkpointer"]


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
        self.max_restarts = int(env[contract.ENV_MAX_RESTARTS]) if env.get(contract.ENV_MAX_RESTARTS) else None
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
        self.restorer = Restorer(ctx, self.folder, self.tracked, self.tier)
        if restart_from_scratch is not None:
            self.restorer.restart_from_scratch = restart_from_scratch
        self.run, self.no_retry_file = self.restorer.run, self.restorer.no_retry_file

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
        hear of it: ``after_restore``). A collective: see restore.Restorer."""
        step = self.restorer.restore()
        if self.restorer.own is not None:  # this job's own checkpoint: saving that step again would add nothing
            self.last_saved = self.restorer.own
        self._announce("after_restore", step)
        return step

    def verify(self, path: Path, marker: str = COMMIT) -> str | None:
        """What is wrong with checkpoint ``path`` (this rank's share of its files), or None: see Restorer.verify."""
        return self.restorer.verify(path, marker)

    def _announce(self, event: str, step: int) -> None:
        for observer in self._observers:
            getattr(observer, event)(step)

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
        failure = None if error is None else self._failure(step, error, needed, who)
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
            return self._failure(step, exc, share.needed)
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
            failure = self._failure(share.step, exc, share.needed, f"on {socket.gethostname()}")
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
        failure = None if error is None else failures.drain_failure(error, step, self.folder, self.complete())
        if self.ctx.runtime.any_rank(failure is not None):
            tier.pending = None
            self._raise_agreed(failure)
        if self.ctx.is_main:
            try:
                tier.commit_shared()
            except Exception as exc:
                failure = failures.drain_failure(exc, step, self.folder, self.complete())
        tier.pending = None
        self._agree_on(failure)

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

    def _failure(self, step: int, exc: BaseException, tensor_bytes: int, who: str = "") -> CheckpointError:
        """The error for a failed save, where saves go first (this node's own folder with the tier); make it
        after the partial write is removed (its free space counts)."""
        folder, committed_now = (self.tier.root if self.tier is not None else self.folder), self.complete()
        return failures.save_failure(step, exc, failures.needed(tensor_bytes, committed_now), folder, committed_now, who)

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
        # rank 0 decides for everyone
        code = requeue_or_stop(self.run, self.max_restarts, step, reason, self.folder) if self.ctx.is_main else 0
        code = self.ctx.runtime.gather_object(code)[0]
        self.watcher.close()
        self.ctx.end_run(code)

    def close(self) -> None:
        self.wait()
        self.watcher.close()
        if self.tier is not None:
            self.tier.close()

    def __iter__(self) -> Iterator[tuple[int, Path]]:
        return iter(self.complete())
