"""sbatch's long options, to catch a misspelt ``--sbatch NAME=...`` while planning.

sbatch refuses an option it does not know only when the job is submitted, after the script is
written (and, for a sweep, possibly after earlier arrays went in). The names are those of the
sbatch(1) man page of Slurm 22.05, plus what 23.02 (--extra) and 23.11 (--tres-per-task) added;
newer options pass through ``site.sbatch`` or a plugin, which are not checked against this list.
"""

from __future__ import annotations

import difflib

SBATCH_OPTIONS = frozenset(
    {
        "account",
        "acctg-freq",
        "array",
        "batch",
        "bb",
        "bbf",
        "begin",
        "chdir",
        "cluster-constraint",
        "clusters",
        "comment",
        "constraint",
        "container",
        "contiguous",
        "core-spec",
        "cores-per-socket",
        "cpu-freq",
        "cpus-per-gpu",
        "cpus-per-task",
        "deadline",
        "delay-boot",
        "dependency",
        "distribution",
        "error",
        "exclude",
        "exclusive",
        "export",
        "export-file",
        "extra",
        "extra-node-info",
        "get-user-env",
        "gid",
        "gpu-bind",
        "gpu-freq",
        "gpus",
        "gpus-per-node",
        "gpus-per-socket",
        "gpus-per-task",
        "gres",
        "gres-flags",
        "help",
        "hint",
        "hold",
        "ignore-pbs",
        "input",
        "job-name",
        "kill-on-invalid-dep",
        "licenses",
        "mail-type",
        "mail-user",
        "mcs-label",
        "mem",
        "mem-bind",
        "mem-per-cpu",
        "mem-per-gpu",
        "mincpus",
        "network",
        "nice",
        "no-kill",
        "no-requeue",
        "nodefile",
        "nodelist",
        "nodes",
        "ntasks",
        "ntasks-per-core",
        "ntasks-per-gpu",
        "ntasks-per-node",
        "ntasks-per-socket",
        "open-mode",
        "output",
        "overcommit",
        "oversubscribe",
        "parsable",
        "partition",
        "power",
        "prefer",
        "priority",
        "profile",
        "propagate",
        "qos",
        "quiet",
        "reboot",
        "requeue",
        "reservation",
        "signal",
        "sockets-per-node",
        "spread-job",
        "switches",
        "test-only",
        "thread-spec",
        "threads-per-core",
        "time",
        "time-min",
        "tmp",
        "tres-per-task",
        "uid",
        "usage",
        "use-min-nodes",
        "verbose",
        "version",
        "wait",
        "wait-all-nodes",
        "wckey",
        "wrap",
    }
)


def unknown_option(name: str) -> str | None:
    """None for an sbatch option; else the hint for a name sbatch does not have (its closest options).

    An abbreviation sbatch would expand (``exclusiv``) is refused too: it stops working the day a
    newer Slurm adds an option with the same beginning."""
    if name in SBATCH_OPTIONS:
        return None
    close = [n for n in SBATCH_OPTIONS if n.startswith(name)] if len(name) >= 3 else []
    close = sorted(close)[:3] if close else difflib.get_close_matches(name, sorted(SBATCH_OPTIONS), n=1, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(f"--{c}" for c in close) + "?"
    return "`man sbatch` lists its options"
