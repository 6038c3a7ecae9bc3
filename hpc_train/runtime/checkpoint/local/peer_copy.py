"""Files between the nodes' own disks, over TCP: a save's partner copy, and the files a restore lacks.

Node-local storage is reachable from its own node alone, and the job's collectives are busy with
training (and MPI or Horovod jobs have no torch process group at all), so each node's first rank
serves its node-local checkpoint folder on a port of its own, from a thread. Every request starts
with the job's token, a secret the ranks shared in a collective: another job on the cluster cannot
write into this one's folder or read its state. Paths are relative to the served folder and never
leave it. A file is received under a ``.part`` name, digested as it arrives, fsynced, and renamed
into place only when its size and digest are those the sender named: a copy cut short by a kill -9
or a full disk is never taken for a whole one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import struct
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, NoReturn

from hpc_train.runtime.checkpoint.shares import fsync_dir

HELD = "HELD"  # a node-local folder's marker: what COMMIT is to the shared folder, plus what this folder holds
_HEADER = struct.Struct("!I")
_CHUNK = 4 << 20
RESEAL_WAIT_S = 1.0  # a re-sealed folder is renamed back within milliseconds
_TIMEOUT_S = 120.0  # a peer that stops sending mid-file: a copy fails instead of hanging its thread


class PeerError(RuntimeError):
    """A copy to or from another node failed; the message is the peer's own where it answered."""


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, _CHUNK))
        if not chunk:
            raise PeerError("the connection closed early")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(sock: socket.socket) -> dict[str, Any]:
    (size,) = _HEADER.unpack(_exactly(sock, _HEADER.size))
    if size > 1 << 24:
        raise PeerError(f"a request of {size} bytes is no request of ours")
    message = json.loads(_exactly(sock, size))
    if not isinstance(message, dict):
        raise PeerError("malformed request")
    return message


def inside(root: Path, relative: str) -> Path:
    """``root / relative``, refused unless it stays inside ``root`` (no absolute path, no ``..``)."""
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or any(p in ("..", ".", "") for p in parts):
        raise PeerError(f"{relative!r} is not a path inside the checkpoint folder")
    return root.joinpath(*parts)


def receive_file(source: Any, target: Path, size: int, digest: str, algorithm: str) -> None:
    """``size`` bytes from ``source`` (a socket or a file) into ``target``, atomically: refused (and
    nothing left behind) unless the bytes have ``digest``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    h = hashlib.new(algorithm)
    left = size
    try:
        with open(part, "wb") as f:
            while left:
                chunk = source.recv(min(left, _CHUNK)) if hasattr(source, "recv") else source.read(min(left, _CHUNK))
                if not chunk:
                    raise PeerError(f"{target.name}: {size - left} of {size} bytes arrived")
                h.update(chunk)
                f.write(chunk)
                left -= len(chunk)
            f.flush()
            os.fsync(f.fileno())
        if h.hexdigest() != digest:
            raise PeerError(f"{target.name}: the bytes that arrived do not have the digest the commit recorded")
        os.replace(part, target)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def _discard_until_closed(conn: socket.socket) -> None:
    """After an error reply: read what the sender still sends (the rest of a file that did not fit)
    until it closes. Closing with its bytes unread would reset the connection, and the sender would
    see a broken pipe in place of the reason (a full disk)."""
    conn.shutdown(socket.SHUT_WR)
    while conn.recv(_CHUNK):
        pass


def _open_settled(path: Path) -> BinaryIO:
    """``path`` opened for reading. A node re-sealing a copy it serves (its leader's gather at a restore:
    ``step-N`` renamed aside, the new ``step-N`` of the same files renamed in) has no ``step-N`` for an
    instant, and a peer fetching from it then failed its whole restore (seen when both nodes' ranks
    started at once): a missing file is looked for again for up to RESEAL_WAIT_S."""
    deadline = time.monotonic() + RESEAL_WAIT_S
    while True:
        try:
            return open(path, "rb")
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class Server:
    """Serves ``root`` to the other nodes of the job: ``put`` a file, ``get`` one, ``seal`` a folder."""

    def __init__(self, root: Path, token: str, host: str = "0.0.0.0") -> None:
        self.root = root
        self.token = token
        self._listener = socket.create_server((host, 0), backlog=64)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="hpc_train-peer-copy", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._handle, args=(conn,), name="hpc_train-peer-copy-conn", daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(_TIMEOUT_S)
            try:
                request = _receive(conn)
                if request.get("token") != self.token:
                    raise PeerError("wrong token: not a rank of this job")
                reply = self._answer(conn, request)
            except Exception as exc:  # the sender gets the reason (a full disk, a bad path), not a closed socket
                reply = {"error": str(exc) or type(exc).__name__}
            try:
                _send(conn, reply)
                if "error" in reply:
                    _discard_until_closed(conn)
            except OSError:
                pass

    def _answer(self, conn: socket.socket, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "put":
            target = inside(self.root, str(request["path"]))
            receive_file(conn, target, int(request["size"]), str(request["digest"]), str(request["algorithm"]))
            return {"ok": True}
        if op == "get":
            with _open_settled(inside(self.root, str(request["path"]))) as f:
                _send(conn, {"size": os.fstat(f.fileno()).st_size})
                conn.sendfile(f)
            return {"ok": True}
        if op == "seal":
            final = inside(self.root, str(request["final"]))
            seal(inside(self.root, str(request["tmp"])), final, request["marker"])
            keep_newest(final.parent, max(1, int(request.get("keep", 1))))
            return {"ok": True}
        raise PeerError(f"unknown request {op!r}")

    def close(self) -> None:
        self._listener.close()


def seal(tmp: Path, final: Path, marker: dict[str, Any]) -> None:
    """``tmp`` renamed to ``final`` (replacing an older copy) with its HELD marker written first."""
    path = tmp / f".{HELD}.tmp"
    path.write_text(json.dumps(marker))
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    os.replace(path, tmp / HELD)
    fsync_dir(tmp)
    if final.exists():  # set aside, not removed first: a kill between the renames leaves a whole copy
        aside = final.with_name(f"{final.name}.old-{os.getpid()}")
        os.replace(final, aside)
        os.replace(tmp, final)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(final.parent)


def keep_newest(folder: Path, keep: int) -> None:
    """Only the newest ``keep`` sealed ``step-N`` copies in ``folder`` (a partner's copies of one node)."""
    sealed = []
    for path in folder.glob("step-*"):
        if "." not in path.name and (path / HELD).is_file() and path.name[5:].isdigit():
            sealed.append((int(path.name[5:]), path))
    for _, path in sorted(sealed)[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


class Client:
    """Requests to one node's :class:`Server`."""

    def __init__(self, address: tuple[str, int], token: str) -> None:
        self.address = address
        self.token = token

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=_TIMEOUT_S)
        return sock

    def _reply(self, sock: socket.socket) -> dict[str, Any]:
        reply = _receive(sock)
        if "error" in reply:
            raise PeerError(str(reply["error"]))
        return reply

    def put(self, relative: str, file: Path, digest: str, algorithm: str) -> None:
        size = file.stat().st_size
        with self._connect() as sock, open(file, "rb") as f:
            _send(
                sock, {"token": self.token, "op": "put", "path": relative, "size": size, "digest": digest, "algorithm": algorithm}
            )
            try:
                sock.sendfile(f)
            except (BrokenPipeError, ConnectionResetError) as exc:
                _raise_reason(sock, exc)
            self._reply(sock)

    def get(self, relative: str, target: Path, digest: str, algorithm: str) -> None:
        with self._connect() as sock:
            _send(sock, {"token": self.token, "op": "get", "path": relative})
            size = int(self._reply(sock)["size"])
            receive_file(sock, target, size, digest, algorithm)
            self._reply(sock)

    def seal(self, tmp: str, final: str, marker: dict[str, Any], keep: int = 1) -> None:
        """``tmp`` sealed as ``final`` on the peer, which then keeps the newest ``keep`` copies beside it."""
        with self._connect() as sock:
            _send(sock, {"token": self.token, "op": "seal", "tmp": tmp, "final": final, "marker": marker, "keep": keep})
            self._reply(sock)


def _raise_reason(sock: socket.socket, exc: OSError) -> NoReturn:
    """The peer stopped taking a file: the reason it sent before it closed (a full disk), else ``exc``."""
    try:
        reply = _receive(sock)
    except (OSError, PeerError):
        raise exc from None
    raise PeerError(str(reply.get("error") or exc)) from exc


def own_address(master_addr: str, master_port: int) -> str:
    """The address the other nodes reach this one at: the one this node's traffic to the master leaves from."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master_addr, master_port or 9))  # UDP: no packet is sent
            found = str(probe.getsockname()[0])
    except OSError:
        found = "127.0.0.1"
    if found.startswith("127.") and not master_addr.startswith("127."):  # the master is this node
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            pass
    return found
