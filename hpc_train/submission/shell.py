"""Shell quoting for generated scripts. Every value a user can influence goes through ``quote``."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from hpc_train.config.text import is_unsafe, kind_of, unsafe_char
from hpc_train.errors import Problem, UnsafeValueError
from hpc_train.plugin.backend import Raw

_SBATCH_KEY = re.compile(r"[a-z][a-z0-9-]*")


def quote(value: object) -> str:
    """One shell word whose value is exactly ``value``, on one line.

    shlex.quote would keep a newline inside single quotes; a line that then begins with ``#SBATCH``
    is still only data to bash, but it is unreadable and fragile. Control characters are written as
    ANSI-C escapes (``$'a\\nb'``) so a generated script never contains a user-supplied line break,
    and so are invisible formatting characters (U+202E would make the script read differently from
    what bash runs), as their UTF-8 bytes: ``\\u`` escapes depend on the locale bash runs in.
    """
    if isinstance(value, Raw):
        return str(value)
    text = str(value)
    if unsafe_char(text) is None:
        return shlex.quote(text)
    out = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char == "'":
            out.append("\\'")
        elif is_unsafe(char):
            out.append("".join(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogatepass")))
        else:
            out.append(char)
    return "$'" + "".join(out) + "'"


def join(words: Iterable[object]) -> str:
    return " ".join(quote(word) for word in words)


def sbatch_line(key: str, value: object) -> str:
    # sbatch reads #SBATCH lines itself and has no escape for a newline: a bad key or value would end
    # the directives there. The config models refuse these with file:line; this is the last line of defence.
    if not _SBATCH_KEY.fullmatch(key):
        raise UnsafeValueError(Problem("#SBATCH", f"--{key}", "is not an sbatch long option name"))
    if value is True:
        return f"#SBATCH --{key}"
    text = str(value)
    char = unsafe_char(text)
    if char is not None:
        raise UnsafeValueError(Problem("#SBATCH", f"--{key}", f"the value {text!r} contains {kind_of(char)}"))
    return f"#SBATCH --{key}={shlex.quote(text)}"


def join_lines(*groups: Iterable[object]) -> str:
    """Quoted words, one non-empty group per line, joined by line continuations (readable launch lines)."""
    lines = [join(group) for group in groups]
    return " \\\n    ".join(line for line in lines if line)
