"""The job folder's names and the login<->job variables have one home (hpc_train.contract): the template
writes what the login side and the runtime read, and no module spells a variable's name itself."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from hpc_train import contract
from hpc_train.testing import render_job
from tests.conftest import REPO

WRITTEN_BY_THE_SCRIPT = ("RUNS", "LAST_RUN", "CHECKPOINTS", "STOP_REQUESTED", "REQUEUE_REQUESTED", "NO_RETRY")


def test_the_template_spells_no_job_folder_name_itself():
    template = (REPO / "templates" / "sbatch" / "base.sh.j2").read_text()
    for key in WRITTEN_BY_THE_SCRIPT:
        assert f"{{{{ files.{key} }}}}" in template
        assert not re.search(rf"JOB_FOLDER}}/{re.escape(getattr(contract, key))}\b", template), key


def test_the_rendered_script_uses_the_contracts_names(plugins):
    text = render_job(plugins, "sandbox", nodes=2)
    for key in WRITTEN_BY_THE_SCRIPT:
        assert f'"${{HPC_TRAIN_JOB_FOLDER}}/{getattr(contract, key)}"' in text, key
    assert vars(contract.FILES) == {k: getattr(contract, k) for k in vars(contract.FILES)}


# -- the variables ---------------------------------------------------------------------------------
PREFIX = "HPC_TRAIN_"
VARIABLE = re.compile(rf"\b{PREFIX}[A-Z0-9_]+")


def declared() -> dict[str, str]:
    return {name: value for name, value in vars(contract).items() if name.startswith("ENV_")}


def test_each_variable_is_declared_once_under_its_own_name():
    names = declared()
    assert len(set(names.values())) == len(names), "two constants for one variable"
    for name, value in names.items():
        # a prefix (ENV_SWEEP_PREFIX) ends in "_" and names a family: HPC_TRAIN_SWEEP_<NAME>
        expected = PREFIX + name.removeprefix("ENV_").removesuffix("PREFIX")
        assert value == expected, f"{name} = {value!r}: expected {expected!r}"
    assert not [key for key in vars(contract.FILES) if key.startswith("ENV_")], "the template's files.* holds variables"


def template_variables() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in [*REPO.glob("templates/**/*.j2"), *REPO.glob("examples/*/*/templates/**/*.j2")]:
        for name in VARIABLE.findall(path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def test_every_variable_the_templates_use_is_declared_in_the_contract():
    names = set(declared().values())
    families = tuple(value for value in names if value.endswith("_"))
    used = template_variables()
    assert "HPC_TRAIN_JOB_FOLDER" in used  # the scan reads the built-in template
    missing = {name: where for name, where in used.items() if name not in names and not name.startswith(families)}
    assert not missing, f"not declared in hpc_train/contract.py: {missing}"


def spelled_names(path: Path, own_constants: bool = False) -> Iterator[str]:
    """Variables' names written in string constants (f-string parts too), anywhere in the string (a shell
    line's ``${HPC_TRAIN_X}`` as much as a bare name); docstrings excepted, and with ``own_constants`` the
    value of a module-level ``NAME = "HPC_TRAIN_..."`` (a plugin's own variable)."""
    tree = ast.parse(path.read_text(), str(path))
    # a string standing alone as a statement is a docstring (or dead text): nothing reads it
    unread = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    if own_constants:
        unread |= {id(node.value) for node in tree.body if isinstance(node, ast.Assign)}
    found = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in unread and PREFIX in node.value
    ]
    for node in sorted(found, key=lambda node: (node.lineno, node.col_offset)):
        for name in re.findall(rf"{PREFIX}[A-Z0-9_]*", node.value):
            yield f"{path.relative_to(REPO)}:{node.lineno}: {name!r}"


def test_no_module_spells_a_variable_name_outside_the_contract():
    sources = sorted((REPO / "hpc_train").rglob("*.py"))
    assert REPO / "hpc_train" / "runtime" / "checkpoint" / "manager.py" in sources
    spelled = [hit for path in sources if path != REPO / "hpc_train" / "contract.py" for hit in spelled_names(path)]
    assert not spelled, "use the ENV_* constants of hpc_train.contract:\n" + "\n".join(spelled)


def test_a_plugin_names_its_own_variables_once_as_module_constants():
    # the core's contract does not know a built-in backend: a plugin's variable is the plugin's constant
    spelled = [hit for path in sorted((REPO / "plugins").rglob("*.py")) for hit in spelled_names(path, own_constants=True)]
    assert not spelled, "use hpc_train.contract's ENV_* or a module-level constant of the plugin:\n" + "\n".join(spelled)
    assert "HPC_TRAIN_DEEPSPEED_CONFIG_JSON" not in (REPO / "plugins" / "deepspeed_runtime.py").read_text()


def test_the_scan_sees_f_string_parts_and_skips_docstrings(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    source = tmp_path / "m.py"
    source.write_text(
        '"""HPC_TRAIN_DOC: a docstring"""\n'
        'def f(key):\n    """HPC_TRAIN_ALSO_DOC"""\n'
        '    return f"HPC_TRAIN_{key}_DIR", "x HPC_TRAIN_LATER", "HPC_TRAIN_PLAIN"\n'
    )
    assert list(spelled_names(source)) == ["m.py:4: 'HPC_TRAIN_'", "m.py:4: 'HPC_TRAIN_LATER'", "m.py:4: 'HPC_TRAIN_PLAIN'"]
