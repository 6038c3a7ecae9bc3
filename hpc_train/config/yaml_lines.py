"""Read YAML keeping the line of every key, so errors can say file:line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hpc_train.errors import ConfigError, Problem

Loc = tuple[str | int, ...]


def read_bytes(path: Path, display: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(Problem(display, "", f"cannot read site file: {exc.strerror or exc}")) from None


def parse_yaml(raw: bytes, display: str) -> tuple[Any, dict[Loc, int]]:
    """Parse one YAML document; return the data and {key path: 1-based line}.

    Duplicate keys are an error: YAML keeps the last one silently, which hides typos in long files.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(Problem(display, "", "the file is not UTF-8 text", line)) from None
    # libyaml's parser when PyYAML has it: several times faster on a cold login node
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = mark.line + 1 if mark else None
        what = " ".join(filter(None, [exc.context, exc.problem]))
        raise ConfigError(Problem(display, "", f"YAML syntax error: {what}", where)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(Problem(display, "", f"YAML error: {exc}")) from None
    finally:
        loader.dispose()
    lines: dict[Loc, int] = {}
    problems: list[Problem] = []
    if node is not None:
        _walk(node, (), lines, problems, display)
    if problems:
        raise ConfigError(problems)
    return data, lines


def _walk(node: yaml.Node, loc: Loc, lines: dict[Loc, int], problems: list[Problem], display: str) -> None:
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                problems.append(Problem(display, ".".join(map(str, loc + (key,))), "duplicate key", key_node.start_mark.line + 1))
            seen.add(key)
            lines[loc + (key,)] = key_node.start_mark.line + 1
            _walk(value_node, loc + (key,), lines, problems, display)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, loc + (index,), lines, problems, display)
