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


def test_torchrun_without_its_agent_runs_one_task_per_rank_through_the_shim(plugins):
    p = plan(plugins, "torchrun", procs_per_node=4, backend_options={"agent": False})
    assert p.tasks_per_node == 4 and ("ntasks-per-node", 4) in p.directives
    text = render(p, ())
    assert "\\\n    /opt/venv/bin/python -m hpc_train.runtime.launch.worker -- /home/alice/project/train.py" in text
    assert "torch.distributed.run" not in text
    # the local site has no srun to start the ranks: torchrun's agent does, as with the option on
    local = render(plan(plugins, "torchrun", site="local", nodes=1, procs_per_node=2, backend_options={"agent": False}), ())
    assert "-m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2" in local
    # the agent's own restarts have no agent to run them: refused before submission, not ignored
    with pytest.raises(ConfigError, match="max_restarts=2 restarts torchrun's agent's workers, and agent=false starts none"):
        plan(plugins, "torchrun", backend_options={"agent": False, "max_restarts": 2})


def test_mpi_style_backends_use_pmix_and_the_shim(plugins):
    for backend in ("mpi", "horovod"):
        text = render(plan(plugins, backend, procs_per_node=2), ())
        assert (
            "--mpi=pmix \\\n    /opt/venv/bin/python -m hpc_train.runtime.launch.worker -- /home/alice/project/train.py" in text
        )
        local = render(plan(plugins, backend, site="local", nodes=1, procs_per_node=2), ())
        assert "mpirun --oversubscribe --bind-to none -np 2 /opt/venv/bin/python -m hpc_train.runtime.launch.worker" in local


def test_horovod_options_become_its_environment(plugins):
    p = plan(plugins, "horovod", backend_options={"fusion_threshold_mb": 64, "cycle_time_ms": 3.5})
    env = env_of(p)
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(64 * 1024 * 1024) and env["HOROVOD_CYCLE_TIME"] == "3.5"
    with pytest.raises(ConfigError, match="fusion_treshold_mb: unknown key"):
        plan(plugins, "horovod", backend_options={"fusion_treshold_mb": 64})


def test_deepspeed_config_from_job_options(plugins):
    p = plan(
        plugins,
        "deepspeed",
        precision="bf16",
        grad_accum=4,
        grad_clip=1.0,
        procs_per_node=2,
        cpus_per_task=3,
        backend_options={"zero_stage": 3, "micro_batch": 8},
    )
    config = json.loads(env_of(p)["HPC_TRAIN_DEEPSPEED_CONFIG_JSON"])
    assert config["zero_optimization"] == {"stage": 3}
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    assert (config["gradient_accumulation_steps"], config["gradient_clipping"]) == (4, 1.0)
    assert config["train_micro_batch_size_per_gpu"] == 8
    assert env_of(p)["OMP_NUM_THREADS"] == "3"  # one task per process: its CPUs are its threads
    text = render(p, ())
    assert "--local-rank-arg -- /home/alice/project/train.py" in text
    assert "trap hpc_train_cleanup EXIT" in text and "deepspeed_allreduce_buffer_" in text


def test_deepspeed_user_config_is_merged_under_the_job(plugins, tmp_path):
    user = write(
        tmp_path / "ds.json",
        json.dumps(
            {
                "zero_optimization": {"stage": 1, "overlap_comm": True},
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                "gradient_clipping": 0.5,
            }
        ),
    )
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


def test_launch_info_holds_the_job_root_and_the_base_port_and_a_plain_backend_takes_no_comm_hook():
    from hpc_train import Backend, LaunchInfo, hookimpl
    from hpc_train.plugin.manager import get_plugin_manager

    seen: list[LaunchInfo] = []

    class Peek(Backend):  # declares nothing beyond its name: the defaults apply
        name = "peek"

        def env(self, info: LaunchInfo) -> dict[str, str]:
            seen.append(info)
            return {}

    class Provider:
        @hookimpl
        def hpc_train_backends(self):
            return [Peek]

    pm = get_plugin_manager((Provider(),))
    plan(pm, "peek", job_root="/scratch/alice/jobs")
    assert (seen[0].job_root, seen[0].master_port_base) == ("/scratch/alice/jobs", load_site("sandbox").config.master_port)
    with pytest.warns(DeprecationWarning, match=r"LaunchInfo.job_folder is renamed LaunchInfo.job_root"):
        assert seen[0].job_folder == "/scratch/alice/jobs"
    with pytest.warns(DeprecationWarning, match=r"LaunchInfo.master_port is renamed LaunchInfo.master_port_base"):
        assert seen[0].master_port == seen[0].master_port_base
    with pytest.raises(ConfigError, match=r"backend 'peek' has no DDP communication hooks.*--backend torchrun"):
        plan(pm, "peek", comm_hook="fp16")


def test_backend_modules_import_no_framework():
    import subprocess

    code = (
        "import sys; import hpc_train_backends.deepspeed, hpc_train_backends.horovod, hpc_train_backends.mpi, "
        "hpc_train_backends.torchrun; print(sorted(m for m in ('torch','deepspeed','horovod','mpi4py') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr


# -- the user's ds_config: the guide's file, named as users name it ----------------------------------

GUIDE_CONFIG = {  # the multi-node DeepSpeed section of the users' guide, as printed there
    "train_batch_size": 256,
    "gradient_accumulation_steps": 4,
    "fp16": {"enabled": True},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
}


def guide_plan(plugins, tmp_path, nodes=4, **options):
    write(tmp_path / "ds_config.json", json.dumps(GUIDE_CONFIG, indent=4))
    options.setdefault("workdir", str(tmp_path))
    return plan(plugins, "deepspeed", site="bluecloud", nodes=nodes, time="1:00:00", **options)


def ds_config_of(p):
    return json.loads(env_of(p)["HPC_TRAIN_DEEPSPEED_CONFIG_JSON"])


def test_guide_config_gets_the_micro_batch_its_numbers_give(plugins, tmp_path):
    p = guide_plan(plugins, tmp_path, backend_options={"config": "ds_config.json"})  # --deepspeed-config
    config = ds_config_of(p)
    # 256 = micro x 4 x 32 GPUs: DeepSpeed's start-up check holds with 2, not with hpc_train's default 1
    assert (config["train_batch_size"], config["gradient_accumulation_steps"]) == (256, 4)
    assert config["train_micro_batch_size_per_gpu"] == 2
    assert config["fp16"]["enabled"] and config["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert f'# ds_config: yours, "{tmp_path / "ds_config.json"}" (named by --deepspeed-config' in render(p, ())


MERGED = '"${HPC_TRAIN_JOB_FOLDER}/ds_config.json"'


@pytest.mark.parametrize(
    "args, flag, rewritten",
    [
        (["--deepspeed", "ds_config.json"], "--deepspeed", f"--deepspeed {MERGED}"),  # the guide's, as Hugging Face takes it
        (["--deepspeed=ds_config.json"], "--deepspeed", f"--deepspeed={MERGED}"),
        (["--deepspeed_config", "ds_config.json"], "--deepspeed_config", f"--deepspeed_config {MERGED}"),
        # DeepSpeed's own switch, then its config flag
        (["--deepspeed", "--deepspeed-config=ds_config.json"], "--deepspeed-config", f"--deepspeed --deepspeed-config={MERGED}"),
    ],
)
def test_config_named_among_the_script_arguments_is_merged_and_replaced(plugins, tmp_path, args, flag, rewritten):
    p = guide_plan(plugins, tmp_path, script_args=["--lr", "1e-4", *args])
    assert ds_config_of(p)["train_micro_batch_size_per_gpu"] == 2 and ds_config_of(p)["fp16"]["enabled"]
    text = render(p, ())
    assert f"train.py --lr 1e-4 {rewritten} &" in text  # the script reads the merged file, never its own
    assert f"(named by {flag} among the script's arguments), under the job's settings" in text


def test_bare_deepspeed_switch_names_no_file(plugins, tmp_path):
    p = guide_plan(plugins, tmp_path, script_args=["--deepspeed", "--lr", "1e-4"])
    assert "train_batch_size" not in ds_config_of(p) and ds_config_of(p)["train_micro_batch_size_per_gpu"] == 1
    assert "# ds_config: hpc_train's defaults and the job's settings (no file of yours named)" in render(p, ())
    assert p.launch[-3:] == ["--deepspeed", "--lr", "1e-4"]


def test_world_where_the_batch_cannot_hold_is_refused_naming_what_would(plugins, tmp_path):
    with pytest.raises(ConfigError) as info:
        guide_plan(plugins, tmp_path, nodes=3, script_args=["--deepspeed", "ds_config.json"])
    message = str(info.value)
    assert f"{tmp_path / 'ds_config.json'}: train_batch_size: 256 does not divide over 24 data-parallel processes" in message
    assert "on 1, 2, 4 or 8 node(s), with train_micro_batch_size_per_gpu 8, 4, 2 or 1" in message
    assert "multiple of 96, such as 192 or 288" in message
    # the job's own --grad-accum takes part: 256 / (8 x 32) = 1 on 4 nodes
    assert (
        ds_config_of(guide_plan(plugins, tmp_path, grad_accum=8, backend_options={"config": "ds_config.json"}))[
            "train_micro_batch_size_per_gpu"
        ]
        == 1
    )
    with pytest.raises(ConfigError, match=r"gradient_accumulation_steps 3 \(--grad-accum\)"):
        guide_plan(plugins, tmp_path, grad_accum=3, backend_options={"config": "ds_config.json"})


def test_all_three_numbers_must_agree(plugins, tmp_path):
    with pytest.raises(ConfigError) as info:
        guide_plan(plugins, tmp_path, backend_options={"config": "ds_config.json", "micro_batch": 4})
    assert (
        "train_batch_size: 256 is not train_micro_batch_size_per_gpu 4 (-o micro_batch) x gradient_accumulation_steps 4 "
        "(from the file) x 32 data-parallel processes (4 node(s) x 8) = 512"
    ) in str(info.value)
    assert "it holds on 2 node(s)" in str(info.value)
    assert (
        ds_config_of(guide_plan(plugins, tmp_path, nodes=2, backend_options={"config": "ds_config.json", "micro_batch": 4}))[
            "train_batch_size"
        ]
        == 256
    )


def test_data_parallel_size_divides_the_batch_under_a_layout(plugins, tmp_path):
    # pp=2 on 32 processes: 16 data-parallel replicas share the batch, 256 / (4 x 16) = 4
    p = guide_plan(plugins, tmp_path, parallel="pp=2", backend_options={"config": "ds_config.json"})
    assert ds_config_of(p)["train_micro_batch_size_per_gpu"] == 4
    with pytest.raises(ConfigError, match=r"12 data-parallel processes \(3 node\(s\) x 8 / 2 \(tp x pp\)\)"):
        guide_plan(plugins, tmp_path, nodes=3, parallel="pp=2", backend_options={"config": "ds_config.json"})


def test_hugging_face_auto_values_are_left_to_the_script(plugins, tmp_path):
    write(tmp_path / "hf.json", json.dumps({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}))
    config = ds_config_of(plan(plugins, "deepspeed", workdir=str(tmp_path), script_args=["--deepspeed", "hf.json"]))
    assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"]) == ("auto", "auto")
    write(tmp_path / "odd.json", json.dumps({"train_batch_size": 25.6}))
    with pytest.raises(ConfigError, match=r"odd.json: train_batch_size: 25.6: expected a whole number >= 1"):
        plan(plugins, "deepspeed", workdir=str(tmp_path), script_args=["--deepspeed", "odd.json"])


def test_bad_config_named_by_the_script_arguments_is_a_clear_error(plugins, tmp_path):
    write(tmp_path / "bad.json", '{\n  "train_batch_size": 256,\n  "fp16": {"enabled": true,}\n}\n')
    with pytest.raises(ConfigError) as info:
        plan(plugins, "deepspeed", workdir=str(tmp_path), script_args=["--deepspeed", "bad.json"])
    assert f"{tmp_path / 'bad.json'}:3: invalid JSON: Expecting property name enclosed in double quotes (column 28)" in str(
        info.value
    )
    with pytest.raises(ConfigError) as info:
        plan(plugins, "deepspeed", workdir=str(tmp_path), script_args=["--deepspeed_config=nope.json"])
    assert f"{tmp_path / 'nope.json'}: DeepSpeed config file not found (named by --deepspeed_config" in str(info.value)
    with pytest.raises(ConfigError, match="--deepspeed_config needs the path of a ds_config JSON file"):
        plan(plugins, "deepspeed", script_args=["--deepspeed_config"])
    write(tmp_path / "other.json", "{}")
    with pytest.raises(ConfigError, match="two ds_config files for one job"):
        plan(
            plugins,
            "deepspeed",
            workdir=str(tmp_path),
            script_args=["--deepspeed", "other.json"],
            backend_options={"config": str(tmp_path / "bad.json")},
        )


def test_cli_says_the_config_problem_without_a_traceback(tmp_path):
    import subprocess

    write(tmp_path / "ds_config.json", json.dumps(GUIDE_CONFIG))
    write(tmp_path / "train.py", "")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train",
            "render",
            "--site",
            "bluecloud",
            "--backend",
            "deepspeed",
            "--nodes",
            "3",
            "--time",
            "1:00:00",
            "train.py",
            "--",
            "--deepspeed",
            "ds_config.json",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 78 and "Traceback" not in out.stderr
    assert "train_batch_size: 256 does not divide over 24 data-parallel processes" in out.stderr
