"""One error family for everything a user can get wrong.

Every error a user can cause derives from :class:`HpcTrainError`. The CLI catches it once, at the
edge, prints ``message`` (and ``hint``) without a traceback and exits with ``exit_code``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from hpc_train.config.text import printable

# Exit codes follow sysexits(3) where one fits, so wrappers can tell usage from infrastructure.
EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_CONFIG = 78  # EX_CONFIG
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: scheduler or command missing/down


class ConfigWarning(UserWarning):
    """Worth saying, not worth stopping for: e.g. a debug-only NCCL variable left in a production profile.
    The CLI prints these as ``warning: ...``; Python callers get them through the warnings module."""


class HpcTrainError(Exception):
    """Base class: a problem the user can act on."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(HpcTrainError):
    """Bad options or arguments."""


class UnknownNameError(UsageError):
    """An unknown site, backend, partition, ... with close matches."""

    def __init__(self, kind: str, name: str, known: Iterable[str], where: str | None = None) -> None:
        known = sorted(known)
        message = f"unknown {kind} {name!r}"
        if where:
            message = f"{where}: {message}"
        super().__init__(message, hint=did_you_mean(name, known, kind))
        self.name = name
        self.known = known


@dataclass(frozen=True)
class Problem:
    """One problem in a config file: where it is and what is wrong."""

    source: str  # a file path, or "<job>" / "--option" for values from the command line
    key: str  # dotted key path, "" for the whole document
    message: str
    line: int | None = None
    hint: str | None = None

    def __str__(self) -> str:
        # keys and file names come from the files themselves: a newline or U+202E in one must not reach the terminal
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        text = f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"
        return printable(f"{text} ({self.hint})" if self.hint else text)

    def sort_key(self) -> tuple[str, int, str]:
        return (self.source, self.line or 0, self.key)


class ConfigError(HpcTrainError):
    """One or more problems in site configs or job options, all reported at once."""

    exit_code = EXIT_CONFIG

    SHOWN = 100  # a generated file can hold thousands of mistakes; the first hundred say enough

    def __init__(self, problems: Iterable[Problem] | Problem) -> None:
        self.problems = [problems] if isinstance(problems, Problem) else list(problems)
        lines = [str(p) for p in self.problems[: self.SHOWN]]
        if len(self.problems) > self.SHOWN:
            lines.append(f"... and {len(self.problems) - self.SHOWN} more")
        if len(self.problems) == 1:
            message = lines[0]
        else:
            message = f"{len(self.problems)} problems:\n" + "\n".join(f"  - {line}" for line in lines)
        super().__init__(message)


class UnsafeValueError(ConfigError, ValueError):
    """A value would change the meaning of a generated script (a newline in an #SBATCH line): the
    last line of defence behind the models' checks, still a message rather than a traceback."""


class TemplateError(ConfigError):
    """A Jinja template (built-in or a site override) failed to load or render."""


class SchedulerError(HpcTrainError):
    """A scheduler command failed or is missing; says which command and what it printed."""

    exit_code = EXIT_UNAVAILABLE

    def __init__(self, command: list[str] | str, detail: str, hint: str | None = None) -> None:
        cmd = command if isinstance(command, str) else " ".join(command)
        super().__init__(f"`{cmd}` failed: {detail.strip() or 'no output'}", hint)
        self.command = cmd
        self.detail = detail


class RemoteError(HpcTrainError):
    """A login node could not be reached or used over ssh: which host, what ssh or the node said, what to do.
    ``retryable``: the connection failed or dropped, and the same call may succeed again."""

    exit_code = EXIT_UNAVAILABLE

    def __init__(self, message: str, hint: str | None = None, retryable: bool = False) -> None:
        super().__init__(message, hint)
        self.retryable = retryable


class SnapshotError(HpcTrainError):
    """The script's project cannot be snapshotted as it stands: over the size limit, a file that cannot be
    read, a link out of the tree, a store that cannot be written."""


class PluginError(HpcTrainError):
    """A plugin broke the contract (duplicate names, bad hook results, failed import of a needed plugin)."""

    exit_code = EXIT_CONFIG


def did_you_mean(name: str, known: Iterable[str], kind: str = "name") -> str:
    known = [printable(str(k)) for k in known]
    close = difflib.get_close_matches(printable(name), known, n=3, cutoff=0.5)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    if not known:
        return f"no {kind}s are available"
    return f"known {kind}s: " + ", ".join(known)
