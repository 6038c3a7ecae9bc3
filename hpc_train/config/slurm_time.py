"""Slurm's time formats, parsed once so limits can be compared and rendered canonically."""

from __future__ import annotations

import re

# sbatch accepts: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_PATTERNS = (
    (re.compile(r"^(?P<m>\d+)$"), ("m",)),
    (re.compile(r"^(?P<m>\d+):(?P<s>\d{1,2})$"), ("m", "s")),
    (re.compile(r"^(?P<h>\d+):(?P<m>\d{1,2}):(?P<s>\d{1,2})$"), ("h", "m", "s")),
    (re.compile(r"^(?P<d>\d+)-(?P<h>\d{1,2})$"), ("d", "h")),
    (re.compile(r"^(?P<d>\d+)-(?P<h>\d{1,2}):(?P<m>\d{1,2})$"), ("d", "h", "m")),
    (re.compile(r"^(?P<d>\d+)-(?P<h>\d{1,2}):(?P<m>\d{1,2}):(?P<s>\d{1,2})$"), ("d", "h", "m", "s")),
)

FORMATS_HINT = "use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. 12:00:00 or 2-00:00:00"
# Slurm keeps a limit as 32-bit minutes, the top two values meaning "not set" and INFINITE: a longer
# time is not a limit sbatch can take (nor one a partition has)
MAX_SECONDS = (0xFFFFFFFE - 1) * 60


def parse_slurm_time(value: str | int) -> int:
    """Return the duration in seconds; raise ValueError with the accepted formats."""
    seconds = _seconds(value)
    if seconds > MAX_SECONDS:
        raise ValueError(
            f"{value!r} is longer than Slurm can hold (at most {format_slurm_time(MAX_SECONDS)}); for no limit, leave it out"
        )
    return seconds


def _seconds(value: str | int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected a Slurm time, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"expected at least 1 minute, got {value}")
        return value * 60
    text = str(value).strip()
    for pattern, parts in _PATTERNS:
        match = pattern.match(text)
        if not match:
            continue
        d = int(match.groupdict().get("d") or 0)
        h = int(match.groupdict().get("h") or 0)
        m = int(match.groupdict().get("m") or 0)
        s = int(match.groupdict().get("s") or 0)
        # Bounded fields must be in range; the leading field may be large ("90" minutes, "36:00:00").
        if (parts[0] != "h" and "h" in parts and h > 23) or ("m" in parts[1:] and m > 59) or s > 59:
            break
        seconds = ((d * 24 + h) * 60 + m) * 60 + s
        if seconds <= 0:
            raise ValueError(f"expected a positive time, got {text!r}")
        return seconds
    raise ValueError(f"malformed time {text!r}: {FORMATS_HINT}")


def format_slurm_time(seconds: int) -> str:
    """Canonical form: HH:MM:SS, or D-HH:MM:SS from one day up."""
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"
