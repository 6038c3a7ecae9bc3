"""Ranks for the tests that start their own worlds, forked from a Python that has already imported torch.

A rank of a tiny test job spends ~2.5 s of CPU starting: ``import torch`` (1.1 s) and ``torch._dynamo``
(1.1 s, imported by the first optimizer and by DDP), then a few milliseconds training. On make test's two
cores that start-up was a third of the suite's CPU. Here one server process per pytest worker imports
them once and forks each rank from there: every rank is still a real process of its own (own pid,
environment, working folder, output file, gloo over TCP, exit status, signals, ``atexit``), that runs its
script as ``python SCRIPT ARGS`` would, with torchrun's variables as the launch without an agent
(``-o agent=false``) sets them. What it does not exercise is torchrun's agent, which the sandbox's tests
run for real; a test that needs a fresh interpreter (sitecustomize, ``python -X``) launches one itself.

    python tests/rank_launcher.py        # the server: requests on stdin, one JSON line each

The server stays single-threaded and imports nothing that starts threads, so a fork copies no lock held
by a thread that the child lacks; it does no torch arithmetic (OpenMP's pool would not survive a fork).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# the job boot's pause (runtime/boot/hpc_train_gc.py), loaded as the job's sitecustomize loads it: importing it as
# hpc_train.runtime.boot would run hpc_train.runtime's __init__ in the server, before every rank's script
BOOT = REPO / "hpc_train" / "runtime" / "boot"
# torchrun's rank variables (and the agent's), none of which may leak from the test's own environment
TORCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID")  # fmt: skip


# -- the server: runs in its own process ------------------------------------------------------------


def _run_child(request: dict[str, Any]) -> None:
    """In the forked child: become ``python ARGV`` in the request's folder and environment, then exit as it would."""
    os.setsid()  # a process of its own, as a launcher's worker is: a signal to the server's group misses it
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, name in ((1, "out"), (2, "err")):  # appended to, as by every rank of a launcher sharing its pipe
        os.dup2(os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    marks = request["env"].get("HPC_TRAIN_TEST_CPU_MARKS")
    if marks:  # tools/test_cpu.py: this process's /proc environ is still the server's, which names another test
        start = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]
        Path(marks, f"{os.getpid()}:{start}").write_text(request["env"].get("PYTEST_CURRENT_TEST", ""))
    import random

    import torch

    random.seed()
    torch.seed()  # a new interpreter's generators are seeded afresh, not copied from the server's
    argv = request["argv"]
    import runpy

    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = str(Path(argv[0]).resolve().parent)
        runpy.run_path(argv[0], run_name="__main__")
    sys.exit(0)  # SystemExit, an exception or the end: the interpreter's own exit (atexit, threads joined)


def _reply(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())  # unbuffered: a fork copies no half-written reply


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _reply({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})


def serve() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # What the server imports lives as long as any rank: made with the collector paused and frozen after, as in
    # a job's Python, it is no rank's collector's to walk, nor (by writing the objects' headers) to copy out of
    # the pages the fork shares (a forked rank's CPU, measured on a tiny 4-step job: 1.03 s -> 0.47 s)
    sys.path.insert(0, str(BOOT))
    from hpc_train_gc import paused

    sys.path.remove(str(BOOT))  # a rank's sys.path is the script's, as a fresh python's

    with paused():
        import torch
        import torch._dynamo
        import torch.distributed
        import torch.nn.parallel  # noqa: F401

    _reply({"ready": os.getpid()})
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.05)
        _reap()
        if not readable:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return  # the test process went away: its ranks are its to kill
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _run_child(request)  # never returns: its SystemExit ends the child's interpreter
            _reply({"id": request["id"], "pid": pid})


# -- the test side ----------------------------------------------------------------------------------


class Server:
    """The fork server of this pytest worker (started on first use, gone with the worker)."""

    _one: Server | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        for name in TORCH_ENV:
            env.pop(name, None)
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.ended: dict[int, int] = {}
        self.started: dict[int, int] = {}
        self.changed = threading.Condition()
        self.next_id = 0
        ready = json.loads(self.proc.stdout.readline() or b"{}")  # type: ignore[union-attr]
        if "ready" not in ready:
            raise RuntimeError(f"the rank launcher did not start (exit {self.proc.wait()})")
        threading.Thread(target=self._listen, daemon=True).start()

    @classmethod
    def get(cls) -> Server:
        with cls._lock:
            if cls._one is None or cls._one.proc.poll() is not None:
                cls._one = Server()
            return cls._one

    def _listen(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            message = json.loads(line)
            with self.changed:
                if "id" in message:
                    self.started[message["id"]] = message["pid"]
                else:
                    self.ended[message["pid"]] = message["returncode"]
                self.changed.notify_all()

    def fork(self, argv: list[str], env: dict[str, str], cwd: Path, out: Path, err: Path) -> int:
        with self.changed:
            self.next_id += 1
            ident = self.next_id
            request = {"id": ident, "argv": argv, "env": env, "cwd": str(cwd), "out": str(out), "err": str(err)}
            self.proc.stdin.write((json.dumps(request) + "\n").encode())  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            if not self.changed.wait_for(lambda: ident in self.started, timeout=60):
                raise RuntimeError("the rank launcher did not fork a rank within 60 s")
            return self.started.pop(ident)

    def returncode(self, pid: int) -> int | None:
        with self.changed:
            return self.ended.get(pid)


class Rank:
    """One forked rank: a small part of ``subprocess.Popen``'s interface."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, out: Path, err: Path) -> None:
        self.server = Server.get()
        self.pid = self.server.fork(argv, env, cwd, out, err)

    def poll(self) -> int | None:
        return self.server.returncode(self.pid)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class World:
    """The ranks of one node of a world, as ``torchrun --nproc-per-node N`` starts them (agent=false): the
    same variables, the node's ranks writing to one stdout and one stderr (one file for both with
    ``merge=True``, as ``stderr=subprocess.STDOUT``), and, like torchrun, the others stopped when one fails."""

    def __init__(self, script_args: list[str], env: dict[str, str], cwd: Path, out_dir: Path, *, nproc: int,
                 port: int, nnodes: int = 1, node_rank: int = 0, merge: bool = False) -> None:  # fmt: skip
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = out_dir / f"node{node_rank}-{time.time_ns()}"
        self.out, self.err = Path(f"{stem}.out"), Path(f"{stem}.out" if merge else f"{stem}.err")
        base = {k: v for k, v in env.items() if k not in TORCH_ENV}
        base.setdefault("OMP_NUM_THREADS", "1")
        self.ranks = []
        for local in range(nproc):
            rank_env = {**base, "RANK": str(node_rank * nproc + local), "LOCAL_RANK": str(local),
                        "WORLD_SIZE": str(nnodes * nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node_rank),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
            self.ranks.append(Rank(script_args, rank_env, cwd, self.out, self.err))
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.ranks[0].pid

    def poll(self) -> int | None:
        codes = [r.poll() for r in self.ranks]
        failed = [c for c in codes if c not in (None, 0)]
        if failed and None in codes:  # torchrun's agent stops the rest of the node's workers
            for rank in self.ranks:
                rank.send_signal(signal.SIGTERM)
        if None not in codes:
            self.returncode = failed[0] if failed else 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if deadline is not None and time.time() > deadline:
                raise subprocess.TimeoutExpired(f"ranks {[r.pid for r in self.ranks]}", timeout or 0)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait (killing every rank on a timeout, then raising) and return the node's stdout and stderr."""
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return _read(self.out), "" if self.err == self.out else _read(self.err)

    def kill(self) -> None:
        for rank in self.ranks:
            rank.kill()
        self.wait(60)


def run_world(script_args: list[str], env: dict[str, str], cwd: Path, *, nproc: int, timeout: float,
              out_dir: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``subprocess.run(["torchrun", "--nproc-per-node", N, *script_args], capture_output=True, ...)`` with the
    ranks forked; their stdout and stderr are kept in ``out_dir`` (a new temporary folder if None)."""
    port = _free_port()
    world = World(script_args, env, cwd, out_dir or Path(tempfile.mkdtemp(prefix="ranks-")), nproc=nproc, port=port)
    out, err = world.communicate(timeout)
    return subprocess.CompletedProcess(["torchrun", *script_args], world.returncode or 0, out, err)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _free_port() -> int:
    from tests.conftest import free_port  # the suite's port range, away from the sandbox's

    return free_port()


if __name__ == "__main__":
    serve()
