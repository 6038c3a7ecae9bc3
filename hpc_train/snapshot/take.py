"""Taking a script's snapshot at submit: its project listed (files.py) without the job root when that lies
inside it, checked against the size limit (limits.py), stored (store.py) under the job root, and, for a
submit, where the code came from (provenance.py) with the uncommitted diff kept beside the trees."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from hpc_train.snapshot.code import Code
from hpc_train.snapshot.files import Entry, find_project, project_files
from hpc_train.snapshot.limits import check_size
from hpc_train.snapshot.sent import sent_for
from hpc_train.snapshot.store import Store

STORE = "snapshots"  # in the job root: objects/, trees/, index/, diffs/


def store_of(job_root: str) -> Store:
    return Store(Path(job_root) / STORE)


def take(script: str, job_root: str, max_bytes: int, *, with_provenance: bool) -> Code:
    """The snapshot of ``script``'s project, stored if new; raises SnapshotError (hpc_train.errors) when it
    cannot be taken, before anything is queued."""
    sent = sent_for(Path(script))  # submit --remote: the laptop's list of the copy's files, and its git facts
    project = sent.project if sent else find_project(Path(script))
    entries = without(sent.entries() if sent else project_files(project), project.root, Path(job_root))
    check_size(project, entries, max_bytes)
    store = store_of(job_root)
    snap = store.save(project, entries)
    facts: dict = {}
    if with_provenance:
        from hpc_train.snapshot.provenance import provenance, received, write_diff

        prov, diff = received(sent) if sent else provenance(project)
        write_diff(diff, store.root / "diffs")
        facts = prov.as_record()
    return Code(str(snap.path), snap.digest, str(project.root), snap.files, snap.size, snap.reused, facts)


def tidy(code: Code | None, above: int) -> int:
    """After a submit: past ``above`` snapshots in its store, collect those no queued job needs (collect.py,
    needed.py); how many went. A listing when under it; never fails the submit that asked."""
    if code is None or above <= 0:
        return 0
    store = Store(Path(code.tree).parent.parent)
    try:
        if sum(1 for p in store.trees.iterdir() if not p.name.startswith(".tmp-")) <= above:
            return 0
        from hpc_train.snapshot.collect import collect
        from hpc_train.snapshot.needed import needed_trees

        return collect(store, needed_trees()).trees
    except OSError:
        return 0


def discard(code: Code | None) -> None:
    """Undo ``take`` for a submission that was refused: the tree it made goes, and the store with it when
    no tree is left in it, so a refused job leaves the job root as it found it. A tree another job runs
    (``reused``) stays; objects other trees hold are left to ``gc``."""
    if code is None or code.reused:
        return
    tree = Path(code.tree)
    shutil.rmtree(tree, ignore_errors=True)
    store = tree.parent.parent
    try:
        emptied = not any(p for p in tree.parent.iterdir() if not p.name.startswith(".tmp-"))
    except OSError:
        return
    if emptied:
        shutil.rmtree(store, ignore_errors=True)


def without(entries: list[Entry], root: Path, job_root: Path) -> list[Entry]:
    """The entries outside the job root: jobs submitted from the project they train keep their folders (logs,
    checkpoints, the store itself) in it, and a snapshot of those would grow with every job, and read files
    that running jobs are writing."""
    try:
        inside = job_root.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return entries
    if inside != ".":
        return [e for e in entries if not e.path.startswith(inside + "/")]
    # the job root is the project's own folder: what hpc_train made there stays out (the script's files stay in)
    return [e for e in entries if not JOB_ROOT_ITEM.fullmatch(e.path.partition("/")[0]) or "/" not in e.path]


# what a job root holds: job folders (Slurm's ids, a local job's), sweep folders, the snapshot store
JOB_ROOT_ITEM = re.compile(rf"\d+(_\d+)?|sweep-.*|local|{STORE}")
