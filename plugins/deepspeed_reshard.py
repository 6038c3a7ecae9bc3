"""A DeepSpeed ZeRO checkpoint loaded at another data-parallel size, through DeepSpeed's universal checkpoint.

ZeRO stages 1-3 write the optimizer state (and under stage 3 the parameters) as one partition per
data-parallel rank, so the files of 4 ranks do not load into 2. DeepSpeed's own converter
(``deepspeed.checkpoint.ds_to_universal``) rewrites them as one file per parameter and state, which an
engine of any data-parallel size loads with ``checkpoint.load_universal``. Rank 0 converts into the
resuming job's own checkpoint folder (the source, perhaps another job's, is only read); every rank loads
it; the conversion is removed once loaded. ZeRO-0 keeps one full state that loads at any size as it is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: the tag hpc_train saves DeepSpeed's engine under, inside a checkpoint's ``engine/`` folder
TAG = "engine"
#: where the conversion is written, in the job's checkpoint folder: ignored by restore (no ``step-`` name)
SCRATCH = "universal.tmp"
#: rank 0's word to the other ranks that the conversion is done (or failed), in the scratch folder
OUTCOME = "outcome.json"
#: worker processes of the converter at most (each holds some of the state's tensors)
MAX_WORKERS = 8
#: the optimizer state DeepSpeed's converter knows how to rewrite
ADAM_STATE = frozenset({"exp_avg", "exp_avg_sq", "step"})
_PARTITION = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt")


def saved_partitions(folder: Path) -> int | None:
    """How many data-parallel ranks the ZeRO checkpoint in ``folder`` is partitioned over; None for
    ZeRO-0 (no partitions: one full state)."""
    ranks = {m.group(1) for path in folder.glob("*optim_states.pt") if (m := _PARTITION.fullmatch(path.name))}
    return len(ranks) or None


def unconvertible(optimizer: Any) -> str | None:
    """Why DeepSpeed's converter cannot rewrite this optimizer's partitioned state; None when it can.

    It knows Adam's state alone (``exp_avg``, ``exp_avg_sq``, ``step``): Adam, AdamW, DeepSpeed's fused
    and CPU Adam. Another optimizer's state (SGD's ``momentum_buffer``) would be dropped, which is refused.
    """
    if optimizer is None:
        return None
    states = list(getattr(optimizer, "state", {}).values())
    keys = set(states[0]) if states else set()
    known = keys <= ADAM_STATE if keys else "adam" in type(optimizer).__name__.lower()  # no state before a step
    if known:
        return None
    extra = ", ".join(sorted(keys - ADAM_STATE))
    return (
        f"its ZeRO partitions hold {type(optimizer).__name__}'s state{f' ({extra})' if extra else ''}, "
        "and DeepSpeed's universal checkpoint "
        "converts Adam's alone (exp_avg, exp_avg_sq); resume it with the world size that saved it"
    )


def convert(source: Path, target: Path) -> str | None:
    """Write the universal form of the ZeRO checkpoint in ``source`` to ``target``; what went wrong, or None.

    DeepSpeed's converter runs as its own process: its worker processes then fork a plain python (not a
    rank, process group and threads and all), it uses the cores this rank may use, and the memory it
    needs (about the whole state) is returned when it ends. What it prints is shown only when it fails.
    """
    shutil.rmtree(target, ignore_errors=True)  # a conversion a killed job left behind
    workers = str(max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)))))
    command = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(source),
               "--output_folder", str(target), "--num_extract_workers", workers, "--num_merge_workers", workers,
               "--inject_missing_state"]  # fmt: skip  # hpc_train's scripts are not Megatron's: a version tag is all that lacks
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return None
    shutil.rmtree(target, ignore_errors=True)
    said = [line for line in (done.stderr + done.stdout).strip().splitlines() if line.strip()]
    error = next((line for line in reversed(said) if "Error" in line), said[-1] if said else "")
    return f"DeepSpeed's converter exited with {done.returncode}" + (f": {error.strip()}" if error else "")


def write_outcome(folder: Path, problem: str | None) -> None:
    """Rank 0, after converting: what the other ranks wait for (a file, not a collective: a large state
    converts for longer than a collective may wait)."""
    folder.mkdir(parents=True, exist_ok=True)
    aside = folder / f".{OUTCOME}.tmp"
    aside.write_text(json.dumps({"problem": problem}))
    os.replace(aside, folder / OUTCOME)


def wait_for_outcome(folder: Path, poll_s: float = 1.0) -> str | None:
    """The other ranks: rank 0's outcome, once it has written it; its problem, or None."""
    while True:
        try:
            return json.loads((folder / OUTCOME).read_text())["problem"]  # type: ignore[no-any-return]
        except (OSError, ValueError, KeyError):
            time.sleep(poll_s)


def scratch_folder(checkpoints: str | None) -> Path:
    """The job's own checkpoint folder's scratch place (shared by its nodes); the working folder outside a job."""
    return Path(checkpoints or ".") / SCRATCH
