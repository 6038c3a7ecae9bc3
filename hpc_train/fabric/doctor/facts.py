"""What the checks know about the site and this node (``NodeFacts``): the fabric variables a job on the
partition would get, whether this is a job's node, how many GPUs it should have; and the site file's own check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpc_train.fabric.doctor.report import OK, WARN, Check


@dataclass
class NodeFacts:
    """What the checks need to know about the site and this node."""

    site: Any = None  # SiteConfig, or None without a site
    partition: str | None = None
    profile: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # the job's fabric variables: site < partition < profile
    in_job: bool = False
    expected_gpus: int = 0
    site_warnings: list[str] = field(default_factory=list)


def is_off(value: str | None) -> bool:
    return value is None or value.strip().lower() in ("", "0", "false", "no")


def check_site_config(ctx: NodeFacts) -> Check:
    if ctx.site is None:
        return Check("site config", OK, "no site given")
    n = len(ctx.site.nccl_profiles)
    summary = f"site {ctx.site.name}: {n} NCCL profile(s); job profile {ctx.profile or 'none'}"
    if ctx.site_warnings:
        return Check(
            "site config", WARN, summary, "see the details; `render` shows each warning with file:line", ctx.site_warnings
        )
    return Check("site config", OK, summary + "; every variable name checked")


def context_for(resolved: Any, partition: str | None, profile: str | None, environ: Mapping[str, str]) -> NodeFacts:
    """The fabric variables a job on ``partition`` would get (site < partition < profile), as submission.plan_env sets them."""
    from hpc_train.fabric import nccl

    in_job = "SLURM_JOB_ID" in environ and "SLURM_NODELIST" in environ
    if resolved is None:
        return NodeFacts(in_job=in_job)
    site = resolved.config
    name = partition or (environ.get("SLURM_JOB_PARTITION") if in_job else None)
    part_name, part = site.partition(name)
    env = dict(site.env)
    if part is not None:
        env.update(part.env)
    selection = nccl.select(site.nccl_profiles, profile, part.nccl_profile if part else None, site.name)
    env.update({n: v for n, v, _ in selection.variables})
    warnings = [
        f"{f.key}: {f.message}"
        for f in nccl.site_findings(
            {"env": site.env, **{f"partitions.{p}.env": pt.env for p, pt in site.partitions.items()}}, site.nccl_profiles
        )
    ]
    warnings += [f"nccl_profile: {m}" for m, _ in selection.problems]
    return NodeFacts(
        site=site,
        partition=part_name,
        profile=selection.label,
        env=env,
        in_job=in_job,
        expected_gpus=part.gpus_per_node if part else 0,
        site_warnings=warnings,
    )
