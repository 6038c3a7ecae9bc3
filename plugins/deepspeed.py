"""DeepSpeed without ssh: one Slurm task per process (srun), a ds_config built from the job.

The config is generated from the job (ZeRO stage, precision, micro-batch, accumulation, clipping),
merged over the user's own file (``-o config=my.json`` / ``--deepspeed-config``, or named among the
script's arguments as DeepSpeed's and Hugging Face's scripts take it: ``--deepspeed_config my.json``,
``--deepspeed my.json``; that argument then points at the merged file). A ``train_batch_size`` there
decides the micro-batch for the job's data-parallel size, or the job is refused before it queues.
Scripts written for the ``deepspeed`` launcher get ``--local_rank=N`` as that launcher passes it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NamedTuple

from hpc_train import (
    Backend,
    CliOption,
    LaunchInfo,
    Raw,
    Word,
    contract,
    hookimpl,
    launch_shim,
    survive_stop_signal,
)
from hpc_train.config.fields import Ge, Le, Model, setting
from hpc_train.errors import ConfigError, Problem
from hpc_train.submission.layout import ENV_VAR as LAYOUT_ENV
from hpc_train.submission.layout import parse as parse_layout
from hpc_train.submission.plan import JOB

CONFIG_ENV = "HPC_TRAIN_DEEPSPEED_CONFIG_JSON"
CONFIG_PATH_ENV = "HPC_TRAIN_DEEPSPEED_CONFIG"  # for the script: the path of the ds_config the job runs with
CONFIG_FILE = f"${{{contract.ENV_JOB_FOLDER}}}/ds_config.json"


DEFAULT_ZERO_STAGE = 2
DEFAULT_MICRO_BATCH = 1


@dataclass(frozen=True, kw_only=True)
class DeepSpeedOptions(Model):
    # None: not said by the job, so the user's ds_config file (or the default) decides
    zero_stage: Annotated[int, Ge(0), Le(3)] | None = setting(
        None, f"ZeRO stage (default: your config's, else {DEFAULT_ZERO_STAGE})"
    )
    micro_batch: Annotated[int, Ge(1)] | None = setting(
        None,
        f"train_micro_batch_size_per_gpu (default: your config's, or train_batch_size / (accumulation x data-parallel processes), else {DEFAULT_MICRO_BATCH})",
    )
    config: str | None = setting(None, "your ds_config JSON; the job's settings are merged over it")
    offload_optimizer: bool = setting(False, "ZeRO optimizer state offload to CPU memory")
    launcher_args: bool = setting(
        True,
        "pass --local_rank=N to the script, as the deepspeed launcher does (scripts that import hpc_train.runtime never see it)",
    )
    torch_adam: bool = setting(True, "torch's Adam instead of the JIT-compiled fused one (CPU jobs)")
    omp_num_threads: Annotated[int, Ge(1)] | None = setting(None, "OMP_NUM_THREADS per process (default: CPUs per process)")


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# -- the user's file: where it is named ------------------------------------------------------------

#: DeepSpeed's own flags (deepspeed.add_config_arguments), next to a bare ``--deepspeed`` switch
CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed-config")
#: Hugging Face's TrainingArguments: ``--deepspeed PATH`` (in DeepSpeed's scripts a bare switch)
HF_FLAG = "--deepspeed"


@dataclass(frozen=True)
class ConfigArg:
    """One place the script's arguments name a ds_config: ``--flag PATH`` or ``--flag=PATH``."""

    flag: str  # one of CONFIG_FLAGS or HF_FLAG, as matched (never other user text)
    index: int  # of the flag word
    joined: bool  # --flag=PATH
    path: str | None  # None: the flag came last, with no path after it


@dataclass(frozen=True)
class ConfigSource:
    """The user's ds_config: what named it and the file it names."""

    named_by: str  # "--deepspeed among the script's arguments", "-o config"
    given: str  # as written
    file: Path  # resolved against the folder the job runs in


def _flag_args(args: list[str], flags: tuple[str, ...]) -> list[ConfigArg]:
    found = []
    for i, arg in enumerate(args):
        for flag in flags:
            if arg == flag:
                found.append(ConfigArg(flag, i, False, args[i + 1] if i + 1 < len(args) else None))
            elif arg.startswith(flag + "="):
                found.append(ConfigArg(flag, i, True, arg[len(flag) + 1 :]))
    return found


def config_args(args: list[str]) -> list[ConfigArg]:
    """Where the script's arguments name its ds_config.

    DeepSpeed's flags first: with them, ``--deepspeed`` is the bare switch DeepSpeed's scripts take
    (``--deepspeed --deepspeed_config ds.json``). Without them, ``--deepspeed PATH`` is the path, as
    Hugging Face scripts take it; followed by another option (or nothing) it is a switch again.
    """
    found = _flag_args(args, CONFIG_FLAGS)
    if found:
        return found
    return [a for a in _flag_args(args, (HF_FLAG,)) if a.joined or (a.path is not None and not a.path.startswith("-"))]


def _resolve(path: str, workdir: str) -> Path:
    file = Path(path).expanduser()
    return file if file.is_absolute() else Path(workdir) / file


def config_source(options: DeepSpeedOptions, info: LaunchInfo) -> ConfigSource | None:
    """The one ds_config the job names, among the script's arguments or as ``-o config``; None if none.

    Relative paths are the job's: from the folder its script runs in.
    """
    workdir = info.env.get("PWD") or os.getcwd()
    named = config_args(list(info.script_args))
    for arg in named:
        if not arg.path:
            raise ConfigError(
                Problem(
                    JOB,
                    "script arguments",
                    f"{arg.flag} needs the path of a ds_config JSON file",
                    hint=f"{arg.flag} ds_config.json",
                )
            )
    sources = [ConfigSource(f"{a.flag} among the script's arguments", str(a.path), _resolve(str(a.path), workdir)) for a in named]
    if options.config:
        sources.append(ConfigSource("--deepspeed-config / -o config", options.config, _resolve(options.config, workdir)))
    files = {os.path.normpath(s.file) for s in sources}
    if len(files) > 1:
        listed = "; ".join(f"{s.given} ({s.named_by})" for s in sources)
        raise ConfigError(
            Problem(
                JOB,
                "deepspeed config",
                f"two ds_config files for one job: {listed}",
                hint="name one: the job's settings are merged over it, and the script gets the merged file",
            )
        )
    return sources[0] if sources else None


def read_user_config(path: str | Path, workdir: str | None = None, named_by: str | None = None) -> dict[str, Any]:
    """The user's ds_config as a dict; a ConfigError naming the file (and line) for anything else."""
    file = Path(path).expanduser()
    if workdir and not file.is_absolute():
        file = Path(workdir) / file
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        hint = f"named by {named_by}; a relative path is from the job's working directory (--workdir)" if named_by else None
        raise ConfigError(Problem(str(file), "", "DeepSpeed config file not found", hint=hint)) from None
    except IsADirectoryError:
        raise ConfigError(Problem(str(file), "", "is a folder, not a DeepSpeed config file")) from None
    except UnicodeDecodeError:
        raise ConfigError(Problem(str(file), "", "not a text file: a DeepSpeed config is JSON")) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(Problem(str(file), "", f"invalid JSON: {exc.msg} (column {exc.colno})", exc.lineno)) from None
    except OSError as exc:
        raise ConfigError(Problem(str(file), "", f"cannot read the DeepSpeed config: {exc.strerror}")) from None
    if not isinstance(data, dict):
        raise ConfigError(Problem(str(file), "", "a DeepSpeed config must be a JSON object"))
    return data


# -- the batch: train_batch_size = micro-batch x accumulation x data-parallel processes --------------

TRAIN, MICRO, ACCUM = "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"


@dataclass(frozen=True)
class Processes:
    """The data-parallel processes that share one batch, and how they come about (for messages)."""

    nodes: int
    per_node: int
    model_parallel: int = 1  # tp x pp of a --parallel layout: those ranks share a data-parallel slot

    @property
    def data_parallel(self) -> int:
        return self.nodes * self.per_node // self.model_parallel

    def at(self, nodes: int) -> int | None:
        """The data-parallel size on ``nodes`` nodes; None where the layout does not fit."""
        world = nodes * self.per_node
        return world // self.model_parallel if world % self.model_parallel == 0 else None

    def __str__(self) -> str:
        shared = f" / {self.model_parallel} (tp x pp)" if self.model_parallel > 1 else ""
        return f"{self.data_parallel} data-parallel processes ({self.nodes} node(s) x {self.per_node}{shared})"


def processes(info: LaunchInfo) -> Processes:
    layout = info.env.get(LAYOUT_ENV)
    if not layout:
        return Processes(info.nodes, info.procs_per_node)
    parsed = parse_layout(layout, world_size=info.nodes * info.procs_per_node)
    return Processes(info.nodes, info.procs_per_node, parsed.tp * parsed.pp)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _node_counts(procs: Processes, fits: Callable[[int], int | None]) -> list[tuple[int, int]]:
    """(nodes, value) for the node counts, up to 4x the job's, where ``fits(data-parallel size)`` gives a value."""
    out = []
    for nodes in range(1, max(8, 4 * procs.nodes) + 1):
        dp = procs.at(nodes)
        value = fits(dp) if dp else None
        if value:
            out.append((nodes, value))
    return out[:8]


def _either(values: list[int]) -> str:
    """[1, 2, 4] -> "1, 2 or 4"."""
    words = [str(v) for v in dict.fromkeys(values)]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _multiples(train: int, share: int) -> str:
    below = train // share * share
    return _either([n for n in (below, below + share) if n >= share])


def _derive(train: int, given: tuple[str, int], derived_key: str, procs: Processes, said: dict[str, str], source: str) -> int:
    """``derived_key`` = train_batch_size / (``given``'s value x data-parallel size), or a problem saying what fits.
    ``given``: the batch number that is known, and its value."""
    known_key, known = given
    value, left = divmod(train, known * procs.data_parallel)
    if value >= 1 and not left:
        return value

    def fits(dp: int) -> int | None:
        whole, rest = divmod(train, known * dp)
        return whole if whole >= 1 and not rest else None

    share = known * procs.data_parallel
    works = _node_counts(procs, fits)
    hints = (
        [f"it divides on {_either([n for n, _ in works])} node(s), with {derived_key} {_either([v for _, v in works])}"]
        if works
        else []
    )
    hints.append(f"make {TRAIN} a multiple of {share}, such as {_multiples(train, share)}")
    raise ConfigError(
        Problem(
            source,
            TRAIN,
            f"{train} does not divide over {procs} with {known_key} {known} ({said[known_key]}): "
            f"{train} / ({known} x {procs.data_parallel}) is no whole {derived_key}, and DeepSpeed would stop at start-up",
            hint="; or ".join(hints),
        )
    )


def _mismatch(train: int, micro: int, accum: int, procs: Processes, said: dict[str, str], source: str) -> ConfigError:
    works = [n for n, _ in _node_counts(procs, lambda dp: dp if micro * accum * dp == train else None)]
    where = f"on {works[0]} node(s), or " if works else ""
    return ConfigError(
        Problem(
            source,
            TRAIN,
            f"{train} is not {MICRO} {micro} ({said[MICRO]}) x {ACCUM} {accum} ({said[ACCUM]}) x {procs} "
            f"= {micro * accum * procs.data_parallel}, and DeepSpeed would stop at start-up",
            hint=f"it holds {where}give two of the three and hpc_train derives the third",
        )
    )


def settle_batch(
    config: dict[str, Any], stated: dict[str, Any], said: dict[str, str], procs: Processes | None, source: str
) -> None:
    """Fill in the micro-batch and accumulation so that DeepSpeed's own start-up check holds.

    DeepSpeed requires train_batch_size = micro-batch x accumulation x data-parallel size.
    ``stated``: those numbers as the user's file (``source``) and the job gave them, no defaults;
    ``said``: who gave each. A train_batch_size that cannot hold on this job is refused here, before the queue wait.
    ``procs`` None (outside hpc_train's launch): DeepSpeed derives what is missing in the job.
    """
    if TRAIN not in stated:  # DeepSpeed multiplies it out
        config.setdefault(MICRO, DEFAULT_MICRO_BATCH)
        config.setdefault(ACCUM, 1)
        return
    for key, value in stated.items():
        if value != "auto" and not _whole(value):
            raise ConfigError(Problem(source, key, f'{value!r}: expected a whole number >= 1 (or "auto" for Hugging Face)'))
    if procs is None or "auto" in stated.values():
        return  # a Hugging Face script fills "auto" from its own arguments, and checks them itself
    train = stated[TRAIN]
    if MICRO not in stated:
        accum = stated.get(ACCUM, 1)
        said = {**said, ACCUM: said[ACCUM] if ACCUM in stated else "DeepSpeed's default"}
        config[MICRO], config[ACCUM] = _derive(train, (ACCUM, accum), MICRO, procs, said, source), accum
    elif ACCUM not in stated:
        config[ACCUM] = _derive(train, (MICRO, stated[MICRO]), ACCUM, procs, said, source)
    elif stated[MICRO] * stated[ACCUM] * procs.data_parallel != train:
        raise _mismatch(train, stated[MICRO], stated[ACCUM], procs, said, source)


# -- the merged config ---------------------------------------------------------------------------


class JobTraining(NamedTuple):
    """What the job says of its training that DeepSpeed's config carries (--precision, --grad-accum, --grad-clip)."""

    precision: str | None
    grad_accum: int | None
    grad_clip: float | None


def _explicit(options: DeepSpeedOptions, training: JobTraining) -> tuple[dict[str, Any], dict[str, str]]:
    """What the job says explicitly, and which option said each batch number."""
    precision, grad_accum, grad_clip = training
    explicit: dict[str, Any] = {}
    said: dict[str, str] = {}
    if options.zero_stage is not None:
        explicit["zero_optimization"] = {"stage": options.zero_stage}
    if options.micro_batch is not None:
        explicit[MICRO], said[MICRO] = options.micro_batch, "-o micro_batch"
    if options.offload_optimizer:
        explicit.setdefault("zero_optimization", {})["offload_optimizer"] = {"device": "cpu"}
    if grad_accum is not None:
        explicit[ACCUM], said[ACCUM] = grad_accum, "--grad-accum"
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
    return explicit, said


def build_ds_config(
    options: DeepSpeedOptions,
    training: JobTraining,
    *,
    user: dict[str, Any] | None = None,
    user_file: str = "your ds_config",
    procs: Processes | None = None,
) -> dict[str, Any]:
    """Defaults < the user's file < what the job says explicitly; the batch numbers settled for ``procs``
    (None: left to DeepSpeed in the job, as outside hpc_train's launch)."""
    defaults: dict[str, Any] = {
        # the micro-batch and accumulation defaults are settle_batch's: a user's train_batch_size decides them
        # DeepSpeed 0.19 clips at 1.0 unless told otherwise; clip only when the job asks (--grad-clip),
        # as every other backend does, so one script trains the same under each
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": DEFAULT_ZERO_STAGE},
        "steps_per_print": 10**9,  # hpc_train's own progress output is enough
        # the script's own torch optimizer (ctx.prepare(model, opt)) is not on DeepSpeed's tested list
        "zero_allow_untested_optimizer": True,
    }
    user = user or {}
    explicit, said = _explicit(options, training)
    config = _deep_merge(_deep_merge(defaults, user), explicit)
    stated = {key: config[key] for key in (TRAIN, MICRO, ACCUM) if key in user or key in explicit}
    in_file = dict.fromkeys((TRAIN, MICRO, ACCUM), "from the file")
    settle_batch(config, stated, {**in_file, **said}, procs, user_file)
    optimizer = config.get("optimizer")
    if options.torch_adam and isinstance(optimizer, dict) and str(optimizer.get("type", "")).lower() in ("adam", "adamw"):
        optimizer.setdefault("params", {}).setdefault("torch_adam", True)
    return config


class DeepSpeed(Backend):
    name = "deepspeed"
    parallel_axes = ("dp", "pp")  # the runtime builds a device mesh over these (--parallel)
    requires = ("torch", "deepspeed")
    cli_options = (CliOption("--deepspeed-config", "config", "your ds_config; the job's settings are merged over it", "JSON"),)
    summary = "DeepSpeed (ZeRO) without ssh: srun one task per process; ds_config from the job"
    Options = DeepSpeedOptions
    runtime = "hpc_train_backends.deepspeed_runtime:DeepSpeedRuntime"
    supports_comm_hook = False
    fixed_micro_batch = (
        "the engine fixes train_micro_batch_size_per_gpu and gradient_accumulation_steps from its config when it is "
        "built, and ZeRO reduces gradients during backward; set them in the ds_config (--deepspeed-config)"
    )
    options: DeepSpeedOptions

    def env(self, info: LaunchInfo) -> dict[str, str]:
        source = config_source(self.options, info)
        user = read_user_config(source.file, named_by=source.named_by) if source else None
        config = build_ds_config(
            self.options,
            JobTraining(info.precision, info.grad_accum, info.grad_clip),
            user=user,
            user_file=str(source.file) if source else "",
            procs=processes(info),
        )
        return {
            CONFIG_ENV: json.dumps(config, sort_keys=True),
            # the launcher DeepSpeed ships leaves this unset, and CPU steps run 2x slower
            "OMP_NUM_THREADS": str(self.options.omp_num_threads or info.cpus_per_proc or 1),
        }

    def setup(self, info: LaunchInfo) -> list[str]:
        return [
            *self._config_note(info),
            f'mkdir -p "${{{contract.ENV_JOB_FOLDER}}}"',
            f'printf \'%s\\n\' "${{{CONFIG_ENV}}}" > "{CONFIG_FILE}"',
            f'export {CONFIG_PATH_ENV}="{CONFIG_FILE}"',
        ]

    def _config_note(self, info: LaunchInfo) -> list[str]:
        """Which file of the user's went into the job's config: one comment line in the script."""
        source = config_source(self.options, info)
        if source is None:
            return ["# ds_config: hpc_train's defaults and the job's settings (no file of yours named)"]
        # json.dumps: a path is user input, and escaped it cannot end the comment line
        file = json.dumps(str(source.file), ensure_ascii=False)
        line = f"# ds_config: yours, {file} (named by {source.named_by}), under the job's settings"
        if config_args(list(info.script_args)):
            line += f"; the script is given {CONFIG_FILE}"
        return [line]

    def cleanup(self, info: LaunchInfo) -> list[str]:
        # DeepSpeed's CPU all-reduce leaves a shared-memory buffer per rank, named after the user,
        # MASTER_ADDR and MASTER_PORT; the port is this job's own, so only its buffers go
        pattern = '/dev/shm/deepspeed_allreduce_buffer_"$(id -u)"_"${MASTER_ADDR}"_"${MASTER_PORT}"_*'
        if info.scheduler == "local":
            return [f"rm -f {pattern}"]
        return [f"srun --overlap --nodes={info.nodes} --ntasks-per-node=1 bash -c 'rm -f {pattern}' || true"]

    def launch(self, info: LaunchInfo) -> list[Word]:
        args: list[Word] = list(info.script_args)
        for found in config_args(list(info.script_args)):
            # the script reads the merged file, not its own: the flag is one we matched, never user text
            if found.joined:
                args[found.index] = Raw(f'{found.flag}="{CONFIG_FILE}"')
            else:
                args[found.index + 1] = Raw(f'"{CONFIG_FILE}"')
        flags = ("--local-rank-arg",) if self.options.launcher_args else ()
        shim = launch_shim(info, *flags, args=args)
        if info.scheduler == "local":
            # torchrun spawns the local workers; the shim adds --local_rank as the deepspeed launcher would
            return survive_stop_signal(
                info,
                [
                    info.python,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nnodes=1",
                    f"--nproc-per-node={info.procs_per_node}",
                    *shim[1:],
                ],
            )
        return shim


@hookimpl
def hpc_train_backends() -> list[type[Backend]]:
    return [DeepSpeed]
