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
    assert kinds >= {("greater_than_equal", "nodes"), ("unexpected_keyword_argument", "nodez"), ("value_error", "time"),
                     ("value_error", "job_name"), ("literal_error", "precision"), ("value_error", "sbatch")}
    assert any("did you mean 'NCCL_IB_HCA'" in msg for _, _, msg in third[1])


def test_edited_model_is_validated_by_its_new_rules(tmp_path):
    model = write(tmp_path / "src" / "mymodels.py", (
        "from __future__ import annotations\nfrom dataclasses import dataclass\nfrom typing import Annotated\n"
        "from hpc_train.config.fields import Ge, Model\n\n"
        "@dataclass(frozen=True, kw_only=True)\nclass Opts(Model):\n    n: Annotated[int, Ge(0)] = 1\n"))
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
