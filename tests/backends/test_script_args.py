"""A script's own arguments under the deepspeed backend: what its user gave, nothing more.

The launch adds ``--local_rank=N`` for scripts written for DeepSpeed's launcher; a script that imports
``hpc_train.runtime`` must not see it (a positional reader would do ``int("--local_rank=0")``). These
run the local site's rendered script with bash: torchrun, the launch shim, the script, DeepSpeed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import hpc_train
from hpc_train.runtime.launch.argv import ENV_VAR, mark, remove_added
from tests.conftest import REPO

# reads its arguments by position, as many scripts do, and trains two steps under DeepSpeed
RUNTIME_SCRIPT = """\
import json, os, sys
from pathlib import Path
import hpc_train.runtime as rt

steps, out = int(sys.argv[1]), Path(sys.argv[2])
args = sys.argv[1:]
ctx = rt.init()
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
model, opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
for _ in range(steps):
    ctx.backward(model(torch.randn(ctx.runtime.ds_config()["train_micro_batch_size_per_gpu"], 4)).pow(2).mean())
    ctx.step()
config = args[args.index("--deepspeed") + 1]
(out / f"rank{ctx.rank}.json").write_text(json.dumps({
    "argv": args, "backend": ctx.backend, "mark_left": os.environ.get("HPC_TRAIN_LAUNCH_ADDED_ARGS"),
    "micro": model.train_micro_batch_size_per_gpu(), "accum": model.gradient_accumulation_steps(),
    "config_arg": config, "config": json.loads(Path(config).read_text())}))
ctx.shutdown()
"""

# written for DeepSpeed's launcher: knows nothing of hpc_train; starts a child that imports the runtime
LAUNCHER_SCRIPT = """\
import json, os, subprocess, sys
from pathlib import Path

out = Path(sys.argv[-1])
child = subprocess.run([sys.executable, "-c", "import json, sys, hpc_train.runtime; print(json.dumps(sys.argv[1:]))",
                        "--local_rank=0", "child-arg"], capture_output=True, text=True, check=True)
(out / f"rank{os.environ['RANK']}.json").write_text(json.dumps({"argv": sys.argv[1:],
                                                               "child_argv": json.loads(child.stdout)}))
"""


def run_local(tmp_path: Path, script_text: str, *script_args: str, extensions: Path | None = None) -> tuple[str, Path]:
    """Render the local site's deepspeed job for 2 processes and run it as the local executor does."""
    script = tmp_path / "train.py"
    script.write_text(script_text)
    out = tmp_path / "out"
    out.mkdir()
    text = hpc_train.render(
        script,
        *[a.replace("{out}", str(out)) for a in script_args],
        site="local",
        backend="deepspeed",
        procs_per_node=2,
        python=sys.executable,
        workdir=str(tmp_path),
        job_root=str(tmp_path / "jobs"),
    )
    batch = tmp_path / "job.sh"
    batch.write_text(text)
    env = {
        **os.environ,
        "HPC_TRAIN_JOB_FOLDER": str(tmp_path / "job"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        **({"TORCH_EXTENSIONS_DIR": str(extensions)} if extensions else {}),
    }
    done = subprocess.run(["bash", str(batch)], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return text, out


def test_runtime_script_reads_exactly_its_arguments_and_trains(tmp_path, extensions):
    (tmp_path / "ds.json").write_text(
        json.dumps({"train_batch_size": 8, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1}})
    )
    # a user's own --local_rank=0 (after the positionals) is theirs and stays
    text, out = run_local(
        tmp_path, RUNTIME_SCRIPT, "2", "{out}", "--local_rank=0", "--deepspeed", "ds.json", extensions=extensions
    )
    assert "--local-rank-arg" in text  # the launch still adds it, for scripts written for DeepSpeed's launcher
    assert '# ds_config: yours, "' + str(tmp_path / "ds.json") + '" (named by --deepspeed' in text
    merged = str(tmp_path / "job" / "ds_config.json")
    for rank in (0, 1):
        report = json.loads((out / f"rank{rank}.json").read_text())
        assert report["argv"] == ["2", str(out), "--local_rank=0", "--deepspeed", merged]
        assert report["backend"] == "deepspeed" and report["mark_left"] is None
        # 8 = micro 2 x accumulation 2 x 2 processes: derived on the login side, accepted by DeepSpeed
        assert (report["micro"], report["accum"]) == (2, 2)
        assert report["config"]["zero_optimization"]["stage"] == 1 and report["config"]["train_batch_size"] == 8


def test_deepspeed_launcher_script_still_gets_local_rank_and_its_children_keep_theirs(tmp_path):
    _, out = run_local(tmp_path, LAUNCHER_SCRIPT, "x", "{out}")
    for rank in (0, 1):
        report = json.loads((out / f"rank{rank}.json").read_text())
        assert report["argv"] == [f"--local_rank={rank}", "x", str(out)]
        # the mark is for the process the launch became: a child importing the runtime keeps every argument
        assert report["child_argv"] == ["--local_rank=0", "child-arg"]


def test_remove_added_takes_only_the_marked_words_for_this_process():
    argv = ["train.py", "--local_rank=3", "--local_rank=3", "5"]
    environ = dict(mark(["--local_rank=3"], pid=41))
    assert remove_added(argv, environ, pid=41) == ["--local_rank=3"]
    assert argv == ["train.py", "--local_rank=3", "5"]  # the user's identical word stays
    assert ENV_VAR not in environ
    assert remove_added(argv, environ, pid=41) == [] and argv == ["train.py", "--local_rank=3", "5"]  # read once


def test_remove_added_leaves_argv_that_is_not_the_launchs():
    other_process = ["child.py", "--local_rank=0"]
    environ = dict(mark(["--local_rank=0"], pid=41))
    assert remove_added(other_process, environ, pid=42) == [] and other_process == ["child.py", "--local_rank=0"]
    assert ENV_VAR not in environ  # an inherited mark is dropped, not passed further down
    rewritten = ["train.py", "5"]  # the script (or something before it) already changed sys.argv
    assert remove_added(rewritten, dict(mark(["--local_rank=0"], pid=7)), pid=7) == [] and rewritten == ["train.py", "5"]
    garbled = ["train.py", "--local_rank=0"]
    assert remove_added(garbled, {ENV_VAR: "not json"}, pid=7) == [] and garbled == ["train.py", "--local_rank=0"]
