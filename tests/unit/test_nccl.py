"""NCCL profiles: catalogue checks with did-you-mean, inheritance, the debug overlay, provenance in render."""

from __future__ import annotations

import pytest

from hpc_train.api import make_job
from hpc_train.config.loader import load_site
from hpc_train.errors import ConfigError
from hpc_train.fabric import nccl
from hpc_train.submission.plan import build_plan
from tests.conftest import write

SITE = """\
name: fab
extends: generic-slurm
default_partition: gpu
partitions:
  gpu:
    gpus_per_node: 8
    nccl_profile: ib
  cpu:
    gpus_per_node: 0
nccl_profiles:
  ib:
    NCCL_IB_HCA: mlx5
    NCCL_SOCKET_IFNAME: ib0
  ib-sharp:
    extends: ib
    NCCL_COLLNET_ENABLE: 1
    NCCL_SOCKET_IFNAME: ib1
"""


def plan_for(plugins, site_dir, text=SITE, **options):
    path = write(site_dir / "fab.yaml", text)
    job = make_job(site=str(path), script="train.py", workdir="/tmp", python="/usr/bin/python3", **options)
    return build_plan(job, load_site(str(path)), plugins)


def env_of(plan):
    return {v.name: (v.value, v.source) for v in plan.env}


@pytest.mark.parametrize(
    "typo, meant",
    [
        ("NCCL_IB_HAC", "NCCL_IB_HCA"),
        ("NCCL_SOCKET_IFNAM", "NCCL_SOCKET_IFNAME"),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLNG", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
        ("NCCL_P2P_DISABEL", "NCCL_P2P_DISABLE"),
    ],
)
def test_a_misspelt_variable_is_an_error_naming_the_real_one(typo, meant):
    issue = nccl.check_name(typo)
    assert issue is not None and issue.error and meant in issue.hint


def test_real_names_and_other_prefixes_pass():
    for name in ("NCCL_IB_HCA", "NCCL_NVLS_ENABLE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "FI_PROVIDER", "OMP_NUM_THREADS"):
        assert nccl.check_name(name) is None


def test_an_unknown_name_with_nothing_close_is_only_a_warning():
    issue = nccl.check_name("NCCL_SOMETHING_FROM_2030")
    assert issue is not None and not issue.error


def test_typo_in_a_profile_fails_the_site_load_with_file_and_line(site_dir):
    text = SITE.replace("    NCCL_SOCKET_IFNAME: ib0\n", "    NCCL_SOCKET_IFNAM: ib0\n")
    path = write(site_dir / "fab.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_site(str(path))
    message = str(err.value)
    assert "fab.yaml:11: nccl_profiles.ib:" in message  # the profile's line
    assert "NCCL_SOCKET_IFNAM" in message and "did you mean 'NCCL_SOCKET_IFNAME'?" in message


def test_typo_in_the_job_env_is_an_error():
    with pytest.raises(ConfigError, match="did you mean 'NCCL_IB_HCA'"):
        make_job(script="t.py", env={"NCCL_IB_HAC": "mlx5"})


def test_extends_of_an_unknown_profile_or_a_cycle_is_an_error(site_dir):
    path = write(site_dir / "fab.yaml", SITE.replace("extends: ib\n", "extends: ibb\n"))
    with pytest.raises(ConfigError, match=r"ib-sharp: extends unknown NCCL profile 'ibb'.*did you mean 'ib'"):
        load_site(str(path))
    cyclic = SITE.replace("  ib:\n", "  ib:\n    extends: ib-sharp\n")
    with pytest.raises(ConfigError, match="inheritance cycle"):
        load_site(str(write(site_dir / "fab.yaml", cyclic)))


def test_partition_default_profile_and_provenance(plugins, site_dir):
    env = env_of(plan_for(plugins, site_dir))
    assert env["NCCL_IB_HCA"] == ("mlx5", "nccl profile ib")
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == ("1", "site")


def test_inherited_variables_say_where_they_came_from(plugins, site_dir):
    plan = plan_for(plugins, site_dir, nccl_profile="ib-sharp")
    env = env_of(plan)
    assert env["NCCL_IB_HCA"] == ("mlx5", "nccl profile ib-sharp (from ib)")
    assert env["NCCL_SOCKET_IFNAME"] == ("ib1", "nccl profile ib-sharp")  # the child wins
    assert plan.nccl_profile == "ib-sharp"


def test_debug_overlay_stacks_on_the_partition_default(plugins, site_dir):
    plan = plan_for(plugins, site_dir, nccl_profile="+debug")
    env = env_of(plan)
    assert plan.nccl_profile == "ib+debug"
    assert env["NCCL_IB_HCA"][0] == "mlx5"
    assert env["NCCL_DEBUG"] == ("INFO", "nccl overlay debug")  # generic-slurm's debug profile
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"][0] == "1"
    assert plan.warnings == []  # debugging was asked for


def test_builtin_debug_overlay_when_the_site_has_none():
    values = nccl.overlay_values({}, "debug")
    assert {v.name for v in values} >= {"NCCL_DEBUG", "TORCH_DISTRIBUTED_DEBUG", "TORCH_NCCL_TRACE_BUFFER_SIZE"}


def test_job_env_beats_the_profile(plugins, site_dir):
    env = env_of(plan_for(plugins, site_dir, env={"NCCL_SOCKET_IFNAME": "eth9"}))
    assert env["NCCL_SOCKET_IFNAME"] == ("eth9", "job")


def test_unknown_profile_and_overlay_are_reported(plugins, site_dir):
    with pytest.raises(ConfigError, match=r"no NCCL profile 'ib-shrp'.*did you mean 'ib-sharp'"):
        plan_for(plugins, site_dir, nccl_profile="ib-shrp")
    with pytest.raises(ConfigError, match="no NCCL profile 'tracing' to overlay"):
        plan_for(plugins, site_dir, nccl_profile="ib+tracing")


def test_debug_variable_in_a_production_profile_is_a_warning_with_its_line(plugins, site_dir):
    text = SITE.replace("    NCCL_SOCKET_IFNAME: ib0\n", "    NCCL_SOCKET_IFNAME: ib0\n    NCCL_DEBUG: INFO\n")
    plan = plan_for(plugins, site_dir, text)
    assert len(plan.warnings) == 1
    warning = str(plan.warnings[0])
    assert "fab.yaml:14: nccl_profiles.ib.NCCL_DEBUG: debug-only NCCL_DEBUG=INFO left on in profile 'ib'" in warning
    assert not plan_for(plugins, site_dir, text.replace("NCCL_DEBUG: INFO", "NCCL_DEBUG: WARN")).warnings


def test_unknown_but_not_misspelt_name_is_a_warning(plugins, site_dir):
    text = SITE.replace("    NCCL_SOCKET_IFNAME: ib0\n", "    NCCL_SOCKET_IFNAME: ib0\n    NCCL_FUTURE_KNOB_XYZ: 1\n")
    plan = plan_for(plugins, site_dir, text)
    assert any("NCCL_FUTURE_KNOB_XYZ is not in hpc_train's catalogue" in str(w) for w in plan.warnings)


def test_shipped_sites_have_clean_profiles():
    for name in ("generic-slurm", "bluecloud", "sandbox"):
        site = load_site(name).config
        env_maps = {"env": site.env, **{f"partitions.{p}.env": v.env for p, v in site.partitions.items()}}
        assert nccl.site_findings(env_maps, site.nccl_profiles) == [], name
    profiles = load_site("generic-slurm").config.nccl_profiles
    for wanted in ("infiniband", "infiniband-ndr", "roce", "aws-efa", "slingshot", "single-node-nvlink", "pcie-consumer", "safe"):
        assert nccl.resolve(profiles, wanted), wanted
    resolved = {v.name: v.value for v in nccl.resolve(profiles, "infiniband-ndr")}
    assert resolved["NCCL_NVLS_ENABLE"] == "1" and resolved["NCCL_IB_HCA"] == "mlx5"
    assert resolved["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"  # from safe, two levels up
    assert {v.name: v.value for v in nccl.resolve(profiles, "pcie-consumer")}["NCCL_P2P_DISABLE"] == "1"


BUILTIN_SITES = ("local", "sandbox", "generic-slurm", "bluecloud")


@pytest.mark.parametrize("site_name", BUILTIN_SITES)
def test_every_shipped_profile_includes_the_safe_settings(site_name):
    # docs/fabric.md promises fail-fast settings on every profile: a profile that forgets `extends`
    # leaves a job with a dead rank hanging until its time limit
    profiles = load_site(site_name).config.nccl_profiles
    safe = {v.name: v.value for v in nccl.resolve(load_site("generic-slurm").config.nccl_profiles, "safe")}
    assert {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"} <= set(safe)
    for name in profiles:
        if name == nccl.DEBUG:  # an overlay, laid over a profile that has them
            continue
        resolved = {v.name: v.value for v in nccl.resolve(profiles, name)}
        assert safe.items() <= resolved.items(), f"{site_name}: profile {name!r} lacks the safe settings"
        if "NCCL_IB_HCA" in resolved:  # InfiniBand or RoCE: retries outlast a switch reroute
            assert "NCCL_IB_RETRY_CNT" in resolved, f"{site_name}: profile {name!r} has no NCCL_IB_RETRY_CNT"


def test_bluecloud_jobs_get_the_safe_settings(plugins):
    for partition in ("a100", "h100", "rtx4090"):
        job = make_job(site="bluecloud", script="train.py", partition=partition, workdir="/tmp", python="/usr/bin/python3")
        env = {var.name: var.value for var in build_plan(job, load_site("bluecloud"), plugins).env}
        assert env["TORCH_NCCL_ENABLE_MONITORING"] == "1", partition
        assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "600", partition
