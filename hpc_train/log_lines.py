"""The lines of a job's log that the login side reads back. ``goodput``, ``report`` and ``status`` tell a
job's runs apart by the batch shell's and rank 0's ``hpc_train: ...`` lines (a run began, failed and what
followed, stopped, saved). Each such line is declared once, here: the batch script gets its text from here
(``lines.SAVED.shell(...)`` in the template), the runtime writes it with ``.text(...)``, and the login side
reads it with ``.parse(...)``, so a writer and its reader cannot drift apart unseen
(tests/unit/test_log_lines.py renders the script and reads back what its echo lines print).

Imported by both sides: it imports nothing of hpc_train's.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

PREFIX = "hpc_train: "
_FIELD = re.compile(r"\{(\w+)\}")
# what a field may hold: the reader's pattern for it
_KINDS = {"int": r"\d+", "word": r"\S+", "text": r".*"}
# a shell expression goes inside the echo's double quotes: the line's own words must not end them or expand
_SHELL_SPECIAL = set('"$`\\!')


class LogLine:
    """One line: its words with ``{field}`` places, and what each field may hold (int, word or text)."""

    def __init__(self, name: str, form: str, **kinds: str) -> None:
        fields = _FIELD.findall(form)
        if sorted(fields) != sorted(kinds) or not set(kinds.values()) <= set(_KINDS):
            raise ValueError(f"{name}: fields {fields} and kinds {kinds} disagree")
        if _SHELL_SPECIAL & set(_FIELD.sub("", form)):
            raise ValueError(f"{name}: {form!r} has a character the shell would expand inside double quotes")
        self.name, self.form, self.kinds = name, form, kinds
        parts = _FIELD.split(form)  # literal, field, literal, field, ...
        body = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>{_KINDS[kinds[p]]})" for i, p in enumerate(parts))
        self.pattern = re.compile(re.escape(PREFIX) + body)

    def text(self, **values: object) -> str:
        """The line without its prefix, for the runtime's ``log()``."""
        return self.form.format(**values)

    def shell(self, **expressions: object) -> str:
        """The whole line for a shell ``echo "..."``: each field a shell expression (``${HPC_TRAIN_RUN}``)."""
        return PREFIX + self.form.format(**expressions)

    def parse(self, line: str) -> dict[str, int | str] | None:
        """The fields of ``line`` (ints as ints) when it is this line, wherever it starts in ``line``; else None."""
        match = self.pattern.search(line)
        if match is None:
            return None
        return {k: int(v) if self.kinds[k] == "int" else v for k, v in match.groupdict().items()}


# the batch shell's, as each run begins and ends
RUN_BEGINS = LogLine(
    "RUN_BEGINS",
    "run {run} of job {job} on {host} at {at} (restart budget {budget})",
    run="int",
    job="word",
    host="word",
    at="word",
    budget="int",
)
RESTARTING = LogLine("RESTARTING", "run {run} failed (exit {status}); restarting inside the allocation", run="int", status="int")
REQUEUEING = LogLine("REQUEUEING", "run {run} failed (exit {status}); requeueing", run="int", status="int")
NOT_RETRIED = LogLine(
    "NOT_RETRIED",
    "run {run} failed (exit {status}): {why}; not requeueing: it would fail the same way",
    run="int",
    status="int",
    why="text",
)
BUDGET_SPENT = LogLine(
    "BUDGET_SPENT",
    "run {run} failed (exit {status}); restart budget exhausted ({restarts} restarts)",
    run="int",
    status="int",
    restarts="int",
)
NOT_STARTED = LogLine(
    "NOT_STARTED", "restart budget exhausted: {restarts} restarts used; not starting run {run}", restarts="int", run="int"
)
# rank 0's, from the checkpointer
STOPPING = LogLine("STOPPING", "run {run}: stopping at step {step}: {reason}", run="int", step="int", reason="text")
SAVED = LogLine("SAVED", "saved step {step} to {where}", step="int", where="text")

ALL = (RUN_BEGINS, RESTARTING, REQUEUEING, NOT_RETRIED, BUDGET_SPENT, NOT_STARTED, STOPPING, SAVED)
# a run's failure, by what followed it
FAILURES = (RESTARTING, REQUEUEING, NOT_RETRIED, BUDGET_SPENT)

# for the templates: ``{{ lines.SAVED.shell(step="${step}", where="${dir}") }}``
LINES = SimpleNamespace(**{line.name: line for line in ALL})
