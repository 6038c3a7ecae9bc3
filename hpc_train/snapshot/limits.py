"""The size a snapshot may reach: over it, submit stops before anything is queued and says which files
weigh most and the ``.hpc_trainignore`` lines that would leave them out."""

from __future__ import annotations

from hpc_train.errors import SnapshotError
from hpc_train.snapshot.files import IGNORE_FILE, Entry, Project

DEFAULT_MAX_BYTES = 1 << 30
SHOWN = 10


def check_size(project: Project, entries: list[Entry], limit: int = DEFAULT_MAX_BYTES) -> int:
    """The snapshot's size in bytes; raises SnapshotError past ``limit``."""
    total = sum(e.size for e in entries)
    if total <= limit:
        return total
    largest = sorted(entries, key=lambda e: (-e.size, e.path))[:SHOWN]
    width = max(len(size_text(e.size)) for e in largest)
    listed = "\n".join(f"  {size_text(e.size):>{width}}  {e.path}" for e in largest)
    lines = list(dict.fromkeys(ignore_line(e.path) for e in largest))
    raise SnapshotError(
        f"the snapshot of {project.root} would hold {size_text(total)} in {len(entries)} files, over its limit of "
        f"{size_text(limit)}; the largest:\n{listed}",
        hint=f"leave them out with {'these lines' if len(lines) > 1 else 'this line'} in {project.root / IGNORE_FILE}: "
        + "  ".join(lines),
    )


def ignore_line(path: str) -> str:
    """The line that leaves ``path`` out: its top folder (data sits in folders), else the file itself,
    anchored at the root so a file of the same name deeper down stays in."""
    top, sep, _ = path.partition("/")
    return f"/{top}/" if sep else f"/{top}"


def size_text(size: int) -> str:
    """1536 -> "1.5 KiB": a reader compares file sizes at a glance."""
    if size < 1024:
        return f"{size} B"
    value, units = size / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.1f} {units[0]}"
