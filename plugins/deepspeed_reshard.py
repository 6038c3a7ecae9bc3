"""A DeepSpeed ZeRO checkpoint loaded at another data-parallel size, through DeepSpeed's universal checkpoint.

ZeRO stages 1-3 write the optimizer state (and under stage 3 the parameters) as one partition per
data-parallel rank, so the files of 4 ranks do not load into 2. DeepSpeed's own converter
(``deepspeed.checkpoint.ds_to_universal``) rewrites them as one file per parameter and state, which an
engine of any data-parallel size loads with ``checkpoint.load_universal``. Rank 0 converts into the
resuming job's own checkpoint folder (the source, perhaps another job's, is only read); every rank loads
it; the conversion is removed once loaded. ZeRO-0 keeps one full state that loads at any size as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shutil
from pathlib import Path
from typing import Any

#: the tag hpc_train saves DeepSpeed's engine under, inside a checkpoint's ``engine/`` folder
TAG = "engine"
#: where the conversion is written, in the job's checkpoint folder: ignored by restore (no ``step-`` name)
SCRATCH = "universal.tmp"
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

    DeepSpeed's converter prints its progress: kept, and shown only when it fails.
    """
    from deepspeed.checkpoint import ds_to_universal

    shutil.rmtree(target, ignore_errors=True)  # a conversion a killed job left behind
    args = argparse.Namespace(
        input_folder=str(source),
        output_folder=str(target),
        num_extract_workers=1,  # its worker processes would fork this rank, process group and all
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # hpc_train's scripts are not Megatron's: the version tag is all that is missing
    )
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            ds_to_universal.main(args)
    except Exception as exc:  # reported on every rank, and the checkpoint before is tried
        shutil.rmtree(target, ignore_errors=True)
        tail = " | ".join(said.getvalue().strip().splitlines()[-3:])
        return f"{type(exc).__name__}: {exc}" + (f" (the converter said: {tail})" if tail else "")
    return None


def scratch_folder(checkpoints: str | None) -> Path:
    """The job's own checkpoint folder's scratch place (shared by its nodes); the working folder outside a job."""
    return Path(checkpoints or ".") / SCRATCH
