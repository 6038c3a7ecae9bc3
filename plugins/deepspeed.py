"""DeepSpeed without ssh: one Slurm task per process (srun), a ds_config built from the job.

The config is generated from the job (ZeRO stage, precision, micro-batch, accumulation, clipping),
merged over the user's own file (``-o config=my.json``, or ``--deepspeed_config my.json`` among the
script's arguments, which then points at the merged file). Scripts written for the ``deepspeed``
launcher get ``--local_rank=N`` as that launcher passes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from hpc_train import (
    Backend,
    LaunchInfo,
    Raw,
    Word,
    hookimpl,
    launch_shim,
    survive_stop_signal,
)
from hpc_train.config.fields import Ge, Le, Model, setting
from hpc_train.errors import ConfigError, Problem

CONFIG_ENV = "HPC_TRAIN_DEEPSPEED_CONFIG_JSON"
CONFIG_FILE = "${HPC_TRAIN_JOB_FOLDER}/ds_config.json"


DEFAULT_ZERO_STAGE = 2
DEFAULT_MICRO_BATCH = 1


@dataclass(frozen=True, kw_only=True)
class DeepSpeedOptions(Model):
    # None: not said by the job, so the user's ds_config file (or the default) decides
    zero_stage: Annotated[int, Ge(0), Le(3)] | None = setting(None, f"ZeRO stage (default: your config's, else {DEFAULT_ZERO_STAGE})")
    micro_batch: Annotated[int, Ge(1)] | None = setting(None, f"train_micro_batch_size_per_gpu (default: your config's, else {DEFAULT_MICRO_BATCH})")
    config: str | None = setting(None, "your ds_config JSON; the job's settings are merged over it")
    offload_optimizer: bool = setting(False, "ZeRO optimizer state offload to CPU memory")
    launcher_args: bool = setting(True, "pass --local_rank=N to the script, as the deepspeed launcher does")
    torch_adam: bool = setting(True, "torch's Adam instead of the JIT-compiled fused one (CPU jobs)")
    omp_num_threads: Annotated[int, Ge(1)] | None = setting(None, "OMP_NUM_THREADS per process (default: CPUs per process)")


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_user_config(path: str, workdir: str | None = None) -> dict[str, Any]:
    file = Path(path).expanduser()
    if workdir and not file.is_absolute():
        file = Path(workdir) / file
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(Problem(path, "", "DeepSpeed config file not found")) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(Problem(path, "", f"invalid JSON: {exc.msg}", exc.lineno)) from None
    if not isinstance(data, dict):
        raise ConfigError(Problem(path, "", "a DeepSpeed config must be a JSON object"))
    return data


def build_ds_config(options: DeepSpeedOptions, *, precision: str | None, grad_accum: int | None,
                    grad_clip: float | None, user: dict[str, Any] | None = None) -> dict[str, Any]:
    """Defaults < the user's file < what the job says explicitly."""
    defaults: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": DEFAULT_MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        # DeepSpeed 0.19 clips at 1.0 unless told otherwise; clip only when the job asks (--grad-clip),
        # as every other backend does, so one script trains the same under each
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": DEFAULT_ZERO_STAGE},
        "steps_per_print": 10**9,  # hpc_train's own progress output is enough
        # the script's own torch optimizer (ctx.prepare(model, opt)) is not on DeepSpeed's tested list
        "zero_allow_untested_optimizer": True,
    }
    explicit: dict[str, Any] = {}
    if options.zero_stage is not None:
        explicit["zero_optimization"] = {"stage": options.zero_stage}
    if options.micro_batch is not None:
        explicit["train_micro_batch_size_per_gpu"] = options.micro_batch
    if options.offload_optimizer:
        explicit.setdefault("zero_optimization", {})["offload_optimizer"] = {"device": "cpu"}
    if grad_accum is not None:
        explicit["gradient_accumulation_steps"] = grad_accum
    if grad_clip is not None:
        explicit["gradient_clipping"] = grad_clip
    if precision == "bf16":
        explicit["bf16"] = {"enabled": True}
        explicit["fp16"] = {"enabled": False}
    elif precision == "fp16":
        explicit["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
        explicit["bf16"] = {"enabled": False}
    elif precision == "fp32":
        explicit["fp16"] = {"enabled": False}
        explicit["bf16"] = {"enabled": False}
    config = _deep_merge(_deep_merge(defaults, user or {}), explicit)
    optimizer = config.get("optimizer")
    if options.torch_adam and isinstance(optimizer, dict) and str(optimizer.get("type", "")).lower() in ("adam", "adamw"):
        optimizer.setdefault("params", {}).setdefault("torch_adam", True)
    return config


def _config_arg(args: list[str]) -> tuple[int, str] | None:
    """Where the script's own --deepspeed_config is, and its value."""
    for i, arg in enumerate(args):
        if arg in ("--deepspeed_config", "--deepspeed-config") and i + 1 < len(args):
            return i, args[i + 1]
        if arg.startswith(("--deepspeed_config=", "--deepspeed-config=")):
            return i, arg.split("=", 1)[1]
    return None


class DeepSpeed(Backend):
    name = "deepspeed"
    parallel_axes = ("dp", "pp")  # the runtime builds a device mesh over these (--parallel)
    requires = ("torch", "deepspeed")
    summary = "DeepSpeed (ZeRO) without ssh: srun one task per process; ds_config from the job"
    Options = DeepSpeedOptions
    runtime = "hpc_train_plugins.deepspeed_runtime:DeepSpeedRuntime"
    supports_comm_hook = False
    options: DeepSpeedOptions

    def _user_config(self, info: LaunchInfo) -> dict[str, Any] | None:
        found = _config_arg(list(info.script_args))
        path = found[1] if found else self.options.config
        return read_user_config(path, str(Path(info.script).parent) if found is None else None) if path else None

    def env(self, info: LaunchInfo) -> dict[str, str]:
        config = build_ds_config(self.options, precision=info.precision, grad_accum=info.grad_accum,
                                 grad_clip=info.grad_clip, user=self._user_config(info))
        return {
            CONFIG_ENV: json.dumps(config, sort_keys=True),
            # the launcher DeepSpeed ships leaves this unset, and CPU steps run 2x slower
            "OMP_NUM_THREADS": str(self.options.omp_num_threads or info.cpus_per_proc or 1),
        }

    def setup(self, info: LaunchInfo) -> list[str]:
        return [
            'mkdir -p "${HPC_TRAIN_JOB_FOLDER}"',
            f'printf \'%s\\n\' "${{{CONFIG_ENV}}}" > "{CONFIG_FILE}"',
            f'export HPC_TRAIN_DEEPSPEED_CONFIG="{CONFIG_FILE}"',
        ]

    def cleanup(self, info: LaunchInfo) -> list[str]:
        # DeepSpeed's CPU all-reduce leaves a shared-memory buffer per rank, named after the user,
        # MASTER_ADDR and MASTER_PORT; the port is this job's own, so only its buffers go
        pattern = '/dev/shm/deepspeed_allreduce_buffer_"$(id -u)"_"${MASTER_ADDR}"_"${MASTER_PORT}"_*'
        if info.scheduler == "local":
            return [f"rm -f {pattern}"]
        return [f"srun --overlap --nodes={info.nodes} --ntasks-per-node=1 bash -c 'rm -f {pattern}' || true"]

    def launch(self, info: LaunchInfo) -> list[Word]:
        args: list[Word] = list(info.script_args)
        found = _config_arg(list(info.script_args))
        if found:
            index, _ = found
            if "=" in args[index]:
                args[index] = Raw(f'--deepspeed_config="{CONFIG_FILE}"')
            else:
                args[index + 1] = Raw(f'"{CONFIG_FILE}"')
        flags = ("--local-rank-arg",) if self.options.launcher_args else ()
        shim = launch_shim(info, *flags, args=args)
        if info.scheduler == "local":
            # torchrun spawns the local workers; the shim adds --local_rank as the deepspeed launcher would
            return survive_stop_signal(info, [info.python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                                              f"--nproc-per-node={info.procs_per_node}", *shim[1:]])
        return shim

@hookimpl
def hpc_train_backends() -> list[type[Backend]]:
    return [DeepSpeed]
