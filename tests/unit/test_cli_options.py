"""The job's flags (hpc_train.cli.options): made from the JobSpec fields, read back into JobSpec keywords."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Annotated

import pytest

from hpc_train import contract
from hpc_train.cli.options import add_job_options, job_options
from hpc_train.config.fields import Flag, Ge, field_kinds, from_env, setting, to_env
from hpc_train.config.job import GROUPS, TRAINING, JobSpec
from hpc_train.config.loader import load_site
from hpc_train.errors import UsageError
from hpc_train.plugin.backend import Backend, CliOption
from hpc_train.runtime.options import RuntimeOptions
from hpc_train.submission.plan import build_plan


class _Torchrun(Backend):
    name = "torchrun"


class _Fake(Backend):
    name = "fake"
    cli_options = (CliOption("--fake-config", "config", "your fake config (100 % yours)", "FILE"),)


BACKENDS = {"torchrun": _Torchrun, "fake": _Fake}


def parse(*argv: str, spec: type = JobSpec, backends=BACKENDS) -> dict:
    parser = argparse.ArgumentParser(prog="submit")
    add_job_options(parser, backends=backends, spec=spec)
    args = parser.parse_args([*argv, "train.py"])
    args.after_dashdash = []
    return job_options(args)


@pytest.mark.parametrize(
    "text, value",
    [
        ("1:30", "1:30"),  # YAML 1.1 reads 5400 (base 60)
        ("8", 8),
        ("-3", -3),
        ("0.5", 0.5),
        ("1e-4", 1e-4),
        ("true", True),
        ("False", False),
        ("TRUE", True),
        ("yes", "yes"),
        ("on", "on"),
        ("no", "no"),  # YAML 1.1's booleans
        ("0o17", "0o17"),
        ("0x1f", "0x1f"),
        ("1_000", "1_000"),  # YAML 1.1's octal, YAML's hex, 1.1's digit groups
        ("null", None),
        ("~", None),
        ("none", "none"),
        ("", ""),
        ("a=b", "a=b"),
        ("[1, 2]", "[1, 2]"),
        ("2024-01-01", "2024-01-01"),
    ],
)
def test_option_values_are_numbers_and_true_false_only_when_they_plainly_are(text, value):
    got = parse("-o", f"k={text}")["backend_options"]["k"]
    assert got == value and type(got) is type(value)


def test_env_values_stay_text_and_pairs_need_an_equals_sign():
    assert parse("-e", "N=8", "--env", "T=true")["env"] == {"N": "8", "T": "true"}
    with pytest.raises(UsageError, match="--env 'N': expected KEY=VALUE"):
        parse("-e", "N")
    assert parse("--sbatch", "mail-type=END", "--sbatch", "exclusive")["sbatch"] == {"mail-type": "END", "exclusive": True}


def test_only_what_is_given_reaches_the_job():
    assert parse() == {"script": "train.py", "script_args": [], "env": {}, "sbatch": {}, "backend_options": {}}
    options = parse(
        "-N",
        "2",
        "--no-metrics",
        "--restart-from-scratch",
        "--hang-timeout",
        "5m",
        "--after",
        "5,6",
        "--after",
        "7",
        "--nccl-debug",
    )
    assert {k: options[k] for k in ("nodes", "metrics", "restart_from_scratch", "hang_timeout", "after", "nccl_profile")} == {
        "nodes": 2,
        "metrics": False,
        "restart_from_scratch": True,
        "hang_timeout": "5m",
        "after": ["5,6", "7"],
        "nccl_profile": "+debug",
    }


def test_every_field_with_a_group_is_a_flag_of_its_name_and_type():
    parser = argparse.ArgumentParser()
    add_job_options(parser, backends={})
    actions = {a.dest: a for a in parser._actions}
    kinds = field_kinds(JobSpec)
    declared = [f for f in dataclasses.fields(JobSpec) if "cli" in f.metadata]
    assert len(declared) > 40 and {f.metadata["cli"].group for f in declared} == set(GROUPS)
    for f in declared:
        action, kind = actions[f.name], kinds[f.name]
        assert (f.metadata["cli"].flag or "--" + f.name.replace("_", "-")) in action.option_strings
        if kind.choices:
            assert tuple(action.choices) == kind.choices
        if kind.type in (int, float) and not kind.text:
            assert action.type is kind.type, f.name


def test_every_env_field_is_a_contract_variable_and_reads_back_as_it_was(tmp_path):
    (tmp_path / "step-00000010").mkdir()
    (tmp_path / "step-00000010" / "COMMIT").write_text("{}")  # --resume-from needs a committed checkpoint
    variables = {v for k, v in vars(contract).items() if k.startswith("ENV_")}
    env_fields = [f for f in dataclasses.fields(JobSpec) if "env" in f.metadata]
    assert {f.metadata["env"] for f in env_fields} <= variables
    job = JobSpec(
        precision="bf16",
        grad_clip=1.0,
        grad_accum=4,
        micro_batch="auto",
        comm_hook="powersgd",
        activation_checkpointing=True,
        max_bad_steps=3,
        on_divergence="rollback",
        checkpoint_every=100,
        keep_checkpoints=3,
        async_checkpoint=False,
        restart_from_scratch=True,
        exact_resume=False,
        metrics=True,
        profile="torch:wait=5,warmup=2,active=3,ranks=0,last",
        resume_from=str(tmp_path),
    )
    exported = to_env(job)
    assert len(exported) == len(env_fields)
    assert exported[contract.ENV_GRAD_CLIP] == "1.0" and exported[contract.ENV_ASYNC_CHECKPOINT] == "0"
    assert from_env(JobSpec, exported) == {f.name: getattr(job, f.name) for f in env_fields}
    read = RuntimeOptions.from_env(exported)  # the runtime's reader takes the fields it shares with JobSpec
    assert (read.precision, read.grad_clip, read.grad_accum, read.comm_hook) == ("bf16", 1.0, 4, "powersgd")
    assert read.activation_checkpointing is True and read.exact_resume is False
    assert read.profile == "torch:wait=5,warmup=2,active=3,ranks=0,last"
    assert (read.max_bad_steps, read.on_divergence) == (3, "rollback")
    assert read.resume_from == str(tmp_path.resolve())
    assert to_env(JobSpec()) == {}  # None: not exported, the job's own default holds


@dataclass(frozen=True, kw_only=True)
class _WithWarmup(JobSpec):
    warmup_steps: Annotated[int, Ge(0)] | None = setting(
        None, "learning-rate warm-up steps", cli=Flag(TRAINING, metavar="N"), env="HPC_TRAIN_WARMUP_STEPS"
    )


def test_a_new_job_field_is_a_flag_a_keyword_and_a_variable_without_other_edits(plugins):
    parser = argparse.ArgumentParser()
    add_job_options(parser, backends={}, spec=_WithWarmup)
    training = parser.format_help().split(TRAINING + ":", 1)[1].split("\n\n", 1)[0]
    assert "--warmup-steps N" in training and "learning-rate warm-up steps" in training
    options = parse("--warmup-steps", "100", spec=_WithWarmup, backends={})
    assert options["warmup_steps"] == 100
    with pytest.raises(SystemExit):
        parse("--warmup-steps", "many", spec=_WithWarmup, backends={})
    job = _WithWarmup(**{**options, "site": "bluecloud", "workdir": "/home/alice/project", "python": "/opt/venv/bin/python"})
    plan = build_plan(job, load_site("bluecloud"), plugins)
    assert [(e.value, e.source) for e in plan.env if e.name == "HPC_TRAIN_WARMUP_STEPS"] == [("100", "job")]
    assert from_env(_WithWarmup, {e.name: str(e.value) for e in plan.env})["warmup_steps"] == 100


def test_a_backend_flag_sets_its_option_and_is_listed_under_backend_options():
    parser = argparse.ArgumentParser()
    add_job_options(parser, backends=BACKENDS)
    listed = parser.format_help().split("backend options:", 1)[1]
    assert "--fake-config FILE" in listed and "(fake) your fake config (100 % yours)" in listed
    assert parse("--backend", "fake", "--fake-config", "x.json", "-o", "config=y.json")["backend_options"] == {"config": "x.json"}


def test_a_backend_flag_with_another_backend_is_a_usage_error_naming_its_backend():
    with pytest.raises(
        UsageError, match="--fake-config is an option of backend 'fake'; this job's backend is 'torchrun'"
    ) as info:
        parse("--fake-config", "x.json")
    assert "--backend fake" in (info.value.hint or "")


def test_deepspeed_config_belongs_to_the_deepspeed_backend(tmp_path, capsys):
    from hpc_train.cli import main

    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    text = capsys.readouterr().out
    assert "backend options:\n  --deepspeed-config JSON" in text and "(deepspeed) your ds_config" in text
    script = tmp_path / "train.py"
    script.write_text("")
    assert main(["render", "--backend", "torchrun", "--deepspeed-config", "x.json", str(script)]) == 2
    err = capsys.readouterr().err
    assert "--deepspeed-config is an option of backend 'deepspeed'" in err and "--backend deepspeed" in err
