"""runtime/boot/hpc_train_gc.py: in a job's Python, torch imports with the collector paused, then is frozen.

Real Pythons started with the boot folder first on PYTHONPATH, as the batch script starts every Python of a job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hpc_train import contract
from hpc_train.runtime.boot import FOLDER

# counts the collections that start while torch's module runs (it is in sys.modules from then on: a young
# collection while its spec is found, before, depends on the environment's size), then reads the collector's
# state after it, and after the first optimizer (which imports torch._dynamo)
PROBE = """\
import gc, json, sys
started = []
def seen(phase, info):
    if phase == "start" and "torch" in sys.modules:
        started.append(info["generation"])
gc.callbacks.append(seen)
{before}
import torch
gc.callbacks.remove(seen)
after_torch = {{"collections": len(started), "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}}
{after}
print(json.dumps({{"torch": after_torch, "enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                  "left": gc.collect(), "finder": any(type(f).__name__ == "_PausedImport" for f in sys.meta_path)}}))
"""
OPTIMIZER = "torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1).step()"


def probe(before: str = "", after: str = "", **env: str) -> dict:
    environ = {**os.environ, "PYTHONPATH": FOLDER, "OMP_NUM_THREADS": "1", **env}
    code = PROBE.format(before=before, after=after)
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_torch_imports_with_the_collector_paused_then_its_objects_are_frozen_and_its_garbage_freed():
    seen = probe(after=OPTIMIZER)
    # one collection, the one that ends the import: none ran while torch's objects were being made
    assert seen["torch"]["collections"] == 1
    assert seen["torch"]["enabled"] is True and seen["torch"]["frozen"] > 50_000
    # torch._dynamo, imported by the optimizer, was frozen after it in the same way
    assert seen["frozen"] > seen["torch"]["frozen"] and seen["enabled"] is True
    assert seen["left"] < 100  # what the imports left unreachable was collected, not frozen with the rest
    assert seen["finder"] is False  # both imported: later imports no longer pass through it


def test_a_watched_plain_scripts_torch_imports_paused_too(tmp_path):
    """The watch's own hook on torch (runtime/boot/hpc_train_watch.py) is found through the pause, not around it."""
    beats = tmp_path / "heartbeats"
    seen = probe(**{contract.ENV_HEARTBEATS: str(beats), contract.ENV_JOB_FOLDER: str(tmp_path), "RANK": "0"})
    assert seen["torch"]["collections"] == 1 and seen["torch"]["frozen"] > 50_000
    assert beats.is_dir() and list(beats.iterdir()), "the watch started no heartbeat"


def test_without_it_the_collector_runs_through_the_import_and_nothing_is_frozen():
    seen = probe(**{contract.ENV_FREEZE_TORCH: "0"})
    assert seen["torch"]["collections"] > 1 and seen["frozen"] == 0 and seen["finder"] is False


def test_a_script_that_paused_the_collector_itself_keeps_it_paused_and_nothing_frozen():
    seen = probe(before="gc.disable()")
    assert seen["torch"] == {"collections": 0, "enabled": False, "frozen": 0}
    assert seen["finder"] is True  # torch._dynamo is still to come
