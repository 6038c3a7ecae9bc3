"""``scontrol show job|node|partition`` output as dictionaries, for both sides.

The login side (hpc_train.jobs.handle) and the job side (hpc_train.runtime.lifecycle.preemption, .health, on the
batch node between runs) read the same format, so it lives here beside hpc_train.contract: the
standard library only, no torch, no submitit, and nothing of the runtime's package is imported.

How scontrol writes a record (slurm_sprint_job_info and its node/partition siblings): ``Key=Value``
fields separated by one space; with ``-o`` a record is one line, without it the record's first line
is at column 0 and the rest are indented three spaces, records apart by a blank line. Values are not
quoted, so some hold spaces: a node's ``Reason=Not responding [slurm@2024-05-01T10:00:00]``, ``OS=Linux
5.15 #1 SMP``, paths in ``Command=``/``WorkDir=``/``StdOut=``, a ``JobName=`` or ``Comment=``. A job's
Reason has no spaces (Slurm writes them as ``_``). Values may hold ``=`` too (``AllocTRES=cpu=4,mem=8G``).
So a field begins only where a word after whitespace looks like a key: an upper-case letter, then
letters, digits, ``_ / :`` (``CPUs/Task``, ``ReqB:S:C:T``, ``MCS_label``), then ``=``. Anything else
belongs to the value before it. Ambiguous by nature: a value holding `` Word=`` splits there.
"""

from __future__ import annotations

import re
import subprocess

_KEY = re.compile(r"(?:^|(?<=\s))([A-Z][A-Za-z0-9_/:]*)=")


def records(text: str) -> list[dict[str, str]]:
    """Every record in ``text``, in order; lines with no field (``No jobs in the system``) give none."""
    found = [_fields(chunk) for chunk in _chunks(text)]
    return [fields for fields in found if fields]


def first(text: str) -> dict[str, str]:
    """The first record (an array job's first task, with ``show job -o ARRAY_ID``); {} when there is none."""
    found = records(text)
    return found[0] if found else {}


def show(entity: str, name: str, timeout: float = 30) -> dict[str, str]:
    """``scontrol show ENTITY -o NAME``'s first record; {} when scontrol is missing, fails or hangs.

    For the job side, which has no site config to pass (the batch script's environment has it);
    the login side runs scontrol through hpc_train.submission.slurm_cmd and parses with :func:`first`.
    """
    try:
        out = subprocess.run(["scontrol", "show", entity, "-o", name], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return first(out.stdout) if out.returncode == 0 else {}


def _chunks(text: str) -> list[str]:
    # an indented line continues the record above it, unless a blank line ended that record
    chunks: list[list[str]] = []
    after_blank = True
    for line in text.splitlines():
        if not line.strip():
            after_blank = True
            continue
        if after_blank or not line[:1].isspace():
            chunks.append([])
        chunks[-1].append(line)
        after_blank = False
    return ["\n".join(lines) for lines in chunks]


def _fields(chunk: str) -> dict[str, str]:
    keys = list(_KEY.finditer(chunk))
    ends = [key.start() for key in keys[1:]] + [len(chunk)]
    # a key seen twice keeps its last value, as dict() did in the parsers this replaced
    return {key.group(1): chunk[key.end() : end].strip() for key, end in zip(keys, ends)}
