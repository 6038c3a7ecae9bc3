"""The laptop's side of ``--remote``: ``submit`` sends the project (upload.py) and asks the login node to
submit it (serve.py), retrying a dropped connection with the same key; ``status``, ``logs``, ``cancel`` and
``report`` run there as they are, their output streamed here."""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import re
import shlex
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train import contract
from hpc_train.errors import ConfigError, HpcTrainError, Problem, RemoteError
from hpc_train.remote import settings as config
from hpc_train.remote.ssh import Ssh, hpc_train_line, remote_line
from hpc_train.snapshot.sent import listing
from hpc_train.version import __version__

if TYPE_CHECKING:
    from hpc_train.snapshot.files import Entry, Project

COMMANDS = ("submit", "status", "logs", "cancel", "report")
ATTEMPTS = 3
KEY_TTL_S = 3600.0  # a submit retried after a drop within this long is answered with the job it queued


class LoginNodeError(HpcTrainError):
    """What the login node's own hpc_train refused, with its exit status."""

    def __init__(self, message: str, hint: str | None, exit_code: int) -> None:
        super().__init__(message, hint)
        self.exit_code = exit_code


def host_of(args: argparse.Namespace) -> str | None:
    """The login node this command goes to; None: it runs here. The user's config is read only when it exists."""
    if getattr(args, "remote", None):
        return str(args.remote)
    if os.environ.get(contract.ENV_NO_REMOTE) == "1":
        return None  # this is the login node answering a --remote call (ssh.hpc_train_line)
    return config.load().host if config.config_path().is_file() else None


def run(args: argparse.Namespace, own: list[str], rest: list[str], host: str) -> int:
    settings, ssh = config.load(), Ssh(host)
    if args.command == "submit":
        return _submit_cli(args, ssh, settings)
    argv = [*without_remote(own), *(["--", *rest] if rest else [])]
    return ssh.stream(hpc_train_line(settings.python, *argv))


def without_remote(argv: list[str]) -> list[str]:
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == "--remote":
            skip = True
        elif not word.startswith("--remote="):
            out.append(word)
    return out


def _submit_cli(args: argparse.Namespace, ssh: Ssh, settings: config.RemoteSettings) -> int:
    from hpc_train.cli.options import job_options

    options = job_options(args)
    script, script_args = options.pop("script"), options.pop("script_args")
    sweep = None
    if args.sweep:
        from hpc_train.sweeps.arrays import parse_cli

        sweep = parse_cli(args.sweep)
        if args.max_concurrent is not None:
            options["max_concurrent"] = args.max_concurrent
    reply = submit(ssh, settings, script, script_args, options, sweep)
    if args.parsable:
        print(reply.get("job_id") or reply.get("sweep_id"))
    else:
        print(describe(reply, ssh.host))
    sys.stdout.flush()
    if not (args.wait or args.follow):
        return 0
    job = str(reply.get("job_id") or reply.get("sweep_id"))
    follow = ["logs", job, "--follow"] if args.follow else ["status", job, "--watch"]
    ssh.stream(hpc_train_line(settings.python, *follow))
    state = json.loads(ssh.run(hpc_train_line(settings.python, "status", job, "--json")).stdout or "{}")
    return 0 if state.get("state") == "COMPLETED" or state.get("counts", {}).keys() == {"COMPLETED"} else 1


def describe(reply: dict[str, Any], host: str) -> str:
    if "sweep_id" in reply:
        return f"Submitted sweep {reply['sweep_id']} on {host}: {reply['tasks']} task(s) in {', '.join(reply['arrays'])}"
    again = " (already queued by the dropped attempt)" if reply.get("again") else ""
    return (
        f"Submitted job {reply['job_id']} to site {reply['site']} through {host}{again} "
        f"({reply['nodes']} node(s) x {reply['procs_per_node']} process(es), backend {reply['backend']})\n"
        f"  folder: {reply['folder']}  (on {host})\n"
        f"  status: python -m hpc_train status {reply['job_id']} --remote {host}"
    )


def submit(
    ssh: Ssh, settings: config.RemoteSettings, script: str, script_args: list[str], options: dict[str, Any], sweep: Any = None
) -> dict[str, Any]:
    """Send the script's project and submit it on the login node; the login node's answer (job id, folder)."""
    from hpc_train.snapshot.files import find_project, project_files
    from hpc_train.snapshot.limits import check_size
    from hpc_train.snapshot.provenance import git_facts

    path = Path(os.path.expanduser(script))
    if not path.is_file():
        raise ConfigError(Problem("<job>", "script", f"training script {script!r} not found", hint=f"looked in {Path.cwd()}"))
    project = find_project(path)
    facts: dict[str, Any] = {}
    # git's status (the commit the login node records) beside git's list of the files: 10-20 ms less a submit
    status = threading.Thread(target=lambda: facts.update(zip(("git", "diff"), git_facts(project))))
    status.start()
    try:
        entries = project_files(project)
    finally:
        status.join()
    check_size(project, entries)  # the site's own limit is checked there too
    from hpc_train.remote.upload import destination

    dest = destination(project, settings.root)
    here = Path.cwd().resolve()
    cwd = here.relative_to(project.root).as_posix() if here.is_relative_to(project.root) else "."
    request = {
        "script": os.path.relpath(path.resolve(), project.root / cwd),
        "script_args": list(script_args),
        "options": options,
        "sweep": sweep,
        "version": __version__,
        "cwd": cwd,
        "files": listing(entries),
        "git": facts["git"],  # the login node's copy has no .git: the commit is named from here
        "diff": base64.b64encode(facts["diff"]).decode(),
    }
    pending = _pending(ssh.host, request, entries)
    key = _key(pending)
    uploads = Uploads(ssh.host, dest)
    transfer = Transfer(project, entries, dest, cwd, uploads.removed(entries))
    for attempt in range(ATTEMPTS):
        try:
            reply = _attempt(ssh, settings, transfer, request, key, uploads.current(entries))
            uploads.record(entries)
            pending.unlink(missing_ok=True)
            return reply
        except RemoteError as exc:
            if not exc.retryable or attempt == ATTEMPTS - 1:
                raise
            print(f"hpc_train: {exc.message}; trying again", file=sys.stderr)
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Transfer:
    """The project as it is sent: its files, their folder on the login node, the folder the submit runs in."""

    project: Project
    entries: list[Entry]
    dest: str
    cwd: str  # relative to dest: where this machine's working folder is in the project, else "."
    removed: list[str]  # sent before, gone here: deleted there


class Uploads:
    """What the last upload of this project to this login node sent (its files' paths and stamps): a project
    unchanged since is not sent again (the login node checks its copy against the list: ``serve``), and a
    file gone since is deleted there."""

    def __init__(self, host: str, dest: str) -> None:
        from hpc_train._resources import cache_dir

        folder = cache_dir("remote") or Path(os.path.expanduser("~/.cache/hpc_train/remote"))
        name = hashlib.blake2b(f"{host}\0{dest}".encode(), digest_size=12).hexdigest()
        self.path = folder / f"sent-{name}.json"
        try:
            self.last: dict[str, Any] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.last = {}

    @staticmethod
    def digest(entries: list[Entry]) -> str:
        return hashlib.blake2b(json.dumps(listing(entries)).encode(), digest_size=16).hexdigest()

    def current(self, entries: list[Entry]) -> bool:
        return bool(self.last) and self.last.get("digest") == self.digest(entries)

    def removed(self, entries: list[Entry]) -> list[str]:
        return sorted(set(self.last.get("paths", [])) - {e.path for e in entries})

    def record(self, entries: list[Entry]) -> None:
        from hpc_train._resources import write_atomic

        with contextlib.suppress(OSError):  # a record not kept costs the next submit one rsync
            self.path.parent.mkdir(parents=True, exist_ok=True)
            record = {"digest": self.digest(entries), "paths": [e.path for e in entries]}
            write_atomic(self.path, json.dumps(record).encode())


def _attempt(
    ssh: Ssh, settings: config.RemoteSettings, t: Transfer, request: dict[str, Any], key: str, current: bool
) -> dict[str, Any]:
    """One try: send the project unless the last upload is current, then ask the login node to submit it; a
    login node whose copy differs after all (changed there, or removed) answers so, and gets it sent."""
    if not current:
        _upload(ssh, settings, t)
    reply = _serve(ssh, settings, t, request, key)
    if "upload" in reply:
        print(f"hpc_train: sending the project again ({reply['upload']})", file=sys.stderr)
        _upload(ssh, settings, t)
        reply = _serve(ssh, settings, t, request, key)
    return reply


def _upload(ssh: Ssh, settings: config.RemoteSettings, t: Transfer) -> None:
    from hpc_train.remote.upload import prepare_line, send

    check_version(ssh, settings, ssh.run(prepare_line(t.dest, settings.python), timeout=120), t.dest)
    send(ssh, t.project, t.entries, t.dest, t.removed)


def _serve(ssh: Ssh, settings: config.RemoteSettings, t: Transfer, request: dict[str, Any], key: str) -> dict[str, Any]:
    folder = remote_line(t.dest + ("/" + t.cwd if t.cwd != "." else ""))
    gone = shlex.quote(json.dumps({"upload": f"{t.dest} is not there"}))
    line = (
        f"{{ cd {folder} 2>/dev/null || {{ echo {gone}; exit 0; }}; }} && "
        f"{contract.ENV_SUBMIT_KEY}={key} {hpc_train_line(settings.python, module='hpc_train.remote.serve')}"
    )
    out = ssh.run(line, stdin=json.dumps(request), timeout=600)
    if out.stderr:
        print(out.stderr, end="", file=sys.stderr)  # the login node's warnings and notes
    lines = out.stdout.strip().splitlines()
    if not lines:
        check_installed(ssh, settings, out)  # hpc_train gone there since the last upload
        raise RemoteError(
            f"the login node {ssh.host} answered nothing (exit {out.returncode})", "its stderr is above", retryable=True
        )
    reply: dict[str, Any] = json.loads(lines[-1])
    if "error" in reply:
        raise LoginNodeError(f"{ssh.host}: {reply['error']}", reply.get("hint"), int(reply.get("exit_code") or 2))
    return reply


def check_version(ssh: Ssh, settings: config.RemoteSettings, out: Any, dest: str) -> None:
    """The login node's folder is writable and its hpc_train is this one's version."""
    err = out.stderr.strip()
    if out.returncode == 3:
        raise RemoteError(
            f"{dest} on {ssh.host} is not writable",
            hint=f"set remote.root in {config.config_path()} to a folder you may write there",
        )
    check_installed(ssh, settings, out)
    theirs = out.stdout.strip().removeprefix("hpc_train ").strip()
    if out.returncode != 0 or theirs != __version__:
        raise RemoteError(
            f"{ssh.host} has hpc_train {theirs or '(unknown: ' + err[-200:] + ')'}, this machine {__version__}",
            hint=f"install hpc_train {__version__} on {ssh.host} (or this one's version here): the two must agree",
        )


def check_installed(ssh: Ssh, settings: config.RemoteSettings, out: Any) -> None:
    """The login node's python is there and has hpc_train (``out``: what a call of it printed)."""
    err = out.stderr.strip()
    if re.search(r"No module named '?hpc_train\b", err) or out.returncode == 127:
        what = "has no hpc_train" if out.returncode != 127 else "is not there"
        raise RemoteError(
            f"{settings.python} on {ssh.host} {what} ({err.splitlines()[-1] if err else 'no message'})",
            hint=f"install hpc_train {__version__} there, or set remote.python in {config.config_path()} to the "
            "python of the venv that has it",
        )


def _pending(host: str, request: dict[str, Any], entries: list[Any]) -> Path:
    """Where this submission's key waits until the login node has answered: the same submission asked again
    (the same host, options and files) after a dropped connection gets the same key, so it is not queued twice."""
    from hpc_train._resources import cache_dir

    stamp = [(e.path, e.stamp) for e in entries]
    digest = hashlib.blake2b(json.dumps([host, request, stamp], sort_keys=True).encode(), digest_size=16).hexdigest()
    folder = cache_dir("remote") or Path(os.path.expanduser("~/.cache/hpc_train/remote"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{digest}.key"


def _key(pending: Path) -> str:
    try:
        if time.time() - pending.stat().st_mtime < KEY_TTL_S:
            return pending.read_text().strip()
    except OSError:
        pass
    key = uuid.uuid4().hex
    pending.write_text(key)
    return key


@dataclass(frozen=True)
class RemoteJob:
    """A job submitted through a login node (``hpc_train.submit(..., remote=HOST)``): asked about over ssh."""

    job_id: str
    host: str
    python: str = config.DEFAULT_PYTHON
    folder: str = ""  # on the login node

    def _cli(self, *argv: str) -> Any:
        return Ssh(self.host).run(hpc_train_line(self.python, *argv))

    @property
    def state(self) -> str:
        out = self._cli("status", self.job_id, "--json")
        return str(json.loads(out.stdout or "{}").get("state") or "UNKNOWN")

    def wait(self, poll_s: float = 5.0, timeout_s: float | None = None) -> str:
        from hpc_train.jobs.states import ACTIVE_STATES

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while (state := self.state) in ACTIVE_STATES and (deadline is None or time.monotonic() < deadline):
            time.sleep(poll_s)
        return state

    def stdout(self, rank: int = 0) -> str:
        return str(self._cli("logs", self.job_id, "--rank", str(rank)).stdout)

    def cancel(self) -> None:
        self._cli("cancel", self.job_id)


def submit_api(host: str, script: str, script_args: list[str], options: dict[str, Any]) -> RemoteJob:
    """``hpc_train.submit(script, *args, remote=host, **options)``."""
    settings = config.load()
    reply = submit(Ssh(host), settings, script, script_args, options)
    return RemoteJob(str(reply["job_id"]), host, settings.python, str(reply.get("folder", "")))
