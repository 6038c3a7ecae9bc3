"""Launch-side behaviour of the four built-in backends (no framework imported)."""

from __future__ import annotations

import json
import sys

import pytest

from hpc_train.api import make_job
from hpc_train.config.loader import load_site
from hpc_train.errors import ConfigError
from hpc_train.submission.plan import build_plan
from hpc_train.submission.renderer import render
from tests.conftest import write


def plan(plugins, backend, site="sandbox", **options):
    options.setdefault("script", "train.py")
    options.setdefault("workdir", "/home/alice/project")
    options.setdefault("python", "/opt/venv/bin/python")
    return build_plan(make_job(site=site, backend=backend, nodes=options.pop("nodes", 2), **options), load_site(site), plugins)


def env_of(p):
    return {e.name: e.value for e in p.env}


@pytest.mark.parametrize("backend, tasks", [("torchrun", 1), ("deepspeed", 4), ("horovod", 4), ("mpi", 4)])
def test_tasks_per_node(plugins, backend, tasks):
    p = plan(plugins, backend, procs_per_node=4)
    assert p.tasks_per_node == tasks
    assert ("ntasks-per-node", tasks) in p.directives


def test_mpi_style_backends_use_pmix_and_the_shim(plugins):
    for backend in ("mpi", "horovod"):
        text = render(plan(plugins, backend, procs_per_node=2), ())
        assert "--mpi=pmix \\\n    /opt/venv/bin/python -m hpc_train.runtime.launch -- /home/alice/project/train.py" in text
        local = render(plan(plugins, backend, site="local", nodes=1, procs_per_node=2), ())
        assert "mpirun --oversubscribe --bind-to none -np 2 /opt/venv/bin/python -m hpc_train.runtime.launch" in local


def test_horovod_options_become_its_environment(plugins):
    p = plan(plugins, "horovod", backend_options={"fusion_threshold_mb": 64, "cycle_time_ms": 3.5})
    env = env_of(p)
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(64 * 1024 * 1024) and env["HOROVOD_CYCLE_TIME"] == "3.5"
    with pytest.raises(ConfigError, match="fusion_treshold_mb: unknown key"):
        plan(plugins, "horovod", backend_options={"fusion_treshold_mb": 64})


def test_deepspeed_config_from_job_options(plugins):
    p = plan(plugins, "deepspeed", precision="bf16", grad_accum=4, grad_clip=1.0, procs_per_node=2,
             backend_options={"zero_stage": 3, "micro_batch": 8})
    config = json.loads(env_of(p)["HPC_TRAIN_DEEPSPEED_CONFIG_JSON"])
    assert config["zero_optimization"] == {"stage": 3}
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    assert (config["gradient_accumulation_steps"], config["gradient_clipping"]) == (4, 1.0)
    assert config["train_micro_batch_size_per_gpu"] == 8
    assert env_of(p)["OMP_NUM_THREADS"] == "2"  # 4 CPUs per node / 2 processes
    text = render(p, ())
    assert "--local-rank-arg -- /home/alice/project/train.py" in text
    assert "trap hpc_train_cleanup EXIT" in text and "deepspeed_allreduce_buffer_" in text


def test_deepspeed_user_config_is_merged_under_the_job(plugins, tmp_path):
    user = write(tmp_path / "ds.json", json.dumps({"zero_optimization": {"stage": 1, "overlap_comm": True},
                                                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                                                   "gradient_clipping": 0.5}))
    p = plan(plugins, "deepspeed", backend_options={"config": str(user), "zero_stage": 2})
    config = json.loads(env_of(p)["HPC_TRAIN_DEEPSPEED_CONFIG_JSON"])
    assert config["zero_optimization"] == {"stage": 2, "overlap_comm": True}  # explicit job option wins
    assert config["gradient_clipping"] == 0.5  # the user's value beats hpc_train's default
    assert config["optimizer"]["params"] == {"lr": 1e-4, "torch_adam": True}  # no JIT-built fused Adam
    # the script's own --deepspeed_config points at the merged file
    q = plan(plugins, "deepspeed", script_args=["--deepspeed", "--deepspeed_config", str(user)])
    assert '--deepspeed_config "${HPC_TRAIN_JOB_FOLDER}/ds_config.json"' in render(q, ())


def test_deepspeed_bad_user_config_names_file_and_line(plugins, tmp_path):
    bad = write(tmp_path / "ds.json", '{\n  "zero_optimization": {"stage": 2,}\n}\n')
    with pytest.raises(ConfigError) as info:
        plan(plugins, "deepspeed", backend_options={"config": str(bad)})
    assert f"{bad}:2: invalid JSON" in str(info.value)
    with pytest.raises(ConfigError, match="DeepSpeed config file not found"):
        plan(plugins, "deepspeed", backend_options={"config": str(tmp_path / "missing.json")})


def test_comm_hook_only_for_ddp(plugins):
    with pytest.raises(ConfigError, match="has no DDP communication hooks"):
        plan(plugins, "horovod", comm_hook="powersgd")
    assert env_of(plan(plugins, "torchrun", comm_hook="powersgd"))["HPC_TRAIN_COMM_HOOK"] == "powersgd"


def test_backend_modules_import_no_framework():
    import subprocess

    code = ("import sys; import hpc_train_plugins.deepspeed, hpc_train_plugins.horovod, hpc_train_plugins.mpi, "
            "hpc_train_plugins.torchrun; print(sorted(m for m in ('torch','deepspeed','horovod','mpi4py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr
