"""Compiled validators in the user's cache: the same results and errors as pydantic's, without pydantic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.config.errors import problems_from_validation
from hpc_train.config.job import JobSpec
from hpc_train.config.validate import ValidationError, validate
from tests.conftest import REPO, write

PROBE = """
import json, sys
sys.path.insert(0, {extra!r})
from hpc_train.config.validate import ValidationError, validate
import importlib
cls = getattr(importlib.import_module({module!r}), {name!r})
out = []
for data in {inputs!r}:
    try:
        out.append(["ok", repr(validate(cls, data))])
    except ValidationError as exc:
        out.append(["error", [(e["type"], list(e["loc"]), e["msg"]) for e in exc.errors(include_url=False)]])
print(json.dumps({{"results": out, "pydantic": "pydantic" in sys.modules}}))
"""

JOB_INPUTS = [
    {"script": "train.py", "nodes": 2, "env": {"A": 3}, "after": "12:13", "parallel": {"dp": 2}, "time": "1:00:00"},
    {"nodes": 0, "nodez": 1, "time": "xx", "job_name": "a\nb", "precision": "fp8", "sbatch": {"nodes": 3}},
    {"env": {"NCCL_IB_HAC": "mlx5_0"}, "grad_clip": -1, "after": ["1x"]},
]


def probe(cache: Path, module: str, name: str, inputs: list, extra: str = "", **env: str) -> dict:
    environ = {**os.environ, "XDG_CACHE_HOME": str(cache), **env}
    code = PROBE.format(extra=extra or str(REPO), module=module, name=name, inputs=inputs)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=environ)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_cached_validator_gives_pydantics_results_without_importing_pydantic(tmp_path):
    cold = probe(tmp_path, "hpc_train.config.job", "JobSpec", JOB_INPUTS)
    assert cold["pydantic"]  # built by pydantic the first time
    assert list((tmp_path / "hpc_train" / "validators").glob("JobSpec-*.pickle"))
    warm = probe(tmp_path, "hpc_train.config.job", "JobSpec", JOB_INPUTS)
    assert not warm["pydantic"]
    assert warm["results"] == cold["results"]
    first, second, third = cold["results"]
    assert first[0] == "ok" and "after=['12', '13']" in first[1] and "env={'A': '3'}" in first[1]
    kinds = {(kind, loc[0]) for kind, loc, _ in second[1]}
    assert kinds >= {
        ("greater_than_equal", "nodes"),
        ("unexpected_keyword_argument", "nodez"),
        ("value_error", "time"),
        ("value_error", "job_name"),
        ("literal_error", "precision"),
        ("value_error", "sbatch"),
    }
    assert any("did you mean 'NCCL_IB_HCA'" in msg for _, _, msg in third[1])


def test_edited_model_is_validated_by_its_new_rules(tmp_path):
    model = write(
        tmp_path / "src" / "mymodels.py",
        (
            "from __future__ import annotations\nfrom dataclasses import dataclass\nfrom typing import Annotated\n"
            "from hpc_train.config.fields import Ge, Model\n\n"
            "@dataclass(frozen=True, kw_only=True)\nclass Opts(Model):\n    n: Annotated[int, Ge(0)] = 1\n"
        ),
    )
    cache = tmp_path / "cache"
    assert probe(cache, "mymodels", "Opts", [{"n": 3}], extra=str(model.parent))["results"][0][0] == "ok"
    assert probe(cache, "mymodels", "Opts", [{"n": 3}], extra=str(model.parent))["pydantic"] is False
    model.write_text(model.read_text().replace("Ge(0)", "Ge(5)"))
    os.utime(model, ns=(model.stat().st_atime_ns, model.stat().st_mtime_ns + 10**9))
    again = probe(cache, "mymodels", "Opts", [{"n": 3}], extra=str(model.parent))
    assert again["results"][0][0] == "error" and again["results"][0][1][0][0] == "greater_than_equal"


def test_damaged_entry_is_rebuilt_and_no_cache_writes_nothing(tmp_path):
    probe(tmp_path, "hpc_train.config.job", "JobSpec", JOB_INPUTS[:1])
    [entry] = (tmp_path / "hpc_train" / "validators").glob("JobSpec-*.pickle")
    entry.write_bytes(b"not a pickle")
    result = probe(tmp_path, "hpc_train.config.job", "JobSpec", JOB_INPUTS[:1])
    assert result["results"][0][0] == "ok" and result["pydantic"]
    off = tmp_path / "off"
    assert probe(off, "hpc_train.config.job", "JobSpec", JOB_INPUTS[:1], HPC_TRAIN_NO_CACHE="1")["results"][0][0] == "ok"
    assert not (off / "hpc_train").exists()


def test_a_plugins_pydantic_model_still_validates():
    from pydantic import BaseModel, ConfigDict

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        depth: int = 1

    assert validate(Options, {"depth": 3}).depth == 3
    with pytest.raises(ValidationError) as caught:
        validate(Options, {"dpeth": 3})
    [problem] = problems_from_validation(caught.value, Options, "backend 'x' options")
    assert problem.key == "dpeth" and problem.message == "unknown key" and "depth" in (problem.hint or "")


def test_unknown_job_option_suggests_the_field():
    with pytest.raises(ValidationError) as caught:
        validate(JobSpec, {"procs_per_nod": 2})
    [problem] = problems_from_validation(caught.value, JobSpec, "job options")
    assert problem.message == "unknown key" and "procs_per_node" in (problem.hint or "")


def test_defaults_stand_in_even_for_required_fields():
    from dataclasses import dataclass

    from hpc_train.config.fields import Model
    from hpc_train.config.validate import defaults

    @dataclass(frozen=True, kw_only=True)
    class Needs(Model):
        name: str
        depth: int = 2

    stand_in = defaults(Needs)
    assert (stand_in.name, stand_in.depth) == (None, 2)


# --- the `validate` command: the check `render` runs, plus warnings ----------------------------------


def _cli(*argv: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from hpc_train.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.py", "print('hi')\n")
    return tmp_path


@pytest.mark.parametrize(
    "files, fragment",
    [
        ({"s.yaml": "extends: generic-slurm\ntemplate: nope.sh.j2\n"}, "s.yaml:2: template: template 'nope.sh.j2' not found"),
        (
            {"s.yaml": "template: bad.sh.j2\ntemplate_dirs: [t]\n", "t/bad.sh.j2": "#!/bin/bash\n{% if %}\n"},
            "bad.sh.j2:2: template syntax error",
        ),
        ({"s.yaml": "template: typo.sh.j2\ntemplate_dirs: [t]\n", "t/typo.sh.j2": "{{ plan.partiton }}\n"}, "partiton"),
        ({"s.yaml": "template: err.sh.j2\ntemplate_dirs: [t]\n", "t/err.sh.j2": "{{ 1 + 'a' }}\n"}, "the template failed"),
        ({"s.yaml": "backends:\n  deepspeed: {stagee: 2}\n"}, "s.yaml:2: backends.deepspeed.stagee: unknown key"),
        (
            {"s.yaml": "backends:\n  torchrun: {max_restarts: true}\n"},
            "s.yaml:2: backends.torchrun.max_restarts: expected an integer",
        ),
        ({"s.yaml": 'partitions:\n  p: {max_time: "1:00:00", default_time: "2:00:00"}\n'}, "s.yaml:2: partitions.p.default_time"),
        ({"s.yaml": "storage:\n  my-data: /d\n"}, "s.yaml:2: storage.my-data"),
    ],
)
def test_validate_and_render_refuse_the_same_sites(here, files, fragment):
    for name, text in files.items():
        write(here / name, text)
    code, _, err = _cli("validate", "--site", "s.yaml")
    assert code == 78 and fragment in err, err
    code, script, err = _cli("render", "--site", "s.yaml", "train.py")
    assert code == 78 and fragment in err and not script, err
    assert "Traceback" not in err


def test_validate_shows_warnings_sorted_by_file_and_line(here):
    write(
        here / "s.yaml",
        "extends: generic-slurm\nenv:\n  NCCL_DEBUG: INFO\n  NCCL_WHATEVER_NEW: 1\n"
        "nccl_profiles:\n  fast: {NCCL_DEBUG_SUBSYS: ALL}\n",
    )
    code, out, err = _cli("validate", "--site", "s.yaml")
    assert code == 0 and "ok: s" in out
    lines = [line for line in err.splitlines() if line.startswith("warning: s.yaml")]
    assert len(lines) >= 2
    numbers = [int(line.split(":")[2]) for line in lines]
    assert numbers == sorted(numbers) and numbers[0] == 3


def test_validate_gives_renders_exit_code_for_the_same_error(here):
    assert _cli("validate", "--site", "nope")[0] == _cli("render", "--site", "nope", "train.py")[0] == 2
    write(here / "empty.yaml", "")
    assert _cli("validate", "--site", "empty.yaml")[0] == _cli("render", "--site", "empty.yaml", "train.py")[0] == 78


def test_a_bool_is_never_a_number_and_a_union_fails_once():
    from hpc_train.config.models import SiteConfig

    with pytest.raises(ValidationError) as caught:
        validate(JobSpec, {"nodes": True, "grad_clip": True})
    assert {e["loc"][0] for e in caught.value.errors()} == {"nodes", "grad_clip"}
    with pytest.raises(ValidationError) as caught:
        validate(SiteConfig, {"name": "x", "sbatch": {"account": {"a": 1}}})
    [problem] = problems_from_validation(caught.value, SiteConfig, "s.yaml")
    assert problem.key == "sbatch.account" and problem.message.startswith("expected a string, an integer or true/false")


@pytest.mark.parametrize(
    "options, where",
    [
        ({"backend": "deepspeed", "backend_options": {"zero_stage": 2.0}}, "zero_stage"),
        ({"backend": "deepspeed", "backend_options": {"micro_batch": 2.5}}, "micro_batch"),
        ({"nodes": 2.0}, "--nodes"),
        ({"grad_accum": True}, "--grad-accum"),
    ],
)
def test_a_count_given_as_a_float_or_a_yes_is_refused_not_rounded(plugins, options, where):
    from hpc_train.errors import ConfigError
    from hpc_train.testing import plan_job

    with pytest.raises(ConfigError) as caught:
        plan_job(plugins, "sandbox", **options)
    assert where in str(caught.value) and "expected an integer, got" in str(caught.value), str(caught.value)
