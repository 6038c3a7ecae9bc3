"""The whole check of one node (``diagnose``), and ``doctor --submit``'s task that runs it on a compute node
and writes its report into the job folder.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpc_train import contract
from hpc_train.fabric.doctor.commands import Runner, run_command
from hpc_train.fabric.doctor.facts import NodeFacts, check_site_config, context_for
from hpc_train.fabric.doctor.gpus import check_gpus
from hpc_train.fabric.doctor.network import check_infiniband, check_interfaces
from hpc_train.fabric.doctor.nvidia_smi import parse_smi_header
from hpc_train.fabric.doctor.report import FAIL, WARN, Report
from hpc_train.fabric.doctor.tools import check_nsys, check_slurm
from hpc_train.fabric.doctor.versions import check_packages, check_versions


def diagnose(
    ctx: NodeFacts,
    run: Runner = run_command,
    sys_root: Path = Path("/sys"),
    backends: Mapping[str, Any] | None = None,
    host: str | None = None,
) -> Report:
    checks = check_gpus(ctx, run)
    code, header = run(["nvidia-smi"])
    have_gpu = code == 0
    driver_cuda = parse_smi_header(header)[1] if have_gpu else None
    checks.append(check_versions(driver_cuda, have_gpu, list(ctx.site.modules) if ctx.site else [], in_job=ctx.in_job))
    checks.append(check_infiniband(ctx, sys_root))
    checks.extend(check_interfaces(ctx, sys_root))
    checks.append(check_slurm(ctx, run))
    checks.append(check_nsys(ctx, run))
    if backends is not None:
        packages = check_packages(backends)
        if packages.status == FAIL and not ctx.in_job:  # no backend runs on a login node: only its jobs need them
            packages.status = WARN
        checks.append(packages)
    checks.append(check_site_config(ctx))
    job = os.environ.get("SLURM_JOB_ID")
    context = f"compute node (job {job})" if ctx.in_job and job else "login node" if not ctx.in_job else "compute node"
    return Report(host or socket.gethostname(), context, checks)


def node_report(site: str | None, partition: str | None, profile: str | None) -> dict[str, Any]:
    """Run on a compute node by ``doctor --submit``: each node writes its report into the job folder."""
    from hpc_train.plugin.manager import default_plugins
    from hpc_train.submission.prepare import resolve_site

    plugins = default_plugins()
    resolved = resolve_site(site, plugins) if site else None
    ctx = context_for(resolved, partition, profile, os.environ)
    report = diagnose(ctx, backends=plugins.backends).to_dict()
    folder = os.environ.get(contract.ENV_JOB_FOLDER)
    if folder:
        out = Path(folder) / "doctor"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{report['host']}.json").write_text(json.dumps(report, indent=1))
    return report
