"""hpc_train.submission.slurm_cmd: Slurm's commands with the site's SLURM_CONF, and submitit's calls."""

from __future__ import annotations

import os
import threading
import time

import pytest

from hpc_train.submission.slurm_cmd import run, slurm_conf_for_submitit


def test_a_command_gets_the_sites_slurm_conf_and_the_process_keeps_its_own(monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/ours.conf")
    out = run(["sh", "-c", 'echo "$SLURM_CONF"'], "/clusters/b/slurm.conf")
    assert out.stdout.strip() == "/clusters/b/slurm.conf" and os.environ["SLURM_CONF"] == "/etc/slurm/ours.conf"
    assert run(["no-such-command-here"]).returncode == 127


@pytest.mark.parametrize("before", [None, "/etc/slurm/ours.conf"])
def test_submitits_call_sees_the_sites_conf_and_the_environment_is_put_back_even_on_error(monkeypatch, before):
    if before is None:
        monkeypatch.delenv("SLURM_CONF", raising=False)
    else:
        monkeypatch.setenv("SLURM_CONF", before)
    with pytest.raises(RuntimeError), slurm_conf_for_submitit("/clusters/a/slurm.conf"):
        assert os.environ["SLURM_CONF"] == "/clusters/a/slurm.conf"
        raise RuntimeError("sbatch failed")
    assert os.environ.get("SLURM_CONF") == before
    with slurm_conf_for_submitit(None):  # no site conf: the process's own, untouched
        assert os.environ.get("SLURM_CONF") == before


def test_two_threads_for_two_clusters_take_turns(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    seen: dict[str, list[str | None]] = {"a": [], "b": []}
    a_inside, order = threading.Event(), []

    def call(name: str, hold_s: float) -> None:
        with slurm_conf_for_submitit(f"/clusters/{name}/slurm.conf"):
            order.append(f"{name} in")
            a_inside.set() if name == "a" else None
            for _ in range(5):  # submitit reads the environment again at each of its sbatch/sacct calls
                seen[name].append(os.environ.get("SLURM_CONF"))
                time.sleep(hold_s)
            order.append(f"{name} out")

    first = threading.Thread(target=call, args=("a", 0.05))
    first.start()
    assert a_inside.wait(10)
    second = threading.Thread(target=call, args=("b", 0.0))
    second.start()
    first.join(10)
    second.join(10)
    assert order == ["a in", "a out", "b in", "b out"]
    assert seen == {"a": ["/clusters/a/slurm.conf"] * 5, "b": ["/clusters/b/slurm.conf"] * 5}
    assert "SLURM_CONF" not in os.environ
