"""The content-addressed store: a tree holds the project's bytes, an unchanged project is stored once, a
changed file is noticed even when its size and mtime are put back, and the errors say what to do. Real
files, real hard links; the unreadable file is read by an unprivileged process, as a user's would be."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.errors import SnapshotError
from hpc_train.snapshot.files import find_project, project_files
from hpc_train.snapshot.store import MANIFEST, Store
from tests.conftest import REPO, write


def project(root: Path) -> Path:
    write(root / "train.py", "import lib.model\n")
    write(root / "lib" / "__init__.py", "")
    write(root / "lib" / "model.py", "W = 1\n")
    write(root / "run.sh", "#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o755)
    os.symlink("lib/model.py", root / "model_link.py")
    return root / "train.py"


def save(store: Store, script: Path):
    found = find_project(script)
    return store.save(found, project_files(found))


def objects(store: Store) -> set[Path]:
    return {p for p in store.objects.rglob("*") if p.is_file()}


def test_a_tree_holds_the_projects_files_links_and_modes_read_only(tmp_path):
    store = Store(tmp_path / "store")
    snap = save(store, project(tmp_path / "proj"))
    tree = snap.path
    assert not snap.reused and snap.files == 5 and snap.size == len("import lib.model\n") + len("W = 1\n") + len("#!/bin/sh\n")
    assert (tree / "train.py").read_text() == "import lib.model\n" and (tree / "lib" / "model.py").read_text() == "W = 1\n"
    assert os.readlink(tree / "model_link.py") == "lib/model.py" and (tree / "model_link.py").read_text() == "W = 1\n"
    assert os.access(tree / "run.sh", os.X_OK) and (tree / "run.sh").stat().st_mode & 0o777 == 0o555
    assert (tree / "train.py").stat().st_mode & 0o777 == 0o444  # shared by every tree with this content
    manifest = json.loads((tree / MANIFEST).read_text())
    assert [f["path"] for f in manifest["files"]] == ["lib/__init__.py", "lib/model.py", "model_link.py", "run.sh", "train.py"]
    assert not [p for p in store.root.rglob(".tmp-*")]  # nothing half-made left behind


def test_an_unchanged_project_is_stored_once_and_a_changed_file_only_adds_itself(tmp_path):
    store = Store(tmp_path / "store")
    script = project(tmp_path / "proj")
    first = save(store, script)
    before = objects(store)
    second = save(store, script)
    assert second.reused and second.digest == first.digest and objects(store) == before

    write(script.parent / "lib" / "model.py", "W = 2\n")
    third = save(store, script)
    assert not third.reused and third.digest != first.digest
    assert len(objects(store) - before) == 1  # the one changed file
    # the unchanged files are the same inode in both trees: hard links, not copies
    assert (third.path / "train.py").stat().st_ino == (first.path / "train.py").stat().st_ino
    assert (first.path / "lib" / "model.py").read_text() == "W = 1\n"  # the first snapshot still runs the first code


def test_an_edit_that_keeps_size_and_mtime_is_still_seen(tmp_path):
    """What the index trusts (size, mtime) a careless tool can put back; ctime it cannot."""
    store = Store(tmp_path / "store")
    script = project(tmp_path / "proj")
    model = script.parent / "lib" / "model.py"
    old = os.stat(model)
    os.utime(model, ns=(old.st_atime_ns, old.st_mtime_ns - 10_000_000_000))  # an old file: indexed, not racy
    first = save(store, script)
    stamp = os.stat(model)
    model.write_text("W = 9\n")  # same size
    os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    again = save(store, script)
    assert again.digest != first.digest and (again.path / "lib" / "model.py").read_text() == "W = 9\n"


def test_objects_collected_since_the_index_was_written_are_read_again(tmp_path):
    store = Store(tmp_path / "store")
    script = project(tmp_path / "proj")
    for path in script.parent.rglob("*"):  # old files: every one indexed
        os.utime(path, (1e9, 1e9), follow_symlinks=False)
    save(store, script)
    shutil.rmtree(store.objects)  # what a garbage collection of unused content would leave
    write(script.parent / "lib" / "__init__.py", "# edited\n")
    tree = save(store, script).path
    assert (tree / "train.py").read_text() == "import lib.model\n" and (tree / "lib" / "__init__.py").read_text() == "# edited\n"


def test_two_clones_of_one_commit_share_a_tree(tmp_path):
    store = Store(tmp_path / "store")
    a = save(store, project(tmp_path / "a"))
    b = save(store, project(tmp_path / "b"))
    assert b.reused and b.digest == a.digest


UNREADABLE = """
import sys
from pathlib import Path
from hpc_train.errors import SnapshotError
from hpc_train.snapshot.files import find_project, project_files
from hpc_train.snapshot.store import Store
found = find_project(Path(sys.argv[1]))
try:
    Store(Path(sys.argv[2])).save(found, project_files(found))
except SnapshotError as exc:
    print(exc)
"""


def test_an_unreadable_file_is_named_with_the_line_that_leaves_it_out(tmp_path):
    script = project(tmp_path / "proj")
    write(script.parent / "secrets.txt", "x")
    os.chmod(script.parent / "secrets.txt", 0o000)
    # root reads every file: as root, the process runs without the capabilities that let it (setpriv)
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search", "--"]
    out = subprocess.run(
        [*(drop if os.geteuid() == 0 else []), sys.executable, "-c", UNREADABLE, str(script), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"cannot read {script.parent / 'secrets.txt'} for the job's snapshot: Permission denied" in out.stdout, out.stdout
    assert f"the line /secrets.txt in {script.parent / '.hpc_trainignore'}" in out.stdout
    assert not [p for p in (tmp_path / "store").rglob(".tmp-*")]


def test_a_store_that_cannot_be_written_is_an_error_not_a_traceback(tmp_path):
    script = project(tmp_path / "proj")
    write(tmp_path / "store", "a file where the store's folder should be")
    with pytest.raises(SnapshotError) as err:
        save(Store(tmp_path / "store"), script)
    assert f"cannot write the snapshot store at {tmp_path / 'store'}" in err.value.message and "--no-snapshot" in (
        err.value.hint or ""
    )
