"""``gc``: remove the code snapshots no queued job needs, and the stored files no snapshot holds."""

from __future__ import annotations

import argparse
import os


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "gc",
        help="remove code snapshots no queued job needs",
        description="Remove the snapshots of the site's job root that no pending, running or requeued job of "
        "this machine runs, once they are older than --min-age, then the files no snapshot holds.",
    )
    parser.add_argument("--site", help="the site whose job root holds the snapshots (default: as submit chooses)")
    parser.add_argument("--job-root", help="that job root itself (default: the site's job_root)")
    parser.add_argument(
        "--min-age", type=float, default=3600.0, metavar="SECONDS", help="leave younger snapshots (default: 3600)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    from hpc_train.errors import UsageError
    from hpc_train.snapshot.collect import collect
    from hpc_train.snapshot.limits import size_text
    from hpc_train.snapshot.needed import needed_trees
    from hpc_train.snapshot.take import store_of

    if args.min_age < 0:
        raise UsageError(f"--min-age must be 0 or more seconds, got {args.min_age:g}")
    job_root = args.job_root or _site_job_root(args.site)
    store = store_of(os.path.abspath(os.path.expanduser(job_root)))
    if not store.root.is_dir():
        print(f"no snapshots in {store.root}")
        return 0
    done = collect(store, needed_trees(), min_age_s=args.min_age)
    print(f"removed {done.trees} snapshot(s) and {done.objects} file(s), {size_text(done.freed_bytes)}, from {store.root}")
    return 0


def _site_job_root(site: str | None) -> str:
    from hpc_train.config.job import JobSpec
    from hpc_train.plugin.manager import default_plugins
    from hpc_train.submission.plan_facts import expand
    from hpc_train.submission.prepare import site_for

    resolved = site_for(JobSpec(site=site), default_plugins())
    return expand(resolved.config.job_root, os.getcwd())
