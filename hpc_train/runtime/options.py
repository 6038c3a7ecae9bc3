"""Training options set on the job (``--precision bf16 --grad-clip 1.0``), read inside the job.

The plan exports them as HPC_TRAIN_* variables; a script may pass defaults to ``rt.init(...)`` and
the job's settings, when given, win, so a script never has to change to try another setting.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

PRECISIONS = ("fp32", "bf16", "fp16")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")

ENV = {
    "precision": "HPC_TRAIN_PRECISION",
    "grad_clip": "HPC_TRAIN_GRAD_CLIP",
    "grad_accum": "HPC_TRAIN_GRAD_ACCUM",
    "comm_hook": "HPC_TRAIN_COMM_HOOK",
    "activation_checkpointing": "HPC_TRAIN_ACTIVATION_CHECKPOINTING",
    "exact_resume": "HPC_TRAIN_EXACT_RESUME",
}


@dataclass(frozen=True)
class RuntimeOptions:
    precision: str = "fp32"
    grad_clip: float | None = None
    grad_accum: int = 1
    comm_hook: str = "none"
    activation_checkpointing: bool = False
    exact_resume: bool = True
    backend_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.comm_hook not in COMM_HOOKS:
            raise ValueError(f"comm_hook must be one of {COMM_HOOKS}, got {self.comm_hook!r}")
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum must be at least 1, got {self.grad_accum}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **defaults: Any) -> RuntimeOptions:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = dict(defaults)
        for name, var in ENV.items():
            raw = env.get(var)
            if raw in (None, ""):
                continue
            if name == "grad_clip":
                values[name] = float(raw)
            elif name == "grad_accum":
                values[name] = int(raw)
            elif name in ("activation_checkpointing", "exact_resume"):
                values[name] = raw.lower() in ("1", "true", "yes")
            else:
                values[name] = raw
        raw_backend = env.get("HPC_TRAIN_BACKEND_OPTIONS")
        if raw_backend:
            values["backend_options"] = {**json.loads(raw_backend), **values.get("backend_options", {})}
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown runtime option(s): {sorted(unknown)}")
        return cls(**values)

    def with_(self, **changes: Any) -> RuntimeOptions:
        return replace(self, **changes)
