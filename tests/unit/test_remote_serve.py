"""The login node's side of ``submit --remote`` (``python -m hpc_train.remote.serve``), as a real process reading
its request on stdin: what it answers before anything is submitted (another version, a copy that is not what
was listed, a request it cannot read). Nothing here reaches a scheduler."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hpc_train.snapshot.files import Entry
from hpc_train.snapshot.sent import listing
from hpc_train.version import __version__
from tests.conftest import write


def serve(folder: Path, request: object) -> tuple[int, dict]:
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train.remote.serve"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=60,
    )
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def _request(folder: Path, version: str = __version__) -> dict:
    script = write(folder / "train.py", "print(1)\n")
    stat = script.stat()
    entry = Entry("train.py", stat.st_size, stamp=(stat.st_size, stat.st_mtime_ns, 0, 0))
    options = {"site": "sandbox", "job_root": str(folder / "jobs")}
    return {"script": "train.py", "options": options, "version": version, "cwd": ".", "files": listing([entry]), "git": {}}


def test_another_version_on_the_laptop_is_refused_naming_both(isolated_user, tmp_path):
    code, reply = serve(tmp_path, _request(tmp_path, version="0.0.9"))
    assert code == 2 and f"this login node has hpc_train {__version__}, the submitting machine 0.0.9" in reply["error"]
    assert not (tmp_path / "jobs").exists()


def test_a_copy_that_is_not_what_was_listed_is_asked_for_again(isolated_user, tmp_path):
    request = _request(tmp_path)
    write(tmp_path / "train.py", "print('edited on the login node')\n")
    code, reply = serve(tmp_path, request)
    assert code == 0 and reply == {"upload": f"train.py in {tmp_path} is not the file that was sent"}
    assert not (tmp_path / "jobs").exists()  # nothing stored, nothing submitted


def test_a_request_it_cannot_read_is_said(isolated_user, tmp_path):
    request = {**_request(tmp_path), "files": [["train.py"]]}  # a row without its size and time
    code, reply = serve(tmp_path, request)
    assert code == 2 and reply["error"].startswith("the submission was not readable")
