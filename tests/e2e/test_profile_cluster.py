"""--profile on the real sandbox cluster, 2 nodes (x 2 processes where which of a node's ranks matters),
under torchrun and MPI (their ranks start in different ways: torchrun forks them, srun starts the launch
shim that becomes them).

torch: a trace per chosen rank (default: rank 0 and the last) in the job folder, parsing as JSON, holding
the requested steps only; ``report`` lists them. nsys: the sandbox has no Nsight Systems, so the site points
tools.nsys at a stand-in that records its arguments and runs the rank as its child, as nsys does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e
EXAMPLE = REPO / "examples" / "train.py"

STUB = """\
#!{python}
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["NSYS_STUB_LOG"], "a") as f:
    f.write(json.dumps({{"argv": args, "host": os.uname().nodename, "rank": os.environ.get("RANK")}}) + "\\n")
app = next(i for i, a in enumerate(args) if i > 0 and not a.startswith("-"))
raise SystemExit(subprocess.call(args[app:]))
"""


def submit(job_root: Path, site: str, backend: str, *args: str, procs: int = 2) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train", "submit", "--site", site, "--job-root", str(job_root), "--backend", backend]
        + ["--nodes", "2", "--procs-per-node", str(procs), "--wait", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.split()[2]


def steps_of(path: Path) -> list[int]:
    events = json.loads(path.read_text())["traceEvents"]
    return sorted(int(e["name"].split("#")[1]) for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))


@pytest.mark.parametrize("backend", ["torchrun", "mpi"])
def test_torch_traces_of_the_chosen_steps_on_the_first_and_last_rank(slurm_cluster, sandbox_job_root, backend):
    # one rank a node: the first rank and the last are on different nodes (which ranks among several of a
    # node are wrapped: the nsys test below)
    profile = ("--profile", "torch:wait=4,warmup=2,active=3")
    job_id = submit(sandbox_job_root, "sandbox", backend, *profile, str(EXAMPLE), "--", "--steps", "20", procs=1)
    run = sandbox_job_root / job_id / "profile" / "run-1"
    found = {int(p.name.split(".")[0].removeprefix("rank-")): p for p in run.glob("rank-*.pt.trace.json")}
    assert sorted(found) == [0, 1], sorted(p.name for p in run.iterdir())
    for path in found.values():
        assert steps_of(path) == [6, 7, 8]
        names = {e.get("name", "") for e in json.loads(path.read_text())["traceEvents"]}
        assert any("all_reduce" in n or "allreduce" in n for n in names), backend  # gradients crossed the nodes
    report = subprocess.run(
        [sys.executable, "-m", "hpc_train", "report", job_id, "--no-plots", "--no-goodput"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert "run 1 rank 0: steps 6-8" in report.stdout and "run 1 rank 1: steps 6-8" in report.stdout
    assert "top operators" in report.stdout


@pytest.mark.parametrize("backend", ["torchrun", "mpi"])
def test_nsys_wraps_only_the_chosen_ranks_on_their_nodes(slurm_cluster, sandbox_job_root, site_dir, backend):
    stub = sandbox_job_root / "bin" / "nsys"  # the job root is on both nodes
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    (site_dir / "sandbox-nsys.yaml").write_text(f"extends: sandbox\ntools:\n  nsys: {stub}\n")
    log = sandbox_job_root / f"nsys-{backend}.log"
    job_id = submit(
        sandbox_job_root,
        "sandbox-nsys",
        backend,
        "--profile",
        "nsys:wait=2,warmup=0,active=2,ranks=1,last",
        "-e",
        f"NSYS_STUB_LOG={log}",
        str(EXAMPLE),
        "--",
        "--steps",
        "10",
    )
    folder = sandbox_job_root / job_id
    code = json.loads((folder / "hpc_train.json").read_text())["code"]
    ran = str(Path(code["tree"]) / EXAMPLE.relative_to(code["project"]))  # the example's copy in the job's snapshot
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    outputs = sorted(next(a for a in c["argv"] if a.startswith("--output=")) for c in calls)
    assert outputs == [f"--output={folder}/profile/run-1/rank-1", f"--output={folder}/profile/run-1/rank-3"]
    assert all("--capture-range=cudaProfilerApi" in c["argv"] and c["argv"][-3:] == [ran, "--steps", "10"] for c in calls)
    assert len({c["host"] for c in calls}) == 2  # rank 1 on the first node, rank 3 on the second
    reports = [json.loads(p.read_text()) for p in folder.glob("rank*.json")]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]  # every rank trained to the end, wrapped or not
