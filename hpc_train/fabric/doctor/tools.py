"""The cluster's tools: Slurm's commands and controller (sinfo), and nsys where the site says it has one."""

from __future__ import annotations

import functools
import re
from typing import Any

from hpc_train.fabric.doctor.commands import Runner, run_command
from hpc_train.fabric.doctor.facts import NodeFacts
from hpc_train.fabric.doctor.report import FAIL, OK, WARN, Check
from hpc_train.submission import slurm_cmd


def check_slurm(ctx: NodeFacts, run: Runner) -> Check:
    site = ctx.site
    if site is None or site.scheduler == "local":
        return Check("slurm", OK, "local site: no Slurm needed")
    if site.slurm_conf and run is run_command:  # the site names its controller's config, for these calls only
        run = functools.partial(run_command, env=slurm_cmd.slurm_env(site.slurm_conf))
    code, version = run(["sinfo", "--version"])
    if code is None:
        return Check("slurm", FAIL, "sinfo not found", "load the Slurm module or run this on the cluster's login node")
    code, text = run(["sinfo", "-h", "-o", "%R|%a|%D|%T"])
    if code != 0:
        return Check(
            "slurm",
            FAIL,
            "the controller does not answer: " + (text.strip().splitlines() or ["no output"])[-1],
            "check SLURM_CONF / the site's slurm_conf, or ask the admins whether slurmctld is up",
        )
    seen: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4:
            entry = seen.setdefault(parts[0], {"avail": parts[1], "states": {}})
            entry["states"][parts[3]] = entry["states"].get(parts[3], 0) + int(parts[2] or 0)
    wanted = list(site.partitions) or list(seen)
    problems: list[str] = []
    details: list[str] = []
    fails = False
    for name in wanted:
        found = seen.get(name)
        if found is None:
            problems.append(f"partition {name} does not exist")
            fails = True
            continue
        states = ", ".join(f"{n} {s}" for s, n in sorted(found["states"].items()))
        details.append(f"{name}: {found['avail']}, {states}")
        usable = sum(
            n
            for s, n in found["states"].items()
            if s.rstrip("*~#!%$@^-+").split("+")[0] in ("idle", "mixed", "allocated", "completing")
        )
        if found["avail"] != "up":
            problems.append(f"partition {name} is {found['avail']}")
            fails = True
        elif not usable:
            problems.append(f"partition {name} has no usable node ({states})")
    summary = f"{version.strip() or 'slurm'}; {len(wanted)} partition(s) checked"
    if problems:
        return Check(
            "slurm",
            FAIL if fails else WARN,
            summary + "; " + "; ".join(problems),
            "fix the site file's partitions, or ask the admins (`sinfo -R` says why nodes are down)",
            details,
        )
    return Check("slurm", OK, summary, None, details)


def check_nsys(ctx: NodeFacts, run: Runner) -> Check:
    """Nsight Systems for ``--profile nsys``: the site's ``tools.nsys`` (default: nsys on PATH)."""
    tools = getattr(ctx.site, "tools", None)
    nsys = tools.nsys if tools is not None else "nsys"
    if not nsys:
        return Check("nsys", OK, f"site {ctx.site.name} has none (tools.nsys: null): --profile nsys is refused at submit")
    code, out = run([nsys, "--version"])
    if code == 0:
        version = re.search(r"version\s+([0-9][0-9.]*[0-9])", out)
        said = version.group(1) if version else "(version not said)"
        return Check("nsys", OK, f"Nsight Systems {said} ({nsys}): --profile nsys works here")
    if code is None:
        summary = f"{nsys!r} not found: --profile nsys would fail on this node"
    else:
        summary = f"`{nsys} --version` failed (exit {code}): " + (out.strip().splitlines() or ["no output"])[0]
    if not ctx.in_job:  # the login node need not have it; the compute nodes do
        return Check("nsys", OK, summary.replace("this node", "this machine") + "; `doctor --submit` checks the compute nodes")
    if run(["nvidia-smi", "-L"])[0] is None:  # a CPU node: nsys would have no GPU to trace
        return Check("nsys", OK, summary.replace("would fail", "has nothing to trace") + " (no NVIDIA driver here)")
    return Check(
        "nsys",
        WARN,
        summary,
        "install Nsight Systems (or load its module in the site's `modules`), set tools.nsys in the site file to its path, "
        "or tools.nsys: null so that --profile nsys is refused at submit",
    )
