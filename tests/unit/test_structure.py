"""The house rules, checked on the source: no import cycles, short functions, login side apart from the job
side, the core apart from the built-in plugins."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

LONGEST = 60  # lines, decorators excluded: a function a reader sees at once
LOGIN_SIDE = ("cli", "submission", "jobs", "sweeps", "config", "plugin", "fabric", "snapshot")


PACKAGES = {"hpc_train": "hpc_train", "plugins": "hpc_train_backends"}  # folder -> the name it is imported as


def modules(folder: str = "hpc_train") -> dict[str, Path]:
    found = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        parts = (PACKAGES.get(folder, folder), *path.relative_to(REPO / folder).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path], typing: bool = False) -> set[str]:
    """Modules of ours ``name`` imports, at the top or inside functions; TYPE_CHECKING imports only with
    ``typing`` (a reader who takes one file takes those too)."""
    tree = ast.parse(path.read_text())
    typing_only = set() if typing else {
        id(sub) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for sub in ast.walk(node)
    }  # fmt: skip
    nodes = [node for node in ast.walk(tree) if id(node) not in typing_only]
    return imported(name, path, nodes, known)


def imported(name: str, path: Path, nodes: list[ast.AST], known: dict[str, Path]) -> set[str]:
    """The modules of ours that the import statements among ``nodes`` (of module ``name``) name."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in nodes:
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


def graph(typing: bool = False) -> dict[str, set[str]]:
    """Every module of hpc_train/ and plugins/ (as hpc_train_backends) and the modules of ours it imports;
    a package is its ``__init__``, so a circle through one is a circle here."""
    known = {**modules("hpc_train"), **modules("plugins")}
    return {name: imports(name, path, known, typing) for name, path in known.items()}


def test_no_import_cycles_between_modules():
    edges = graph()
    assert "hpc_train.contract" in edges["hpc_train.runtime.supervise.watchdog"]  # the scan sees imports
    assert "hpc_train.runtime.engine.backend" in edges["hpc_train_backends.torchrun_runtime"]  # and plugins/
    assert not cycles(edges), cycles(edges)


def test_no_circle_of_files_even_through_type_annotations():
    """What two parts both name lives in a small module both import: the Context as its parts see it
    (runtime.views), the layout's ParallelState (engine.parallel_state), the plan's records (submission.job_plan)."""
    assert not cycles(graph(typing=True)), cycles(graph(typing=True))


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


# What each room of hpc_train/runtime may import when it is imported (its __init__ says why); a function may
# import more when it runs. A top-level module is a room of its own; "" is the package's own __init__.
RUNTIME = "hpc_train.runtime"
RUNTIME_ROOMS: dict[str, set[str]] = {
    "": {"launch"},
    "log": set(),
    "options": set(),
    "views": set(),  # protocols only: what they name is imported for type checkers
    "preflight_job": set(),
    "data": {"log"},
    "launch": set(),
    "lifecycle": set(),
    "boot": set(),
    "supervise": {"lifecycle", "log"},
    "step": {"lifecycle", "log"},
    "checkpoint": {"lifecycle", "supervise", "log"},
    "engine": {"launch", "step", "options"},
    "observe": {"checkpoint", "step", "log"},
    "context": {"launch", "lifecycle", "step", "checkpoint", "engine", "observe", "data", "options", "log"},
}


def runtime_room(module: str) -> str:
    return module.removeprefix(RUNTIME).lstrip(".").split(".")[0]


def import_time_imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of ours ``name`` imports when it is imported: its top level (a ``try`` included), not a
    function's body, not ``TYPE_CHECKING``."""
    top = [sub for node in ast.parse(path.read_text()).body for sub in (node.body if isinstance(node, ast.Try) else [node])]
    return imported(name, path, top, known)


def test_each_room_of_the_runtime_imports_only_what_its_rules_allow():
    known = modules()
    rooms = {runtime_room(name) for name in known if name.startswith(RUNTIME)}
    assert rooms == set(RUNTIME_ROOMS), f"rooms without rules, or rules without a room: {rooms ^ set(RUNTIME_ROOMS)}"
    broken = []
    for name, path in known.items():
        if not name.startswith(RUNTIME):
            continue
        room = runtime_room(name)
        for target in import_time_imports(name, path, known):
            other = runtime_room(target) if target.startswith(RUNTIME + ".") else None
            if other is not None and other != room and other not in RUNTIME_ROOMS[room]:
                broken.append(f"{name} imports {target}: {room or 'hpc_train.runtime'} may import {sorted(RUNTIME_ROOMS[room])}")
    assert not broken, "\n".join(broken)


def test_the_room_rules_see_an_import_that_breaks_them(tmp_path):
    source = tmp_path / "tool.py"
    source.write_text(
        "import os\nfrom hpc_train.runtime.context import init\nif TYPE_CHECKING:\n    import hpc_train.runtime.observe\n"
    )
    known = {"hpc_train.runtime.supervise.tool": source, "hpc_train.runtime.context": source, "hpc_train.runtime.observe": source}
    assert import_time_imports("hpc_train.runtime.supervise.tool", source, known) == {"hpc_train.runtime.context"}


def test_the_core_never_imports_the_built_in_plugins():
    for path in sorted((REPO / "hpc_train").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[0] in ("plugins", "hpc_train_backends")], path


# A function of more than MOST_PARAMETERS takes a typed object instead (issue 32); constructors take what
# their object holds, and a config field's declaration (fields.setting) is one too.
MOST_PARAMETERS = 6
CONSTRUCTORS = {"__init__", "setting"}


def test_no_function_takes_more_than_six_parameters_but_constructors():
    many = []
    for folder in ("hpc_train", "plugins"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in CONSTRUCTORS:
                    args = node.args
                    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                    count = len(names) - (names[:1] in (["self"], ["cls"]))
                    if count > MOST_PARAMETERS:
                        many.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {count} parameters")
    assert not many, many
