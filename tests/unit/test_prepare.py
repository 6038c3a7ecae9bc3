"""Which site a job goes to without --site, and the refusal to train on a Slurm login node by fallback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train import hookimpl
from hpc_train.errors import ConfigWarning, UsageError
from hpc_train.plugin.manager import get_plugin_manager
from hpc_train.submission import prepare
from tests.conftest import write


class Detects:
    @hookimpl
    def hpc_train_detect_site(self, hostname, environ):
        return "sandbox" if environ.get("ON_SANDBOX") else None


def test_choice_says_whether_the_site_was_given_detected_or_the_fallback(monkeypatch):
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "login1")
    plugins = get_plugin_manager(extra_plugins=(Detects(),))
    assert prepare.choose_site("bluecloud", plugins) == prepare.SiteChoice("bluecloud", "given")
    assert prepare.choose_site("bluecloud", plugins).note() is None
    fallback = prepare.choose_site(None, plugins)
    assert fallback == prepare.SiteChoice("local", "fallback", "login1")
    assert fallback.note() == "site: local (no --site given and no site detected for host login1; say --site NAME)"
    monkeypatch.setenv("ON_SANDBOX", "1")
    detected = prepare.choose_site(None, plugins)
    assert detected.why == "detected" and detected.note() == "site: sandbox (no --site given; detected for host login1)"
    assert prepare.resolve_site(None, plugins).name == "sandbox"  # the API's resolve_site picks the same


def test_a_slurm_node_is_told_by_its_config_file_before_asking_the_controller(tmp_path):
    conf = write(tmp_path / "slurm.conf", "ClusterName=x\n")

    def no_ping() -> bool:
        raise AssertionError("a config file was there: no need to ask the controller")

    assert prepare.slurm_here({"SLURM_CONF": str(conf)}, ping=no_ping) == f"{conf} configures Slurm here"
    assert (
        prepare.slurm_here({}, exists=lambda p: p == "/etc/slurm/slurm.conf", ping=no_ping)
        == "/etc/slurm/slurm.conf configures Slurm here"
    )
    nothing = {"exists": lambda p: False}
    assert prepare.slurm_here({}, **nothing, ping=lambda: True) == "a Slurm controller answers `scontrol ping`"
    assert prepare.slurm_here({"SLURM_CONF": str(tmp_path / "gone.conf")}, **nothing, ping=lambda: False) is None


def test_the_controller_must_say_it_is_up(monkeypatch):
    from hpc_train.submission import slurm_cmd

    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/scontrol")
    replies = [
        (0, "Slurmctld(primary) at ctl1 is UP\n", True),
        (1, "Slurmctld(primary) at ctl1 is DOWN\n", False),
        (0, "", False),
    ]  # the last: a stand-in scontrol that prints nothing
    for code, text, expected in replies:

        def reply(cmd, slurm_conf=None, timeout=60, code=code, text=text):
            assert timeout <= 5  # a controller that hangs must not hang the login side
            return subprocess.CompletedProcess(cmd, code, text, "")

        monkeypatch.setattr(slurm_cmd, "run", reply)
        assert prepare._controller_answers() is expected, text


def job(**options):
    return prepare.make_job(script="train.py", **options)


def test_training_on_a_slurm_node_by_fallback_is_refused(monkeypatch, plugins, capsys):
    monkeypatch.setattr(prepare, "slurm_here", lambda: "/etc/slurm/slurm.conf configures Slurm here")
    with pytest.raises(UsageError) as info:
        prepare.site_for(job(), plugins, training=True)
    assert (
        "the job would train on this machine (site local), but this is a Slurm node (/etc/slurm/slurm.conf" in info.value.message
    )
    assert "--site NAME" in info.value.hint and "--site local to train on this machine anyway" in info.value.hint
    with pytest.warns(ConfigWarning, match="submit refuses it without --site local"):  # render: a warning only
        assert prepare.site_for(job(), plugins).name == "local"
    assert "site: local (no --site given and no site detected for host" in capsys.readouterr().err


def test_an_explicit_site_asks_nothing_and_says_nothing(monkeypatch, plugins, capsys):
    def no_probe() -> str:
        raise AssertionError("--site given: no detection, no Slurm probe")

    monkeypatch.setattr(prepare, "slurm_here", no_probe)
    assert prepare.site_for(job(site="local"), plugins, training=True).name == "local"
    assert prepare.site_for(job(site="sandbox"), plugins, training=True).name == "sandbox"
    assert capsys.readouterr().err == ""


def test_submit_through_the_api_refuses_before_anything_is_made(monkeypatch, plugins, tmp_path):
    from hpc_train.api import submit
    from hpc_train.submission import executor

    monkeypatch.setattr(prepare, "slurm_here", lambda: "a Slurm controller answers `scontrol ping`")
    monkeypatch.setattr(executor, "submit_plan", lambda *a, **k: pytest.fail("submitted"))
    script = write(tmp_path / "train.py", "print('hi')\n")
    with pytest.raises(UsageError, match="this is a Slurm node"):
        submit(str(script), plugins=plugins, job_root=str(tmp_path / "jobs"))
    assert not (tmp_path / "jobs").exists()


def test_the_cli_says_which_site_and_why(tmp_path: Path):
    script = write(tmp_path / "train.py", "print('hi')\n")
    conf = write(tmp_path / "slurm.conf", "ClusterName=x\n")
    run = [sys.executable, "-m", "hpc_train"]
    quiet = subprocess.run([*run, "render", "--site", "local", str(script)], capture_output=True, text=True, check=False)
    assert quiet.returncode == 0 and "site:" not in quiet.stderr
    env = {**os.environ, "SLURM_CONF": str(conf)}
    render = subprocess.run([*run, "render", str(script)], capture_output=True, text=True, env=env, check=False)
    assert render.returncode == 0 and render.stdout.startswith("#!/bin/bash")  # stdout: the script only
    assert "site: local (no --site given and no site detected for host" in render.stderr
    assert f"warning: site local runs the job on this machine, a Slurm node ({conf} configures Slurm here)" in render.stderr
    submit = subprocess.run(
        [*run, "submit", "--job-root", str(tmp_path / "jobs"), str(script)], capture_output=True, text=True, env=env, check=False
    )
    assert submit.returncode == 2 and "Traceback" not in submit.stderr
    assert submit.stderr.startswith("error: no --site given and no site detected for host")
    assert "hint: say --site NAME for the cluster" in submit.stderr and not (tmp_path / "jobs").exists()
