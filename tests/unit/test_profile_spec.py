"""--profile's SPEC: the grammar, every way it can be wrong, and the checks only the plan can make (the
job's world, the site's nsys, a function job)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpc_train import contract
from hpc_train.config.loader import load_site
from hpc_train.config.profile_spec import ProfileSpec, SpecError, parse, run_folder
from hpc_train.errors import ConfigError
from hpc_train.submission.plan import build_plan
from hpc_train.submission.prepare import make_job
from hpc_train.testing import plan_job
from tests.conftest import REPO


def test_the_defaults_are_steps_5_to_7_on_the_first_and_last_rank():
    spec = parse("torch")
    assert spec == ProfileSpec("torch", wait=5, warmup=2, active=3, ranks=None)
    assert list(spec.steps) == [7, 8, 9] and spec.first == 7
    assert spec.chosen(8) == {0, 7} and spec.chosen(1) == {0}
    assert str(spec) == "torch:wait=5,warmup=2,active=3"  # what the job reads back, defaults spelled out


def test_the_briefs_example_parses_with_its_rank_list_after_a_comma():
    spec = parse("torch:wait=5,warmup=2,active=3,ranks=0,3")
    assert (spec.wait, spec.warmup, spec.active, spec.ranks) == (5, 2, 3, (0, 3))
    assert list(spec.steps) == [7, 8, 9] and spec.chosen(4) == {0, 3}
    assert parse(str(spec)) == spec


@pytest.mark.parametrize(
    "text, world, chosen",
    [
        ("nsys:ranks=all", 4, {0, 1, 2, 3}),
        ("torch:ranks=last", 4, {3}),
        ("torch:ranks=1-3,last,0", 8, {0, 1, 2, 3, 7}),
        ("torch:active=1,ranks=2,wait=0", 4, {2}),  # the rank list ends at the next KEY=VALUE
        ("torch:ranks=0,5", 4, {0}),  # a rank the world lacks profiles nowhere (the plan refuses it first)
    ],
)
def test_ranks(text, world, chosen):
    assert parse(text).chosen(world) == chosen


def test_flags_and_spacing():
    spec = parse(" torch: wait = 0 , warmup=0, active=1, stack=1, memory=yes, shapes=off ")
    assert (spec.wait, spec.warmup, spec.active, spec.stack, spec.memory, spec.shapes) == (0, 0, 1, True, True, False)
    assert list(spec.steps) == [0]
    assert str(spec) == "torch:wait=0,warmup=0,active=1,stack=1,memory=1"


@pytest.mark.parametrize(
    "text, said",
    [
        ("torhc", "unknown profiler 'torhc'; did you mean 'torch'?"),
        ("nsy:active=1", "unknown profiler 'nsy'; did you mean 'nsys'?"),
        ("perf", "unknown profiler 'perf'; known profilers: torch, nsys"),
        ("", "no profiler named; known profilers: torch, nsys"),
        (":wait=1", "no profiler named"),
        ("torch:", "an empty setting"),
        ("torch:wait=1,,active=2", "an empty setting"),
        ("torch:wiat=1", "unknown setting 'wiat'; did you mean 'wait'?"),
        ("torch:5", "'5' is not KEY=VALUE"),
        ("torch:wait", "'wait' is not KEY=VALUE"),
        ("torch:wait=1,wait=2", "wait is given twice"),
        ("torch:wait=-1", "wait=-1: a number of steps, 0 or more"),
        ("torch:warmup=-2", "warmup=-2: a number of steps, 0 or more"),
        ("torch:active=0", "active=0: at least 1 step is recorded"),
        ("torch:active=-3", "active=-3: at least 1 step is recorded"),
        ("torch:wait=x", "wait='x': expected a whole number of steps"),
        ("torch:active=1.5", "active='1.5': expected a whole number of steps"),
        ("torch:ranks=", "'' is not a rank"),
        ("torch:ranks=-1", "rank -1: ranks count from 0; use 'last' for the last rank"),
        ("torch:ranks=0,-2", "rank -2: ranks count from 0"),
        ("torch:ranks=3-1", "'3-1' is not a rank"),
        ("torch:ranks=first", "'first' is not a rank"),
        ("torch:ranks=all,0", "ranks=all names every rank: give it alone"),
        ("torch:stack=maybe", "stack='maybe': expected 1 or 0"),
        ("nsys:stack=1", "stack is a setting of the torch profiler"),
        ("nsys:memory=0", "memory is a setting of the torch profiler"),
    ],
)
def test_every_bad_spec_says_what_is_wrong_and_what_is_right(text, said):
    with pytest.raises(SpecError) as caught:
        parse(text)
    assert said in str(caught.value)
    assert caught.value.hint  # and how it would be right


def test_a_job_option_that_does_not_parse_is_refused_when_the_job_is_made():
    with pytest.raises(ConfigError) as caught:
        make_job(script="train.py", profile="torch:actvie=2")
    assert "profile" in str(caught.value) and "did you mean 'active'?" in str(caught.value)
    assert make_job(script="train.py", profile="nsys:ranks=last").profile == "nsys:wait=5,warmup=2,active=3,ranks=last"


def test_the_cli_refuses_a_bad_spec_with_one_message_and_no_traceback(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train",
            "render",
            "--site",
            "local",
            "--profile",
            "torch:active=0",
            str(REPO / "examples" / "train.py"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 78, out.stderr
    assert "--profile: active=0: at least 1 step is recorded" in out.stderr and "Traceback" not in out.stderr


# -- what only the plan knows ------------------------------------------------------------------------


def plan_problems(plugins, site, **options) -> str:
    with pytest.raises(ConfigError) as caught:
        plan_job(plugins, site, **options)
    return str(caught.value)


def test_ranks_outside_the_world_are_refused_with_the_worlds_size(plugins):
    said = plan_problems(plugins, "sandbox", nodes=2, procs_per_node=2, profile="torch:ranks=0,4-5")
    assert "rank 4, 5 is outside the job's 4 processes (2 node(s) x 2 per node): ranks 0-3" in said
    assert "'last' for the last one" in said
    plan = plan_job(plugins, "sandbox", nodes=2, procs_per_node=2, profile="torch:ranks=0,3")
    env = {e.name: e.value for e in plan.env}
    assert env[contract.ENV_PROFILE] == "torch:wait=5,warmup=2,active=3,ranks=0,3"
    assert contract.ENV_NSYS not in env and contract.ENV_PROFILE_SCRIPT not in env  # the torch profiler needs no wrapper


def test_nsys_exports_the_sites_nsys_and_the_script_whose_python_it_runs(plugins):
    plan = plan_job(plugins, "sandbox", nodes=2, partition="gpu", profile="nsys:ranks=0,last")
    env = {e.name: e.value for e in plan.env}
    assert env[contract.ENV_NSYS] == "nsys"  # the site says nothing: nsys on the nodes' PATH
    assert env[contract.ENV_PROFILE_SCRIPT] == plan.workdir + "/train.py"
    assert env[contract.ENV_PROFILE] == "nsys:wait=5,warmup=2,active=3,ranks=0,last"


def test_nsys_where_the_site_says_it_has_none_is_refused_at_submit(plugins, site_dir):
    (site_dir / "bare.yaml").write_text("extends: local\ntools:\n  nsys: null\n")
    said = plan_problems(plugins, "bare", profile="nsys")
    assert "site 'bare' has no Nsight Systems (tools.nsys is null in its site file)" in said and "--profile torch" in said
    plan_job(plugins, "bare", profile="torch")  # the torch profiler needs nothing of the site
    (site_dir / "own.yaml").write_text("extends: local\ntools:\n  nsys: /opt/nsight/bin/nsys\n")
    env = {e.name: e.value for e in plan_job(plugins, "own", profile="nsys").env}
    assert env[contract.ENV_NSYS] == "/opt/nsight/bin/nsys"


def test_the_sites_tools_reject_unknown_keys(site_dir):
    (site_dir / "typo.yaml").write_text("extends: local\ntools:\n  nsight: /opt/nsight/bin/nsys\n")
    with pytest.raises(ConfigError, match="nsight"):
        load_site("typo")


def test_nsys_needs_a_script_job(plugins):
    job = make_job(site="local", profile="nsys")
    with pytest.raises(ConfigError, match="a function job has none"):
        build_plan(job, load_site("local"), plugins, kind="function", function_name="f")
    build_plan(make_job(site="local", profile="torch"), load_site("local"), plugins, kind="function", function_name="f")


def test_the_run_folder_is_the_job_folders_profile_per_run(tmp_path):
    env = {contract.ENV_JOB_FOLDER: str(tmp_path), contract.ENV_RUN: "3"}
    assert run_folder(env) == tmp_path / "profile" / "run-3"
    assert run_folder({contract.ENV_JOB_FOLDER: str(tmp_path)}) == tmp_path / "profile" / "run-1"
