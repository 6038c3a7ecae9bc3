"""Requeue-aware checkpoints: saved atomically, found again after a requeue, never half-loaded.

Layout of the job's checkpoint folder (``$HPC_TRAIN_CHECKPOINT_DIR``, one per job)::

    step-00000120/            a complete checkpoint: hpc_train.pt (+ engine/ for DeepSpeed) + COMMIT
    step-00000180.tmp-4242/   being written; ignored by restore, removed by the next save

A checkpoint is complete when its COMMIT marker exists; the marker is written last, after the
data is fsynced and the folder renamed into place, and records each file's size so a truncated
file is caught before loading. Older checkpoints are deleted only after a newer one is committed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train.runtime.preemption import StopWatcher, log, requeue

if TYPE_CHECKING:
    from hpc_train.runtime.context import Context

STATE_FILE = "hpc_train.pt"
ENGINE_DIR = "engine"
COMMIT = "COMMIT"
EXIT_STOPPED = 3  # stopped for a time limit or preemption without a requeue: resubmit to continue


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the previous one is untouched."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> dict[str, int]:
    sizes = {}
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        with open(file, "rb") as f:
            os.fsync(f.fileno())
        sizes[str(file.relative_to(path))] = file.stat().st_size
    for folder in sorted((p for p in path.rglob("*") if p.is_dir()), reverse=True):
        _fsync_dir(folder)
    _fsync_dir(path)
    return sizes


def _rng_state() -> dict[str, Any]:
    """This rank's random generators, as plain bytes and ints (safe to gather and to load with weights_only)."""
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state().numpy().tobytes(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = [s.cpu().numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (kind, keys.astype("<u4").tobytes(), int(pos), int(has_gauss), float(cached))
    except ImportError:
        pass
    return state


def _bytes_tensor(data: bytes) -> Any:
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(_bytes_tensor(state["torch"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_bytes_tensor(s) for s in state["cuda"]])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.frombuffer(keys, dtype="<u4").copy(), pos, has_gauss, cached))


def _to_cpu(obj: Any, staging: dict[tuple[Any, ...], Any], path: tuple[Any, ...] = ()) -> Any:
    """A snapshot detached from training: tensors copied to CPU, containers copied.

    Copies go into staging buffers kept from the previous save: writing into memory that is already
    mapped is several times faster than allocating (page faults), and this copy is the only part of
    an async save that blocks training.
    """
    import torch

    if isinstance(obj, torch.Tensor):
        buffer = staging.get(path)
        if buffer is None or buffer.shape != obj.shape or buffer.dtype != obj.dtype:
            buffer = staging[path] = torch.empty(obj.shape, dtype=obj.dtype, device="cpu")
        return buffer.copy_(obj.detach())
    if isinstance(obj, dict):
        return {k: _to_cpu(v, staging, path + (k,)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v, staging, path + (i,)) for i, v in enumerate(obj))
    return obj


class Checkpointer:
    """Save every N steps and when the job must stop; restore the newest complete checkpoint."""

    def __init__(self, ctx: Context, folder: str | os.PathLike[str] | None = None, every: int | None = None,
                 keep: int | None = None, async_save: bool | None = None) -> None:
        env = os.environ
        self.ctx = ctx
        self.folder = Path(folder or env.get("HPC_TRAIN_CHECKPOINT_DIR") or "checkpoints")
        self.every = every if every is not None else int(env.get("HPC_TRAIN_CHECKPOINT_EVERY") or 0)
        self.keep = max(1, keep if keep is not None else int(env.get("HPC_TRAIN_KEEP_CHECKPOINTS") or 2))
        self.async_save = async_save if async_save is not None else env.get("HPC_TRAIN_ASYNC_CHECKPOINT") == "1"
        self.run = int(env.get("HPC_TRAIN_RUN") or 1)
        self.max_restarts = int(env["HPC_TRAIN_MAX_RESTARTS"]) if env.get("HPC_TRAIN_MAX_RESTARTS") else None
        self.tracked: dict[str, Any] = {}
        self.watcher = StopWatcher().start()
        self.last_saved: int | None = None
        self._writer: threading.Thread | None = None
        self._writer_error: BaseException | None = None
        self._staging: dict[tuple[Any, ...], Any] = {}
        if ctx.is_main:
            self.folder.mkdir(parents=True, exist_ok=True)

    # -- what is saved --------------------------------------------------------------------------
    def track(self, name: str, obj: Any) -> Any:
        """Save and restore ``obj`` too: anything with state_dict()/load_state_dict(), or a dict (restored in place)."""
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")) and not isinstance(obj, dict):
            raise TypeError(f"cannot track {name!r}: give an object with state_dict()/load_state_dict() or a dict")
        self.tracked[name] = obj
        return obj

    def _payload(self, step: int) -> dict[str, Any]:
        rng = self.ctx.runtime.gather_object(_rng_state())
        payload = {
            "step": step,
            "world_size": self.ctx.world_size,
            "backend": self.ctx.backend,
            "saved_at": time.time(),
            "run": self.run,
            "rng": rng,
            "runtime": self.ctx.runtime.checkpoint_state(),
            "tracked": {name: (obj.state_dict() if hasattr(obj, "state_dict") else dict(obj))
                        for name, obj in self.tracked.items()},
        }
        return payload

    # -- finding checkpoints ----------------------------------------------------------------------
    def complete(self) -> list[tuple[int, Path]]:
        """Committed checkpoints, newest first."""
        found = []
        if self.folder.is_dir():
            for path in self.folder.iterdir():
                if path.name.startswith("step-") and "." not in path.name and (path / COMMIT).is_file():
                    try:
                        found.append((int(path.name[5:]), path))
                    except ValueError:
                        continue
        return sorted(found, reverse=True)

    def restore(self) -> int:
        """The step to continue from: 0 on a fresh job, else the newest checkpoint that loads."""
        for step, path in self.complete():
            try:
                self._load(path)
            except Exception as exc:  # a damaged checkpoint must not end the run: fall back
                log(f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc}); trying the one before")
                continue
            self.last_saved = step
            if self.ctx.is_main:
                log(f"run {self.run}: restored step {step} from {path}")
            return step
        if self.ctx.is_main:
            log(f"run {self.run}: no checkpoint in {self.folder}; starting from step 0")
        return 0

    def _load(self, path: Path) -> None:
        import torch

        commit = json.loads((path / COMMIT).read_text())
        for name, size in commit.get("files", {}).items():
            actual = (path / name).stat().st_size if (path / name).exists() else -1
            if actual != size:
                raise CheckpointError(f"{name} has {actual} bytes, the commit recorded {size}")
        payload = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
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
            _set_rng_state(rng[self.ctx.rank])
        else:
            log(f"checkpoint was saved by {len(rng)} ranks, this job has {self.ctx.world_size}: RNG streams restart")

    # -- saving -----------------------------------------------------------------------------------
    def save(self, step: int, *, wait: bool | None = None) -> None:
        """Save ``step`` now; every rank must call it. Rank 0's write runs in the background when
        async saving is on (training is blocked only while the state is copied), unless ``wait``."""
        runtime = self.ctx.runtime
        self._agree_on(self._finish_writer(), "the previous checkpoint")
        # every rank may write into it (engine or sharded state): all must name the same folder
        suffix = os.environ.get("SLURM_JOB_ID") or runtime.gather_object(os.getpid())[0]
        tmp = self.folder / f"step-{step:08d}.tmp-{suffix}"
        final = self.folder / f"step-{step:08d}"
        if self.ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        runtime.barrier()
        error: str | None = None
        try:
            runtime.write_engine_state(str(tmp / ENGINE_DIR))
        except Exception as exc:
            error = f"writing the engine state of step {step} failed: {type(exc).__name__}: {exc}"
        payload = self._payload(step)  # a collective: every rank gets here
        if error is None and self.ctx.is_main:
            background = self.async_save if wait is None else not wait
            if background and payload["runtime"] is not None:
                snapshot = _to_cpu(payload, self._staging)  # training goes on changing the live tensors
                self._writer = threading.Thread(target=self._write_guarded, args=(snapshot, tmp, final, step),
                                                name="hpc_train-checkpoint-writer")
                self._writer.start()
            else:
                try:  # training waits for this write: the live tensors cannot change under it
                    self._write(payload, tmp, final, step)
                except CheckpointError as exc:
                    error = str(exc)
        if error is not None and self.ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        self._agree_on(error, f"step {step}")
        self.last_saved = step

    def _agree_on(self, error: str | None, what: str) -> None:
        """Every rank raises if any rank failed (one rank raising alone would hang the others)."""
        if self.ctx.runtime.any_rank(error is not None):
            raise CheckpointError(error or f"another rank failed to save {what}; see its log")

    def _write_guarded(self, snapshot: dict[str, Any], tmp: Path, final: Path, step: int) -> None:
        try:
            self._write(snapshot, tmp, final, step)
        except CheckpointError as exc:
            self._writer_error = exc

    def _write(self, snapshot: dict[str, Any], tmp: Path, final: Path, step: int) -> None:
        import torch

        try:
            torch.save(snapshot, tmp / STATE_FILE)
            sizes = _fsync_tree(tmp)
            if final.exists():  # the same step saved again (a stop right after a periodic save)
                shutil.rmtree(final)
            os.replace(tmp, final)
            marker = final / f".{COMMIT}.tmp"
            marker.write_text(json.dumps({"step": step, "files": sizes, "committed_at": time.time()}))
            with open(marker, "rb") as f:
                os.fsync(f.fileno())
            os.replace(marker, final / COMMIT)
            _fsync_dir(final)
            _fsync_dir(self.folder)
        except Exception as exc:  # ENOSPC shows up as OSError or as torch's "file write failed"
            shutil.rmtree(tmp, ignore_errors=True)
            if final.exists() and not (final / COMMIT).exists():
                shutil.rmtree(final, ignore_errors=True)
            raise CheckpointError(self._failure(step, exc)) from None
        self._prune()
        log(f"saved step {step} to {final}")

    def _failure(self, step: int, exc: BaseException) -> str:
        detail = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        try:
            free = shutil.disk_usage(self.folder).free / 2**20
            detail += f" ({free:.1f} MiB free in {self.folder})"
        except OSError:
            pass
        previous = self.complete()
        kept = f"checkpoint step {previous[0][0]} is intact" if previous else "no earlier checkpoint exists"
        return f"saving step {step} failed: {detail}; {kept}"

    def _prune(self) -> None:
        for _, path in self.complete()[self.keep:]:
            shutil.rmtree(path, ignore_errors=True)
        for path in self.folder.glob("step-*.tmp-*"):
            shutil.rmtree(path, ignore_errors=True)  # left by a writer that died; the new one is committed

    def _finish_writer(self) -> str | None:
        """Wait for rank 0's background write; its error message, if it failed."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        error, self._writer_error = self._writer_error, None
        return str(error) if error is not None else None

    def wait(self) -> None:
        """Block until an async save is written and committed (every rank must call it)."""
        self._agree_on(self._finish_writer(), "the last checkpoint")

    # -- the training loop's one call -----------------------------------------------------------------
    def step(self, step: int) -> None:
        """Call after every step: saves when due; when the job must stop, saves, requeues and exits."""
        runtime = self.ctx.runtime
        stop = runtime.any_rank(self.watcher.requested)
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
        else:
            self.wait()
        code = 0
        if self.ctx.is_main:
            log(f"run {self.run}: stopping at step {step}: {reason}")
            if self.max_restarts is not None and self.run > self.max_restarts:
                log(f"restart budget exhausted ({self.max_restarts} restarts); step {step} is saved in {self.folder}, "
                    "resubmit to continue")
                code = EXIT_STOPPED
            else:
                done, message = requeue()
                log(message)
                code = 0 if done else EXIT_STOPPED
                marker = os.environ.get("HPC_TRAIN_REQUEUED_FILE")
                if done and marker:  # the batch script then waits for Slurm instead of ending the job
                    Path(marker).touch()
        code = self.ctx.runtime.gather_object(code)[0]  # rank 0 decided for everyone
        self.watcher.close()
        self.ctx.shutdown()
        raise SystemExit(code)

    def close(self) -> None:
        self.wait()
        self.watcher.close()

    def __iter__(self) -> Iterator[tuple[int, Path]]:
        return iter(self.complete())
