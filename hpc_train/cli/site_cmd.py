"""``site show NAME``: the resolved config, each value with the file and line it came from."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("site", help="show one site's resolved configuration")
    parser.add_argument("action", choices=["show"])
    parser.add_argument("name", help="site name or path")
    return parser


def _scalar(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else json.dumps(value)


def _emit(data: Any, loc: tuple[str, ...], prov: dict[str, tuple[str, int | None]], indent: int, out: list[str]) -> None:
    pad = "  " * indent
    for key, value in data.items():
        here = loc + (str(key),)
        source = prov.get(".".join(here))
        note = f"  # {source[0]}:{source[1]}" if source and source[1] else ("  # " + source[0] if source else "  # default")
        if isinstance(value, dict) and value:
            out.append(f"{pad}{key}:{note}")
            _emit(value, here, prov, indent + 1, out)
        elif isinstance(value, list) and value:
            out.append(f"{pad}{key}:{note}")
            out.extend(f"{pad}  - {_scalar(item)}" for item in value)
        else:
            out.append(f"{pad}{key}: {_scalar(value) if value != {} and value != [] else ('{}' if value == {} else '[]')}{note}")


def run(args: argparse.Namespace) -> int:
    from hpc_train.api import resolve_site
    from hpc_train.config.loader import display_path
    from hpc_train.config.validate import dump
    from hpc_train.plugin.manager import default_plugins

    resolved = resolve_site(args.name, default_plugins())
    chain = " <- ".join(display_path(p) for p in reversed(resolved.chain))
    print(f"# site {resolved.name}: {chain}")
    out: list[str] = []
    _emit(dump(resolved.config), (), resolved.provenance, 0, out)
    print("\n".join(out))
    return 0
