"""Over the size limit, nothing is stored: the error lists the heaviest files and the .hpc_trainignore
lines that leave them out, and those lines are enough."""

from __future__ import annotations

import pytest

from hpc_train.errors import SnapshotError
from hpc_train.snapshot.files import find_project, project_files
from hpc_train.snapshot.limits import check_size, size_text
from tests.conftest import write


def test_over_the_limit_the_ten_largest_and_the_lines_that_leave_them_out(tmp_path):
    root = tmp_path / "plain"
    write(root / "train.py", "x" * 100)
    for i in range(12):
        write(root / "data" / f"shard{i:02}.bin", "d" * (2000 + i))
    write(root / "vocab.json", "v" * 5000)
    project = find_project(root / "train.py")
    entries = project_files(project)
    with pytest.raises(SnapshotError) as err:
        check_size(project, entries, limit=10_000)
    message = err.value.message
    assert f"the snapshot of {project.root} would hold 28.5 KiB in 14 files, over its limit of 9.8 KiB" in message
    listed = message.split("the largest:\n")[1].splitlines()
    assert [line.split()[-1] for line in listed] == ["vocab.json", *(f"data/shard{i:02}.bin" for i in range(11, 2, -1))]
    assert listed[0].split()[:2] == ["4.9", "KiB"]
    assert err.value.hint == f"leave them out with these lines in {project.root / '.hpc_trainignore'}: /vocab.json  /data/"
    write(root / ".hpc_trainignore", "/vocab.json\n/data/\n")
    assert check_size(project, project_files(project), limit=10_000) == 100 + len("/vocab.json\n/data/\n")


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 << 20, "5.0 MiB"), (3 << 30, "3.0 GiB"), (2 << 40, "2.0 TiB")],
)
def test_sizes_read_at_a_glance(size, text):
    assert size_text(size) == text
