"""Every array's script of a sweep from one render: the filled skeleton is, byte for byte, what rendering
each array in full gives, through the real renderer and templates (the built-in and a site's)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpc_train.api import make_job, render_plan
from hpc_train.sweeps.arrays import split, sweep_plan
from hpc_train.sweeps.scripts import ArrayPart, ArrayScripts, array_directives
from tests.conftest import write


def _plan(tmp_path: Path, plugins, site: str = "sandbox", **options):
    script = write(tmp_path / "train.py", "print('hi')\n")
    job = make_job(script=str(script), site=site, backend="mpi", job_root=str(tmp_path / "jobs"), snapshot=False, **options)
    return sweep_plan(job, plugins)


def _scripts_and_full_renders(tmp_path: Path, plugins, plan, tasks: int, limit: int | None):
    """Each array's script from ArrayScripts beside its own full render, and how many renders it made."""
    renders = []

    def render(p):
        renders.append(p)
        return render_plan(p, plugins)

    overrides = [{"lr": f"{i}e-4", "name": f"it's {i}"} for i in range(tasks)]
    chunks = split(list(range(tasks)), 8)
    scripts = ArrayScripts(plan, render, len(chunks))
    pairs, previous = [], None
    for number, chunk in enumerate(chunks):
        part = ArrayPart(str(tmp_path / "sweep"), chunk, overrides)
        directives = array_directives(plan, part, limit, previous if limit else None)
        full = render_plan(dataclasses.replace(plan, sweep=part, directives=directives), plugins)
        pairs.append((scripts.script(part, directives), full))
        previous = str(1000 + number)
    return pairs, len(renders)


# a limit chains the arrays: the first has no dependency on another array, unless the job has its own
@pytest.mark.parametrize(("limit", "after", "shapes"), [(None, [], 1), (3, [], 2), (3, ["41", "42_3"], 1)])
def test_every_array_s_script_is_its_full_render_from_a_few_renders(tmp_path: Path, plugins, limit, after, shapes):
    plan = _plan(tmp_path, plugins, after=after)
    pairs, renders = _scripts_and_full_renders(tmp_path, plugins, plan, tasks=8 * 12 + 5, limit=limit)
    assert len(pairs) == 13 and all(script == full for script, full in pairs)
    assert len({script for script, _ in pairs}) == 13  # each array its own tasks, range and dependency
    # the first array of each set of directives, in full and as a skeleton; the rest are filled in
    assert renders == 2 * shapes
    last = pairs[-1][0]
    assert "    4) HPC_TRAIN_SWEEP_TASK=100;" in last
    if limit:
        own = "afterok:41:42_3," if after else ""
        assert "#SBATCH --array=0-4%3\n" in last and f"#SBATCH --dependency={own}afterany:1011\n" in last
    else:
        assert "#SBATCH --array=0-4\n" in last and "--dependency" not in last


def test_a_lone_array_is_rendered_once(tmp_path: Path, plugins):
    pairs, renders = _scripts_and_full_renders(tmp_path, plugins, _plan(tmp_path, plugins), tasks=5, limit=None)
    assert renders == 1 and pairs[0][0] == pairs[0][1]


def _site_with_block(site_dir: Path, name: str, block: str, body: str) -> str:
    """A site on the sandbox whose template overrides one block of the built-in."""
    write(
        site_dir / "templates" / f"{name}.sh.j2",
        f'{{% extends "default:sbatch/base.sh.j2" %}}\n{{% block {block} %}}\n{body}{{% endblock %}}\n',
    )
    write(site_dir / f"{name}.yaml", f"extends: sandbox\ntemplate: {name}.sh.j2\ntemplate_dirs: [templates]\n")
    return name


@pytest.mark.parametrize(
    ("block", "body", "tasks", "fragment"),
    [  # a template that reads the tasks itself; one that prints the directives its own way
        (
            "setup",
            "# this array runs {{ plan.sweep.tasks | length }} task(s) from {{ plan.sweep.tasks[0] }}\n",
            26,
            "# this array runs 2 task(s) from 24\n",
        ),
        (
            "directives",
            "{% for key, value in plan.directives %}\n#SBATCH --{{ key }} {{ value }}\n{% endfor %}\n",
            24,
            "#SBATCH --array 0-7\n",
        ),
    ],
)
def test_a_template_the_skeleton_does_not_fit_is_rendered_per_array(
    tmp_path: Path, plugins, site_dir, block, body, tasks, fragment
):
    plan = _plan(tmp_path, plugins, site=_site_with_block(site_dir, "own", block, body))
    pairs, renders = _scripts_and_full_renders(tmp_path, plugins, plan, tasks=tasks, limit=None)
    assert all(script == full for script, full in pairs) and fragment in pairs[-1][0]
    # the first array in full and as a skeleton, which did not give that render: every other array in full
    assert renders == 2 + (len(pairs) - 1)
