"""What a plan exports and asks for, built from its facts: the variables every process of the job gets
(lowest precedence first), what the backend is told to launch (``LaunchInfo``), the ``#SBATCH`` options
and the CPUs per task."""

from __future__ import annotations

import json
import os
from typing import Any

from hpc_train import contract
from hpc_train.config import profile_spec
from hpc_train.config.fields import field_names, to_env
from hpc_train.config.slurm_time import format_slurm_time
from hpc_train.config.validate import dump
from hpc_train.plugin.backend import LaunchInfo, Word
from hpc_train.submission.job_plan import EnvVar
from hpc_train.submission.layout import ENV_VAR as LAYOUT_ENV
from hpc_train.submission.plan_facts import Facts, Names, expand, hang_timeout, straggler_threshold, watchdog


def health_env(f: Facts) -> dict[str, str]:
    """The watchdog's timeout (none: learned from the run), the straggler rule, node exclusion."""
    job, site, requeue = f.job, f.site, f.requeue
    env = {contract.ENV_STRAGGLER_THRESHOLD: f"{straggler_threshold(job, site):g}"}
    watched = watchdog(f)
    if watched:
        timeout = hang_timeout(job, site)
        if timeout is not None:
            env[contract.ENV_HANG_TIMEOUT] = f"{timeout:g}"
    node_check = requeue.enabled and (job.node_check if job.node_check is not None else site.health.node_check)
    if watched or node_check:  # both name suspects; without this the requeue could land on the same node
        env[contract.ENV_EXCLUDE_SUSPECTS] = "1" if site.health.exclude_suspect_nodes else "0"
    return env


def local_tier_env(f: Facts) -> dict[str, str]:
    """The site's node-local folder, unexpanded: each node expands its own ($SLURM_TMPDIR differs per node)."""
    job, site = f.job, f.site
    if site.checkpoint_local_dir is None or job.local_checkpoints is False:
        return {}
    return {contract.ENV_LOCAL_CHECKPOINT_DIR: site.checkpoint_local_dir}


def profile_env(f: Facts, names: Names) -> dict[str, str]:
    """Under --profile nsys the job's sitecustomize puts the chosen ranks' python under nsys
    (hpc_train.runtime.nsys_exec): it needs which nsys, and which script's python is a rank's."""
    job, site = f.job, f.site
    if job.profile is None or profile_spec.parse(job.profile).kind != "nsys" or not site.tools.nsys:
        return {}
    return {contract.ENV_NSYS: site.tools.nsys, contract.ENV_PROFILE_SCRIPT: names.script}


def launch_info(f: Facts, names: Names, extra_script_args: tuple[Word, ...], cpus: int | None) -> LaunchInfo:
    job, site, res, requeue, layout, tasks = f.job, f.site, f.res, f.requeue, f.layout, f.tasks
    return LaunchInfo(
        scheduler=site.scheduler,
        nodes=job.nodes,
        procs_per_node=res.procs,
        gpus_per_node=res.gpus,
        python=names.python,
        script=names.script,
        script_args=(*job.script_args, *extra_script_args),  # extra: a sweep task's overrides (Raw)
        master_port_base=site.master_port,
        job_root=names.job_root,
        cpus_per_proc=max(1, cpus * tasks // res.procs) if cpus else None,
        gpu_bind=res.part.gpu_bind if res.gpus > 0 else None,
        precision=job.precision,
        grad_accum=job.grad_accum,
        grad_clip=job.grad_clip,
        stop_signal=requeue.policy.signal if requeue.enabled else None,
        # what the job's processes will see that a backend may decide with: the folder the script runs in
        # (relative paths among its arguments) and the layout (data-parallel size = world / (tp x pp))
        env={"PWD": names.workdir, **({LAYOUT_ENV: str(layout)} if layout is not None else {})},
    )


def environment(f: Facts, selection: Any, options: Any, info: LaunchInfo, names: Names) -> dict[str, EnvVar]:
    """Every exported variable, lowest precedence first: site < partition < nccl profile < backend < plugins < job."""
    job, site, res, plugins, layout, requeue, backend = f.job, f.site, f.res, f.plugins, f.layout, f.requeue, f.backend
    env: dict[str, EnvVar] = {}

    def put(values: dict[str, Any], source: str) -> None:
        env.update({key: EnvVar(key, value, source) for key, value in values.items()})

    if watchdog(f):  # lowest: a site's or user's own recorder settings win
        put(FLIGHT_RECORDER_ENV, "hpc_train (hang reports)")
    put(site.env, "site")
    put(res.part.env, f"partition {res.part_name}")
    for var_name, var_value, var_source in selection.variables:
        put({var_name: var_value}, var_source)
    put({contract.storage_dir_env(key): expand(value, names.workdir) for key, value in site.storage.items()}, "site storage")
    put(backend.env(info), f"backend {backend.name}")
    put(plugins.job_env(job, site, backend.name), "plugins")
    if options is not None and field_names(type(backend).Options):
        put({contract.ENV_BACKEND_OPTIONS: json.dumps(dump(options), separators=(",", ":"))}, f"backend {backend.name}")
    put(to_env(job), "job")  # the job options the runtime reads in the job: each field's setting(env=...)
    if layout is not None:
        put({LAYOUT_ENV: str(layout)}, "job")  # the runtime builds its device mesh from this
    put(dict(job.env), "job")
    put(
        {
            contract.ENV_SITE: site.name,
            contract.ENV_BACKEND: backend.name,
            contract.ENV_NODES: str(job.nodes),
            contract.ENV_PROCS_PER_NODE: str(res.procs),
            contract.ENV_JOB_ROOT: names.job_root,
            **({contract.ENV_CODE: names.code_tree} if names.code_tree else {}),
            **({contract.ENV_STOP_SIGNAL: requeue.policy.signal} if requeue.enabled else {}),  # the ranks save and stop on it
            **health_env(f),
            **local_tier_env(f),
            **profile_env(f, names),
        },
        "hpc_train",
    )
    return env


def directives(f: Facts, cpus: int | None, names: Names) -> list[tuple[str, Any]]:
    """The #SBATCH options, sorted: ours, then the site's, the partition's, the plugins' and the job's own."""
    job, site, res, tasks, requeue, plugins = f.job, f.site, f.res, f.tasks, f.requeue, f.plugins
    if site.scheduler != "slurm":
        return []
    directives: dict[str, Any] = {
        "job-name": names.job_name,
        "nodes": job.nodes + job.spare_nodes,  # the spares wait in the allocation
        "ntasks-per-node": tasks,
        "output": os.path.join(names.job_root, "%j", "%j_0_log.out"),
        "error": os.path.join(names.job_root, "%j", "%j_0_log.err"),
        "open-mode": "append",
        "partition": res.part_name or None,
        "time": format_slurm_time(res.time_seconds) if res.time_seconds is not None else None,
    }
    if res.gpus > 0:
        directives["gres"] = f"gpu:{res.part.gpu_type}:{res.gpus}" if res.part.gpu_type else f"gpu:{res.gpus}"
    if requeue.enabled:
        # B: -> only the batch shell gets the warning; it tells the ranks through a file
        directives.update({"requeue": True, "signal": f"B:{requeue.policy.signal}@{requeue.grace}"})
    defaults_from_partition = {"constraint": res.part.constraint, "mem": res.part.mem_per_node, "cpus_per_task": cpus}
    for key in ("cpus_per_task", "mem", "account", "qos", "reservation", "constraint"):
        value = getattr(job, key)
        directives[key.replace("_", "-")] = value if value is not None else defaults_from_partition.get(key)
    directives.update(site.sbatch)
    directives.update(res.part.sbatch)
    directives.update(plugins.sbatch_directives(job, site, f.backend.name))
    directives.update(job.sbatch)
    if job.after:  # a dependency that can never be met cancels the job instead of leaving it pending
        directives.setdefault("dependency", f"{job.after_type}:" + ":".join(job.after))
        directives.setdefault("kill-on-invalid-dep", "yes")
    return sorted((k, v) for k, v in directives.items() if v is not None and v is not False)


def cpus_per_task(f: Facts) -> int | None:
    """The CPUs each Slurm task asks for: --cpus-per-task, else the task's share of the CPUs that come with
    the job's part of a node (all of it; on a GPU partition, the share of its GPUs the job uses).

    Slurm's default is one CPU per task: where tasks are bound (task/affinity, task/cgroup), a torchrun
    task that forks 8 workers would run them, and their data loaders, on one core."""
    job, res, tasks = f.job, f.res, f.tasks
    part = res.part
    if job.cpus_per_task is not None or not part.cpus_per_node:
        return job.cpus_per_task
    node = part.cpus_per_node * res.gpus // part.gpus_per_node if part.gpus_per_node and res.gpus else part.cpus_per_node
    return max(1, node // tasks)


# torch.distributed's flight recorder, read by the hang report (hpc_train.runtime.lifecycle.heartbeat.flight_record): the last
# 2,000 collectives per process group, under both names torch has used (TORCH_FR_ since 2.6)
FLIGHT_RECORDER_ENV = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
