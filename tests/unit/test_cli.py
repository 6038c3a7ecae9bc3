"""The CLI as a user meets it: output, exit codes, and errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, write


def cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True, cwd=cwd or REPO, env=env)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    return write(tmp_path / "train.py", "print('hi')\n")


def test_render_prints_the_script_and_submits_nothing(script):
    out = cli(
        "render",
        "--site",
        "bluecloud",
        "--backend",
        "torchrun",
        "--nodes",
        "4",
        "--gpus-per-node",
        "8",
        "--time",
        "12:00:00",
        str(script),
        "--",
        "--lr",
        "1e-4",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=4" in out.stdout and "#SBATCH --gres=gpu:a100:8" in out.stdout
    assert f"/snapshots/trees/{code_digest(out.stdout)}/train.py --lr 1e-4" in out.stdout  # the script as it is now
    assert "#SBATCH --time=12:00:00" in out.stdout


def code_digest(script_text: str) -> str:
    line = next(line for line in script_text.splitlines() if line.startswith("export HPC_TRAIN_CODE="))
    return line.split("=", 1)[1].split()[0].rsplit("/", 1)[1]


@pytest.mark.parametrize(
    "args, code, fragments",
    [
        (["render", "--site", "bluecloude", "X"], 2, ["unknown site 'bluecloude'", "did you mean 'bluecloud'"]),
        (["render", "--site", "bluecloud", "--backend", "deepspeedd", "X"], 2, ["unknown backend 'deepspeedd'"]),
        (["render", "--site", "bluecloud", "--nodes", "99", "X"], 78, ["allows at most 32 nodes"]),
        (["render", "--site", "bluecloud", "--time", "12h", "X"], 78, ["--time: malformed time '12h'"]),
        (["render", "--site", "bluecloud", "missing_train.py"], 78, ["training script 'missing_train.py' not found"]),
        (["render", "--site", "bluecloud", "--env", "NOEQUALS", "X"], 2, ["--env 'NOEQUALS': expected KEY=VALUE"]),
        (["status", "424242"], 2, ["no job '424242' submitted through hpc_train"]),
    ],
)
def test_bad_input_is_a_message_not_a_traceback(script, args, code, fragments):
    args = [str(script) if a == "X" else a for a in args]
    out = cli(*args)
    assert out.returncode == code, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("error: ")
    for fragment in fragments:
        assert fragment in out.stderr


def test_bad_site_file_error_names_file_and_line(script, tmp_path):
    site = write(tmp_path / "broken.yaml", "partitions:\n  a100:\n    gpus_per_node: 8x\n")
    out = cli("render", "--site", str(site), str(script))
    assert out.returncode == 78
    assert "broken.yaml:3: partitions.a100.gpus_per_node: expected an integer, got '8x'" in out.stderr
    assert "Traceback" not in out.stderr


def test_sbatch_missing_is_a_clear_error(script, tmp_path):
    import os

    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}
    out = cli("submit", "--site", "generic-slurm", str(script), env=env)
    assert out.returncode == 69
    assert "sbatch not found on PATH" in out.stderr and "Traceback" not in out.stderr


def test_listing_commands():
    assert "bluecloud" in cli("sites").stdout
    backends = cli("backends").stdout
    assert "torchrun" in backends and "max_restarts" in backends
    plugins = cli("plugins")
    assert plugins.returncode == 0 and "hpc_train_backends" in plugins.stdout
    validate = cli("validate")
    assert validate.returncode == 0 and "ok: bluecloud" in validate.stdout


def test_site_show_says_where_values_come_from():
    out = cli("site", "show", "sandbox").stdout
    assert "# site sandbox: site_configs/sandbox.yaml <- site_configs/generic-slurm.yaml" in out
    assert 'PYTHONUNBUFFERED: "1"  # site_configs/generic-slurm.yaml:' in out
    assert 'slurm_conf: "/tmp/hpc_train-sandbox/etc/slurm.conf"  # site_configs/sandbox.yaml:' in out


def test_validate_reports_bad_backend_options(tmp_path):
    site = write(tmp_path / "s.yaml", "backends:\n  torchrun:\n    max_restart: 1\n  horovodd: {}\n")
    out = cli("validate", "--site", str(site))
    assert out.returncode == 78
    assert "backends.torchrun.max_restart: unknown key" in out.stderr
    assert "backends.horovodd: no such backend" in out.stderr


def test_submit_refuses_what_render_refuses_before_calling_sbatch(script, tmp_path):
    # passes planning, fails the site check: without the shared check, submit would go on to sbatch
    # (absent from PATH here: "sbatch not found", exit 69) instead of naming the site's mistake
    import os

    import hpc_train
    from hpc_train.errors import ConfigError

    site = write(tmp_path / "s.yaml", "extends: generic-slurm\nbackends:\n  torchrun:\n    max_restart: 1\n")
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}
    render = cli("render", "--site", str(site), str(script), env=env)
    submit = cli("submit", "--site", str(site), str(script), env=env)
    assert render.returncode == 78 and "backends.torchrun.max_restart: unknown key" in render.stderr
    assert (submit.returncode, submit.stderr) == (render.returncode, render.stderr)
    assert submit.stdout == ""
    with pytest.raises(ConfigError) as info:
        hpc_train.submit(str(script), site=str(site))
    assert f"error: {info.value.message}" in render.stderr  # the Python API: the same message


@pytest.mark.parametrize(
    "args, error, command",
    [
        (["submit", "--nodes", "x", "X"], "error: argument --nodes/-N: invalid int value: 'x'", "submit"),
        (["submit"], "error: the following arguments are required: script", "submit"),
        (["render", "--site"], "error: argument --site: expected one argument", "render"),
        (["validate", "--bad"], "error: unrecognized arguments: --bad", "validate"),
        (["bogus"], "error: argument COMMAND: invalid choice: 'bogus'", None),
    ],
)
def test_usage_error_is_the_error_line_and_where_to_read_more(script, args, error, command):
    out = cli(*[str(script) if a == "X" else a for a in args])
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert len(lines) == 2, out.stderr  # not the usage block
    assert lines[0].startswith(error), out.stderr
    assert lines[1] == "  see: python -m hpc_train" + (f" {command}" if command else "") + " --help"


LOGIN_SIDE = """
import sys, runpy
sys.argv = ["hpc_train"] + {args!r}
try:
    runpy.run_module("hpc_train", run_name="__main__")
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "deepspeed", "horovod", "mpi4py", "numpy") if m in sys.modules)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
"""


@pytest.mark.parametrize(
    "args", [["--help"], ["render", "--site", "bluecloud", "X"], ["status", "1"], ["sites"], ["backends"], ["submit", "--help"]]
)
def test_login_side_never_imports_frameworks(script, args):
    args = [str(script) if a == "X" else a for a in args]
    out = subprocess.run([sys.executable, "-c", LOGIN_SIDE.format(args=args)], capture_output=True, text=True, cwd=REPO)
    assert "HEAVY=\n" in out.stderr or out.stderr.rstrip().endswith("HEAVY="), out.stderr[-2000:]


WARM_RENDER = """
import sys, runpy
sys.argv = ["hpc_train", "render", "--site", "bluecloud", "--nodes", "4", {script!r}]
try:
    runpy.run_module("hpc_train", run_name="__main__")
except SystemExit:
    pass
print("LOADED=" + ",".join(m for m in ("pydantic", "yaml", "importlib.metadata") if m in sys.modules), file=sys.stderr)
"""


def test_warm_render_needs_neither_pydantic_nor_yaml_nor_metadata(script):
    # login-node latency: the caches (validators, resolved sites, entry points) spare these imports
    runs = [
        subprocess.run([sys.executable, "-c", WARM_RENDER.format(script=str(script))], capture_output=True, text=True, cwd=REPO)
        for _ in range(2)
    ]
    assert runs[0].stdout == runs[1].stdout and "#SBATCH --nodes=4" in runs[1].stdout
    assert "LOADED=\n" in runs[1].stderr, runs[1].stderr[-2000:]


def test_python_api_render_matches_cli(script):
    import hpc_train

    text = hpc_train.render(script, "--lr", "1e-4", site="bluecloud", nodes=4, time="12:00:00")
    out = cli("render", "--site", "bluecloud", "--nodes", "4", "--time", "12:00:00", str(script), "--", "--lr", "1e-4")
    assert text == out.stdout


def state_after_cancel(job_id: str) -> str:
    """The local job's state once it stopped RUNNING (or still RUNNING after ~20 s of polls)."""
    import time

    for _ in range(100):
        state = json.loads(cli("status", job_id, "--json").stdout)["state"]
        if state != "RUNNING":
            break
        time.sleep(0.2)
    return state


def test_status_json_for_a_local_job_and_parsable(script, tmp_path):
    sleeper = write(tmp_path / "sleep.py", "import time; time.sleep(60)\n")
    out = cli(
        "submit", "--site", "local", "--backend", "torchrun", "--job-root", str(tmp_path / "jobs"), "--parsable", str(sleeper)
    )
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    assert job_id.isdigit()
    status = json.loads(cli("status", job_id, "--json").stdout)
    assert status["state"] == "RUNNING" and status["site"] == "local"
    assert cli("cancel", job_id).returncode == 0
    assert state_after_cancel(job_id) in ("CANCELLED", "FAILED")


def test_cancel_ends_a_local_job_started_where_sigint_is_ignored(tmp_path):
    # what `nohup python -m hpc_train submit ... &` (or CI's shell) gives the job: SIGINT ignored
    import signal

    sleeper = write(tmp_path / "sleep.py", "import time; time.sleep(60)\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train",
            "submit",
            "--site",
            "local",
            "--job-root",
            str(tmp_path / "jobs"),
            "--parsable",
            str(sleeper),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    assert cli("cancel", job_id).returncode == 0
    assert state_after_cancel(job_id) in ("CANCELLED", "FAILED")


def test_diagnose_a_folder_says_what_it_lacks_and_an_unknown_job_is_an_error(tmp_path):
    (tmp_path / "runs").write_text("2\n")
    (tmp_path / "hangs.jsonl").write_text(
        '{"run": 1, "quiet_s": 12.0, "culprits": [{"rank": 3, "host": "n2", '
        '"steps": 7, "top": ["File \\"t.py\\", line 3 in f"], "reason": "r"}]}\n{"run'
    )
    out = cli("diagnose", str(tmp_path))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert 'rank 3 on n2, last step 7, at File "t.py", line 3 in f (r)' in out.stdout
    assert "hangs.jsonl: 1 unreadable line(s) skipped" in out.stdout and "no metrics/steps.jsonl" in out.stdout
    missing = cli("diagnose", "4242")
    assert missing.returncode != 0 and "no job '4242'" in missing.stderr and "Traceback" not in missing.stderr


def rendered_script_path(out: str) -> str:
    launch = next(line for line in out.splitlines() if "train.py" in line and "python" in line)
    return next(word for word in launch.split() if word.endswith("train.py"))


def test_render_runs_the_script_from_a_snapshot_of_its_project_unless_told_not_to(tmp_path, script):
    write(tmp_path / "lib.py", "X = 1\n")
    jobs = tmp_path / "jobs"
    out = cli("render", "--site", "bluecloud", "--job-root", str(jobs), str(script))
    assert out.returncode == 0, out.stderr
    code = next(line for line in out.stdout.splitlines() if line.startswith("export HPC_TRAIN_CODE="))
    tree = Path(code.split("=", 1)[1].split()[0])
    assert tree.parent == jobs / "snapshots" / "trees" and rendered_script_path(out.stdout) == str(tree / "train.py")
    assert (tree / "lib.py").read_text() == "X = 1\n"  # stored: `render > job.sh; sbatch job.sh` runs it
    in_place = cli("render", "--site", "bluecloud", "--job-root", str(jobs), "--no-snapshot", str(script))
    assert rendered_script_path(in_place.stdout) == str(script) and "HPC_TRAIN_CODE" not in in_place.stdout
    site = write(tmp_path / "site.yaml", "extends: bluecloud\nsnapshot:\n  enabled: false\n")
    by_site = cli("render", "--site", str(site), "--job-root", str(jobs), str(script))
    assert rendered_script_path(by_site.stdout) == str(script), by_site.stderr


def test_a_snapshot_over_the_sites_limit_is_refused_naming_what_to_leave_out(tmp_path, script):
    write(tmp_path / "data" / "big.bin", "x" * 3000)
    site = write(tmp_path / "site.yaml", "extends: bluecloud\nsnapshot:\n  max_size: 2K\n")
    out = cli("render", "--site", str(site), "--job-root", str(tmp_path / "jobs"), str(script))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "over its limit of 2.0 KiB" in out.stderr and "data/big.bin" in out.stderr and "/data/" in out.stderr
    bad = write(tmp_path / "bad.yaml", "extends: bluecloud\nsnapshot:\n  max_size: lots\n")
    out = cli("render", "--site", str(bad), str(script))
    assert out.returncode != 0 and "bad.yaml:3: snapshot.max_size" in out.stderr and "'lots' is not a memory size" in out.stderr
