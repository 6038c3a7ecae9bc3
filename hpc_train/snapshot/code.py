"""The snapshot a job runs, as the plan, the job's record and a sweep's record carry it: plain data, so the
planner names it without importing the store (git and pathspec load only when a snapshot is taken)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Code:
    tree: str  # the snapshot's folder (absolute): the project's files as they were at submit
    digest: str  # the tree's name in the store: equal digests, equal files
    project: str  # the folder it was taken of (the git work tree's top, else the script's folder)
    files: int = 0
    size: int = 0
    reused: bool = False  # the same tree was stored before: this submit copied nothing
    provenance: dict[str, Any] = field(default_factory=dict)  # hpc_train.snapshot.provenance, at submit

    def path_of(self, path: str) -> str:
        """``path`` (absolute) inside the snapshot when it lies in the project; else unchanged."""
        rel = os.path.relpath(path, self.project)
        if rel == os.curdir or rel.startswith(os.pardir + os.sep) or rel == os.pardir:
            return path
        return os.path.join(self.tree, rel)

    def as_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, data: dict[str, Any] | None) -> Code | None:
        if not isinstance(data, dict):
            return None
        try:
            return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except TypeError:  # a record written by another version, without a field this one needs
            return None
