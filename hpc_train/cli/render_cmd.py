"""``render``: print the exact sbatch script; submit nothing."""

from __future__ import annotations

import argparse
import sys

from hpc_train.cli.options import add_job_options, job_options


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "render",
        help="print the sbatch script a submit would send",
        description="Print the exact sbatch script; nothing is submitted.",
    )
    add_job_options(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from hpc_train.api import check_script, make_job
    from hpc_train.cli.validate_cmd import checked_plan, render_checked
    from hpc_train.plugin.manager import default_plugins
    from hpc_train.submission.prepare import code_for, site_for

    plugins = default_plugins()
    job = make_job(**job_options(args))
    resolved = site_for(job, plugins)  # without --site: which one and why, on stderr
    check_script(job)
    # the snapshot is stored: the script printed names it, and `render > job.sh; sbatch job.sh` runs it
    plan = checked_plan(job, resolved, plugins, code=code_for(submitting=False))  # as `validate` checks
    sys.stdout.write(render_checked(plan, plugins))
    # stderr, so `render > job.sh` stays the exact script; the sources are on each export line
    if plan.nccl_profile:
        asked = (plan.job.nccl_profile or "").split("+")[0]
        origin = "asked for by the job" if asked else f"partition {plan.partition}'s default"
        print(f"nccl profile: {plan.nccl_profile} ({origin})", file=sys.stderr)
    for warning in plan.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0
