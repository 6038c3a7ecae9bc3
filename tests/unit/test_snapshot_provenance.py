"""Where the code came from: commit, branch, dirty, the diff's digest and text, the Python and the
installed packages. Real git repositories."""

from __future__ import annotations

import importlib.metadata
import platform

import pytest

from hpc_train.snapshot.files import find_project
from hpc_train.snapshot.provenance import installed_packages, packages_digest, provenance, write_diff
from tests.conftest import write
from tests.unit.test_snapshot_files import git, repo


def test_a_clean_tree_gives_its_commit_and_branch_and_no_diff(tmp_path):
    root = repo(tmp_path / "proj")
    git(root, "branch", "-m", "exp/lr")
    facts, diff = provenance(find_project(root / "train.py"))
    assert facts.commit == git(root, "rev-parse", "HEAD").strip() and facts.branch == "exp/lr"
    assert not facts.dirty and facts.diff_digest is None and diff == b""
    assert facts.python == platform.python_version() and facts.packages_digest == packages_digest()


def test_uncommitted_changes_are_dirty_with_the_diff_kept_by_its_digest(tmp_path):
    root = repo(tmp_path / "proj")
    write(root / "pkg" / "model.py", "W = 2\n")
    facts, diff = provenance(find_project(root / "train.py"))
    assert facts.dirty and b"-W = 1\n+W = 2\n" in diff
    kept = write_diff(diff, tmp_path / "diffs")
    assert kept is not None and kept.read_bytes() == diff and kept.stem == facts.diff_digest
    write(root / "pkg" / "model.py", "W = 3\n")
    assert provenance(find_project(root / "train.py"))[0].diff_digest != facts.diff_digest


def test_an_untracked_file_makes_the_tree_dirty_and_a_detached_head_has_no_branch(tmp_path):
    root = repo(tmp_path / "proj")
    git(root, "checkout", "-q", "--detach")
    write(root / "notes.py", "")
    facts, _ = provenance(find_project(root / "train.py"))
    assert facts.dirty and facts.branch is None and facts.commit


def test_outside_git_only_the_python_and_packages(tmp_path):
    facts, diff = provenance(find_project(write(tmp_path / "plain" / "train.py", "")))
    assert (facts.commit, facts.branch, facts.dirty, diff) == (None, None, False, b"")
    assert facts.packages_digest == packages_digest()


def test_the_packages_are_pip_freezes_lines_without_running_pip():
    listed = installed_packages()
    assert f"pytest=={pytest.__version__}" in listed and f"pydantic=={importlib.metadata.version('pydantic')}" in listed
    assert listed == sorted(set(listed), key=str.lower)


def test_the_packages_digest_is_kept_until_a_site_packages_folder_changes(tmp_path, monkeypatch):
    import os
    import sys

    site = tmp_path / "lib" / "site-packages"
    meta = write(site / "demo-1.0.dist-info" / "METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "project"), str(site)])
    first = packages_digest()
    assert "demo==1.0" in installed_packages()
    write(tmp_path / "project" / "edited.py", "x = 1\n")  # the working folder changes with every edit
    stamp = site.stat().st_mtime_ns
    meta.write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.1\n")  # inside a dist-info: no folder changes
    os.utime(site, ns=(stamp, stamp))
    assert packages_digest() == first  # the cached digest: nothing that is stamped changed
    (site / "demo-1.0.dist-info").rename(site / "demo-2.0.dist-info")  # an upgrade replaces the dist-info
    assert packages_digest() != first and "demo==1.1" in installed_packages()
