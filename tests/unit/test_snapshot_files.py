"""Which files make a script's project: git's view in a work tree, the folder minus the usual clutter
outside one, .hpc_trainignore in both; links stay inside the tree. Real git, real folders."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpc_train.errors import SnapshotError
from hpc_train.snapshot.files import Entry, Project, find_project, project_files
from tests.conftest import write


def git(root: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True, env=env).stdout


def repo(root: Path) -> Path:
    write(root / "train.py", "import model\n")
    write(root / "pkg" / "model.py", "W = 1\n")
    write(root / ".gitignore", "runs/\n*.log\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "one")
    return root


def paths(entries: list[Entry]) -> list[str]:
    return [e.path for e in entries]


def test_in_a_git_tree_the_files_are_what_git_would_commit(tmp_path):
    root = repo(tmp_path / "proj")
    write(root / "new_module.py", "")  # untracked, not ignored: part of what runs
    write(root / "runs" / "out.txt", "x")  # ignored by git
    write(root / "debug.log", "x")
    (root / "pkg" / "model.py").unlink()  # tracked, deleted in the work tree
    write(root / "sub" / "deep" / "job.py", "")
    project = find_project(root / "sub" / "deep" / "job.py")
    assert project == Project(root.resolve(), True)  # the work tree's top, from a script deep inside
    assert paths(project_files(project)) == [".gitignore", "new_module.py", "sub/deep/job.py", "train.py"]


def test_hpc_trainignore_leaves_out_tracked_files_too(tmp_path):
    root = repo(tmp_path / "proj")
    write(root / "data" / "big.bin", "x" * 10)
    git(root, "add", "-A")
    write(root / ".hpc_trainignore", "/data/\n")
    assert paths(project_files(find_project(root / "train.py"))) == [".gitignore", ".hpc_trainignore", "pkg/model.py", "train.py"]


def test_outside_git_the_folder_less_environments_caches_and_checkpoints(tmp_path):
    root = tmp_path / "plain"
    for name in ("train.py", "lib/util.py", "conf/a.yaml", "run.sh"):
        write(root / name, "x")
    for name in (".venv/lib/site.py", "lib/__pycache__/util.cpython-311.pyc", "model.pt", "wandb/run/x", "outputs/1/log"):
        write(root / name, "clutter")
    write(root / ".hpc_trainignore", "conf/\n!conf/keep.yaml\n")
    write(root / "conf" / "keep.yaml", "x")
    project = find_project(root / "train.py")
    assert project == Project(root.resolve(), False)
    assert paths(project_files(project)) == [".hpc_trainignore", "lib/util.py", "run.sh", "train.py"]


def test_the_exec_bit_and_size_are_read(tmp_path):
    root = tmp_path / "plain"
    write(root / "run.sh", "#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o755)
    write(root / "train.py", "12345")
    assert project_files(find_project(root / "train.py")) == [Entry("run.sh", 10, executable=True), Entry("train.py", 5)]


def test_a_link_inside_the_tree_stays_a_link_relative_to_its_folder(tmp_path):
    root = (tmp_path / "plain").resolve()
    write(root / "configs" / "base.yaml", "x")
    write(root / "train.py", "x")
    os.symlink("configs/base.yaml", root / "default.yaml")
    (root / "lib").mkdir()
    os.symlink(root / "configs", root / "lib" / "configs")  # absolute, into the tree
    entries = {e.path: e for e in project_files(find_project(root / "train.py"))}
    assert entries["default.yaml"].link == "configs/base.yaml"
    assert entries["lib/configs"].link == "../configs"  # made relative: it must point into the snapshot, not back here
    assert "lib/configs/base.yaml" not in entries  # a linked folder is not entered


@pytest.mark.parametrize("target", ["../outside.txt", "/etc/hostname"])
def test_a_link_out_of_the_tree_is_refused_naming_it_and_the_fix(tmp_path, target):
    root = tmp_path / "plain"
    write(tmp_path / "outside.txt", "secret")
    write(root / "train.py", "x")
    os.symlink(target, root / "data.txt")
    with pytest.raises(SnapshotError) as err:
        project_files(find_project(root / "train.py"))
    assert f"data.txt is a symbolic link to {target}, outside the project" in err.value.message
    assert "/data.txt in" in (err.value.hint or "") and ".hpc_trainignore" in (err.value.hint or "")
    write(root / ".hpc_trainignore", "/data.txt\n")  # the hint's line is enough
    assert paths(project_files(find_project(root / "train.py"))) == [".hpc_trainignore", "train.py"]


def test_the_default_ignores_read_without_pathspec_as_pathspec_reads_them():
    import pathspec

    from hpc_train.snapshot.files import DEFAULT_IGNORES, DefaultIgnores

    spec, ours = pathspec.GitIgnoreSpec.from_lines(DEFAULT_IGNORES), DefaultIgnores()
    paths = [
        "train.py", "model.pt", "a/b/model.pt", "x.pyc", "x.pyo", "x.pyx", "__pycache__/", "pkg/__pycache__/m.pyc",
        "pkg/__pycache__/", ".venv/", "src/.venv/bin/python", "mylib.egg-info/", "mylib.egg-info/PKG-INFO", "outputs/",
        "outputs/run1/log.txt", "data/outputs.txt", "build.py", "build/", "checkpoints/step-1/x.bin", "notes.h5",
        "env.py", "env/", "wandb/run/x", "node_modules/a/b.js", "weights.safetensors", "data.npy", "a.npz.txt",
    ]  # fmt: skip
    for path in paths:
        assert ours.match_file(path) == spec.match_file(path), path
