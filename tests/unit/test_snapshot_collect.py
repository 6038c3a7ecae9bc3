"""Collection: the trees no job needs go, and with them the content no other tree holds; what is young
(a submit in progress, a tree just used again) stays."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hpc_train.snapshot.collect import Collected, collect
from hpc_train.snapshot.files import Entry
from hpc_train.snapshot.store import Store
from tests.conftest import write
from tests.unit.test_snapshot_store import project, save

DAY = 86400


def age(paths: list[Path], seconds: float) -> None:
    when = time.time() - seconds
    for path in paths:
        os.utime(path, (when, when), follow_symlinks=False)


def everything(store: Store) -> list[Path]:
    return [store.objects, store.trees, *store.objects.rglob("*"), *store.trees.glob("*")]


def test_an_unneeded_old_tree_goes_with_the_content_only_it_held(tmp_path):
    store = Store(tmp_path / "store")
    script = project(tmp_path / "proj")
    old = save(store, script)
    write(script.parent / "lib" / "model.py", "W = 2 and a longer line\n")
    kept = save(store, script)
    age(everything(store), DAY)
    done = collect(store, keep={kept.digest})
    assert not old.path.exists() and (kept.path / "lib" / "model.py").read_text() == "W = 2 and a longer line\n"
    assert (done.trees, done.objects, done.freed_bytes) == (1, 1, len("W = 1\n"))  # the other files are kept's too
    assert collect(store, keep={kept.digest}) == Collected(0, 0, 0)  # nothing left to do


def test_what_is_young_stays_a_tree_used_again_included(tmp_path):
    store = Store(tmp_path / "store")
    script = project(tmp_path / "proj")
    first = save(store, script)
    assert collect(store, keep=set()).trees == 0  # made a moment ago: a job may be being submitted with it
    age(everything(store), DAY)
    again = save(store, script)  # a new submit of the same code
    assert again.reused and collect(store, keep=set()).trees == 0 and first.path.exists()


def test_content_stored_but_not_yet_linked_stays_until_it_is_old(tmp_path):
    store = Store(tmp_path / "store")
    script = project(tmp_path / "proj")
    save(store, script)
    age(everything(store), DAY)
    assert collect(store, keep=set()).objects == 4  # the tree went: its four distinct contents with it
    write(script.parent / "extra.py", "new content\n")
    name = store.put(script.parent, Entry("extra.py", 12))  # what a submit stores before it builds the tree
    assert collect(store, keep=set()).objects == 0 and store.has(name)
    age([store.objects / name[:2] / name], DAY)
    assert collect(store, keep=set()).objects == 1 and not store.has(name)
