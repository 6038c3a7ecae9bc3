"""--parallel layouts: parsing, the checks against the job's resources, and the job's environment."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpc_train.api import make_job
from hpc_train.config.loader import load_site
from hpc_train.errors import ConfigError, UsageError
from hpc_train.submission.layout import Layout, canonical, parse, problems
from hpc_train.submission.plan import build_plan
from hpc_train.testing import make_plugins
from tests.conftest import REPO


@pytest.mark.parametrize(
    "text, layout",
    [
        ("dp=2,tp=2,pp=1", Layout(2, 2, 1)),
        (" tp=2 , pp=2 ", Layout(1, 2, 2)),
        ({"dp": 4}, Layout(4, 1, 1)),
    ],
)
def test_parse(text, layout):
    assert parse(text) == layout


def test_dp_left_out_takes_what_the_world_leaves():
    assert parse("tp=2", world_size=8) == Layout(dp=4, tp=2, pp=1)
    assert parse("tp=3", world_size=8) == Layout(dp=1, tp=3, pp=1)  # no fit: the size check reports it
    assert canonical("pp=2, tp=2") == "tp=2,pp=2" and canonical({"dp": 2, "tp": 2}) == "dp=2,tp=2"


@pytest.mark.parametrize(
    "text, fragment, hint",
    [
        ("dp=2,tq=2", "unknown axis 'tq'", "did you mean 'tp'?"),
        ("dp=2,dp=2", "axis 'dp' given twice", None),
        ("dp=two", "dp='two': expected a whole number ≥ 1", None),
        ("dp=0", "dp='0': expected a whole number ≥ 1", None),
        ("dp:2", "expected AXIS=N items", None),
        ("", "parallel layout is empty", None),
    ],
)
def test_bad_layouts_say_what_is_wrong(text, fragment, hint):
    with pytest.raises(UsageError) as info:
        parse(text)
    assert fragment in info.value.message
    assert info.value.hint == hint or hint is None


def test_mesh_order_keeps_tp_innermost():
    layout = Layout(dp=2, tp=2, pp=2)
    assert layout.shape == (2, 2, 2)
    assert [layout.coordinates(r) for r in (0, 1, 2, 5)] == [
        {"pp": 0, "dp": 0, "tp": 0},
        {"pp": 0, "dp": 0, "tp": 1},
        {"pp": 0, "dp": 1, "tp": 0},
        {"pp": 1, "dp": 0, "tp": 1},
    ]


def check(value, nodes=2, procs=2, gpus=0, backend="torchrun", backend_axes=None):
    axes = {name: cls.parallel_axes for name, cls in make_plugins().backends.items()}  # what the plugins declare
    if backend_axes is not None:
        axes[backend] = backend_axes
    return problems(value, nodes=nodes, procs_per_node=procs, gpus_per_node=gpus, backend=backend, axes_by_backend=axes)


def test_layout_must_fill_the_job():
    assert check("dp=2,tp=2") == (Layout(2, 2, 1), [])
    _layout, found = check("dp=2,tp=4")
    assert [m for m, _ in found] == ["dp=2,tp=4,pp=1 is 8 processes, but the job has 4 (2 nodes x 2 per node)"]


def test_tensor_parallel_stays_inside_a_gpu_node():
    assert check("tp=4", gpus=2)[1][0][0].startswith("tp=4 would split tensor-parallel groups across nodes")
    assert check("tp=4")[1] == []  # CPU partitions may (slowly) run tp across nodes over gloo
    assert check("tp=2,pp=2", gpus=2)[1] == []


def test_backends_without_the_axis_are_told_which_have_it():
    found = check("dp=2,pp=2", backend="deepspeed")[1]
    assert found == [] and check("dp=2,tp=2", backend="deepspeed")[1] == [
        ("backend 'deepspeed' has no tensor parallel (tp=2)", "use --backend torchrun")
    ]
    assert check("dp=4", backend="horovod")[1] == [
        (
            "backend 'horovod' takes no parallel layout (it is data parallel over all processes)",
            "drop --parallel, or use --backend deepspeed or torchrun",
        )
    ]
    assert check("dp=4", backend="mine", backend_axes=("dp", "pp"))[1] == []  # a plugin's own declaration


def plan(plugins, **options):
    options.setdefault("script", "train.py")
    options.setdefault("workdir", "/home/alice/project")
    return build_plan(make_job(**options), load_site(options["site"]), plugins)


def test_plan_exports_the_layout(plugins):
    p = plan(plugins, site="sandbox", nodes=2, procs_per_node=2, parallel="tp=2")
    assert {e.name: e.value for e in p.env}["HPC_TRAIN_PARALLEL"] == "dp=2,tp=2,pp=1"
    assert "HPC_TRAIN_PARALLEL" not in {e.name for e in plan(plugins, site="sandbox").env}


def test_plan_reports_layout_problems_with_the_rest(plugins):
    with pytest.raises(ConfigError) as info:
        plan(plugins, site="bluecloud", nodes=2, procs_per_node=4, partition="a100", parallel="tp=8,dp=2")
    text = str(info.value)
    assert text.startswith("2 problems:")  # every problem at once
    assert "<job>: --parallel: dp=2,tp=8,pp=1 is 16 processes, but the job has 8 (2 nodes x 4 per node)" in text
    assert "<job>: --parallel: tp=8 would split tensor-parallel groups across nodes (4 processes per node)" in text
    assert "(use a tp that divides 4 and put dp or pp across nodes)" in text


def test_cli_rejects_a_bad_layout_before_anything_runs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train",
            "render",
            "--site",
            "sandbox",
            "--nodes",
            "2",
            "--procs-per-node",
            "2",
            "--parallel",
            "dp=2,tp=3",
            str(script),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 78 and "Traceback" not in out.stderr
    assert "parallel: dp=2,tp=3,pp=1 is 6 processes, but the job has 4" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train", "render", "--site", "sandbox", "--parallel", "dq=1", str(script)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 78 and "unknown axis 'dq'" in out.stderr and "did you mean 'dp'" in out.stderr
