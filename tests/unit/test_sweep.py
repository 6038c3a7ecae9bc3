"""Sweeps: expanding overrides, splitting by MaxArraySize, and the array scripts bash runs."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from hpc_train.errors import ConfigError, UsageError
from hpc_train.sweeps.arrays import (
    expand,
    parse_cli,
    parse_max_array_size,
    split,
    submit_arrays,
    sweep_plan,
)
from hpc_train.sweeps.scripts import ArrayPart, array_directives, env_name
from tests.conftest import write


def test_a_grid_is_the_product_of_its_axes_last_key_fastest():
    tasks = expand({"lr": [1e-4, "3e-4"], "seed": [0, 1, 2]})
    assert tasks == [
        {"lr": "0.0001", "seed": "0"},
        {"lr": "0.0001", "seed": "1"},
        {"lr": "0.0001", "seed": "2"},
        {"lr": "3e-4", "seed": "0"},
        {"lr": "3e-4", "seed": "1"},
        {"lr": "3e-4", "seed": "2"},
    ]


def test_an_explicit_list_keeps_each_tasks_own_keys():
    assert expand([{"lr": 0.1}, {"lr": 0.2, "warmup": 100, "fast": True}]) == [
        {"lr": "0.1"},
        {"lr": "0.2", "warmup": "100", "fast": "true"},
    ]


@pytest.mark.parametrize(
    "over, message",
    [
        ({"lr": []}, "over['lr'] is empty"),
        ({"lr": 0.1}, "expected a list of values"),
        ({"lr": "0.1"}, "expected a list of values"),
        ({"l r": [1]}, "'l r' is not a usable override name"),
        ({"lr": [[1]]}, "sweep values are strings or numbers"),
        ([], "the sweep has no tasks"),
        ([1], "expected a mapping of overrides"),
        ({"a-b": [1], "a_b": [2]}, "would share the variable HPC_TRAIN_SWEEP_A_B"),
        ({"task": [1]}, "which hpc_train sets itself"),
    ],
)
def test_bad_overrides_are_usage_errors_that_say_what_is_wrong(over, message):
    with pytest.raises(UsageError) as info:
        expand(over)
    assert message in info.value.message


def test_cli_sweeps_become_a_grid_and_reject_mistakes():
    assert parse_cli(["lr=1e-4,3e-4", "seed=0,1,2"]) == {"lr": ["1e-4", "3e-4"], "seed": ["0", "1", "2"]}
    for bad, message in [
        (["lr"], "expected NAME=V1,V2"),
        (["lr=1,,2"], "an empty value"),
        (["lr=1", "lr=2"], "given twice"),
        (["=1"], "expected NAME=V1,V2"),
    ]:
        with pytest.raises(UsageError) as info:
            parse_cli(bad)
        assert message in info.value.message


def test_max_array_size_comes_from_scontrol_show_config():
    config = "Configuration data as of ...\nMaxArraySize            = 8\nMaxJobCount             = 10000\n"
    assert parse_max_array_size(config) == 8
    assert parse_max_array_size("MaxJobCount = 10000\n") == 1001  # Slurm's default


def test_split_keeps_order_and_never_exceeds_the_limit():
    assert split(list(range(10)), 8) == [list(range(8)), [8, 9]]
    assert split([3, 17], 8) == [[3, 17]]
    chunks = split(list(range(200)), 8)
    assert len(chunks) == 25 and [t for c in chunks for t in c] == list(range(200))


NASTY = ["it's", "a b", "$(touch /tmp/pwned)", "new\nline", "`x`", "*"]


def test_the_array_script_hands_each_task_its_overrides_as_arguments_and_environment(tmp_path: Path):
    overrides = [{"lr": "1e-4", "name": value} for value in NASTY]
    part = ArrayPart(str(tmp_path / "sweep folder"), [3, 5], overrides)
    (tmp_path / "sweep folder" / "slurm").mkdir(parents=True)
    probe = (
        'printf "%s\\0" "$HPC_TRAIN_SWEEP_TASK" "$HPC_TRAIN_JOB_FOLDER" "$HPC_TRAIN_SWEEP_NAME" '
        '"$HPC_TRAIN_SWEEP_OVERRIDES" "${hpc_train_sweep_args[@]}"'
    )
    for index, task in enumerate(part.tasks):
        env = {"PATH": "/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": str(index), "SLURM_ARRAY_JOB_ID": "77"}
        out = subprocess.run(
            ["bash", "-c", "\n".join(part.lines) + "\n" + probe], env=env, capture_output=True, text=True, check=True
        )
        got = out.stdout.split("\0")[:-1]
        folder = tmp_path / "sweep folder" / str(task)
        assert got[:3] == [str(task), str(folder), NASTY[task]]
        assert json.loads(got[3]) == overrides[task]
        assert got[4:] == ["--lr", "1e-4", "--name", NASTY[task]]
        assert folder.is_dir() and (tmp_path / "sweep folder" / "slurm" / f"77_{index}").resolve() == folder
    assert not Path("/tmp/pwned").exists()
    wrong = subprocess.run(
        ["bash", "-c", "\n".join(part.lines)], env={"SLURM_ARRAY_TASK_ID": "2"}, capture_output=True, text=True, check=False
    )
    assert wrong.returncode == 1 and "array index 2 is not part of this sweep" in wrong.stderr


def _sandbox_plan(tmp_path: Path, plugins, **options):
    from hpc_train.api import make_job

    script = write(tmp_path / "train.py", "print('hi')\n")
    job = make_job(script=str(script), site="sandbox", backend="mpi", job_root=str(tmp_path / "jobs"), **options)
    return sweep_plan(job, plugins)


def test_an_array_script_renders_the_array_its_logs_and_the_overrides(tmp_path: Path, plugins):
    from hpc_train.api import render_plan

    plan = _sandbox_plan(tmp_path, plugins, after=["41", "42_3"])
    part = ArrayPart(str(tmp_path / "sw"), list(range(8, 10)), [{"lr": str(i)} for i in range(10)])
    plan = dataclasses.replace(plan, sweep=part, directives=array_directives(plan, part, limit=4, after_array="99"))
    text = render_plan(plan, plugins)
    assert "#SBATCH --array=0-1\n" in text  # a limit above the array's size is no limit
    assert "#SBATCH --dependency=afterok:41:42_3,afterany:99\n" in text
    assert "#SBATCH --kill-on-invalid-dep=yes\n" in text
    assert f"#SBATCH --output={tmp_path}/sw/slurm/%A_%a.out\n" in text
    assert f"--output={tmp_path}/sw/slurm/%A_%a/%t_log.out" in text  # srun's, through the task's link
    assert '"${hpc_train_sweep_args[@]}"' in text.split("# launch", 1)[1]
    assert "    1) HPC_TRAIN_SWEEP_TASK=9; hpc_train_sweep_args=(--lr 9)" in text
    assert 'export HPC_TRAIN_CHECKPOINT_DIR="${HPC_TRAIN_JOB_FOLDER}/checkpoints"' in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    limited = array_directives(plan, ArrayPart("/s", list(range(8)), [{}] * 8), limit=3, after_array=None)
    assert dict(limited)["array"] == "0-7%3"


def test_a_plain_job_gets_a_dependency_only_when_asked(tmp_path: Path, plugins):
    from hpc_train.api import make_job, plan_job

    script = write(tmp_path / "train.py", "print('hi')\n")
    plain = plan_job(make_job(script=str(script), site="sandbox"), plugins)
    assert not any(k in ("dependency", "kill-on-invalid-dep") for k, _ in plain.directives)
    after = plan_job(make_job(script=str(script), site="sandbox", after="7,8", after_type="afterany"), plugins)
    assert ("dependency", "afterany:7:8") in after.directives
    with pytest.raises(ConfigError) as info:
        make_job(script=str(script), after=["abc"])
    assert "--after" in info.value.message and "not a Slurm job id" in info.value.message


def test_sweeps_need_a_slurm_site_and_leave_the_array_to_hpc_train(tmp_path: Path, plugins):
    with pytest.raises(UsageError, match="sweeps are Slurm job arrays"):
        from hpc_train.api import make_job

        sweep_plan(make_job(script=str(write(tmp_path / "t.py", "")), site="local"), plugins)
    with pytest.raises(UsageError, match="conflicts with the sweep"):
        _sandbox_plan(tmp_path, plugins, sbatch={"array": "0-3"})


def test_env_names_are_prefixed_and_shell_safe():
    assert env_name("model.size") == "HPC_TRAIN_SWEEP_MODEL_SIZE"
    assert env_name("lr") == "HPC_TRAIN_SWEEP_LR"


def test_hpc_train_sweep_is_the_api_function_before_and_after_the_sweeps_modules_are_imported():
    import hpc_train
    import hpc_train.sweeps.submit

    assert callable(hpc_train.sweep) and hpc_train.sweep is hpc_train.api.sweep  # not shadowed by a module
    with pytest.raises(UsageError, match="max_concurrent"):
        hpc_train.sweep("x.py", over={"lr": [1]}, max_concurrent=0)


def test_cli_sweep_and_dependency_options_reach_the_job(tmp_path: Path, capsys):
    from hpc_train.cli import build_parser, main
    from hpc_train.cli.options import job_options

    args = build_parser().parse_args(
        [
            "submit",
            "--after",
            "5",
            "--after",
            "6,7",
            "--after-type",
            "afterany",
            "--sweep",
            "lr=1,2",
            "--array-parallelism",
            "3",
            "t.py",
        ]
    )
    args.after_dashdash = []
    options = job_options(args)
    assert options["after"] == ["5", "6,7"] and options["after_type"] == "afterany"
    assert args.sweep == ["lr=1,2"] and args.max_concurrent == 3
    script = str(write(tmp_path / "t.py", ""))
    assert main(["submit", "--max-concurrent", "3", script]) == 2
    assert "--max-concurrent limits a sweep" in capsys.readouterr().err
    assert main(["submit", "--sweep", "lr=1,2", "--follow", script]) == 2
    assert "use --wait" in capsys.readouterr().err
    assert main(["status", "123456789"]) == 2  # neither a job nor a sweep: the job's message
    assert "no job '123456789'" in capsys.readouterr().err


def test_each_array_of_a_split_sweep_waits_only_for_the_one_before(tmp_path: Path, plugins, monkeypatch):
    # a stand-in sbatch: this test is about the scripts submit_arrays writes, not about Slurm
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write(
        bin_dir / "sbatch",
        '#!/bin/bash\nn=$(( $(ls "$SCRIPTS" | wc -l) + 101 ))\ncp "${@: -1}" "$SCRIPTS/$n.sh"\necho "Submitted batch job $n"\n',
    ).chmod(0o755)
    (tmp_path / "scripts").mkdir()
    monkeypatch.setenv("SCRIPTS", str(tmp_path / "scripts"))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr("hpc_train.sweeps.arrays.max_array_size", lambda slurm_conf=None: 2)
    from hpc_train.api import render_plan

    plan = _sandbox_plan(tmp_path, plugins)
    before = list(plan.directives)
    arrays = submit_arrays(plan, lambda p: render_plan(p, plugins), tmp_path / "sw", [{}] * 8, range(8), limit=1)
    assert [a["job_id"] for a in arrays] == ["101", "102", "103", "104"]
    deps = [re.findall(r"#SBATCH --dependency=(\S+)", (tmp_path / "scripts" / f"{n}.sh").read_text()) for n in range(101, 105)]
    assert deps == [[], ["afterany:101"], ["afterany:102"], ["afterany:103"]]  # not the 1st, 2nd and 3rd
    assert plan.directives == before and plan.sweep is None  # the plan itself is left as it was


@pytest.mark.parametrize(
    "site_text, options, fragment",
    [
        (None, {"nodes": 9}, "allows at most 3 nodes, 9 requested"),
        # only the shared check (prepare.checked_plan) looks at a backend the job does not use, and at the template
        ("extends: sandbox\nbackends:\n  deepspeed:\n    stagee: 2\n", {}, "backends.deepspeed.stagee: unknown key"),
        ("extends: sandbox\ntemplate: nope.sh.j2\n", {}, "template 'nope.sh.j2' not found"),
        (None, {"sbatch": {"mail-tipe": "END"}}, "did you mean --mail-type?"),
    ],
)
def test_a_sweep_fails_before_submitting_with_the_message_render_gives(
    tmp_path, site_dir, plugins, monkeypatch, site_text, options, fragment
):
    import hpc_train.sweeps.submit as sweep_submit
    from hpc_train.api import render, sweep

    site = "sandbox" if site_text is None else str(write(site_dir / "strict.yaml", site_text))
    script = str(write(tmp_path / "train.py", "print('hi')\n"))
    options = {"site": site, "job_root": str(tmp_path / "jobs"), **options}
    monkeypatch.setattr(sweep_submit, "submit_arrays", lambda *a, **k: pytest.fail("the sweep was submitted"))
    with pytest.raises(ConfigError) as single:
        render(script, plugins=plugins, **options)
    with pytest.raises(ConfigError) as swept:
        sweep(script, over={"lr": [1, 2]}, plugins=plugins, **options)
    assert fragment in str(single.value) and str(swept.value) == str(single.value)
    assert not (tmp_path / "jobs").exists()  # refused before any folder was made
