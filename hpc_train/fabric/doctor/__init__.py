"""``doctor``: is this node (login or compute) fit to run the site's jobs? Each check: ok / warn / fail
and what to do about it.

Everything is read from commands and files (nvidia-smi, /sys, sinfo, package metadata), never by
importing torch: the login-side CLI stays light, and a broken CUDA install cannot crash the doctor
that is meant to diagnose it. Commands go through a ``runner`` and files through ``sys_root``, so
the parsers are tested on recorded outputs from real A100, H100 and RTX 4090 nodes.

One module per concern: ``report`` (a check's result), ``commands``, ``nvidia_smi`` (parsers), ``facts`` (what
the checks know), ``gpus``, ``versions``, ``network``, ``tools`` (Slurm, nsys) and ``node`` (all of them).
"""

from __future__ import annotations

from hpc_train.fabric.doctor.commands import Runner, run_command
from hpc_train.fabric.doctor.facts import NodeFacts, check_site_config, context_for
from hpc_train.fabric.doctor.gpus import check_gpus, check_nvlink, check_topology
from hpc_train.fabric.doctor.network import check_infiniband, check_interfaces
from hpc_train.fabric.doctor.node import diagnose, node_report
from hpc_train.fabric.doctor.nvidia_smi import Gpu, Topology, parse_nvlink, parse_query_gpu, parse_smi_header, parse_topo
from hpc_train.fabric.doctor.report import FAIL, OK, WARN, Check, Report, format_report
from hpc_train.fabric.doctor.tools import check_nsys, check_slurm
from hpc_train.fabric.doctor.versions import check_packages, check_versions, nccl_wheel, torch_build

__all__ = [
    "FAIL",
    "OK",
    "WARN",
    "Check",
    "Gpu",
    "NodeFacts",
    "Report",
    "Runner",
    "Topology",
    "check_gpus",
    "check_infiniband",
    "check_interfaces",
    "check_nsys",
    "check_nvlink",
    "check_packages",
    "check_site_config",
    "check_slurm",
    "check_topology",
    "check_versions",
    "context_for",
    "diagnose",
    "format_report",
    "nccl_wheel",
    "node_report",
    "parse_nvlink",
    "parse_query_gpu",
    "parse_smi_header",
    "parse_topo",
    "run_command",
    "torch_build",
]
