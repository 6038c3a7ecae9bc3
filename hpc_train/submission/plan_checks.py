"""The rules a job is checked against before anything is queued, as a list of small checks with one
signature (``CHECKS``): each reads the plan's facts and adds what is wrong to ``f.problems``, so a
user sees every problem at once. A new rule is a function here and a line in ``CHECKS``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hpc_train import contract, resume_shape
from hpc_train.config import profile_spec
from hpc_train.config.fields import flag_of
from hpc_train.config.job import JobSpec
from hpc_train.config.models import SiteConfig, mem_megabytes, mem_size_problem
from hpc_train.errors import Problem
from hpc_train.submission.plan_facts import JOB, USER_VAR, Facts, login_user, watchdog


def check_fit(f: Facts) -> None:
    """What the job asks of one node against what the partition's nodes have (where the site says it):
    sbatch would queue such a job forever or refuse it, and a process beyond the GPUs shares one."""
    job, res, tasks, problems = f.job, f.res, f.tasks, f.problems
    part, name = res.part, res.part_name
    gpus = min(res.gpus, part.gpus_per_node)
    if job.procs_per_node is not None and gpus > 0 and job.procs_per_node > gpus:  # a process per GPU
        has = (
            f"the job has {gpus} GPUs per node (--gpus-per-node)"
            if job.gpus_per_node is not None and gpus < part.gpus_per_node
            else f"partition {name!r} has {gpus} GPUs per node"
        )
        problems.add(
            "--procs-per-node",
            f"{job.procs_per_node} processes per node, but {has}; a job runs one process per GPU",
            f"use --procs-per-node {gpus}, or leave it out: one per GPU is the default",
        )
    mem_problem = mem_size_problem(job.mem) if job.mem is not None else None  # a JobSpec made without make_job
    if mem_problem:
        problems.add("--mem", mem_problem)
    elif job.mem is not None and part.mem_per_node and mem_megabytes(job.mem) > mem_megabytes(part.mem_per_node):
        problems.add(
            "--mem",
            f"{job.mem} per node, but partition {name!r} has {part.mem_per_node} per node",
            f"use --mem {part.mem_per_node} or less, or leave it out for the partition's",
        )
    if job.cpus_per_task and part.cpus_per_node and job.cpus_per_task * tasks > part.cpus_per_node:
        fits = part.cpus_per_node // tasks
        problems.add(
            "--cpus-per-task",
            f"{job.cpus_per_task} CPUs x {tasks} task(s) per node = "
            f"{job.cpus_per_task * tasks}, but partition {name!r} has {part.cpus_per_node} CPUs per node",
            f"use --cpus-per-task {fits} or fewer" if fits else "fewer processes per node",
        )


def check_sbatch_names(f: Facts) -> None:
    """``--sbatch NAME=...`` names an option sbatch has: it would refuse the script only at submission."""
    job, problems = f.job, f.problems
    if not job.sbatch:
        return
    from hpc_train.config.sbatch_options import unknown_option  # a job without --sbatch loads no list

    for key, value in job.sbatch.items():
        hint = unknown_option(key)
        if hint is not None:
            typed = key if value is True else f"{key}={value}"
            problems.add(f"--sbatch {typed}", f"sbatch has no option --{key}", hint)


def check_container(f: Facts) -> None:
    """A container needs a runtime on the site and an image from the job or the site."""
    job, site, problems = f.job, f.site, f.problems
    if (job.container or job.container_image) and site.container.runtime == "none":
        problems.add("container", f"site {site.name!r} has no container runtime (container.runtime in the site file)")
    elif job.container and not (job.container_image or site.container.image):
        problems.add("container", f"site {site.name!r} names no container image; give one with --container-image")


def check_user(f: Facts) -> None:
    """A path with $USER needs a user name now: left as text it would name another folder in the job."""
    job, resolved, problems = f.job, f.resolved, f.problems
    site = resolved.config
    paths = {f"storage.{key}": value for key, value in site.storage.items()}
    if not job.job_root:
        paths["job_root"] = site.job_root
    used = {key: value for key, value in paths.items() if USER_VAR.search(value)}
    if job.job_root and USER_VAR.search(job.job_root):
        used["--job-root"] = job.job_root
    if not used or login_user() is not None:
        return
    for key, value in used.items():
        source, line = (JOB, None) if key == "--job-root" else resolved.provenance.get(key, (problems.site_file, None))
        problems.append(
            Problem(
                source,
                key,
                f"{value!r} uses $USER, but USER is not set and no user name is known for this account",
                line,
                "export USER=$(id -un), or write the path without $USER",
            )
        )


def check_spares(f: Facts) -> None:
    """Spares restart a failed run inside the allocation: a script job, requeue on, and room in the partition."""
    job, res, requeue, kind, problems = f.job, f.res, f.requeue, f.kind, f.problems
    if not job.spare_nodes:
        return
    if not requeue.enabled or kind != "script":
        problems.add(
            "spare_nodes",
            "spare nodes restart a failed run inside the allocation: that needs a script job on a Slurm site with requeue on",
            "drop --spare-nodes, or add --requeue",
        )
    if job.on_failure == "fail":
        problems.add(
            "spare_nodes",
            "needs --on-failure requeue (given: --on-failure fail): a run that crashes on a node would end the job "
            "FAILED with the spares unused",
            "leave --on-failure out, and a crashed run restarts on a spare; or drop --spare-nodes",
        )
    total = job.nodes + job.spare_nodes
    if res.part.max_nodes is not None and total > res.part.max_nodes:
        problems.add(
            "spare_nodes",
            f"{job.nodes} nodes + {job.spare_nodes} spare = {total}: partition "
            f"{res.part_name!r} allows at most {res.part.max_nodes}",
            f"use --spare-nodes {max(res.part.max_nodes - job.nodes, 0)} or fewer",
        )


def check_requeue_options(f: Facts) -> None:
    """The options the requeue acts on, refused where it is off: the batch script has no retry (nor the
    warning signal) then, and they would do nothing."""
    job, site, requeue, problems = f.job, f.site, f.requeue, f.problems
    if requeue.enabled:
        return
    given = {
        "on_failure": job.on_failure == "requeue",
        "max_restarts": bool(job.max_restarts),  # 0 restarts is what no requeue does
        "signal_grace": job.signal_grace is not None,
    }
    why, hint = no_requeue_here(job, site)
    for key in (k for k, on in given.items() if on):
        problems.add(key, f"acts through the requeue: {why}", f"{hint}, or leave {flag_of(JobSpec, key)} out")


def check_slurm_only(f: Facts) -> None:
    """Slurm's own options, refused on the local site rather than dropped: nothing there takes them."""
    job, site, problems = f.job, f.site, f.problems
    if job.after_type != "afterok" and not job.after:  # afterok is the default: not told apart from not given
        problems.add("after_type", f"{job.after_type} says how the --after jobs must end, and none is given", "add --after JOB")
    if site.scheduler == "slurm":
        return
    for key in (k for k in SLURM_ONLY if getattr(job, k)):
        problems.add(
            key,
            f"an sbatch option, and site {site.name!r} runs the job on this machine, without sbatch",
            f"submit to a Slurm site, or leave {flag_of(JobSpec, key)} out",
        )


def check_hang_timeout(f: Facts) -> None:
    """A --hang-timeout given where no watchdog would run is refused, not ignored: a hung rank would sit
    until the time limit (seen on --site local: 150 s, until killed from outside)."""
    job, site, requeue, kind, problems = f.job, f.site, f.requeue, f.kind, f.problems
    if not job.hang_timeout or (kind == "script" and watchdog(f)):
        return
    if site.scheduler != "slurm":
        why = f"site {site.name!r} runs the job on this machine, where nothing restarts a hung run"
        hint = "submit to a Slurm site (--site sandbox after `make cluster-up`, or your cluster's), or leave --hang-timeout out"
    elif kind != "script":
        why, hint = "a function job has no ranks of its own to watch", "submit a script, or leave --hang-timeout out"
    elif not requeue.enabled:
        why, hint = "with requeue off, a hung run could not be restarted", "drop --no-requeue"
    else:
        why, hint = (
            "it runs on the batch node, outside the job's container",
            "run without the container, or leave --hang-timeout out",
        )
    problems.add("hang_timeout", f"the hang watchdog does not run here: {why}", hint)


def check_local_tier(f: Facts) -> None:
    """--local-checkpoints needs the site's node-local folder (checkpoint_local_dir)."""
    job, site, problems = f.job, f.site, f.problems
    if job.local_checkpoints and site.checkpoint_local_dir is None:
        problems.add(
            "local_checkpoints",
            f"site {site.name!r} names no node-local storage for checkpoints",
            "drop --local-checkpoints, or set checkpoint_local_dir in the site file",
        )


def check_profile(f: Facts) -> None:
    """--profile's ranks against the job's world, and nsys against what the site says it has."""
    job, site, res, kind, problems = f.job, f.site, f.res, f.kind, f.problems
    if job.profile is None:
        return
    found = profile_spec.problems(
        profile_spec.parse(job.profile),
        world_size=job.nodes * res.procs,
        where=f"{job.nodes} node(s) x {res.procs} per node",
        nsys=site.tools.nsys,
        site=site.name,
        script_job=kind == "script",
    )
    for message, hint in found:
        problems.add("--profile", message, hint)


def check_resume(f: Facts) -> None:
    """--resume-from: the newest checkpoint's recorded shape against this job's, so a refusal comes before the queue."""
    job, res, layout, problems = f.job, f.res, f.layout, f.problems
    if job.resume_from is None or (job.parallel is not None and layout is None):  # a bad layout is reported already
        return
    found = contract.committed(Path(job.resume_from))
    saved = resume_shape.read_shape(found[0][1]) if found else None
    if saved is None:  # no shape recorded (an older checkpoint): the job checks what it can
        return
    world = job.nodes * res.procs
    problem = resume_shape.refusal(
        saved,
        world=world,
        dp=layout.dp if layout is not None else world,
        pp=layout.pp if layout is not None else 1,
        layout=layout is not None,
        backend=job.backend,
    )
    if problem:
        problems.add(
            "resume_from",
            f"{found[0][1]} (saved by {resume_shape.describe(saved)}) cannot continue in this job "
            f"({world} processes: {job.nodes} node(s) x {res.procs}): {problem}",
        )


def check_micro_batch(f: Facts) -> None:
    """--micro-batch needs a runtime that can change the accumulation as it runs (the backend says)."""
    job, plugins, problems, backend_cls = f.job, f.plugins, f.problems, type(f.backend)
    if job.micro_batch is None:
        return
    if backend_cls.fixed_micro_batch:
        able = " or ".join(sorted(n for n, c in plugins.backends.items() if not c.fixed_micro_batch))
        problems.add(
            "micro_batch",
            f"backend {job.backend!r} cannot change the micro-batch as it runs: {backend_cls.fixed_micro_batch}",
            f"use --micro-batch with --backend {able}" if able else None,
        )
    if (job.grad_accum or 1) > 1:
        problems.add(
            "micro_batch",
            "--micro-batch sets the accumulation itself: the loader's batch is one optimizer step",
            "drop --grad-accum and give ctx.loader the whole batch per rank",
        )
    if job.parallel:
        problems.add("micro_batch", "--micro-batch does not apply under --parallel (a pipeline has its own micro-batches)")


def check_divergence(f: Facts) -> None:
    """--on-divergence acts after --max-bad-steps bad steps in a row; with 0 it never would."""
    job, problems = f.job, f.problems
    if job.max_bad_steps == 0 and job.on_divergence is not None:
        problems.add(
            "on_divergence",
            f"{job.on_divergence!r} never acts with --max-bad-steps 0 (0: bad steps are skipped, the run never "
            "stops or rolls back)",
            f"give --max-bad-steps N (N >= 1: {job.on_divergence} after N bad steps in a row, like 5), "
            "or drop --on-divergence to skip bad steps for ever",
        )


def no_requeue_here(job: JobSpec, site: SiteConfig) -> tuple[str, str]:
    """Why this job does not requeue, and what would change that."""
    if site.scheduler != "slurm":
        return f"site {site.name!r} runs the job on this machine; only Slurm sites requeue", "submit to a Slurm site"
    if job.requeue is False:
        return "requeue is off (--no-requeue)", "drop --no-requeue"
    return f"site {site.name!r} has requeue off (requeue.enabled)", "add --requeue"


# sbatch options with no counterpart on a site that runs the job on this machine
SLURM_ONLY = ("account", "qos", "reservation", "constraint", "mem", "sbatch", "after")


def check_comm_hook(f: Facts) -> None:
    """--comm-hook needs DDP's communication hooks (the backend says whether it has them)."""
    job, plugins = f.job, f.plugins
    if job.comm_hook not in (None, "none") and not type(f.backend).supports_comm_hook:
        able = " or ".join(sorted(n for n, c in plugins.backends.items() if c.supports_comm_hook))
        f.problems.add(
            "comm_hook",
            f"backend {job.backend!r} has no DDP communication hooks",
            f"use it with --backend {able}" if able else None,
        )


# every rule a job is checked against, in the order its problems are listed; each adds what it finds to f.problems
CHECKS: tuple[Callable[[Facts], None], ...] = (
    check_comm_hook,
    check_micro_batch,
    check_divergence,
    check_fit,
    check_sbatch_names,
    check_container,
    check_user,
    check_spares,
    check_requeue_options,
    check_slurm_only,
    check_hang_timeout,
    check_resume,
    check_local_tier,
    check_profile,
)
