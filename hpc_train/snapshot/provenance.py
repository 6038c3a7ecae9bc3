"""Where a job's code came from: the commit, the branch, whether the tree had uncommitted changes (and
the digest of that diff, whose text is kept beside the snapshot), the Python and a digest of the installed
packages, read from their metadata rather than by running pip (a second on a busy login node)."""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpc_train._resources import cache_dir, file_stamp, write_atomic
from hpc_train.snapshot.files import Project, git
from hpc_train.snapshot.sent import Sent
from hpc_train.snapshot.store import digest_of  # one digest for the store's names and the records'


@dataclass(frozen=True)
class Provenance:
    commit: str | None = None  # None outside git, or in a repository without a commit yet
    branch: str | None = None  # None on a detached HEAD
    dirty: bool = False
    diff_digest: str | None = None  # of `git diff HEAD --binary`, when dirty
    python: str = platform.python_version()
    packages_digest: str = ""

    def as_record(self) -> dict:
        return asdict(self)


def provenance(project: Project) -> tuple[Provenance, bytes]:
    """The facts, and the uncommitted diff (empty when clean or outside git) to keep beside the snapshot."""
    facts, diff = git_facts(project)
    digest = digest_of(diff) if diff else None
    return Provenance(**facts, diff_digest=digest, packages_digest=packages_digest()), diff


def git_facts(project: Project) -> tuple[dict[str, Any], bytes]:
    """``commit``, ``branch`` and ``dirty`` from one ``git status`` (v2 names the commit and the branch: three
    git calls were 20 ms of every submit), and the uncommitted diff; nothing outside git."""
    out = git(project.root, "status", "--porcelain=v2", "--branch", "--untracked-files=normal") if project.git else None
    if out is None:
        return {}, b""
    facts: dict[str, Any] = {"commit": None, "branch": None, "dirty": False}
    for line in out.splitlines():
        if line.startswith(b"# branch.oid "):
            facts["commit"] = None if line.endswith(b"(initial)") else os.fsdecode(line.split()[-1])
        elif line.startswith(b"# branch.head "):
            facts["branch"] = None if line.endswith(b"(detached)") else os.fsdecode(line.split(b" ", 2)[2])
        elif line and not line.startswith(b"#"):
            facts["dirty"] = True
    diff = (git(project.root, "diff", "HEAD", "--binary") or b"") if facts["commit"] and facts["dirty"] else b""
    return facts, diff


def received(sent: Sent) -> tuple[Provenance, bytes]:
    """A project sent by ``submit --remote``: the laptop's git facts and diff, this machine's Python and
    packages (the job runs with these)."""
    commit, branch = sent.git.get("commit"), sent.git.get("branch")
    digest = digest_of(sent.diff) if sent.diff else None
    return Provenance(commit, branch, bool(sent.git.get("dirty")), digest, packages_digest=packages_digest()), sent.diff


def installed_packages() -> list[str]:
    """``name==version`` of every distribution this Python sees, as pip freeze lists them (sorted, one
    line each; a name seen twice on the path counts once, as import would find it)."""
    import importlib.metadata  # here: ~30 ms of imports a cached digest spares

    seen: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").strip()
        if name:
            seen.setdefault(name.lower().replace("_", "-"), f"{name}=={dist.version}")
    return sorted(seen.values(), key=str.lower)


def packages_digest() -> str:
    """The digest of installed_packages(), kept in the user's cache under the stamps of the site-packages
    folders on sys.path: installing, upgrading or removing a distribution adds or removes a ``*.dist-info``
    folder, which changes its folder's mtime. Reading every distribution's metadata costs a submit ~0.1 s."""
    # the folders distributions are installed into: not the script's or the working folder, which change with
    # every edit (a distribution installed into a plain folder on PYTHONPATH is read, but does not refresh this)
    key = [[path, list(file_stamp(path) or ())] for path in sys.path if path.endswith(("site-packages", "dist-packages"))]
    folder = cache_dir("provenance")
    entry = folder / f"packages-{digest_of(json.dumps(key).encode())}.json" if folder is not None else None
    try:
        if entry is not None:
            stored = json.loads(entry.read_text())
            if stored["key"] == key:
                return str(stored["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = digest_of("\n".join(installed_packages()).encode())
    if entry is not None:
        write_atomic(entry, json.dumps({"key": key, "digest": digest}).encode())
    return digest


def write_diff(diff: bytes, folder: Path) -> Path | None:
    """The uncommitted diff, kept by its digest in ``folder`` (the store's ``diffs/``): a tree's digest says
    what the files were, not which commit they differ from."""
    if not diff:
        return None
    path = folder / f"{digest_of(diff)}.diff"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tmp-{path.name}-{os.getpid()}"
        tmp.write_bytes(diff)
        os.replace(tmp, path)
    return path
