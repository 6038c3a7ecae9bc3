"""``--remote HOST`` of the commands that a login node can run for this machine (hpc_train.remote): a module of
its own, so ``status`` and ``logs`` do not import the job options to add it."""

from __future__ import annotations

import argparse


def add_remote_option(parser: argparse.ArgumentParser) -> None:
    """``--remote HOST``: run the command on a cluster's login node over ssh (hpc_train.remote)."""
    parser.add_argument(
        "--remote",
        metavar="HOST",
        help="run it on this login node over ssh (an alias of ~/.ssh/config, user@host; default: remote.host "
        "of ~/.config/hpc_train/config.yaml, else here)",
    )
