"""doctor: GPU checks on recorded nvidia-smi outputs (A100, H100, RTX 4090), sysfs fabric checks on a
fake /sys tree, and the real command on this (GPU-less) machine."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.config.loader import load_site
from hpc_train.fabric import doctor
from hpc_train.fabric.doctor import FAIL, OK, WARN, NodeFacts
from hpc_train.plugin.backend import Backend
from tests.conftest import REPO, write

DATA = Path(__file__).resolve().parent / "data" / "nvidia_smi"


def recorded(machine: str, nvlink_text: str | None = None):
    files = {
        ("nvidia-smi",): "nvidia-smi.txt",
        ("nvidia-smi", "topo", "-m"): "topo-m.txt",
        ("nvidia-smi", "nvlink", "--status"): "nvlink-s.txt",
    }

    def run(cmd):
        if cmd[0] == "nvidia-smi" and any(c.startswith("--query-gpu") for c in cmd):
            return 0, (DATA / machine / "query-gpu.csv").read_text()
        if tuple(cmd) == ("nvidia-smi", "nvlink", "--status") and nvlink_text is not None:
            return 0, nvlink_text
        name = files.get(tuple(cmd))
        return (0, (DATA / machine / name).read_text()) if name else (None, "")

    return run


def by_name(checks):
    return {c.name: c for c in checks}


def test_parse_topo_a100_nvlink_and_nics():
    topo = doctor.parse_topo((DATA / "a100" / "topo-m.txt").read_text())
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert topo.nvlink_pairs() == 28 and {k for _, _, k in topo.gpu_pairs()} == {"NV12"}
    assert topo.nics == {"NIC0": "mlx5_0", "NIC1": "mlx5_1", "NIC2": "mlx5_2", "NIC3": "mlx5_3"}
    assert topo.best_nic("GPU5") == ("mlx5_2", "PXB")
    assert topo.cpu_affinity["GPU4"] == "64-127,192-255"


def test_parse_topo_h100_strips_the_ansi_underline():
    topo = doctor.parse_topo((DATA / "h100" / "topo-m.txt").read_text())
    assert len(topo.gpus) == 8 and topo.links[("GPU0", "GPU7")] == "NV18"
    assert len(topo.nics) == 8 and topo.best_nic("GPU3") == ("mlx5_3", "PIX")


def test_parse_topo_rtx4090_pcie_only():
    topo = doctor.parse_topo((DATA / "rtx4090" / "topo-m.txt").read_text())
    assert topo.nvlink_pairs() == 0 and not topo.nics
    assert topo.links[("GPU0", "GPU1")] == "PIX" and topo.links[("GPU0", "GPU4")] == "SYS"


def test_parse_header_query_and_nvlink():
    assert doctor.parse_smi_header((DATA / "h100" / "nvidia-smi.txt").read_text()) == ("550.54.15", "12.4")
    gpus = doctor.parse_query_gpu((DATA / "a100" / "query-gpu.csv").read_text())
    assert len(gpus) == 8 and gpus[0].name == "NVIDIA A100-SXM4-80GB" and gpus[0].memory_mib == 81920
    links = doctor.parse_nvlink((DATA / "h100" / "nvlink-s.txt").read_text())
    assert len(links) == 8 and len(links[0]) == 18 and links[7][17] == 26.562


@pytest.mark.parametrize(
    "machine, profile_env, nvlink_status",
    [
        ("a100", {"NCCL_IB_HCA": "mlx5"}, OK),
        ("h100", {"NCCL_NVLS_ENABLE": "1"}, OK),
    ],
)
def test_nvlink_nodes_are_healthy(machine, profile_env, nvlink_status):
    checks = by_name(doctor.check_gpus(NodeFacts(env=profile_env, expected_gpus=8, in_job=True), recorded(machine)))
    assert checks["gpus"].status == OK and checks["gpus"].summary.startswith("8 x NVIDIA")
    assert checks["topology"].status == OK and "all 8 GPUs pairwise on NVLink" in checks["topology"].summary
    assert checks["nvlink"].status == nvlink_status


def test_a_down_nvlink_is_a_warning():
    text = (DATA / "a100" / "nvlink-s.txt").read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("GPU 3:")) + 6
    lines[at] = "\t Link 5: <inactive>"
    checks = by_name(doctor.check_gpus(NodeFacts(expected_gpus=8), recorded("a100", "\n".join(lines))))
    assert checks["nvlink"].status == WARN and "GPU 3 link 5" in checks["nvlink"].summary
    assert "95 of 96 links up" in checks["nvlink"].summary


def test_p2p_disabled_on_an_nvlink_node_is_a_warning():
    checks = by_name(doctor.check_gpus(NodeFacts(env={"NCCL_P2P_DISABLE": "1"}), recorded("h100")))
    assert checks["topology"].status == WARN and "NCCL_P2P_DISABLE" in checks["topology"].fix


def test_consumer_gpus_without_p2p_off_get_the_pcie_profile_advice():
    checks = by_name(doctor.check_gpus(NodeFacts(), recorded("rtx4090")))
    assert "no NVLink" in checks["topology"].summary
    assert checks["topology"].status == WARN and "pcie-consumer" in checks["topology"].fix
    assert "nvlink" not in checks  # no NVLink check without NVLink
    fine = by_name(doctor.check_gpus(NodeFacts(env={"NCCL_P2P_DISABLE": "1"}), recorded("rtx4090")))
    assert fine["topology"].status == OK


def test_fewer_gpus_than_the_partition_promises_fails_in_a_job():
    checks = by_name(doctor.check_gpus(NodeFacts(expected_gpus=16, partition="big", in_job=True), recorded("a100")))
    assert checks["gpus"].status == FAIL and "promises 16" in checks["gpus"].summary


def test_no_gpu_is_said_plainly():
    def none(cmd):
        return None, ""

    [check] = doctor.check_gpus(NodeFacts(), none)
    assert check.status == OK and check.summary.startswith("no GPU on this machine")
    [check] = doctor.check_gpus(NodeFacts(expected_gpus=8, in_job=True), none)
    assert check.status == FAIL


def test_driver_failure_is_a_failure():
    [check] = doctor.check_gpus(
        NodeFacts(), lambda cmd: (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    )
    assert check.status == FAIL and "couldn't communicate" in check.summary


@pytest.mark.parametrize(
    "build, driver_cuda, gpu, status",
    [
        (("2.3.0+cu121", "12.1"), "12.2", True, OK),
        (("2.5.0+cu124", "12.4"), "12.2", True, WARN),  # minor version compatibility
        (("2.5.0+cu124", "12.4"), "11.8", True, FAIL),  # driver too old
        (("2.5.0+cpu", None), "12.4", True, FAIL),  # CPU build on a GPU node
        (("2.13.0+cpu", None), None, False, OK),
        ((None, None), None, False, FAIL),
    ],
)
def test_version_matching(build, driver_cuda, gpu, status):
    assert doctor.check_versions(driver_cuda, gpu, [], build=build, nccl="2.21.5").status == status


def test_missing_torch_is_a_warning_on_a_login_node_and_a_failure_in_a_job():
    login = doctor.check_versions(None, False, [], build=(None, None), in_job=False)
    assert login.status == WARN and "a login node needs none" in login.summary and "the site's `python`" in login.fix
    assert doctor.check_versions(None, False, [], build=(None, None), in_job=True).status == FAIL


def test_doctor_on_a_login_node_without_torch_passes_with_warnings(plugins, monkeypatch):
    monkeypatch.setattr(doctor.versions, "torch_build", lambda: (None, None))

    def not_installed(dist):
        raise doctor.versions.importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(doctor.versions.importlib.metadata, "version", not_installed)  # no torch, so no backend is ready
    backends = {name: plugins.backend(name) for name in ("torchrun", "mpi")}
    no_gpu = lambda cmd: (None, "")  # noqa: E731  (nvidia-smi and sinfo not found)
    login = by_name(doctor.diagnose(NodeFacts(), run=no_gpu, sys_root=Path("/nonexistent"), backends=backends).checks)
    assert login["versions"].status == WARN and login["python packages"].status == WARN
    assert FAIL not in {c.status for c in login.values()}  # `doctor` exits 0
    in_job = doctor.diagnose(NodeFacts(in_job=True), run=no_gpu, sys_root=Path("/nonexistent"), backends=backends)
    assert by_name(in_job.checks)["versions"].status == FAIL and by_name(in_job.checks)["python packages"].status == FAIL
    assert in_job.status == FAIL


def test_site_nccl_module_that_torch_ignores_is_a_warning():
    check = doctor.check_versions("12.2", True, ["cuda/12.1", "nccl/2.18.3"], build=("2.3.0+cu121", "12.1"), nccl="2.20.5")
    assert check.status == WARN and "nccl/2.18.3" in check.fix


def test_torch_build_is_read_without_importing_torch():
    version, _ = doctor.torch_build()
    assert version and version.startswith("2.")


def fake_ib(root: Path, dev: str, state: str = "4: ACTIVE", layer: str = "InfiniBand", gid_type: str | None = None) -> None:
    port = root / "class" / "infiniband" / dev / "ports" / "1"
    write(port / "state", state + "\n")
    write(port / "rate", "200 Gb/sec (4X HDR)\n")
    write(port / "link_layer", layer + "\n")
    if gid_type:
        write(port / "gid_attrs" / "types" / "3", gid_type + "\n")


def test_infiniband_ports_and_hca_matching(tmp_path):
    fake_ib(tmp_path, "mlx5_0")
    fake_ib(tmp_path, "mlx5_1", state="1: DOWN")
    check = doctor.check_infiniband(NodeFacts(env={"NCCL_IB_HCA": "mlx5"}, profile="ib", in_job=True), tmp_path)
    assert check.status == WARN and "1 of 2 ports active" in check.summary  # a port down
    check = doctor.check_infiniband(NodeFacts(env={"NCCL_IB_HCA": "=mlx5_1"}, profile="ib", in_job=True), tmp_path)
    assert check.status == FAIL and "none matches NCCL_IB_HCA==mlx5_1" in check.summary
    check = doctor.check_infiniband(NodeFacts(env={"NCCL_IB_HCA": "^mlx5_1"}, profile="ib", in_job=True), tmp_path)
    assert check.status == OK and "1 match" in check.summary  # the down port is excluded anyway


def test_missing_infiniband_fails_only_where_the_profile_needs_it(tmp_path):
    assert doctor.check_infiniband(NodeFacts(env={"NCCL_IB_HCA": "mlx5"}, profile="ib", in_job=True), tmp_path).status == FAIL
    assert doctor.check_infiniband(NodeFacts(env={"NCCL_IB_HCA": "mlx5"}, profile="ib"), tmp_path).status == WARN
    assert doctor.check_infiniband(NodeFacts(env={"NCCL_IB_HCA": "mlx5", "NCCL_IB_DISABLE": "1"}), tmp_path).status == OK


def test_roce_gid_index_must_be_roce_v2(tmp_path):
    fake_ib(tmp_path, "mlx5_0", layer="Ethernet", gid_type="IB/RoCE v1")
    check = doctor.check_infiniband(NodeFacts(env={"NCCL_IB_HCA": "mlx5", "NCCL_IB_GID_INDEX": "3"}, profile="roce"), tmp_path)
    assert check.status == WARN and "RoCE v1" in check.summary


def test_socket_interfaces_named_by_the_profile(tmp_path):
    write(tmp_path / "class" / "net" / "ib0" / "operstate", "up\n")
    write(tmp_path / "class" / "net" / "eth0" / "operstate", "down\n")
    ok = doctor.check_interfaces(NodeFacts(env={"NCCL_SOCKET_IFNAME": "ib"}), tmp_path)
    assert [c.status for c in ok] == [OK] and "ib0 up" in ok[0].summary
    bad = doctor.check_interfaces(
        NodeFacts(env={"NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "^ib"}, in_job=True), tmp_path
    )
    assert [c.status for c in bad] == [FAIL, FAIL] and "eth0 (down)" in bad[0].summary


def test_slurm_partition_state(plugins):
    from hpc_train.config.loader import load_site

    site = load_site("sandbox").config
    site = dataclasses.replace(site, slurm_conf=None)
    outputs = {"--version": (0, "slurm 23.11.4\n"), "-h": (0, "cpu|up|1|idle\ncpu|up|1|drained\ngpu|down|2|idle\n")}
    check = doctor.check_slurm(NodeFacts(site=site), lambda cmd: outputs[cmd[1]])
    assert check.status == FAIL and "partition gpu is down" in check.summary
    assert "cpu: up, 1 drained, 1 idle" in check.details
    check = doctor.check_slurm(
        NodeFacts(site=site), lambda cmd: (1, "sinfo: error: Unable to contact slurm controller (connect failure)")
    )
    assert check.status == FAIL and "Unable to contact" in check.summary


def test_packages_per_backend(plugins):
    have = {"torch": "2.13.0"}
    builtins = {name: plugins.backend(name) for name in ("torchrun", "deepspeed")}  # each declares `requires`
    check = doctor.check_packages(builtins, installed=have.get)
    assert check.status == WARN and "torchrun" in check.summary and "deepspeed (needs deepspeed)" in check.summary
    assert doctor.check_packages({"torchrun": builtins["torchrun"]}, installed={}.get).status == FAIL

    class Mine(Backend):  # a third-party backend's own declaration is what doctor checks
        name = "mine"
        requires = ("torch", "mine-framework")

    assert "mine (needs mine-framework)" in doctor.check_packages({"mine": Mine}, installed=have.get).summary
    # the hint installs what the backends declare, not a list of built-in names
    fix = doctor.check_packages({**builtins, "mine": Mine}, installed=have.get).fix
    assert fix is not None and fix.endswith("pip install deepspeed mine-framework")


def test_doctor_cli_on_this_machine_without_gpu(python_env):
    code = (
        "import sys, runpy; sys.argv=['hpc_train','doctor','--site','local','--json']\n"
        "try: runpy.run_module('hpc_train', run_name='__main__')\nexcept SystemExit: pass\n"
        "print('HEAVY=' + ','.join(m for m in ('torch','deepspeed','horovod') if m in sys.modules), file=sys.stderr)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=python_env, timeout=120, check=False
    )
    report = json.loads(out.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["gpus"]["summary"].startswith("no GPU on this machine")
    assert checks["slurm"]["status"] == OK and "local site" in checks["slurm"]["summary"]
    assert checks["versions"]["status"] == OK and "torch 2." in checks["versions"]["summary"]
    assert {"infiniband", "python packages", "site config"} <= set(checks)
    assert "HEAVY=\n" in out.stderr + "\n" and "HEAVY=torch" not in out.stderr  # no torch import on the login side


def test_report_formatting_and_round_trip():
    report = doctor.Report("n1", "login node", [doctor.Check("gpus", WARN, "no GPU", "do this", ["detail"])])
    text = doctor.format_report(report)
    assert "WARN  gpus  no GPU" in text and "→ do this" in text and text.rstrip().endswith("0 ok, 1 warning(s), 0 failure(s)")
    assert doctor.Report.from_dict(report.to_dict()).to_dict() == report.to_dict()


# -- nsys, for --profile nsys --------------------------------------------------------------------------
NSYS_VERSION = "NVIDIA Nsight Systems version 2024.5.1.113-245134619542v0\n"  # `nsys --version` on an H100 node


def nsys_runner(found: bool, calls: list[list[str]] | None = None, gpu: bool = True):
    def run(cmd):
        if calls is not None:
            calls.append(cmd)
        if cmd[0] == "nvidia-smi":
            return (0, "GPU 0: NVIDIA H100 80GB HBM3\n") if gpu else (None, "")
        return (0, NSYS_VERSION) if found else (None, "")

    return run


def test_nsys_is_checked_where_the_site_says_it_is():
    calls: list[list[str]] = []
    site = load_site("sandbox").config
    site = dataclasses.replace(site, tools=dataclasses.replace(site.tools, nsys="/opt/nsight/bin/nsys"))
    check = doctor.check_nsys(NodeFacts(site=site, in_job=True), nsys_runner(True, calls))
    assert calls == [["/opt/nsight/bin/nsys", "--version"]]
    assert check.status == OK and check.summary.startswith("Nsight Systems 2024.5.1.113 (/opt/nsight/bin/nsys)")


def test_nsys_missing_on_a_compute_node_is_said_with_the_fix():
    check = doctor.check_nsys(NodeFacts(site=load_site("sandbox").config, in_job=True), nsys_runner(False))
    assert check.status == WARN and "'nsys' not found: --profile nsys would fail on this node" in check.summary
    assert check.fix is not None and "tools.nsys" in check.fix
    cpu = doctor.check_nsys(NodeFacts(site=load_site("sandbox").config, in_job=True), nsys_runner(False, gpu=False))
    assert cpu.status == OK and "has nothing to trace" in cpu.summary  # a CPU node: nothing for nsys to do
    login = doctor.check_nsys(NodeFacts(site=load_site("sandbox").config), nsys_runner(False))
    assert login.status == OK and "`doctor --submit` checks the compute nodes" in login.summary


def test_a_site_without_nsys_is_no_warning(site_dir):
    (site_dir / "bare.yaml").write_text("extends: local\ntools:\n  nsys: null\n")
    calls: list[list[str]] = []
    check = doctor.check_nsys(NodeFacts(site=load_site("bare").config, in_job=True), nsys_runner(False, calls))
    assert check.status == OK and "tools.nsys: null" in check.summary and calls == []
    assert "nsys" in {c.name for c in doctor.diagnose(NodeFacts(), recorded("a100"), sys_root=Path("/nonexistent")).checks}
