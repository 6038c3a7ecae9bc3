"""Format a JobPlan as an sbatch script through Jinja templates that sites can override.

One Environment per set of template folders: StrictUndefined (a missing value is an error, never an
empty ``#SBATCH --partition=``), site folders first, the built-ins also reachable as ``default:``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import jinja2

from hpc_train import contract
from hpc_train._resources import builtin_dir, cache_dir
from hpc_train.contract import FILES
from hpc_train.errors import Problem, TemplateError
from hpc_train.log_lines import LINES
from hpc_train.plugin.backend import Raw
from hpc_train.submission.job_plan import JobPlan
from hpc_train.submission.shell import join, join_lines, quote, sbatch_line
from hpc_train.version import __version__


@functools.cache
def environment(template_dirs: tuple[str, ...] = ()) -> jinja2.Environment:
    builtin = jinja2.FileSystemLoader(str(builtin_dir("templates")))
    loader = jinja2.ChoiceLoader(
        [
            *(jinja2.FileSystemLoader(d) for d in template_dirs),
            jinja2.PrefixLoader({"default": builtin}, delimiter=":"),
            builtin,
        ]
    )
    env = jinja2.Environment(
        loader=loader,
        bytecode_cache=_bytecode_cache(),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["q"] = quote
    env.filters["shjoin"] = join
    env.globals["shlines"] = join_lines
    return env


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    # Compiling the templates is a good part of a cold render; the cache is keyed by source checksum.
    folder = cache_dir("jinja")
    return jinja2.FileSystemBytecodeCache(str(folder)) if folder is not None else None


def template_dirs_for(plan: JobPlan, plugin_dirs: Sequence[Path] = ()) -> tuple[str, ...]:
    site_dirs = [(plan.site_path.parent / d).resolve() for d in plan.site.template_dirs]
    return tuple(str(d) for d in [*site_dirs, *plugin_dirs])


def context(plan: JobPlan) -> dict[str, object]:
    srun: list[object] = []
    if plan.scheduler == "slurm":
        srun = [
            "srun",
            f"--nodes={plan.nodes}",
            f"--ntasks-per-node={plan.tasks_per_node}",
            # asked again: Slurm 22.05's srun does not take --cpus-per-task from the allocation
            *([f"--cpus-per-task={plan.cpus_per_task}"] if plan.cpus_per_task else []),
            *([f"--cpu-bind={plan.cpu_bind}"] if plan.cpu_bind else []),
            *(["--gpu-bind=closest"] if plan.gpu_bind else []),
            "--kill-on-bad-exit=1",
            "--unbuffered",
            f"--output={plan.stdout_pattern}",
            f"--error={plan.stderr_pattern}",
            # with spare nodes the allocation is larger than the step: the script picks the healthy ones
            # (and the step's task count: the batch shell's SLURM_NTASKS counts the spares' tasks too)
            *(
                [f"--ntasks={plan.nodes * plan.tasks_per_node}", Raw(f'--nodelist="${{{contract.ENV_STEP_NODES}}}"')]
                if plan.spare_nodes
                else []
            ),
            *plan.srun_args,
        ]
    return {
        "container": container_words(plan),
        "plan": plan,
        "files": FILES,  # the job folder's file names (hpc_train.contract)
        "lines": LINES,  # the log lines the login side reads back (hpc_train.log_lines)
        "version": __version__,
        "site": plan.site,
        "job": plan.job,
        "backend": plan.backend_name,
        "sbatch_lines": [sbatch_line(k, v) for k, v in plan.directives],
        "env": plan.env,
        "srun": srun,
        "extra": plan.extra,
    }


def container_words(plan: JobPlan) -> list[str]:
    """Words between srun and the launch line that put each task in the site's container."""
    container = plan.site.container
    image = plan.job.container_image or container.image
    wanted = plan.job.container if plan.job.container is not None else (container.enabled or bool(plan.job.container_image))
    if not wanted or container.runtime == "none" or not image:
        return []
    if container.runtime == "pyxis":
        words = [f"--container-image={image}"]
        if container.mounts:
            words.append("--container-mounts=" + ",".join(container.mounts))
        return [*words, *container.options]
    words = [container.runtime, "exec"]
    if plan.gpus_per_node > 0:
        words.append("--nv")
    for mount in container.mounts:
        words += ["--bind", mount]
    return [*words, *container.options, image]


def render(plan: JobPlan, plugin_template_dirs: Sequence[Path] = ()) -> str:
    dirs = template_dirs_for(plan, plugin_template_dirs)
    env = environment(dirs)
    name = plan.site.template
    try:
        template = env.get_template(name)
        return template.render(**context(plan))
    except jinja2.TemplateSyntaxError as exc:
        source = exc.filename or exc.name or name
        raise TemplateError(Problem(source, "", f"template syntax error: {exc.message}", exc.lineno)) from None
    except jinja2.TemplateNotFound as exc:
        searched = ", ".join(dirs + (str(builtin_dir("templates")),))
        raise TemplateError(
            Problem(f"site {plan.site.name}", "template", f"template {exc.name!r} not found (searched {searched})")
        ) from None
    except jinja2.UndefinedError as exc:
        raise TemplateError(Problem(name, "", f"template uses an undefined value: {exc.message}")) from None
