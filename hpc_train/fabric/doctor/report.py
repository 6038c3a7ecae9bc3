"""A check's result and the node's report: ok / warn / fail, what was found and what to do about it; the text
``doctor`` prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass
class Check:
    name: str
    status: str
    summary: str
    fix: str | None = None
    details: list[str] = field(default_factory=list)


@dataclass
class Report:
    host: str
    context: str  # "login node" / "compute node (job 42)"
    checks: list[Check]

    @property
    def status(self) -> str:
        statuses = {c.status for c in self.checks}
        return FAIL if FAIL in statuses else WARN if WARN in statuses else OK

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "context": self.context, "status": self.status, "checks": [asdict(c) for c in self.checks]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        return cls(data["host"], data["context"], [Check(**c) for c in data["checks"]])


def format_report(report: Report, color: bool = False) -> str:
    marks = {OK: "ok", WARN: "WARN", FAIL: "FAIL"}
    paint = {OK: "\x1b[32m", WARN: "\x1b[33m", FAIL: "\x1b[31m"} if color else {}
    width = max(len(c.name) for c in report.checks)
    lines = [f"hpc_train doctor on {report.host} ({report.context})"]
    for check in report.checks:
        mark = marks[check.status]
        if color:
            mark = f"{paint[check.status]}{mark:<4}\x1b[0m"
        lines.append(f"  {mark:<4}  {check.name:<{width}}  {check.summary}")
        for detail in check.details:
            lines.append(f"        {'':<{width}}    {detail}")
        if check.fix and check.status != OK:
            lines.append(f"        {'':<{width}}  → {check.fix}")
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in (OK, WARN, FAIL)}
    lines.append(f"{report.status}: {counts[OK]} ok, {counts[WARN]} warning(s), {counts[FAIL]} failure(s)")
    return "\n".join(lines) + "\n"
