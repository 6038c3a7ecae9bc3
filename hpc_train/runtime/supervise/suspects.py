"""Suspect nodes: the one place a node is named as the cause of a failed run.

The watchdog (a hang), the failure path (the ranks of one node failed first) and the node check at
start-up all name nodes here: one line in the job folder's ``suspect_nodes.jsonl`` (read by the next
run's node choice, the requeue's exclusion and ``diagnose``), then the site's
``hpc_train_node_suspect`` hook, where admins drain or report the node.

Runs on the batch node, between runs; torch-free.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train import contract

NODE_CHECK_REASON = "node check: "  # how a failed node check's reason begins (hpc_train.runtime.supervise.node_check)

if TYPE_CHECKING:
    from hpc_train.plugin.manager import Plugins


def read_suspects(job_folder: Path) -> list[dict[str, Any]]:
    found = []
    try:
        lines = (job_folder / contract.SUSPECT_NODES).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a line cut by a full disk or a killed writer: the others still count
            continue
        if isinstance(record, dict) and isinstance(record.get("node"), str):
            found.append(record)
    return found


def record_suspect(
    job_folder: Path, node: str, run: int, reason: str, environ: Mapping[str, str], plugins: Plugins | None = None
) -> None:
    """Name ``node`` for ``run``: the record first (what the next run relies on), then the site's hook."""
    with open(job_folder / contract.SUSPECT_NODES, "a") as out:
        out.write(json.dumps({"node": node, "run": run, "reason": reason, "at": time.time()}) + "\n")
    _tell_site(environ.get(contract.ENV_SITE) or "", node, reason, environ.get("SLURM_JOB_ID"), job_folder, plugins)


def _tell_site(site: str, node: str, reason: str, job_id: str | None, job_folder: Path, plugins: Plugins | None) -> None:
    try:
        if plugins is None:
            from hpc_train.plugin.manager import default_plugins

            plugins = default_plugins()
        plugins.node_suspect(site, node, reason, job_id, job_folder)
    except Exception as exc:  # a site plugin's bug must not change how the job goes on
        print(
            f"hpc_train: the site's hpc_train_node_suspect hook failed for {node}: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
