"""Job options shared by ``render`` and ``submit``; they map one-to-one onto JobSpec fields."""

from __future__ import annotations

import argparse
from typing import Any

from hpc_train.errors import UsageError


def add_job_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("script", help="training script (its arguments go after --)")
    parser.add_argument("script_args", nargs="*", help=argparse.SUPPRESS)
    g = parser.add_argument_group("where and how")
    g.add_argument("--site", help="site name or path to a site YAML file (default: detected, else 'local')")
    g.add_argument("--backend", default="torchrun", help="distributed backend (default: torchrun)")
    g.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE", help="backend option (repeatable)")
    g.add_argument("--deepspeed-config", metavar="JSON", help="your ds_config (deepspeed backend); the job's settings are merged over it")
    g.add_argument("--nccl-profile", help="NCCL/fabric profile from the site file (PROFILE+OVERLAY stacks them)")
    g.add_argument("--nccl-debug", action="store_true", help="add the site's debug overlay (NCCL_DEBUG=INFO, flight recorder, ...)")
    g.add_argument("--env", "-e", action="append", default=[], metavar="NAME=VALUE", help="environment variable (repeatable)")
    g.add_argument("--python", help="python on the compute nodes (default: this interpreter)")
    g.add_argument("--container", action=argparse.BooleanOptionalAction, default=None,
                   help="run every task in the site's container image (--no-container: never)")
    g.add_argument("--container-image", help="run every task in this image (site's container runtime)")
    g.add_argument("--workdir", help="working directory of the job (default: here)")
    g.add_argument("--job-root", help="folder for job folders (default: the site's job_root)")
    t = parser.add_argument_group("training (read by hpc_train.runtime inside the job)")
    t.add_argument("--precision", choices=["fp32", "bf16", "fp16"], help="mixed precision (fp16 adds loss scaling)")
    t.add_argument("--grad-clip", type=float, metavar="NORM", help="clip the gradient norm")
    t.add_argument("--grad-accum", type=int, metavar="N", help="micro-batches per optimizer step")
    t.add_argument("--comm-hook", choices=["none", "fp16", "bf16", "powersgd"], help="DDP gradient compression")
    t.add_argument("--activation-checkpointing", action="store_true", default=None,
                   help="recompute activations in backward (less memory)")
    t.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=None,
                   help="record step time, throughput, loss, communication (default on; see `report`)")
    t.add_argument("--parallel", metavar="dp=N,tp=N,pp=N",
                   help="data/tensor/pipeline parallel layout; dp x tp x pp = nodes x processes per node")
    _add_checkpoint_options(parser.add_argument_group("preemption, time limits and checkpoints"))
    _add_resource_options(parser.add_argument_group("resources"))
    d = parser.add_argument_group("dependencies")
    d.add_argument("--after", action="append", default=[], metavar="JOB",
                   help="start after this job or sweep (repeatable; ids may be comma-separated)")
    d.add_argument("--after-type", choices=["afterok", "afterany", "afternotok", "after", "aftercorr"],
                   help="how the --after jobs must end (default afterok: succeeded; afterany: ended at all)")


def _add_checkpoint_options(c: argparse._ArgumentGroup) -> None:
    c.add_argument("--requeue", action=argparse.BooleanOptionalAction, default=None,
                   help="save and requeue before the time limit or on the warning signal (default: the site's)")
    c.add_argument("--max-restarts", type=int, metavar="N", help="requeues allowed before the job stops for good")
    c.add_argument("--signal-grace", type=int, metavar="SECONDS", help="warning this long before the time limit")
    c.add_argument("--on-failure", choices=["fail", "requeue"], help="a crashed run: fail, or requeue within the budget")
    c.add_argument("--hang-timeout", metavar="DURATION",
                   help="no step for this long is a hang: stacks dumped, the rank named, the run restarted "
                        "(300, 5m, off; default: learned from the run's step time)")
    c.add_argument("--spare-nodes", type=int, metavar="K",
                   help="allocate K more nodes; a run that fails for a node (a hang, a crash there) restarts on "
                        "the others inside the allocation, without a requeue or a queue wait")
    c.add_argument("--straggler-threshold", type=float, metavar="FRACTION",
                   help="name a rank slower than the median by more than this (default 0.2 = 20 %%; 0: off)")
    c.add_argument("--checkpoint-every", type=int, metavar="N", help="save every N steps")
    c.add_argument("--keep-checkpoints", type=int, metavar="K", help="complete checkpoints to keep (default 2)")
    c.add_argument("--async-checkpoint", action=argparse.BooleanOptionalAction, default=None,
                   help="write periodic checkpoints in the background")
    c.add_argument("--restart-from-scratch", action="store_true", default=None,
                   help="when the job's checkpoints exist but none loads (damaged), set them aside and train "
                        "from step 0 instead of failing (a checkpoint that loads is still resumed from)")
    c.add_argument("--exact-resume", action=argparse.BooleanOptionalAction, default=None,
                   help="fix DDP's gradient buckets so resumed runs are bit-identical (default on)")


def _add_resource_options(r: argparse._ArgumentGroup) -> None:
    r.add_argument("--nodes", "-N", type=int, default=1, help="nodes (default: 1)")
    r.add_argument("--procs-per-node", type=int, help="processes per node (default: GPUs per node, 1 on CPU)")
    r.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the partition's)")
    r.add_argument("--cpus-per-task", type=int)
    r.add_argument("--mem", help="memory per node, as sbatch takes it (500G)")
    r.add_argument("--partition", "-p")
    r.add_argument("--time", "-t", help="time limit: 12:00:00, 2-00:00:00, minutes")
    r.add_argument("--job-name", "-J")
    r.add_argument("--account", "-A")
    r.add_argument("--qos", "-q")
    r.add_argument("--reservation")
    r.add_argument("--constraint", "-C")
    r.add_argument("--sbatch", action="append", default=[], metavar="OPTION=VALUE",
                   help="any other sbatch option, e.g. --sbatch mail-type=END (repeatable)")


def add_sweep_options(parser: argparse.ArgumentParser) -> None:
    """``submit``'s sweep options: one job becomes a job array over these values (hpc_train.sweeps.arrays)."""
    s = parser.add_argument_group("sweeps (Slurm job arrays)")
    s.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2",
                   help="run once per value, as --NAME V and $HPC_TRAIN_SWEEP_NAME (repeatable: a grid)")
    s.add_argument("--max-concurrent", "--array-parallelism", type=int, metavar="N", dest="max_concurrent",
                   help="at most N sweep tasks run at once (the array's %%N)")


def _pairs(values: list[str], flag: str, typed: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE")
        if typed:
            import yaml

            try:
                out[key] = yaml.safe_load(value) if value else value
            except yaml.YAMLError:
                out[key] = value
        else:
            out[key] = value
    return out


def job_options(args: argparse.Namespace) -> dict[str, Any]:
    """JobSpec keyword arguments from parsed options (None means: not given, use defaults)."""
    sbatch: dict[str, Any] = {}
    for item in args.sbatch:
        key, sep, value = item.partition("=")
        sbatch[key.lstrip("-")] = value if sep else True
    options: dict[str, Any] = {
        "site": args.site,
        "backend": args.backend,
        "script": args.script,
        "script_args": list(args.script_args) + list(args.after_dashdash),
        "nodes": args.nodes,
        "procs_per_node": args.procs_per_node,
        "gpus_per_node": args.gpus_per_node,
        "cpus_per_task": args.cpus_per_task,
        "mem": args.mem,
        "partition": args.partition,
        "time": args.time,
        "job_name": args.job_name,
        "account": args.account,
        "qos": args.qos,
        "reservation": args.reservation,
        "constraint": args.constraint,
        "env": _pairs(args.env, "--env"),
        "nccl_profile": (args.nccl_profile or "") + "+debug" if args.nccl_debug else args.nccl_profile,
        "backend_options": {**_pairs(args.option, "--option", typed=True),
                            **({"config": args.deepspeed_config} if args.deepspeed_config else {})},
        "sbatch": sbatch,
        "job_root": args.job_root,
        "python": args.python,
        "container": args.container,
        "container_image": args.container_image,
        "workdir": args.workdir,
        "precision": args.precision,
        "grad_clip": args.grad_clip,
        "grad_accum": args.grad_accum,
        "comm_hook": args.comm_hook,
        "activation_checkpointing": args.activation_checkpointing,
        "parallel": args.parallel,
        "requeue": args.requeue,
        "max_restarts": args.max_restarts,
        "signal_grace": args.signal_grace,
        "on_failure": args.on_failure,
        "hang_timeout": args.hang_timeout,
        "straggler_threshold": args.straggler_threshold,
        "spare_nodes": args.spare_nodes,
        "checkpoint_every": args.checkpoint_every,
        "keep_checkpoints": args.keep_checkpoints,
        "async_checkpoint": args.async_checkpoint,
        "restart_from_scratch": args.restart_from_scratch,
        "exact_resume": args.exact_resume,
        "metrics": args.metrics,
        "after": list(args.after) or None,
        "after_type": args.after_type,
    }
    return {k: v for k, v in options.items() if v is not None}
