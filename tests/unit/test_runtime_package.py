"""hpc_train.runtime's package: the training API loads on first use, so the batch shell's tools that pass
through the package start with only what they use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

# the training library's rooms and modules: what a rank's script uses, none of it any business of the batch
# shell's tools (supervise/, launch/, lifecycle/)
TRAINING_LIBRARY = {"context", "data", "engine", "step", "checkpoint", "observe"}
TOOLS = [
    "supervise.watchdog",
    "supervise.node_check",
    "supervise.hang_report",
    "supervise.suspects",
    "supervise.between_runs",
    "launch.signal_guard",
    "launch.worker",
    "lifecycle.heartbeat",
]


def loaded(code: str) -> dict:
    """Whether ``code`` loads torch, and the runtime's modules it loads (``supervise.watchdog``, ``context``)."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    modules = json.loads(out.stdout.splitlines()[-1])
    prefix = "hpc_train.runtime."
    return {"torch": "torch" in modules, "runtime": {m.removeprefix(prefix) for m in modules if m.startswith(prefix)}}


def rooms(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


@pytest.mark.parametrize("tool", TOOLS)
def test_a_batch_shell_tool_loads_neither_torch_nor_the_training_library(tool):
    seen = loaded(f"import hpc_train.runtime.{tool}")
    assert not seen["torch"], f"python -m hpc_train.runtime.{tool} imports torch"
    assert tool in seen["runtime"] and not rooms(seen["runtime"]) & TRAINING_LIBRARY, sorted(seen["runtime"])


def test_the_training_api_is_there_on_first_use():
    import hpc_train.runtime as rt
    from hpc_train.runtime import Context, RuntimeOptions

    assert rt.init.__module__ == "hpc_train.runtime.context" and rt.Context is Context
    assert RuntimeOptions.__module__ == "hpc_train.runtime.options" and set(rt.__all__) <= set(dir(rt))
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        rt.nope  # noqa: B018
    assert loaded("import hpc_train.runtime as rt; rt.init")["runtime"] >= {"context", "checkpoint.manager", "engine.backend"}
