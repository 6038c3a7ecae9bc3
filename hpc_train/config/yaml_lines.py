"""Read YAML keeping the line of every key, so errors can say file:line.

Site files are hostile input: anyone who can write to a folder on ``$HPC_TRAIN_SITE_PATH`` writes
for everyone who lists it. So a file is refused, with its line, before it can cost anything: too big,
not UTF-8, an alias bomb (400 bytes that expand to a billion values), a value nested deeper than
any config needs, an alias that contains itself, or a tag that builds something other than text,
numbers, lists and mappings.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

import yaml

from hpc_train.config.text import describe
from hpc_train.errors import ConfigError, Problem

Loc = tuple[str | int, ...]

MAX_BYTES = 1 << 20  # 1 MiB: a site file is a few KB
MAX_VALUES = 100_000  # after aliases are expanded
MAX_DEPTH = 64

_TAG = "tag:yaml.org,2002:"
MERGE = _TAG + "merge"
_SCALAR_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null", "timestamp")}
_KINDS = {
    _TAG + "int": "a number",
    _TAG + "float": "a number",
    _TAG + "bool": "true/false",
    _TAG + "null": "null",
    _TAG + "timestamp": "a date",
}

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser: several times faster on a login node


class _Loader(_Base):  # type: ignore[misc]
    """YAML 1.1 as PyYAML reads it, less base-60 numbers: ``12:00:00`` is 43200 there, and 30 days
    to a Slurm time field. Without them it stays the text Slurm reads as twelve hours."""

    yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, re.Pattern[str]]]]] = {
        first: [
            (tag, re.compile(r"(?!.*:)" + regex.pattern, regex.flags) if tag in (_TAG + "int", _TAG + "float") else regex)
            for tag, regex in resolvers
        ]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


def read_bytes(path: Path, display: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(Problem(display, "", f"cannot read site file: {exc.strerror or exc}")) from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(Problem(display, "", f"the file is larger than {MAX_BYTES >> 20} MiB; a site file is a few KB"))
    return raw


def parse_yaml(raw: bytes, display: str) -> tuple[Any, dict[Loc, int]]:
    """Parse one YAML document; return the data and {key path: 1-based line}.

    Duplicate keys are an error: YAML keeps the last one silently, which hides typos in long files.
    Merge keys (``<<: *defaults``) are not duplicates: the mapping's own keys override what they bring.
    """
    text = _decode(raw, display)
    loader = _Loader(text)
    try:
        node = _compose(loader, text, display)
        if node is None:
            return None, {}
        _check_shape(node, display)
        lines: dict[Loc, int] = {}
        problems: list[Problem] = []
        _walk(loader, node, (), lines, problems, display)
        if problems:
            raise ConfigError(problems)
        try:
            data = loader.construct_document(node)
        except yaml.MarkedYAMLError as exc:
            raise ConfigError(_syntax_problem(exc, display)) from None
        return data, lines
    finally:
        loader.dispose()


def _decode(raw: bytes, display: str) -> str:
    try:
        return raw.decode("utf-8-sig")  # an editor's byte-order mark is not part of the text
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(Problem(display, "", "the file is not UTF-8 text", line)) from None


def _compose(loader: Any, text: str, display: str) -> yaml.Node | None:
    try:
        return loader.get_single_node()  # type: ignore[no-any-return]
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        char = chr(exc.character) if isinstance(exc.character, int) else str(exc.character)
        raise ConfigError(Problem(display, "", f"the file contains {describe(char)}, which YAML does not allow", line)) from None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(_syntax_problem(exc, display)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(Problem(display, "", f"YAML error: {exc}")) from None
    except RecursionError:  # PyYAML's pure-Python parser, where libyaml is missing, recurses per level
        raise ConfigError(Problem(display, "", f"values are nested more than {MAX_DEPTH} levels deep")) from None


def _syntax_problem(exc: yaml.MarkedYAMLError, display: str) -> Problem:
    mark = exc.problem_mark or exc.context_mark
    what = " ".join(filter(None, [exc.context, exc.problem]))
    return Problem(display, "", f"YAML syntax error: {what}", mark.line + 1 if mark else None)


def _tag(node: yaml.Node) -> str:
    return "!!" + node.tag[len(_TAG) :] if node.tag.startswith(_TAG) else node.tag


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_shape(root: yaml.Node, display: str) -> None:
    """Size after alias expansion, depth and self-reference, from the node graph (each node once)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            kids = _children(node)
            size[key] = 1 + sum(size[id(kid)] for kid in kids)
            depth[key] = 1 + max((depth[id(kid)] for kid in kids), default=0)
            if size[key] > MAX_VALUES:
                raise ConfigError(
                    Problem(
                        display,
                        "",
                        f"this value holds more than {MAX_VALUES} values once its "
                        "aliases are expanded (an alias bomb?); a site file has hundreds",
                        _line(node),
                    )
                )
            if depth[key] > MAX_DEPTH:
                raise ConfigError(Problem(display, "", f"values are nested more than {MAX_DEPTH} levels deep", _line(node)))
            continue
        if key in size:
            continue
        if key in open_nodes:  # an ancestor: `a: &x [*x]`
            raise ConfigError(Problem(display, "", "an alias refers to the value that contains it", _line(node)))
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((kid, False) for kid in _children(node) if id(kid) not in size)


def _walk(loader: Any, node: yaml.Node, loc: Loc, lines: dict[Loc, int], problems: list[Problem], display: str) -> None:
    lines.setdefault(loc, _line(node))
    where = ".".join(map(str, loc))
    if isinstance(node, yaml.MappingNode):
        if node.tag != _TAG + "map":
            problems.append(Problem(display, where, f"YAML tag {_tag(node)} is not supported here", _line(node)))
            return
        for key, key_line, value_node in _pairs(node, loc, problems, display):
            lines[loc + (key,)] = key_line
            _walk(loader, value_node, loc + (key,), lines, problems, display)
    elif isinstance(node, yaml.SequenceNode):
        if node.tag != _TAG + "seq":
            problems.append(Problem(display, where, f"YAML tag {_tag(node)} is not supported here", _line(node)))
            return
        for index, item in enumerate(node.value):
            _walk(loader, item, loc + (index,), lines, problems, display)
    else:
        _check_scalar(loader, node, where, problems, display)


def _check_scalar(loader: Any, node: yaml.Node, where: str, problems: list[Problem], display: str) -> None:
    if node.tag not in _SCALAR_TAGS:
        problems.append(Problem(display, where, f"YAML tag {_tag(node)} is not supported here", _line(node)))
    elif node.tag != _TAG + "str":
        try:  # `!!int abc` or a 5000-digit number fail inside PyYAML with no line: try each here
            loader.construct_object(node)
        except Exception:
            problems.append(Problem(display, where, f"cannot read {node.value[:40]!r} as {_KINDS[node.tag]}", _line(node)))


def _pairs(
    node: yaml.MappingNode,
    loc: Loc,
    problems: list[Problem],
    display: str,
) -> list[tuple[str, int, yaml.Node]]:
    """(key, line, value) as the mapping means them: its own keys, then what ``<<`` merges in
    (earlier merges win over later ones, as PyYAML builds it); a key written twice is an error."""
    own: dict[str, tuple[str, int, yaml.Node]] = {}
    merged: list[tuple[str, int, yaml.Node]] = []
    for key_node, value_node in node.value:
        if key_node.tag == MERGE:
            merged.extend(_merged(value_node, loc, problems, display))
            continue
        key = _key(key_node, loc, problems, display)
        if key in own:
            problems.append(Problem(display, ".".join(map(str, loc + (key,))), "duplicate key", _line(key_node)))
        own[key] = (key, _line(key_node), value_node)
    out = dict(own)
    for key, line, value in merged:
        out.setdefault(key, (key, line, value))
    return list(out.values())


def _merged(value: yaml.Node, loc: Loc, problems: list[Problem], display: str) -> list[tuple[str, int, yaml.Node]]:
    sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
    out: list[tuple[str, int, yaml.Node]] = []
    for source in sources:
        if not isinstance(source, yaml.MappingNode):
            problems.append(
                Problem(
                    display,
                    ".".join(map(str, loc + ("<<",))),
                    "a merge key (<<) takes an alias of a mapping, or a list of them",
                    _line(source),
                )
            )
            continue
        out.extend(_pairs(source, loc, [], display))  # its own duplicates are reported where it is written
    return out


def _key(node: yaml.Node, loc: Loc, problems: list[Problem], display: str) -> str:
    if isinstance(node, yaml.ScalarNode) and node.tag == _TAG + "str":
        return str(node.value)
    text = str(node.value) if isinstance(node, yaml.ScalarNode) else "?"
    what = _KINDS.get(node.tag, "a list or mapping") if isinstance(node, yaml.ScalarNode) else "a list or mapping"
    problems.append(
        Problem(
            display,
            ".".join(map(str, loc + (text,))),
            f"a key must be a name, this one is read as {what} (quote it)",
            _line(node),
        )
    )
    return text
