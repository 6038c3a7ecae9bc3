"""Which files make a script's project.

In a git work tree: git's own view, the tracked files plus the untracked ones git does not ignore, so
what the user would commit is what the job runs. Outside git: the script's folder, minus what a training
folder holds besides its code (environments, caches, checkpoints, run outputs). ``.hpc_trainignore`` at
the project's root (gitignore syntax) leaves out more in both cases.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Protocol

from hpc_train.errors import SnapshotError

IGNORE_FILE = ".hpc_trainignore"
CACHEDIR_TAG = "CACHEDIR.TAG"  # a folder holding one is a cache (a snapshot store among them): never listed
MAX_FILES = 100_000  # more is a home folder or a data folder, not a project: refused before it is all read
# outside git only: a git tree says what it ignores in its own .gitignore
DEFAULT_IGNORES = (
    ".git/",
    ".hg/",
    ".svn/",
    ".venv/",
    "venv/",
    "env/",
    "__pycache__/",
    "*.py[cod]",
    ".ipynb_checkpoints/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".tox/",
    "*.egg-info/",
    "build/",
    "dist/",
    "node_modules/",
    "wandb/",
    "mlruns/",
    "outputs/",
    "lightning_logs/",
    "checkpoints/",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.safetensors",
    "*.npy",
    "*.npz",
    "*.h5",
)


@dataclass(frozen=True)
class Project:
    """The tree a script belongs to: its git work tree's top, else the script's own folder."""

    root: Path
    git: bool


@dataclass(frozen=True)
class Entry:
    """One file of the project: a regular file (``size`` bytes) or a symbolic link (``link``: its target,
    relative, inside the project)."""

    path: str  # relative to the project's root, "/"-separated
    size: int = 0
    executable: bool = False
    link: str | None = None
    # size, mtime, ctime and inode when listed: the store's index compares them instead of reading the file
    stamp: tuple[int, int, int, int] = field(default=(0, 0, 0, 0), compare=False)


def find_project(script: Path) -> Project:
    """The folder holding ``.git`` (a folder, or a file for a worktree or submodule) nearest above the script is
    the work tree's top, as ``git rev-parse --show-toplevel`` would say, without starting git (~5 ms)."""
    folder = script.resolve().parent
    top = next((p for p in (folder, *folder.parents) if (p / ".git").exists()), None)
    return Project(top, True) if top is not None else Project(folder, False)


def project_files(project: Project) -> list[Entry]:
    """The project's files, sorted by path; raises SnapshotError for a link that leaves the tree."""
    ignored = ignore_spec(project.root, defaults=not project.git)
    names = sorted(set(capped(git_names(project.root) if project.git else walked_names(project.root, ignored), project)))
    if ignored is not None:  # most git projects have no .hpc_trainignore: 2,000 matches against nothing cost 40 ms
        names = [name for name in names if not ignored.match_file(name)]
    entries = (entry(project.root, os.fspath(project.root), name) for name in names)
    return [e for e in entries if e is not None]


def capped(names: Iterable[str], project: Project) -> Iterator[str]:
    for count, name in enumerate(names):
        if count == MAX_FILES:
            raise SnapshotError(
                f"the snapshot of {project.root} would hold more than {MAX_FILES:,} files: is that folder a home "
                "or data folder rather than the script's project?",
                hint=f"put the script in a folder of its own, leave the rest out in {project.root / IGNORE_FILE}, "
                "or run it in place with --no-snapshot",
            )
        yield name


def git(folder: Path, *args: str) -> bytes | None:
    """git's output, or None where there is no git or the folder is not in a work tree."""
    import subprocess  # here: a project outside git never starts one

    try:
        out = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def git_names(root: Path) -> list[str]:
    out = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if out is None:
        raise SnapshotError(
            f"`git ls-files` failed in {root}", hint="is the work tree readable? --no-snapshot runs the code in place"
        )
    return [os.fsdecode(name) for name in out.split(b"\0") if name]


def walked_names(root: Path, ignored: Ignores | None) -> Iterator[str]:
    for folder, dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root).as_posix()
        prefix = "" if rel == "." else f"{rel}/"
        if CACHEDIR_TAG in files and folder != os.fspath(root):
            dirs[:] = []
            continue
        # prune ignored folders here: a .venv holds tens of thousands of files nobody wants listed
        dirs[:] = [d for d in dirs if ignored is None or not ignored.match_file(f"{prefix}{d}/")]
        linked = [d for d in dirs if os.path.islink(os.path.join(folder, d))]  # a link is an entry, not a folder to enter
        dirs[:] = [d for d in dirs if d not in linked]
        yield from (f"{prefix}{name}" for name in (*files, *linked))


class Ignores(Protocol):
    def match_file(self, file: str) -> bool: ...


def ignore_spec(root: Path, defaults: bool) -> Ignores | None:
    """What to leave out: the defaults outside git, and ``.hpc_trainignore``; None when nothing is."""
    path = root / IGNORE_FILE
    try:
        own = [line for line in path.read_text(errors="replace").splitlines() if line.strip() and not line.startswith("#")]
    except FileNotFoundError:
        own = []
    except OSError as exc:
        raise SnapshotError(f"cannot read {path}: {exc.strerror}") from None
    if not own:
        return DefaultIgnores() if defaults else None
    import pathspec  # here, not at the top: only a project with its own .hpc_trainignore pays for it (~8 ms)

    return pathspec.GitIgnoreSpec.from_lines([*(DEFAULT_IGNORES if defaults else ()), *own])


class DefaultIgnores:
    """DEFAULT_IGNORES as gitignore reads them, without pathspec: each is a folder name or a file name pattern
    without a slash inside, so it matches that name at any depth."""

    folders = tuple(p[:-1] for p in DEFAULT_IGNORES if p.endswith("/"))
    files = tuple(p for p in DEFAULT_IGNORES if not p.endswith("/"))

    def match_file(self, file: str) -> bool:
        parts = file.rstrip("/").split("/")
        folders = parts if file.endswith("/") else parts[:-1]
        if any(fnmatchcase(name, pattern) for name in folders for pattern in self.folders):
            return True
        return not file.endswith("/") and any(fnmatchcase(parts[-1], pattern) for pattern in self.files)


def entry(root: Path, top: str, name: str) -> Entry | None:
    """``name``'s entry (``top`` is ``root`` as text: a Path per file costs more than the stat it is for)."""
    try:
        st = os.lstat(os.path.join(top, name))
    except FileNotFoundError:
        return None  # tracked, deleted in the work tree: the commit would not have it either
    if stat.S_ISLNK(st.st_mode):
        return Entry(name, link=inside_target(root, name))
    if not stat.S_ISREG(st.st_mode):
        return None  # a submodule's folder, a socket, a fifo: not code
    stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    return Entry(name, st.st_size, executable=bool(st.st_mode & 0o111), stamp=stamp)


def inside_target(root: Path, name: str) -> str:
    """A link's target, relative to the link's folder, when it stays inside the tree: a snapshot never
    follows a link out of the project (the job would read whatever is there when it starts)."""
    path = root / name
    target = os.readlink(path)
    resolved = Path(os.path.normpath(path.parent / target))
    real_root = root.resolve()
    try:
        inside = resolved.resolve().is_relative_to(real_root) and resolved.is_relative_to(root)
    except OSError:
        inside = False
    if not inside:
        raise SnapshotError(
            f"{path} is a symbolic link to {target}, outside the project {root}: a snapshot holds the project's own files",
            hint=f"copy what it points to into the project, or leave the link out with the line /{name} in {root / IGNORE_FILE}",
        )
    return os.path.relpath(resolved, path.parent)
