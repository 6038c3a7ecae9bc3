"""Failures the scheduler does not announce, injected for real on the sandbox: a hung rank (blocked, or
stopped with SIGSTOP), a node where training fails at start, a crash loop."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from hpc_train.runtime.supervise.hang_report import main_stack, waiting
from tests.conftest import REPO, once_per_run
from tests.e2e.test_requeue_cluster import assert_identical, final_params, hpc, log_text, no_agent, state, wait_for

pytestmark = pytest.mark.e2e
SCRIPT = REPO / "tests" / "e2e" / "faulty_train.py"
HANG_TIMEOUT = 10


def submit(job_root: Path, backend: str, *extra: str, script_args: tuple[str, ...] = (), steps: int = 300) -> str:
    out = hpc(
        "submit",
        "--site",
        "sandbox",
        "--job-root",
        str(job_root),
        "--backend",
        backend,
        "--nodes",
        "2",
        "--procs-per-node",
        "1",
        "--parsable",
        *extra,
        str(SCRIPT),
        "--",
        "--steps",
        str(steps),
        *script_args,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def finished(job: str) -> bool:
    return state(job) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def hosts(job_root: Path, job: str, run: int) -> set[str]:
    return {p.read_text() for p in (job_root / job).glob(f"hosts-{run}-rank-*")}


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def first_poll_past_the_limit(hang: dict) -> bool:
    """Quiet past the limit at the verdict's poll, within it at the poll before: the hang was named at the
    first poll that could see it (how late a loaded machine ran that poll is the machine's, not the rule's)."""
    before = hang["quiet_at_last_poll_s"]
    return before is not None and before <= hang["limit_s"] == HANG_TIMEOUT <= hang["quiet_s"]


def reference(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Path:
    """The final parameters of faulty_train.py run uninterrupted: one job per backend for the whole run
    (torchrun's ranks do the same arithmetic with its agent or without), asked for once the test's own
    job runs, so the two run side by side."""

    def make(folder: Path) -> None:
        job = submit(folder, backend, "--no-requeue", *no_agent(backend))
        wait_for(lambda: finished(job), 300, f"the {backend} reference job")
        assert state(job) == "COMPLETED", log_text(folder, job)[-3000:]
        shutil.copy(folder / job / "final.pt", folder / "final.pt")

    return once_per_run(tmp_path_factory, f"faulty-reference-{backend}", make) / "final.pt"


@pytest.mark.parametrize(
    "backend, options, how, spares",
    [("torchrun", (), "sleep", 1), ("torchrun", ("-o", "agent=false"), "sleep", 1), ("mpi", (), "stop", 0)],
    ids=["torchrun", "torchrun-without-agent", "mpi"],
)
def test_a_hung_rank_is_named_and_the_run_restarts_elsewhere_from_its_checkpoint(
    slurm_cluster, sandbox_job_root, tmp_path_factory, backend, options, how, spares
):
    job = submit(
        sandbox_job_root,
        backend,
        *options,
        "--hang-timeout",
        str(HANG_TIMEOUT),
        "--checkpoint-every",
        "25",
        "--spare-nodes",
        str(spares),
        script_args=("--hang", f"1:120:{how}", "--step-seconds", "0.02"),
    )
    uninterrupted = torch.load(reference(tmp_path_factory, backend), weights_only=True)
    wait_for(lambda: finished(job), 420, "the hung job to finish", release=job)
    folder = sandbox_job_root / job
    text = log_text(sandbox_job_root, job)
    assert state(job) == "COMPLETED", text[-3000:]
    assert int((folder / "runs").read_text()) == 2, text[-3000:]

    [hang] = records(folder / "hangs.jsonl")
    hung_host = (folder / "hosts-1-rank-1").read_text()
    assert [(c["rank"], c["host"]) for c in hang["culprits"]] == [(1, hung_host)], hang
    assert hang["limit"] == "--hang-timeout" and first_poll_past_the_limit(hang), hang
    dumps = Path(hang["dumps"])
    assert waiting(main_stack((dumps / "rank-0.txt").read_text()))  # rank 0 waits for rank 1
    reason = hang["culprits"][0]["reason"]
    if how == "sleep":  # the blocked rank answered: its stack shows where it is stuck, its flight record how far
        assert reason.startswith("has not entered collective #") and "that the others wait in" in reason, reason
        assert json.loads((dumps / "rank-1.fr.json").read_text())["entries"]
        assert "faulty_train.py" in (dumps / "rank-1.txt").read_text()
    else:  # a stopped process cannot answer (its heartbeat stopped with it, often a beat behind the others):
        # py-spy read its stacks from outside
        assert "did not answer" in reason or "stopped at step" in reason, reason
        stopped = (dumps / "rank-1.txt").read_text()
        assert "no answer from inside; read by py-spy" in stopped and "faulty_train.py" in stopped, stopped
        assert hang["culprits"][0]["top"], hang
    assert f"hang: rank 1 on {hung_host}" in text, text[-3000:]

    # the restart avoided the node (inside the allocation with a spare, else by the requeue's exclusion),
    # resumed from the last checkpoint, and changed nothing
    assert hung_host not in hosts(sandbox_job_root, job, 2), (hung_host, hosts(sandbox_job_root, job, 2))
    if spares:
        assert "restarting inside the allocation" in text and "requeueing" not in text, text[-3000:]
    else:
        assert "requeueing" in text and f"the next run avoids {hung_host}" in text, text[-3000:]
    assert "run 2: starting at step 1" in text and "starting at step 0\n" not in text.split("run 2:")[-1]
    assert_identical(uninterrupted, final_params(sandbox_job_root, job))


def test_a_plain_scripts_hung_rank_is_named_by_its_optimizer_steps(slurm_cluster, sandbox_job_root):
    """A script that never imports hpc_train.runtime: its optimizer steps are the heartbeat."""
    out = hpc(
        "submit", "--site", "sandbox", "--job-root", str(sandbox_job_root), "--nodes", "2", "--procs-per-node", "1",
        "--parsable", "--hang-timeout", str(HANG_TIMEOUT), "--spare-nodes", "1",
        str(REPO / "tests" / "e2e" / "plain_hang_train.py"), "--", "--hang-step", "60",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    wait_for(lambda: finished(job), 420, "the plain job to finish", release=job)
    folder = sandbox_job_root / job
    text = log_text(sandbox_job_root, job)
    assert state(job) == "COMPLETED" and int((folder / "runs").read_text()) == 2, text[-3000:]
    [hang] = records(folder / "hangs.jsonl")
    hung_host = (folder / "plain-hosts-1-rank-1").read_text()
    assert [(c["rank"], c["host"]) for c in hang["culprits"]] == [(1, hung_host)], hang
    assert {r["steps"] for r in hang["ranks"].values()} == {60}, hang  # each optimizer step counted once
    assert first_poll_past_the_limit(hang), hang
    assert "plain_hang_train.py" in (Path(hang["dumps"]) / "rank-1.txt").read_text()
    assert "restarting inside the allocation" in text, text[-3000:]
    assert hung_host not in {p.read_text() for p in folder.glob("plain-hosts-2-rank-*")}


@pytest.mark.parametrize("spares", [0, 1])
def test_a_sick_node_is_avoided_inside_the_allocation_or_by_the_requeue(slurm_cluster, sandbox_job_root, spares):
    marker = sandbox_job_root / f"sick-node-{time.time_ns()}"
    # spares alone retry a crashed run (issue 31: without --on-failure requeue the job ended FAILED, spare unused)
    retry = () if spares else ("--on-failure", "requeue")
    # with a spare, torchrun's ranks start without its agent; without, the agent's failure takes the node down
    job = submit(
        sandbox_job_root,
        "torchrun",
        *(no_agent("torchrun") if spares else ()),
        *retry,
        "--spare-nodes",
        str(spares),
        script_args=("--sick-node", str(marker)),
        steps=60,
    )
    wait_for(lambda: finished(job), 300, "the job on a sick node to finish", release=job)
    folder = sandbox_job_root / job
    text = log_text(sandbox_job_root, job)
    sick = marker.read_text()
    assert state(job) == "COMPLETED", text[-3000:]
    assert int((folder / "runs").read_text()) == 2, text[-3000:]
    assert [(s["node"], s["reason"]) for s in records(folder / "suspect_nodes.jsonl")] == [(sick, "failed first")]
    assert sick not in hosts(sandbox_job_root, job, 2) and len(hosts(sandbox_job_root, job, 2)) == 2
    if spares:  # no requeue, no queue wait: the spare was in the allocation all along
        assert "restarting inside the allocation" in text and "requeueing" not in text, text[-3000:]
    else:
        assert f"the next run avoids {sick}" in text and "requeueing" in text, text[-3000:]
    # status says how the job was retried, without the log
    told = json.loads(hpc("status", job, "--json").stdout)
    how = "restarted" if spares else "requeued"
    assert [(r["run"], r["how"], r["after"]) for r in told["retries"]] == [(2, how, "failed")], told
    assert told["not_retried"] is None and "retried 1 time" in told["why"], told


def test_a_crash_loop_ends_at_the_first_restart_that_makes_no_progress(slurm_cluster, sandbox_job_root):
    # rank 1 fails at step 10 wherever it runs, before the first checkpoint (every 25)
    job = submit(
        sandbox_job_root,
        "torchrun",
        *no_agent("torchrun"),  # the rule is the subject; the agent's failure path: the sick node's test without spares
        "--on-failure",
        "requeue",
        "--max-restarts",
        "6",
        "--checkpoint-every",
        "25",
        script_args=("--crash-at", "10"),
        steps=60,
    )
    wait_for(lambda: finished(job), 300, "the crash loop to end", release=job)
    text = log_text(sandbox_job_root, job)
    runs = int((sandbox_job_root / job / "runs").read_text())
    assert state(job) == "FAILED", text[-3000:]
    assert runs == 2, text[-3000:]  # run 1 failed, its restart failed at the same place: no third try
    assert "failed without getting past the start" in text and "not requeueing" in text, text[-3000:]
    # the decision reaches the user without the log: status --json says why, and from which step run 2 began
    status = json.loads(hpc("status", job, "--json").stdout)
    assert status["not_retried"]["reason"] == "no_progress", status
    assert "failed without getting past the start" in status["why"], status
    assert status["retries"] == [{"run": 2, "how": "requeued", "after": "failed", "from_step": -1}], status


@pytest.fixture
def read_only_on_n2(slurm_cluster, sandbox_job_root):
    """The job root read-only on node n2 alone, as a shared file system mounted read-only (or gone stale
    and remounted so) on one node is: a bind mount made read-only inside n2's mount namespace."""
    pid = (slurm_cluster.sandbox_dir / "run" / "slurmd-n2.pid").read_text().strip()
    root = str(sandbox_job_root)
    subprocess.run(
        [
            "nsenter",
            "--target",
            pid,
            "--mount",
            "sh",
            "-c",
            f'mount --bind "{root}" "{root}" && mount -o remount,bind,ro "{root}"',
        ],
        check=True,
    )
    try:
        probe = subprocess.run(["nsenter", "--target", pid, "--mount", "touch", f"{root}/probe"], capture_output=True)
        assert probe.returncode != 0 and not (sandbox_job_root / "probe").exists(), "the bind mount is not read-only"
        yield "n2"
    finally:
        subprocess.run(["nsenter", "--target", pid, "--mount", "umount", "-l", root], check=False)


@pytest.mark.parametrize("spares", [1, 0])
def test_a_node_that_fails_its_check_at_start_up_is_never_trained_on(read_only_on_n2, sandbox_job_root, spares):
    # Slurm fills the lowest-numbered idle nodes first: n2 is in the job's first allocation
    agent = no_agent("torchrun") if spares else ()  # the check runs before any launcher: one of the two with it
    job = submit(sandbox_job_root, "torchrun", *agent, "--node-check", "--spare-nodes", str(spares), steps=40)
    wait_for(lambda: finished(job), 300, "the job with a bad node to finish", release=job)
    folder = sandbox_job_root / job
    text = log_text(sandbox_job_root, job)
    assert state(job) == "COMPLETED", text[-3000:]
    [suspect] = records(folder / "suspect_nodes.jsonl")
    assert suspect["node"] == read_only_on_n2 and suspect["run"] == 1, suspect
    assert suspect["reason"].startswith("node check: job folder: cannot write") and "Read-only" in suspect["reason"]
    assert f"node check: {read_only_on_n2} failed: job folder" in text, text[-3000:]
    runs = int((folder / "runs").read_text())
    trained = hosts(sandbox_job_root, job, runs)
    assert read_only_on_n2 not in trained and len(trained) == 2, trained
    if spares:  # the spare took its place before training: one run, no requeue
        assert runs == 1 and "requeueing" not in text, text[-3000:]
        assert "node check: 2 of 3 nodes passed; run 1 avoids n2" in text, text[-3000:]
    else:  # nothing trained on the first allocation; the requeue excluded the node
        assert runs == 2 and not hosts(sandbox_job_root, job, 1), text[-3000:]
        assert "run 1 does not start: a node failed its check" in text and f"the next run avoids {read_only_on_n2}" in text
