"""The node check at start-up (hpc_train.runtime.supervise.node_check): what fails a node, what collect makes of it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from hpc_train import contract, hookimpl
from hpc_train.fabric.doctor import FAIL, OK
from hpc_train.runtime.supervise import node_check
from hpc_train.runtime.supervise.suspects import read_suspects, record_suspect
from hpc_train.testing import make_plugins


def sys_tree(root: Path, interfaces: dict[str, str]) -> Path:
    for name, state in interfaces.items():
        (root / "class" / "net" / name).mkdir(parents=True)
        (root / "class" / "net" / name / "operstate").write_text(state + "\n")
    return root


def test_a_node_whose_fabric_interface_is_down_fails(tmp_path):
    sys_root = sys_tree(tmp_path / "sys", {"lo": "unknown", "eth0": "up", "hpc0": "down"})
    (tmp_path / "job").mkdir()
    report = node_check.check_node(tmp_path / "job", {"NCCL_SOCKET_IFNAME": "hpc0"}, sys_root, host="n2")
    checks = {c.name: c for c in report.checks}
    assert report.status == FAIL
    assert checks["interface NCCL_SOCKET_IFNAME"].status == FAIL
    assert "hpc0 (down)" in checks["interface NCCL_SOCKET_IFNAME"].summary
    assert checks["job folder"].status == OK


def test_a_healthy_node_passes_and_leaves_no_probe_behind(tmp_path):
    sys_root = sys_tree(tmp_path / "sys", {"eth0": "up", "hpc0": "up"})
    (tmp_path / "job").mkdir()
    report = node_check.check_node(tmp_path / "job", {"NCCL_SOCKET_IFNAME": "hpc0"}, sys_root, host="n1")
    assert report.status != FAIL, report.to_dict()
    assert list((tmp_path / "job").iterdir()) == []


def test_a_node_reports_on_stdout_because_the_job_folder_may_be_what_is_broken(tmp_path, capsys):
    (tmp_path / "job").write_text("not a folder")
    assert node_check.run_check(tmp_path / "job", {}) == 1
    out, err = capsys.readouterr()
    [report] = node_check.parse_reports("srun: some noise\n" + out + "cut " + node_check.MARKER + '{"host": \n')
    assert report.status == FAIL and [c.name for c in report.checks if c.status == FAIL] == ["job folder"]
    assert "job folder: cannot write" in err


def test_a_job_folder_that_cannot_be_written_fails(tmp_path):
    (tmp_path / "job").write_text("a file where the folder should be")
    check = node_check.check_job_folder(tmp_path / "job", "n1")
    assert check.status == FAIL and "cannot write" in check.summary


def test_a_job_folder_that_does_not_answer_fails_within_the_timeout(tmp_path):
    # a FIFO without a reader blocks open() in the kernel, as a stale mount does
    (tmp_path / "job").mkdir()
    fifo = tmp_path / "job" / f".node-check-n1-{os.getpid()}"
    os.mkfifo(fifo)
    try:
        check = node_check.check_job_folder(tmp_path / "job", "n1", timeout=0.5)
        assert check.status == FAIL and "did not answer within 0.5 s" in check.summary
    finally:
        threading.Thread(target=lambda: open(fifo, "rb").close(), daemon=True).start()  # lets the prober go


def reports_of(tmp_path, states: dict[str, str], env: dict[str, str]) -> list:
    return [
        node_check.check_node(tmp_path / "job", env, sys_tree(tmp_path / f"sys-{host}", {"hpc0": state}), host=host)
        for host, state in states.items()
    ]


def test_judge_names_failed_and_silent_nodes_as_suspects_and_records_the_reports(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    env = {"SLURM_JOB_ID": "7", "NCCL_SOCKET_IFNAME": "hpc0"}
    reports = reports_of(tmp_path, {"n1": "up", "n2": "down"}, env)
    assert node_check.judge(job, 3, reports, ["n1", "n2", "n3"], env) == 1
    found = {s["node"]: s for s in read_suspects(job)}
    assert set(found) == {"n2", "n3"} and {s["run"] for s in found.values()} == {3}
    assert found["n2"]["reason"].startswith("node check: interface NCCL_SOCKET_IFNAME")
    assert "no report" in found["n3"]["reason"]
    recorded = [json.loads(line) for line in (job / contract.NODE_CHECKS).read_text().splitlines()]
    assert [(r["run"], r["host"], r["status"]) for r in recorded] == [(3, "n1", OK), (3, "n2", FAIL)]
    assert node_check.judge(job, 4, [], [], env) == 0  # nothing known: not judged


def test_every_node_passing_names_nobody(tmp_path):
    (tmp_path / "job").mkdir()
    reports = reports_of(tmp_path, {"n1": "up"}, {})
    assert node_check.judge(tmp_path / "job", 1, reports, ["n1"], {}) == 0
    assert read_suspects(tmp_path / "job") == []


class Drainer:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, str | None]] = []
        self.fail = fail

    @hookimpl
    def hpc_train_node_suspect(self, site, node, reason, job_id, job_folder):
        self.calls.append((site, node, reason, job_id))
        if self.fail:
            raise RuntimeError("drain service down")


def test_the_site_hook_hears_of_each_suspect_after_the_record(tmp_path):
    drainer = Drainer()
    record_suspect(tmp_path, "n2", 1, "hang", {"SLURM_JOB_ID": "9", contract.ENV_SITE: "sandbox"}, make_plugins(drainer))
    assert drainer.calls == [("sandbox", "n2", "hang", "9")]
    assert [(s["node"], s["reason"]) for s in read_suspects(tmp_path)] == [("n2", "hang")]


def test_a_failing_site_hook_changes_nothing_for_the_job(tmp_path, capsys):
    record_suspect(tmp_path, "n3", 2, "failed first", {}, make_plugins(Drainer(fail=True)))
    assert [s["node"] for s in read_suspects(tmp_path)] == ["n3"]
    assert "hpc_train_node_suspect hook failed for n3: RuntimeError: drain service down" in capsys.readouterr().err


def test_a_torn_suspect_line_does_not_hide_the_others(tmp_path):
    (tmp_path / contract.SUSPECT_NODES).write_text('{"node": "n1", "run": 1}\n{"node": "n2", "ru\n[1]\n')
    assert [s["node"] for s in read_suspects(tmp_path)] == ["n1"]
