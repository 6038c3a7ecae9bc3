"""Docs stay in step with the code: every hook and every CLI command is documented."""

import inspect
import os
import re

from hpc_train.cli import COMMANDS
from hpc_train.plugin import hookspecs
from hpc_train.plugin.manager import hook_reference
from tests.conftest import REPO

PLUGINS_MD = REPO / "docs" / "plugins.md"
START = "<!-- hook reference: generated, do not edit by hand -->\n"
END = "<!-- end of hook reference -->\n"


def hookspec_functions():
    return [(name, f) for name, f in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("hpc_train_")]


def test_hook_reference_is_generated_from_the_hookspecs():
    text = PLUGINS_MD.read_text()
    assert START in text and END in text, "docs/plugins.md lost its hook reference markers"
    head, rest = text.split(START, 1)
    current, tail = rest.split(END, 1)
    expected = "\n" + hook_reference() + "\n"
    if os.environ.get("UPDATE_DOCS") == "1":
        PLUGINS_MD.write_text(head + START + expected + END + tail)
        return
    assert current == expected, "docs/plugins.md's hook reference is out of date: rerun with UPDATE_DOCS=1"


def test_every_hook_is_in_the_plugin_docs_with_parameters_and_return_type():
    text = PLUGINS_MD.read_text()
    for name, spec in hookspec_functions():
        annotations = dict(spec.__annotations__)
        returns = annotations.pop("return")
        params = ", ".join(f"{p}: {t}" for p, t in annotations.items())
        assert f"### `{name}({params}) -> {returns}`" in text, f"document {name} in docs/plugins.md"
        assert f"`{name}(" in text.split("## Hook reference")[0], f"add {name} to the table in docs/plugins.md"


def test_every_site_scoped_hook_exists_and_the_docs_name_it():
    names = {name for name, _ in hookspec_functions()}
    assert set(hookspecs.SITE_SCOPED_HOOKS) <= names
    scoping = PLUGINS_MD.read_text().split("## Site scoping", 1)[1].split("\n## ", 1)[0]
    for hook in hookspecs.SITE_SCOPED_HOOKS:
        assert f"`{hook}`" in scoping, f"docs/plugins.md's 'Site scoping' section should name {hook}"


def test_the_site_plugin_guide_points_at_files_that_exist():
    guide = (REPO / "docs" / "site-plugin-guide.md").read_text()
    for path in set(re.findall(r"`(examples/site_plugin/[\w./-]+)`", guide)):
        assert (REPO / path).exists(), f"docs/site-plugin-guide.md names {path}, which does not exist"
    import hpc_train.testing

    hooks = set(re.findall(r"`(hpc_train_\w+)`", guide)) | set(re.findall(r"def (hpc_train_\w+)\(", guide))
    for name in hooks - set(vars(hpc_train.testing)):  # the testing fixtures share the prefix
        assert name in dict(hookspec_functions()), f"docs/site-plugin-guide.md names an unknown hook {name}"


def test_every_command_is_in_the_cli_reference():
    text = (REPO / "docs" / "cli.md").read_text()
    missing = [c for c in COMMANDS if f"`{c}" not in text]
    assert not missing, f"document these commands in docs/cli.md: {missing}"
