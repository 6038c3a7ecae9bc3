"""``python -m hpc_train acme-limits``: ACME's job rules, as the plugin enforces them."""

from __future__ import annotations

import argparse

name = "acme-limits"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help="ACME: time limits, default accounts and QoS per partition")
    parser.add_argument("--partition", help="one partition only")
    return parser


def run(args: argparse.Namespace) -> int:
    from acme_hpc.plugin import (
        DEFAULT_ACCOUNT,
        DEFAULT_QOS,
        MAX_TIME,
        RESERVATION_ABOVE_NODES,
    )
    from hpc_train.errors import UnknownNameError

    partitions = sorted(MAX_TIME)
    if args.partition:
        if args.partition not in MAX_TIME:
            raise UnknownNameError("partition", args.partition, partitions, where="acme-limits")
        partitions = [args.partition]
    for partition in partitions:
        print(
            f"{partition:<8} max time {MAX_TIME[partition]:<10} account {DEFAULT_ACCOUNT[partition]:<11} "
            f"qos {DEFAULT_QOS[partition]}"
        )
    print(f"jobs on more than {RESERVATION_ABOVE_NODES} nodes need --reservation")
    return 0
