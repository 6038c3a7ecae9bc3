"""Taking a script's snapshot at submit: the job root stays out of it wherever it lies, a store is never
snapshotted into the next, a home folder is refused before it is read whole, and a submit records where
the code came from. Real folders, real git."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.errors import SnapshotError
from hpc_train.snapshot import files
from hpc_train.snapshot.code import Code
from hpc_train.snapshot.take import take
from tests.conftest import write
from tests.unit.test_snapshot_files import git

MB = 1 << 20


def names(code: Code) -> set[str]:
    tree = Path(code.tree)
    return {p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file() and p.name != "hpc_train_snapshot.json"}


def test_a_job_root_inside_the_project_stays_out_of_its_snapshots(tmp_path):
    script = write(tmp_path / "train.py", "print(1)\n")
    write(tmp_path / "lib.py", "X = 1\n")
    write(tmp_path / "runs" / "123" / "123_0_log.out", "a log\n")
    first = take(str(script), str(tmp_path / "runs"), MB, with_provenance=False)
    second = take(str(script), str(tmp_path / "runs"), MB, with_provenance=False)
    assert names(first) == {"train.py", "lib.py"}
    assert second.digest == first.digest and second.reused and not first.reused
    assert Path(first.tree).parent.parent == tmp_path / "runs" / "snapshots"


def test_a_job_root_that_is_the_projects_folder_leaves_out_job_and_sweep_folders(tmp_path):
    script = write(tmp_path / "train.py", "print(1)\n")
    write(tmp_path / "data" / "vocab.txt", "a b\n")
    write(tmp_path / "4711" / "4711_0_log.out", "log\n")
    write(tmp_path / "sweep-20261207-101010-abcdef" / "0" / "out.txt", "x\n")
    code = take(str(script), str(tmp_path), MB, with_provenance=False)
    assert names(code) == {"train.py", "data/vocab.txt"}


def test_a_store_is_never_snapshotted_into_the_next_wherever_it_lies(tmp_path):
    project = tmp_path / "proj"
    script = write(project / "train.py", "print(1)\n")
    inner = take(str(script), str(project / "elsewhere"), MB, with_provenance=False)  # a store inside, not our job root
    assert (
        (project / "elsewhere" / "snapshots" / "CACHEDIR.TAG")
        .read_text()
        .startswith("Signature: 8a477f597d28d172789f06886806bc55")
    )
    write(project / "train.py", "print(2)\n")
    outer = take(str(script), str(tmp_path / "jobs"), MB, with_provenance=False)
    assert names(outer) == {"train.py"} and names(inner) == {"train.py"}
    # in a git work tree, the store's own .gitignore keeps it out of `git ls-files --others`
    git(project, "init", "-q")
    in_git = take(str(script), str(tmp_path / "jobs"), MB, with_provenance=False)
    assert names(in_git) == {"train.py"}


def test_a_folder_of_more_files_than_a_project_holds_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "MAX_FILES", 50)
    script = write(tmp_path / "train.py", "print(1)\n")
    for i in range(60):
        write(tmp_path / "notes" / f"{i}.txt", "x")
    with pytest.raises(SnapshotError) as err:
        take(str(script), str(tmp_path / "jobs"), MB, with_provenance=False)
    assert "more than 50 files" in str(err.value) and "--no-snapshot" in err.value.hint
    assert not (tmp_path / "jobs" / "snapshots" / "trees").exists()  # nothing stored


def test_over_the_limit_nothing_is_stored_and_the_largest_file_is_named(tmp_path):
    script = write(tmp_path / "train.py", "print(1)\n")
    write(tmp_path / "blob.bin", "x" * 4096)
    with pytest.raises(SnapshotError) as err:
        take(str(script), str(tmp_path / "jobs"), 1024, with_provenance=False)
    assert "blob.bin" in str(err.value) and "/blob.bin" in err.value.hint
    assert not (tmp_path / "jobs" / "snapshots").exists()


def test_a_submit_records_the_commit_branch_and_the_uncommitted_diff(tmp_path):
    project = tmp_path / "proj"
    script = write(project / "train.py", "print(1)\n")
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "one")
    clean = take(str(script), str(tmp_path / "jobs"), MB, with_provenance=True)
    head = git(project, "rev-parse", "HEAD").strip()
    assert clean.provenance["commit"] == head and clean.provenance["branch"] == "main" and not clean.provenance["dirty"]
    assert clean.provenance["packages_digest"] and clean.project == str(project.resolve())
    write(project / "train.py", "print(2)\n")
    dirty = take(str(script), str(tmp_path / "jobs"), MB, with_provenance=True)
    assert dirty.provenance["dirty"] and dirty.digest != clean.digest
    diff = tmp_path / "jobs" / "snapshots" / "diffs" / f"{dirty.provenance['diff_digest']}.diff"
    assert "+print(2)" in diff.read_text()
    assert not take(str(script), str(tmp_path / "jobs"), MB, with_provenance=False).provenance  # render: no git status


def test_paths_map_into_the_tree_only_inside_the_project(tmp_path):
    code = Code(tree="/store/trees/ab", digest="ab", project="/home/u/proj")
    assert code.path_of("/home/u/proj/scripts/train.py") == "/store/trees/ab/scripts/train.py"
    assert code.path_of("/home/u/other/train.py") == "/home/u/other/train.py"
    assert code.path_of("/home/u/proj") == "/home/u/proj"
    assert Code.from_record(code.as_record()) == code
    assert Code.from_record({"digest": "ab"}) is None and Code.from_record(None) is None
