"""Durations as users write them on the command line and in site files: 300, 300s, 5m, 1h, off."""

from __future__ import annotations

import re
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600}
OFF = ("off", "none", "no", "false")


def parse_duration(value: Any) -> float:
    """Seconds (0 means off); ValueError with the forms that would be right."""
    if isinstance(value, bool):  # YAML's `yes`/`no`: a bool is no duration (True would mean 1 s)
        raise ValueError(f"{value!r} is not a duration: give seconds (300), 300s, 5m, 1h, or off")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and value.strip().lower() in OFF:
        return 0.0
    elif isinstance(value, str) and (match := _DURATION.match(value.lower())):
        seconds = float(match.group(1)) * _UNIT[match.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration: give seconds (300), 300s, 5m, 1h, or off")
    if seconds < 0:
        raise ValueError(f"{value!r} is negative: give seconds (300), 300s, 5m, 1h, or off")
    return seconds


def optional_duration(value: Any) -> float | None:
    """For a config field where None means "the default" (a module-level function: schemas are pickled)."""
    return None if value is None else parse_duration(value)
