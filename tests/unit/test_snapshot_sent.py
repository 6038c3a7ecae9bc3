"""A project sent by ``submit --remote``: the login node snapshots exactly what the laptop listed (a tracked
``*.pt`` included, a file the job wrote left out, the git project's top rather than the script's folder),
with the laptop's commit, and says when its copy is not what was listed. Real folders, real git, and the
copy made as rsync makes it (contents and modification times kept)."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

from hpc_train.snapshot.files import find_project, project_files
from hpc_train.snapshot.provenance import git_facts
from hpc_train.snapshot.sent import Sent, listing, receiving, sent_for
from hpc_train.snapshot.take import take
from tests.conftest import write
from tests.unit.test_snapshot_files import git
from tests.unit.test_snapshot_take import MB, names


def _laptop(tmp_path: Path) -> tuple[Path, dict]:
    """A git project with its script in a sub-folder, and the request its submit --remote sends."""
    project = tmp_path / "laptop"
    write(project / "src" / "train.py", "from lib import X\n")
    write(project / "src" / "lib.py", "X = 1\n")
    write(project / "weights.pt", "tracked")
    git(project, "init", "-q", "-b", "exp")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "c")
    write(project / "src" / "lib.py", "X = 2\n")  # uncommitted
    entries = project_files(find_project(project / "src" / "train.py"))
    facts, diff = git_facts(find_project(project / "src" / "train.py"))
    return project, {"files": json.loads(json.dumps(listing(entries))), "git": facts, "diff": base64.b64encode(diff).decode()}


def _copy(project: Path, dest: Path) -> Path:
    shutil.copytree(project, dest, ignore=shutil.ignore_patterns(".git"))  # copy2 keeps the times, as rsync -a
    return dest


def test_the_login_node_snapshots_the_laptops_list_with_its_commit(tmp_path):
    project, request = _laptop(tmp_path)
    copy = _copy(project, tmp_path / "login" / "laptop-1234")
    write(copy / "src" / "written-by-a-job.txt", "output\n")
    sent = Sent.from_request(copy, request)
    assert sent.stale() is None
    with receiving(sent):
        code = take(str(copy / "src" / "train.py"), str(tmp_path / "jobs"), MB, with_provenance=True)
    assert names(code) == {"src/train.py", "src/lib.py", "weights.pt"} and code.project == str(copy)
    head = git(project, "rev-parse", "HEAD").strip()
    facts = code.provenance
    assert (facts["commit"], facts["branch"], facts["dirty"]) == (head, "exp", True) and facts["diff_digest"]
    diff = tmp_path / "jobs" / "snapshots" / "diffs" / f"{facts['diff_digest']}.diff"
    assert b"+X = 2" in diff.read_bytes()
    # outside receiving(), the same copy is a folder outside git: its script's folder, the job's file taken in
    plain = take(str(copy / "src" / "train.py"), str(tmp_path / "jobs"), MB, with_provenance=True)
    assert names(plain) == {"train.py", "lib.py", "written-by-a-job.txt"} and plain.provenance["commit"] is None


def test_a_copy_that_is_not_what_was_listed_says_which_file(tmp_path):
    project, request = _laptop(tmp_path)
    copy = _copy(project, tmp_path / "copy")

    def stale() -> str:  # each submit reads the copy anew
        return Sent.from_request(copy, request).stale() or ""

    write(copy / "src" / "lib.py", "X = 'edited there'\n")
    assert "src/lib.py" in stale() and "not the file that was sent" in stale()
    shutil.copy2(project / "src" / "lib.py", copy / "src" / "lib.py")
    assert stale() == ""
    (copy / "weights.pt").unlink()
    assert "weights.pt is not in" in stale()
    os.symlink("src/lib.py", copy / "weights.pt")  # a link where a file was listed
    assert "weights.pt is not in" in stale()


def test_only_a_script_inside_the_copy_is_snapshotted_from_the_list(tmp_path):
    project, request = _laptop(tmp_path)
    copy = _copy(project, tmp_path / "copy")
    elsewhere = write(tmp_path / "other" / "job.py", "pass\n")
    with receiving(Sent.from_request(copy, request)):
        assert sent_for(copy / "src" / "train.py") is not None and sent_for(elsewhere) is None
    assert sent_for(copy / "src" / "train.py") is None
