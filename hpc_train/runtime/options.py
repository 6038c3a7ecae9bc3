"""Training options set on the job (``--precision bf16 --grad-clip 1.0``), read inside the job.

The plan exports each JobSpec field declared with ``setting(env=...)`` under that variable
(hpc_train.contract); a field of RuntimeOptions reads the JobSpec field of its name back, typed as
that field is. A script may pass defaults to ``rt.init(...)`` and the job's settings, when given,
win, so a script never has to change to try another setting.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from hpc_train import contract


def _job_spec() -> type:
    # imported when first used: a job pays for the JobSpec module only once it makes its options
    from hpc_train.config.job import JobSpec

    return JobSpec


@dataclass(frozen=True)
class RuntimeOptions:
    precision: str = "fp32"
    grad_clip: float | None = None
    grad_accum: int = 1
    micro_batch: str | None = None  # "auto" or a size: hpc_train.runtime.step.memory
    comm_hook: str = "none"
    activation_checkpointing: bool = False
    exact_resume: bool = True
    profile: str | None = None  # --profile: hpc_train.runtime.observe.profiling (checked there)
    max_bad_steps: int = 5  # hpc_train.runtime.step.numerics
    on_divergence: str = "stop"
    resume_from: str | None = None  # --resume-from: another job's checkpoint folder (hpc_train.runtime.checkpoint.reshape)
    backend_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from hpc_train.config.fields import field_kinds

        kinds = field_kinds(_job_spec())
        for name in ("precision", "comm_hook", "on_divergence"):  # the values the job's field (a Literal) takes
            choices = kinds[name].choices or ()
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum must be at least 1, got {self.grad_accum}")
        if self.micro_batch is not None:
            from hpc_train.runtime.step.memory import parse

            parse(self.micro_batch)  # "auto" or a size of at least 1
        if self.max_bad_steps < 0:
            raise ValueError(f"max_bad_steps must be 0 (never stop) or more, got {self.max_bad_steps}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **defaults: Any) -> RuntimeOptions:
        env = os.environ if environ is None else environ
        from hpc_train.config.fields import from_env

        values: dict[str, Any] = {**defaults, **from_env(_job_spec(), env, names={f.name for f in fields(cls)})}
        raw_backend = env.get(contract.ENV_BACKEND_OPTIONS)
        if raw_backend:
            values["backend_options"] = {**json.loads(raw_backend), **values.get("backend_options", {})}
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown runtime option(s): {sorted(unknown)}")
        return cls(**values)

    def with_(self, **changes: Any) -> RuntimeOptions:
        return replace(self, **changes)
