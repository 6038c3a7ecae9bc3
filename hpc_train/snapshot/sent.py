"""A project sent from another machine (``submit --remote``): the login node snapshots exactly the files the
laptop listed, and records the laptop's git facts, which its copy cannot give (the copy holds no ``.git``).

Walking the copy instead would see it as a folder outside git: the default ignores would leave out a tracked
``*.pt``, a script in a sub-folder would make that sub-folder the project, files the laptop removed or the
job wrote would be taken in, and the commit would be lost. The list also says whether the copy is current
(the size and modification second of every file, as rsync's own quick check compares them): a second submit
of an unchanged project then needs no rsync at all.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_train.errors import SnapshotError
from hpc_train.snapshot.files import Entry, Project, entry

AGAIN = "submit again: the project is sent again when the login node's copy differs"
_SENT: contextvars.ContextVar[Sent | None] = contextvars.ContextVar("hpc_train_sent_project", default=None)


@dataclass(frozen=True)
class Listed:
    """One file as the laptop listed it."""

    path: str
    size: int
    mtime_s: int
    link: str | None = None


def listing(entries: list[Entry]) -> list[list[Any]]:
    """The laptop's side: ``[path, size, mtime in whole seconds, link target or None]`` per file, for JSON."""
    return [[e.path, e.size, e.stamp[1] // 1_000_000_000, e.link] for e in entries]


@dataclass(frozen=True)
class Sent:
    """The copy on this machine (``root``), what the laptop listed, and its git facts and uncommitted diff."""

    root: Path
    files: list[Listed]
    git: dict[str, Any] = field(default_factory=dict)  # commit, branch, dirty, diff_digest (provenance.Provenance)
    diff: bytes = b""

    @classmethod
    def from_request(cls, root: Path, data: dict[str, Any]) -> Sent:
        files = [Listed(str(p), int(size), int(mtime), link) for p, size, mtime, link in data["files"]]
        diff = base64.b64decode(data.get("diff") or "")
        return cls(root, files, dict(data.get("git") or {}), diff)

    @property
    def project(self) -> Project:
        return Project(self.root, git=False)

    @functools.cached_property
    def listed_entries(self) -> list[Entry]:
        """The listed files as they are in the copy; raises SnapshotError naming the first that differs (changed
        there since the check: the laptop's next submit sends it again). Read once: the check and the snapshot
        that follows it are of the same listing."""
        top, out = os.fspath(self.root), []
        for listed in self.files:
            found = entry(self.root, top, listed.path)
            if found is None or found.link != listed.link:
                raise SnapshotError(f"{listed.path} is not in {self.root} as it was sent", hint=AGAIN)
            if found.link is None and (found.size, found.stamp[1] // 1_000_000_000) != (listed.size, listed.mtime_s):
                raise SnapshotError(f"{listed.path} in {self.root} is not the file that was sent", hint=AGAIN)
            out.append(found)
        return out

    def entries(self) -> list[Entry]:
        return self.listed_entries

    def stale(self) -> str | None:
        """Why the copy is not what the laptop has (the first file that differs), or None when it is."""
        try:
            self.entries()
        except SnapshotError as exc:
            return exc.message
        except OSError as exc:  # a folder of the copy unreadable: send it again
            return str(exc)
        return None


@contextlib.contextmanager
def receiving(sent: Sent) -> Iterator[None]:
    """While the login node submits the sent project: a snapshot of a script inside ``sent.root`` is of the list."""
    token = _SENT.set(sent)
    try:
        yield
    finally:
        _SENT.reset(token)


def sent_for(script: Path) -> Sent | None:
    """The sent project ``script`` belongs to, when this process is submitting one."""
    sent = _SENT.get()
    if sent is None:
        return None
    return sent if script.resolve().is_relative_to(sent.root.resolve()) else None
