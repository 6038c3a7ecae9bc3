"""Characters no config value may carry, and how to show one safely.

A site file is read by one person and shown to many: in ``sites``, in error messages, in the sbatch
script and in squeue. Control characters can break a line of a generated script or drive the
terminal; invisible formatting characters (U+202E RIGHT-TO-LEFT OVERRIDE, zero-width spaces) make
text read differently from what it is. Neither has a use in a name, a path or an option.

This module imports nothing from hpc_train: ``hpc_train.errors`` uses it to print what it reports.
"""

from __future__ import annotations

import unicodedata

# Cc: C0/C1 controls and DEL; Cf: bidirectional overrides, zero-width and other invisible format
# characters; Zl/Zp: Unicode line and paragraph separators; Cs: lone surrogates (from \ud800 escapes)
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def is_unsafe(char: str) -> bool:
    return unicodedata.category(char) in UNSAFE_CATEGORIES


def unsafe_char(text: str, allow: str = "") -> str | None:
    """The first character of ``text`` that must not be there (``allow`` lists exceptions), or None."""
    if text.isprintable():  # the common case, in C: isprintable() is False for every unsafe category
        return None
    for char in text:
        if char not in allow and is_unsafe(char):
            return char
    return None


def describe(char: str) -> str:
    """``U+202E RIGHT-TO-LEFT OVERRIDE``, ``U+000A (a newline)``: a character that cannot be shown as itself."""
    name = unicodedata.name(char, "")
    if name:
        return f"U+{ord(char):04X} {name}"
    plain = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x1b": "an escape", "\x00": "a NUL byte"}
    return f"U+{ord(char):04X} ({plain.get(char, 'a control character')})"


def printable(text: str) -> str:
    """``text`` with every unsafe character written as its escape (``\\n``, ``\\u202e``): safe to print."""
    if text.isprintable():
        return text
    return "".join(repr(char)[1:-1] if is_unsafe(char) else char for char in text)


def shorten(text: str, limit: int = 80) -> str:
    """At most ``limit`` characters: a 1 MB value must not become a 1 MB error message."""
    return text if len(text) <= limit else f"{text[: limit - 20]}...({len(text)} characters)"


def kind_of(char: str) -> str:
    """What to call an unsafe character in a message, with the character itself: "newlines or other
    control characters (U+000A (a newline))", "invisible formatting characters (U+202E ...)"."""
    if unicodedata.category(char) == "Cc":
        return f"newlines or other control characters (found {describe(char)})"
    return f"invisible formatting or separator characters (found {describe(char)})"
