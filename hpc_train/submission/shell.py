"""Shell quoting for generated scripts. Every value a user can influence goes through ``quote``."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from hpc_train.plugin.backend import Raw

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def quote(value: object) -> str:
    """One shell word whose value is exactly ``value``, on one line.

    shlex.quote would keep a newline inside single quotes; a line that then begins with ``#SBATCH``
    is still only data to bash, but it is unreadable and fragile. Control characters are written as
    ANSI-C escapes (``$'a\\nb'``) so a generated script never contains a user-supplied line break.
    """
    if isinstance(value, Raw):
        return str(value)
    text = str(value)
    if not _CONTROL.search(text):
        return shlex.quote(text)
    out = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char == "'":
            out.append("\\'")
        elif _CONTROL.match(char):
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "$'" + "".join(out) + "'"


def join(words: Iterable[object]) -> str:
    return " ".join(quote(word) for word in words)


def sbatch_line(key: str, value: object) -> str:
    if value is True:
        return f"#SBATCH --{key}"
    text = str(value)
    if _CONTROL.search(text):
        # sbatch reads #SBATCH lines itself; there is no escape for a newline. Plans reject these
        # earlier with a friendly message; this is the last line of defence.
        raise ValueError(f"#SBATCH --{key} value contains a control character: {text!r}")
    return f"#SBATCH --{key}={shlex.quote(text)}"


def join_lines(*groups: Iterable[object]) -> str:
    """Quoted words, one non-empty group per line, joined by line continuations (readable launch lines)."""
    lines = [join(group) for group in groups]
    return " \\\n    ".join(line for line in lines if line)
