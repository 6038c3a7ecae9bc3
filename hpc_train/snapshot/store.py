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
from hpc_train.snapshot.files import CACHEDIR_TAG, IGNORE_FILE, Entry, Project

# the Cache Directory Tagging Specification's signature (https://bford.info/cachedir/)
CACHEDIR_TEXT = "Signature: 8a477f597d28d172789f06886806bc55\n# hpc_train's code snapshots: python -m hpc_train gc\n"
MANIFEST = "hpc_train_snapshot.json"  # in the tree, beside the project's files (a name no project uses)
CHUNK = 1 << 20
SMALL = 4 << 20  # read whole: hashed before anything is written, so known content costs no write
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
        self.mark()
        index = Index(self.root / "index" / f"{digest_of(os.fsencode(project.root))}.json")
        files = {e.path: e for e in entries if e.link is None}
        names = {path: self.object_for(project.root, e, index) for path, e in files.items()}
        while True:
            manifest = {
                "files": [
                    {"path": e.path, "link": e.link} if e.link is not None else {"path": e.path, "object": names[e.path]}
                    for e in entries
                ]
            }
            # the digest is the content's, wherever the project lies: two clones of one commit share a tree
            digest = digest_of(json.dumps(manifest["files"], sort_keys=True).encode())
            tree = self.trees / digest
            if (tree / MANIFEST).exists():
                os.utime(tree)  # used again: young, so a collection running now leaves it (collect.py)
                reused = True
                break
            # the index named objects unchecked (a stat each, for nothing when the tree exists); a new tree
            # needs them all, and one that is gone (collected) is read again from the project
            lost = {path: self.put(project.root, files[path]) for path, name in names.items() if not self.has(name)}
            if all(names[path] == name for path, name in lost.items()):
                reused = self.build(tree, manifest)
                break
            names.update(lost)  # the file changed behind an index entry: the tree is another one
        index.retain(set(files))
        index.save()
        return Snapshot(digest, tree, len(entries), sum(e.size for e in entries), reused)

    def mark(self) -> None:
        """Tag the store as what it is, so no snapshot ever holds one (a job root inside a project would
        otherwise put every earlier snapshot into the next): CACHEDIR.TAG for a folder that is walked
        (files.walked_names, and backup tools), a .gitignore of everything for one git lists."""
        self.root.mkdir(parents=True, exist_ok=True)
        for name, text in ((CACHEDIR_TAG, CACHEDIR_TEXT), (".gitignore", "*\n")):
            if not (self.root / name).exists():
                (self.root / name).write_text(text)

    def has(self, name: str) -> bool:
        return (self.objects / name[:2] / name).exists()

    def object_for(self, root: Path, entry: Entry, index: Index) -> str:
        """The object holding the file's content: the index's word when the file's stat is unchanged,
        else the file is read (and stored when its content is new)."""
        key = list(entry.stamp)
        known = index.get(entry.path, key)
        if known is not None:
            return known
        name = self.put(root, entry)
        index.record(entry.path, key, name, racy=time.time_ns() - entry.stamp[1] < RACY_NS)
        return name

    def put(self, root: Path, entry: Entry) -> str:
        """The file's object, stored if its content is new: a small file is read once, hashed, and
        written only when the store lacks it; a large one is hashed as it is copied."""
        if entry.size <= SMALL:
            data = read(root, entry.path)
            name = digest_of(data) + ("-x" if entry.executable else "")  # one inode, one mode: the exec bit is in the key
            if not self.has(name):
                fd, tmp = self.temporary()
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                self.settle(tmp, name, entry.executable)
            return name
        fd, tmp = self.temporary()
        digest = copy_hashing(root, entry.path, fd, tmp)
        name = digest + ("-x" if entry.executable else "")
        self.settle(tmp, name, entry.executable)
        return name

    def temporary(self) -> tuple[int, str]:
        self.objects.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(dir=self.objects, prefix=".tmp-")

    def settle(self, tmp: str, name: str, executable: bool) -> None:
        """The written copy becomes the object ``name`` (read-only), unless it is there already."""
        try:
            final = self.objects / name[:2] / name
            if not final.exists():
                final.parent.mkdir(exist_ok=True)
                os.chmod(tmp, 0o555 if executable else 0o444)
                os.replace(tmp, final)
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


def read(root: Path, name: str) -> bytes:
    try:
        return (root / name).read_bytes()
    except OSError as exc:
        raise unreadable(root, name, exc) from None


def copy_hashing(root: Path, name: str, fd: int, tmp: str) -> str:
    digest = hashlib.blake2b(digest_size=16)
    try:
        with open(root / name, "rb") as src, os.fdopen(fd, "wb") as out:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:
        os.unlink(tmp)
        if exc.filename == str(root / name) or not exc.filename:
            raise unreadable(root, name, exc) from None
        raise
    return digest.hexdigest()


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
