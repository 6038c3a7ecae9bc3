"""The content-addressed store: every file's content once (``objects/``), one tree of hard links per
distinct state of a project (``trees/<digest>/``).

A second submit of an unchanged project finds its tree already there and copies nothing; a sweep's
thousand tasks share one tree. Objects are read-only: a job that opened its own code for writing would
otherwise change every snapshot holding the same content. A per-project index of (size, mtime, ctime,
inode) spares re-reading files that did not change since the last snapshot, as git's index does.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hpc_train.errors import SnapshotError
from hpc_train.snapshot.files import IGNORE_FILE, Entry, Project

MANIFEST = "hpc_train_snapshot.json"  # in the tree, beside the project's files (a name no project uses)
CHUNK = 1 << 20
# a file changed within this long of being indexed may keep its mtime on a coarse clock: not indexed
RACY_NS = 2_000_000_000


@dataclass(frozen=True)
class Snapshot:
    digest: str
    path: Path  # the tree the job runs in
    files: int
    size: int
    reused: bool  # the same tree was stored before: nothing copied


def digest_of(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / "objects"
        self.trees = root / "trees"

    def save(self, project: Project, entries: list[Entry]) -> Snapshot:
        """The tree of ``entries`` (from files.project_files), stored if it is new. A file of the project
        that cannot be read, or a store that cannot be written, raises SnapshotError."""
        try:
            return self._save(project, entries)
        except OSError as exc:  # the project's own files raise their SnapshotError where they are read
            raise store_failed(self.root, exc) from None

    def _save(self, project: Project, entries: list[Entry]) -> Snapshot:
        index = Index(self.root / "index" / f"{digest_of(os.fsencode(project.root))}.json")
        files = [
            {"path": e.path, "link": e.link}
            if e.link is not None
            else {"path": e.path, "object": self.object_for(project.root, e, index)}
            for e in entries
        ]
        # the digest is the content's, wherever the project lies: two clones of one commit share a tree
        manifest = {"files": files}
        digest = digest_of(json.dumps(files, sort_keys=True).encode())
        tree = self.trees / digest
        reused = (tree / MANIFEST).exists()
        if not reused:
            reused = self.build(tree, manifest)
        index.retain({e.path for e in entries if e.link is None})
        index.save()
        return Snapshot(digest, tree, len(files), sum(e.size for e in entries), reused)

    def object_for(self, root: Path, entry: Entry, index: Index) -> str:
        path = root / entry.path
        try:
            st = path.stat()
        except OSError as exc:
            raise unreadable(root, entry.path, exc) from None
        key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        known = index.get(entry.path, key)
        if known is not None and (self.objects / known[:2] / known).exists():
            return known
        name = self.put(root, entry)
        index.record(entry.path, key, name, racy=time.time_ns() - st.st_mtime_ns < RACY_NS)
        return name

    def put(self, root: Path, entry: Entry) -> str:
        """Copy a file into the store (one read: hashed as it is copied); its object's name."""
        self.objects.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.objects, prefix=".tmp-")
        try:
            digest = copy_hashing(root, entry.path, fd)
            name = digest + ("-x" if entry.executable else "")  # one inode, one mode: the exec bit is part of the key
            final = self.objects / name[:2] / name
            if not final.exists():
                final.parent.mkdir(exist_ok=True)
                os.chmod(tmp, 0o555 if entry.executable else 0o444)
                os.replace(tmp, final)
            return name
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def build(self, tree: Path, manifest: dict) -> bool:
        """Make the tree beside its final name, then rename it there: a tree with a manifest is whole.
        True when a concurrent submit made the same tree first."""
        self.trees.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.trees, prefix=f".tmp-{tree.name}-"))
        try:
            for item in manifest["files"]:
                place(tmp / item["path"], item, self.objects)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            try:
                os.rename(tmp, tree)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                return True
            return False
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def place(dest: Path, item: dict, objects: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if item.get("link") is not None:
        os.symlink(item["link"], dest)
        return
    source = objects / item["object"][:2] / item["object"]
    try:
        os.link(source, dest)
    except OSError as exc:
        if exc.errno != errno.EMLINK:  # an inode's links are counted (65,000 on ext4): an empty
            raise  # __init__.py is in every tree
        shutil.copyfile(source, dest)
        os.chmod(dest, source.stat().st_mode & 0o777)


def copy_hashing(root: Path, name: str, fd: int) -> str:
    digest = hashlib.blake2b(digest_size=16)
    try:
        src = open(root / name, "rb")  # noqa: SIM115 - closed below, apart from the store's own errors
    except OSError as exc:
        os.close(fd)
        raise unreadable(root, name, exc) from None
    with src, os.fdopen(fd, "wb") as out:
        while True:
            try:
                chunk = src.read(CHUNK)
            except OSError as exc:
                raise unreadable(root, name, exc) from None
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)
            out.write(chunk)


def unreadable(root: Path, name: str, exc: OSError) -> SnapshotError:
    return SnapshotError(
        f"cannot read {root / name} for the job's snapshot: {exc.strerror}",
        hint=f"make it readable, or leave it out with the line /{name} in {root / IGNORE_FILE}",
    )


def store_failed(root: Path, exc: OSError) -> SnapshotError:
    where = f" ({exc.filename})" if exc.filename else ""
    return SnapshotError(
        f"cannot write the snapshot store at {root}{where}: {exc.strerror}",
        hint="free space there or make it writable; --no-snapshot runs the code in place",
    )


class Index:
    """(size, mtime, ctime, inode) of each file at its last snapshot, and the object it was: a cache, so a
    missing or unreadable index only costs a re-read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.changed = False
        try:
            self.entries: dict[str, list] = json.loads(path.read_text())["entries"]
        except (OSError, ValueError, KeyError, TypeError):
            self.entries = {}

    def get(self, name: str, key: list[int]) -> str | None:
        known = self.entries.get(name)
        return known[4] if isinstance(known, list) and len(known) == 5 and known[:4] == key else None

    def record(self, name: str, key: list[int], obj: str, racy: bool) -> None:
        if racy:
            self.changed |= self.entries.pop(name, None) is not None
            return
        self.entries[name] = [*key, obj]
        self.changed = True

    def retain(self, names: set[str]) -> None:
        gone = set(self.entries) - names
        for name in gone:
            del self.entries[name]
        self.changed |= bool(gone)

    def save(self) -> None:
        if not self.changed:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as out:
            json.dump({"entries": self.entries}, out)
        os.replace(tmp, self.path)
