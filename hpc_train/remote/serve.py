"""The login node's side of ``submit --remote``: reads the submission (JSON) from stdin, submits it as a local
``submit`` would, and answers with the job (JSON) on stdout.

A key (``HPC_TRAIN_SUBMIT_KEY``) makes it safe to retry: the job it queued is recorded under the key before
the answer is written, so the same key asked again answers with that job instead of queueing another. A
dropped connection does not stop a submit half-way (SIGHUP is ignored), and a retry that arrives while the
first is still submitting waits for it (a lock per key).

    python -m hpc_train.remote.serve < request.json
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpc_train import contract
from hpc_train.errors import HpcTrainError, UsageError
from hpc_train.snapshot.sent import Sent, receiving

KEY = re.compile(r"[0-9a-f]{32}")


def keys_dir() -> Path:
    from hpc_train.jobs.handle import state_dir

    folder = state_dir() / "submit_keys"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def held(key: str | None) -> Iterator[Path | None]:
    if key is None:
        yield None
        return
    if not KEY.fullmatch(key):
        raise UsageError(f"{contract.ENV_SUBMIT_KEY} must be 32 hex digits, got {key!r}")
    path = keys_dir() / f"{key}.json"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a retry waits for the first attempt of the same key
        yield path


def submit(request: dict[str, Any]) -> dict[str, Any]:
    import hpc_train

    options = dict(request.get("options") or {})
    if request.get("sweep"):
        handle = hpc_train.sweep(request["script"], *request.get("script_args", []), over=request["sweep"], **options)
        return {"sweep_id": handle.sweep_id, "tasks": len(handle), "arrays": handle.array_ids, "folder": str(handle.folder)}
    job = hpc_train.submit(request["script"], *request.get("script_args", []), **options)
    record = job.record
    return {
        "job_id": job.job_id,
        "folder": str(job.folder),
        "log": str(job.log_path(0)),
        "site": record.site,
        "nodes": record.nodes,
        "procs_per_node": record.procs_per_node,
        "backend": record.backend,
    }


def answer(request: dict[str, Any], key: str | None) -> dict[str, Any]:
    with held(key) as path:
        if path is not None and path.is_file():
            return {**json.loads(path.read_text()), "again": True}
        sent = received(request)
        if sent is not None and (why := sent.stale()):
            return {"upload": why}  # the laptop sends its project and asks again, with the same key
        with receiving(sent) if sent is not None else contextlib.nullcontext():
            result = submit(request)
        if path is not None:
            path.write_text(json.dumps(result))  # before the answer: a dropped answer finds it here
        return result


def received(request: dict[str, Any]) -> Sent | None:
    """The project the laptop listed, in its copy here (this process runs in the copy's folder ``cwd``)."""
    from hpc_train.version import __version__

    if "files" not in request:
        return None
    if request.get("version") != __version__:  # the laptop checked when it last sent the project: not since
        raise UsageError(
            f"this login node has hpc_train {__version__}, the submitting machine {request.get('version')}",
            hint=f"install hpc_train {__version__} there (or {request.get('version')} here): the two must agree",
        )
    cwd = str(request.get("cwd") or ".")
    root = Path.cwd() if cwd == "." else Path.cwd().joinpath(*[".."] * len(Path(cwd).parts)).resolve()
    return Sent.from_request(root, request)


def main() -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the connection dropping must not stop a submit half-way
    # read at this interpreter's start (hpc_train.remote.ssh.hpc_train_line); the job inherits the environment,
    # and its script must find the modules beside it
    for name in ("PYTHONSAFEPATH", contract.ENV_NO_REMOTE):
        os.environ.pop(name, None)
    warnings.showwarning = lambda message, *rest: print(f"warning: {message}", file=sys.stderr)
    try:
        reply = answer(json.loads(sys.stdin.read()), os.environ.get(contract.ENV_SUBMIT_KEY) or None)
        code = 0
    except HpcTrainError as exc:
        reply, code = {"error": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}, exc.exit_code
    except (ValueError, KeyError, TypeError) as exc:
        reply, code = {"error": f"the submission was not readable: {exc!r}", "hint": None, "exit_code": 2}, 2
    with contextlib.suppress(OSError):  # the connection may be gone: the job is recorded under its key
        print(json.dumps(reply), flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
