"""The house rules, checked on the source: no import cycles, short functions, login side apart from the job
side, the core apart from the built-in plugins."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

LONGEST = 60  # lines, decorators excluded: a function a reader sees at once
LOGIN_SIDE = ("cli", "submission", "jobs", "sweeps", "config", "plugin", "fabric")


def modules(folder: str = "hpc_train") -> dict[str, Path]:
    found = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of ours ``name`` imports, at the top or inside functions; TYPE_CHECKING imports excepted."""
    tree = ast.parse(path.read_text())
    typing_only = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for sub in ast.walk(node)}  # fmt: skip
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [node.module])])
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {target for target in found if target in known and target != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_import_cycles_between_modules():
    edges = graph()
    assert "hpc_train.contract" in edges["hpc_train.runtime.watchdog"]  # the scan sees imports
    assert not cycles(edges), cycles(edges)


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_function_is_longer_than_a_reader_sees_at_once():
    long = []
    for folder in ("hpc_train", "plugins"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > LONGEST:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "\n".join(long)


def test_the_login_side_never_imports_the_job_side():
    edges = graph()
    login = [name for name in edges if name.split(".")[1:2] and name.split(".")[1] in LOGIN_SIDE]
    assert "hpc_train.cli.submit_cmd" in login
    crossing = {name: sorted(t for t in edges[name] if t.startswith("hpc_train.runtime")) for name in login}
    assert not {name: targets for name, targets in crossing.items() if targets}


def test_the_core_never_imports_the_built_in_plugins():
    for path in sorted((REPO / "hpc_train").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[0] in ("plugins", "hpc_train_plugins")], path
