"""Docs stay in step with the code: every hook and every CLI command is documented."""

import inspect

from hpc_train import hookspecs
from hpc_train.cli import COMMANDS
from tests.conftest import REPO


def test_every_hook_is_in_the_plugin_docs():
    text = (REPO / "docs" / "plugins.md").read_text()
    hooks = [name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("hpc_train_")]
    missing = [h for h in hooks if f"`{h}(" not in text]
    assert not missing, f"document these hooks in docs/plugins.md: {missing}"


def test_every_command_is_in_the_cli_reference():
    text = (REPO / "docs" / "cli.md").read_text()
    missing = [c for c in COMMANDS if f"`{c}" not in text]
    assert not missing, f"document these commands in docs/cli.md: {missing}"
