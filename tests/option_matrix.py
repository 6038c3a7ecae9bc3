"""Every job option against every place a job can run: the site kinds (``local``, a Slurm site) x the built-in
backends x their launch paths (torchrun's agent on and off), through the real ``render`` path (the parser,
``make_job``, the plan, the template). In each cell an option is honoured, its effect visible in the plan or
the rendered script, or refused before anything is queued with a message naming it and where it works.

OPTIONS is the table: option -> how to give it, how its effect shows, which cells refuse it (and with what).
tests/unit/test_option_matrix.py checks every cell against it, fails when the declarations (JobSpec's
flags, the backends' ``cli_options``) have an option the table has not, and keeps docs/cli.md's
"Where each option works" section (:func:`markdown`, from the same probing) up to date.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc_train import contract
from hpc_train.cli.options import BACKEND_GROUP, add_job_options, job_options
from hpc_train.config.fields import field_names, to_env
from hpc_train.config.job import GROUPS, JobSpec
from hpc_train.errors import ConfigError, HpcTrainError, UsageError
from hpc_train.plugin.manager import Plugins
from hpc_train.submission.job_plan import JobPlan
from hpc_train.submission.prepare import make_job, plan_job, render_plan
from hpc_train.submission.shell import quote
from hpc_train.testing import make_plugins

SITES = {"local": "local", "Slurm": "sandbox"}  # site kind -> the site the matrix plans on


@dataclasses.dataclass(frozen=True)
class Cell:
    kind: str  # "local" or "Slurm"
    backend: str
    agent: bool | None = None  # torchrun's launch path where the backend has one (an ``agent`` option); None: none

    @property
    def site(self) -> str:
        return SITES[self.kind]

    @property
    def slurm(self) -> bool:
        return self.kind == "Slurm"

    @property
    def label(self) -> str:
        return self.backend + (" -o agent=false" if self.agent is False else "")

    def argv(self) -> list[str]:
        return ["--site", self.site, "--backend", self.backend, *(["-o", "agent=false"] if self.agent is False else [])]


Shows = Callable[[JobPlan, str, Cell], bool]
Refused = Callable[[Cell], str | None]


def never(cell: Cell) -> str | None:
    return None


@dataclasses.dataclass(frozen=True)
class Entry:
    argv: list[str] | Callable[[Cell, Path], list[str]]  # what gives the option ([] for the axes themselves)
    shows: Shows  # its effect, in the plan or the rendered script
    how: str  # the same in words, for docs/cli.md
    refused: Refused = never  # a cell that refuses it -> a fragment of the refusal; None: honoured there
    key: str | None = None  # the refusal's key when it is not the option's flag

    def given(self, cell: Cell, tmp: Path) -> list[str]:
        return self.argv(cell, tmp) if callable(self.argv) else list(self.argv)


def text_has(*fragments: str) -> Shows:
    return lambda plan, text, cell: all(f in text for f in fragments)


def directive(line: str) -> Shows:
    return text_has(f"#SBATCH {line}\n")


def job_env(name: str) -> Shows:
    """The field's own variable (``setting(env=...)``), exported with the value the job spec holds."""
    var = next(f.metadata["env"] for f in dataclasses.fields(JobSpec) if f.name == name)
    return lambda plan, text, cell: f"export {var}={quote(to_env(plan.job)[var])}  # job\n" in text


def env_entry(name: str, *argv: str, refused: Refused = never) -> Entry:
    var = next(f.metadata["env"] for f in dataclasses.fields(JobSpec) if f.name == name)
    return Entry(list(argv), job_env(name), f"`{var}` exported to the job", refused)


def on_local(fragment: str) -> Refused:
    return lambda cell: None if cell.slurm else fragment


def unless(backends: tuple[str, ...], fragment: str) -> Refused:
    return lambda cell: None if cell.backend in backends else fragment


def slurm_or_plan(line: str, plan_test: Callable[[JobPlan], bool]) -> Shows:
    """A directive on Slurm; on the local site the plan's own value (what the local executor uses)."""
    return lambda plan, text, cell: plan_test(plan) and (not cell.slurm or f"#SBATCH {line}\n" in text)


def _resume_folder(cell: Cell, tmp: Path) -> list[str]:
    step = tmp / "ckpt" / "step-10"
    step.mkdir(parents=True, exist_ok=True)
    (step / contract.COMMIT).write_text("")
    return ["--resume-from", str(tmp / "ckpt")]


def _ds_config(cell: Cell, tmp: Path) -> list[str]:
    (tmp / "ds.json").write_text("{}")
    return ["--deepspeed-config", str(tmp / "ds.json")]


SBATCH_ONLY = on_local("without sbatch")
REQUEUE_ONLY = on_local("only Slurm sites requeue")
NO_LOCAL_DIR = "checkpoint_local_dir"
SANDBOX_GPU = ["--partition", "gpu"]

OPTIONS: dict[str, Entry] = {
    # where and how
    "--site": Entry([], lambda p, t, c: f"site {c.site}, " in t, "the script's header; the site's settings"),
    "--backend": Entry([], lambda p, t, c: f"backend {c.backend}, " in t, "the launch line"),
    "--option": Entry(["-o", "omp_num_threads=3"], text_has("export OMP_NUM_THREADS=3  # backend"), "the backend's exports"),
    "--deepspeed-config": Entry(
        _ds_config,
        text_has("# ds_config: yours, "),
        "`# ds_config:` comment, the merged file",
        unless(("deepspeed",), "use --backend deepspeed"),
    ),
    "--nccl-profile": Entry(
        ["--nccl-profile", "sandbox-tcp"],
        text_has("# nccl profile sandbox-tcp\n"),
        "its variables exported",
        on_local("the site defines no NCCL profiles"),
    ),
    "--nccl-debug": Entry(
        ["--nccl-debug"], text_has("export NCCL_DEBUG=INFO  # nccl overlay debug"), "`NCCL_DEBUG=INFO` and the rest exported"
    ),
    "--env": Entry(["-e", "MINE=1"], text_has("export MINE=1  # job"), "exported, marked `# job`"),
    "--python": Entry(["--python", "/opt/other/bin/python"], text_has("/opt/other/bin/python -"), "every python of the job"),
    "--container": Entry(["--container"], lambda p, t, c: False, "", lambda c: "has no container runtime"),
    "--container-image": Entry(
        ["--container-image", "/i.sif"], lambda p, t, c: False, "", lambda c: "has no container runtime", key="--container"
    ),
    "--workdir": Entry(["--workdir", "/w"], text_has("\ncd /w\n"), "`cd` before the launch"),
    "--job-root": Entry(["--job-root", "/jr"], text_has("export HPC_TRAIN_JOB_ROOT=/jr"), "`HPC_TRAIN_JOB_ROOT`, the logs"),
    "--snapshot": Entry(
        ["--no-snapshot"],
        lambda p, t, c: p.code is None and "HPC_TRAIN_CODE" not in t and f" {p.job.script}" in t,
        "off: the script runs in place (on, the default: its project's copy, `HPC_TRAIN_CODE`)",
    ),
    # training (the job's runtime reads them)
    "--precision": env_entry("precision", "--precision", "bf16"),
    "--grad-clip": env_entry("grad_clip", "--grad-clip", "1.5"),
    "--grad-accum": env_entry("grad_accum", "--grad-accum", "2"),
    "--micro-batch": env_entry(
        "micro_batch",
        "--micro-batch",
        "auto",
        refused=unless(("torchrun", "mpi"), "use --micro-batch with --backend mpi or torchrun"),
    ),
    "--comm-hook": env_entry("comm_hook", "--comm-hook", "fp16", refused=unless(("torchrun",), "use it with --backend torchrun")),
    "--activation-checkpointing": env_entry("activation_checkpointing", "--activation-checkpointing"),
    "--max-bad-steps": env_entry("max_bad_steps", "--max-bad-steps", "3"),
    "--on-divergence": env_entry("on_divergence", "--on-divergence", "rollback"),
    "--metrics": env_entry("metrics", "--no-metrics"),
    "--profile": env_entry("profile", "--profile", "torch"),
    "--parallel": Entry(
        ["--parallel", "dp=2", "--procs-per-node", "2"],
        text_has("export HPC_TRAIN_PARALLEL="),
        "`HPC_TRAIN_PARALLEL` exported",
        unless(("torchrun", "deepspeed"), "use --backend deepspeed or torchrun"),
    ),
    # preemption, time limits and checkpoints
    "--requeue": Entry(["--requeue"], directive("--requeue"), "`#SBATCH --requeue`, the signal trap", REQUEUE_ONLY),
    "--max-restarts": Entry(["--max-restarts", "2"], text_has("HPC_TRAIN_MAX_RESTARTS=2\n"), "the restart budget", REQUEUE_ONLY),
    "--signal-grace": Entry(
        ["--signal-grace", "30"], directive("--signal=B:USR2@30"), "`#SBATCH --signal=B:SIG@S`", REQUEUE_ONLY
    ),
    "--on-failure": Entry(
        ["--on-failure", "requeue"], text_has("\nhpc_train_retry=1\n"), "the retry after a failed run", REQUEUE_ONLY
    ),
    "--hang-timeout": Entry(
        ["--hang-timeout", "20s"],
        text_has("export HPC_TRAIN_HANG_TIMEOUT=20"),
        "the watchdog beside the step",
        on_local("submit to a Slurm site"),
    ),
    "--spare-nodes": Entry(
        ["--spare-nodes", "1"],
        text_has("#SBATCH --nodes=2\n", "restarting inside the allocation"),
        "N+K `#SBATCH --nodes`, the restart loop",
        on_local("a Slurm site with requeue on"),
    ),
    "--node-check": Entry(
        ["--node-check"],
        text_has("-m hpc_train.runtime.supervise.node_check"),
        "the check before each run",
        on_local("a Slurm site with requeue on"),
    ),
    "--straggler-threshold": Entry(
        ["--straggler-threshold", "0.5"],
        text_has("export HPC_TRAIN_STRAGGLER_THRESHOLD=0.5"),
        "`HPC_TRAIN_STRAGGLER_THRESHOLD` exported",
    ),
    "--checkpoint-every": env_entry("checkpoint_every", "--checkpoint-every", "50"),
    "--keep-checkpoints": env_entry("keep_checkpoints", "--keep-checkpoints", "3"),
    "--async-checkpoint": env_entry("async_checkpoint", "--async-checkpoint"),
    "--local-checkpoints": Entry(["--local-checkpoints"], lambda p, t, c: False, "", lambda c: NO_LOCAL_DIR),
    "--restart-from-scratch": env_entry("restart_from_scratch", "--restart-from-scratch"),
    "--resume-from": Entry(_resume_folder, job_env("resume_from"), "`HPC_TRAIN_RESUME_FROM` exported"),
    "--exact-resume": env_entry("exact_resume", "--no-exact-resume"),
    # resources
    "--nodes": Entry(["--nodes", "2"], directive("--nodes=2"), "`#SBATCH --nodes`", on_local("use --nodes 1")),
    "--procs-per-node": Entry(["--procs-per-node", "2"], text_has("x 2 process(es)"), "the launch's process count"),
    "--gpus-per-node": Entry(
        lambda c, tmp: ["--gpus-per-node", "2", *(SANDBOX_GPU if c.slurm else [])],
        directive("--gres=gpu:2"),
        "`#SBATCH --gres=gpu:N`",
        on_local("has 0 GPUs per node"),
    ),
    "--cpus-per-task": Entry(
        ["--cpus-per-task", "2"],
        lambda p, t, c: "export OMP_NUM_THREADS=2" in t and (not c.slurm or "#SBATCH --cpus-per-task=2\n" in t),
        "`OMP_NUM_THREADS`; Slurm: `#SBATCH`",
    ),
    "--mem": Entry(["--mem", "4G"], directive("--mem=4G"), "`#SBATCH --mem`", SBATCH_ONLY),
    "--partition": Entry(
        lambda c, tmp: ["--partition", "gpu" if c.slurm else "cpu"],
        slurm_or_plan("--partition=gpu", lambda p: p.partition in ("gpu", "cpu")),
        "`#SBATCH --partition`; local: the partition's limits",
    ),
    "--time": Entry(
        ["--time", "00:20:00"],
        slurm_or_plan("--time=00:20:00", lambda p: p.time_seconds == 1200),
        "`#SBATCH --time`; local: the executor's timeout",
    ),
    "--job-name": Entry(
        ["--job-name", "mine"],
        slurm_or_plan("--job-name=mine", lambda p: p.job_name == "mine"),
        "`#SBATCH --job-name`; local: the job record",
    ),
    "--account": Entry(["--account", "a"], directive("--account=a"), "`#SBATCH --account`", SBATCH_ONLY),
    "--qos": Entry(["--qos", "q"], directive("--qos=q"), "`#SBATCH --qos`", SBATCH_ONLY),
    "--reservation": Entry(["--reservation", "r"], directive("--reservation=r"), "`#SBATCH --reservation`", SBATCH_ONLY),
    "--constraint": Entry(["--constraint", "c"], directive("--constraint=c"), "`#SBATCH --constraint`", SBATCH_ONLY),
    "--sbatch": Entry(["--sbatch", "mail-type=END"], directive("--mail-type=END"), "`#SBATCH --NAME=VALUE`", SBATCH_ONLY),
    # dependencies
    "--after": Entry(["--after", "12"], directive("--dependency=afterok:12"), "`#SBATCH --dependency`", SBATCH_ONLY),
    "--after-type": Entry(
        ["--after", "12", "--after-type", "afterany"],
        directive("--dependency=afterany:12"),
        "`#SBATCH --dependency=TYPE:...`",
        SBATCH_ONLY,
        key="--after",
    ),
}


def backends(plugins: Plugins) -> dict[str, Any]:
    return dict(sorted(plugins.backends.items()))


def cells(plugins: Plugins) -> list[Cell]:
    """Every site kind x backend, and both launch paths where a backend has an ``agent`` option (Slurm only:
    the local site always starts torchrun's workers with its agent, docs/backends.md)."""
    out = []
    for kind in SITES:
        for name, cls in backends(plugins).items():
            paths = (True, False) if kind == "Slurm" and "agent" in field_names(cls.Options) else (None,)
            out += [Cell(kind, name, agent) for agent in paths]
    return out


_PARSERS: dict[int, argparse.ArgumentParser] = {}


def parser(plugins: Plugins) -> argparse.ArgumentParser:
    """``render``'s job options, made by the same call from the same declarations, with the built-in backends."""
    if id(plugins) not in _PARSERS:
        _PARSERS[id(plugins)] = argparse.ArgumentParser(prog="render")
        add_job_options(_PARSERS[id(plugins)], backends=backends(plugins))
    return _PARSERS[id(plugins)]


def declared(plugins: Plugins) -> list[str]:
    """Every job option the declarations make: one flag per JobSpec setting with a group, ``--nccl-debug``,
    each backend's ``cli_options`` (a negatable switch by its positive name)."""
    titles = {*GROUPS, BACKEND_GROUP}
    flags = []
    for group in parser(plugins)._action_groups:
        if group.title in titles:
            flags += [next(s for s in a.option_strings if s.startswith("--")) for a in group._group_actions]
    return flags


@dataclasses.dataclass(frozen=True)
class Outcome:
    plan: JobPlan | None = None
    text: str = ""
    error: HpcTrainError | None = None


_OUTCOMES: dict[tuple[int, Cell, int, Path], Outcome] = {}


def probe(plugins: Plugins, cell: Cell, entry: Entry, tmp: Path) -> Outcome:
    """The cell's job with the option, as ``render`` plans and renders it; or the refusal. Kept per folder:
    the matrix test and the docs' table ask for the same ones."""
    key = (id(plugins), cell, id(entry), tmp)
    if key not in _OUTCOMES:
        _OUTCOMES[key] = _probe(plugins, cell, entry, tmp)
    return _OUTCOMES[key]


def _probe(plugins: Plugins, cell: Cell, entry: Entry, tmp: Path) -> Outcome:
    script = tmp / "train.py"
    script.write_text("")
    argv = [*cell.argv(), "--python", "/opt/venv/bin/python", *entry.given(cell, tmp), str(script)]
    try:
        args = parser(plugins).parse_args(argv)
        args.after_dashdash = []
        plan = plan_job(make_job(**job_options(args)), plugins)
        return Outcome(plan, render_plan(plan, plugins))
    except (ConfigError, UsageError) as exc:
        return Outcome(error=exc)


def refusals(error: HpcTrainError, key: str) -> list[str]:
    """The refusal's words for ``key``, each problem's message and hint; [] when none names ``key``."""
    if not isinstance(error, ConfigError):  # a usage error: one message, naming the flag itself
        words = error.message + (f" ({error.hint})" if error.hint else "")
        return [words] if key in words else []
    return [p.message + (f" ({p.hint})" if p.hint else "") for p in error.problems if p.key == key]


def _where(accepted: list[Cell], every: list[Cell]) -> str:
    if not every:
        return "—"
    if len(accepted) == len(every):
        return "yes"
    return ", ".join(c.label for c in accepted) or "no"


def row(plugins: Plugins, flag: str, tmp: Path) -> str:
    entry, found = OPTIONS[flag], {}
    for cell in cells(plugins):
        found[cell] = probe(plugins, cell, entry, tmp)
    columns = []
    for kind in SITES:
        every = [c for c in found if c.kind == kind]
        columns.append(_where([c for c in every if found[c].error is None], every))
    # the words of a refusal the table expects (a cell may have others: local's partition limits --nodes too)
    said = [
        words
        for cell, out in found.items()
        if out.error is not None
        for words in refusals(out.error, entry.key or flag)
        if (entry.refused(cell) or "\0") in words
    ]
    why = said[0].replace("|", "\\|") if said else ""
    return f"| `{flag}` | {' | '.join(columns)} | {entry.how or '—'} | {why} |"


HEADER = (
    "| option | local site | Slurm site | its effect shows as | refused elsewhere, before anything is queued |\n"
    "| --- | --- | --- | --- | --- |"
)


def markdown(plugins: Plugins | None = None, tmp: Path | None = None) -> str:
    """docs/cli.md's "Where each option works" table, from probing every option in every cell (in ``tmp``,
    else a folder of its own)."""
    plugins = plugins or make_plugins()
    if tmp is None:
        with tempfile.TemporaryDirectory() as folder:
            return markdown(plugins, Path(folder))
    rows = [row(plugins, flag, tmp) for flag in declared(plugins) if flag in OPTIONS]
    return "\n".join([HEADER, *rows]) + "\n"
