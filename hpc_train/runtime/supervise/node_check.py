"""The node check at start-up: every node of the allocation checks itself before training runs on it.

``python -m hpc_train.runtime.supervise.node_check`` runs in the batch shell before a run. It starts one srun
task per node (``... node_check run``), each running the `doctor` checks that can fail a node -- its
GPUs, its InfiniBand ports, the interfaces the job's NCCL/Gloo variables name -- and whether the job
folder answers from there (a read-only or stale shared mount on one node kills or hangs its ranks at the
first checkpoint). Each task prints its report on stdout, which srun brings back to the batch node:
a node whose shared file system is the problem could not write a report file. Nothing is compared
across nodes, so the check costs about the same on 2 nodes as on 200.

The batch shell's side then writes every report to ``node_checks.jsonl`` and names each node that
failed, or sent no report in time, a suspect of this run (hpc_train.runtime.supervise.suspects): spare nodes
replace it or the requeue avoids it. Exit 1 when any node failed.

Torch-free: it reads commands and /sys (hpc_train.fabric.doctor), so a broken CUDA install fails the
check instead of crashing it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from hpc_train import contract
from hpc_train.fabric.doctor import (
    FAIL,
    OK,
    Check,
    NodeFacts,
    Report,
    check_gpus,
    check_infiniband,
    check_interfaces,
    run_command,
)
from hpc_train.runtime.log import log
from hpc_train.runtime.supervise.suspects import NODE_CHECK_REASON, record_suspect

FOLDER_TIMEOUT_S = 10.0  # a healthy shared file system answers in milliseconds; a stale NFS mount never
TIMEOUT_S = 120.0  # the whole check: srun's start on every node, then each node's few seconds
MARKER = "hpc_train-node-check "  # starts the one stdout line that carries a node's report


def check_job_folder(job_folder: Path, host: str, timeout: float = FOLDER_TIMEOUT_S) -> Check:
    """Write, sync and read back a small file in the job folder, within ``timeout``."""
    probe = job_folder / f".node-check-{host}-{os.getpid()}"
    outcome: list[str] = []

    def attempt() -> None:
        try:
            with open(probe, "wb") as out:
                out.write(host.encode())
                out.flush()
                os.fsync(out.fileno())
            outcome.append("ok" if probe.read_bytes() == host.encode() else "read back something else")
            probe.unlink()
        except OSError as exc:
            outcome.append(exc.strerror or str(exc))

    worker = threading.Thread(target=attempt, daemon=True)  # a hung mount blocks in the kernel: never joined
    worker.start()
    worker.join(timeout)
    if not outcome:
        return Check(
            "job folder",
            FAIL,
            f"{job_folder} did not answer within {timeout:g} s",
            "the shared file system hangs on this node (a stale mount?): drain it and tell the admins",
        )
    if outcome[0] != "ok":
        return Check(
            "job folder",
            FAIL,
            f"cannot write {job_folder} from here: {outcome[0]}",
            "the shared file system is read-only, full or not mounted on this node",
        )
    return Check("job folder", OK, f"{job_folder} writable")


def context(environ: Mapping[str, str]) -> NodeFacts:
    """What the job asks of this node: the GPUs Slurm gave it and the fabric its variables name."""
    gpus = environ.get("SLURM_GPUS_ON_NODE") or "0"
    return NodeFacts(
        partition=environ.get("SLURM_JOB_PARTITION"),
        env=dict(environ),
        in_job=True,
        expected_gpus=int(gpus) if gpus.isdigit() else 0,
    )


def check_node(job_folder: Path, environ: Mapping[str, str], sys_root: Path = Path("/sys"), host: str | None = None) -> Report:
    host = host or socket.gethostname()
    ctx = context(environ)
    checks = [
        *check_gpus(ctx, run_command),
        check_infiniband(ctx, sys_root),
        *check_interfaces(ctx, sys_root),
        check_job_folder(job_folder, host),
    ]
    return Report(host, f"compute node (job {environ.get('SLURM_JOB_ID', '?')})", checks)


def run_check(job_folder: Path, environ: Mapping[str, str]) -> int:
    """One node's side: the checks, each failure said on stderr, the report on stdout (one line)."""
    report = check_node(job_folder, environ)
    for check in report.checks:
        if check.status == FAIL:
            log(f"node check on {report.host}: {check.name}: {check.summary}")
    print(MARKER + json.dumps(report.to_dict(), separators=(",", ":")), flush=True)
    return 0 if report.status != FAIL else 1


def srun_checks(environ: Mapping[str, str], timeout: float = TIMEOUT_S) -> list[Report]:
    """Every node's report, from one srun task per node of the allocation."""
    nodes = environ.get("SLURM_JOB_NUM_NODES") or "1"
    argv = [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        "--quiet",
        sys.executable,
        "-m",
        "hpc_train.runtime.supervise.node_check",
        "run",
    ]
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    except OSError as exc:
        log(f"node check: cannot start srun: {exc}")
        return []
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # srun ends its step on TERM; what came back so far still counts
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    return parse_reports(out or "")


def parse_reports(text: str) -> list[Report]:
    reports = []
    for line in text.splitlines():
        if not line.startswith(MARKER):
            continue
        try:
            reports.append(Report.from_dict(json.loads(line[len(MARKER) :])))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short: that node counts as not reporting
    return reports


def allocated_nodes(environ: Mapping[str, str]) -> list[str]:
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", environ.get("SLURM_JOB_NODELIST", "")], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return out.stdout.split()


def failures(reports: list[Report], nodes: list[str]) -> dict[str, str]:
    """Why each node failed its check (a node without a report failed it too)."""
    by_host = {report.host: report for report in reports}
    failed = {}
    for node in nodes:
        report = by_host.get(node)
        if report is None:
            failed[node] = "no report: the check did not start there or did not finish in time"
            continue
        bad = [c for c in report.checks if c.status == FAIL]
        if bad:
            failed[node] = "; ".join(f"{c.name}: {c.summary}" for c in bad)
    return failed


def judge(job_folder: Path, run: int, reports: list[Report], nodes: list[str], environ: Mapping[str, str]) -> int:
    """Record the reports, name the failed nodes suspects of ``run``; 1 when any failed."""
    if not nodes:
        log("node check: cannot list the allocation's nodes (scontrol show hostnames): not judged")
        return 0
    try:
        with open(job_folder / contract.NODE_CHECKS, "a") as out:
            for report in reports:
                out.write(json.dumps({"run": run, **report.to_dict()}) + "\n")
    except OSError as exc:  # the verdict below does not depend on the record
        log(f"node check: could not record the reports: {exc}")
    failed = failures(reports, nodes)
    for node, why in failed.items():
        log(f"node check: {node} failed: {why}")
        record_suspect(job_folder, node, run, NODE_CHECK_REASON + why, environ)
    log(
        f"node check: {len(nodes) - len(failed)} of {len(nodes)} nodes passed"
        + (f"; run {run} avoids {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc_train.runtime.supervise.node_check")
    parser.add_argument("what", nargs="?", choices=["run"], help="run: this node's check (one srun task per node)")
    args = parser.parse_args(argv)
    folder = os.environ.get(contract.ENV_JOB_FOLDER)
    if not folder:
        log(f"node check: {contract.ENV_JOB_FOLDER} is not set: not inside an hpc_train batch script")
        return 0
    if args.what == "run":
        return run_check(Path(folder), os.environ)
    run = int(os.environ.get(contract.ENV_RUN) or 1)
    return judge(Path(folder), run, srun_checks(os.environ), allocated_nodes(os.environ), os.environ)


if __name__ == "__main__":
    sys.exit(main())
