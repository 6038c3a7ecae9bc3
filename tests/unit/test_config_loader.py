"""Site files: discovery, extends, provenance, and errors that name file, key and line."""

from __future__ import annotations

import pytest

from hpc_train.config.loader import SiteRegistry, default_search_dirs, load_site
from hpc_train.errors import ConfigError, UnknownNameError
from tests.conftest import write


def test_builtin_sites_all_load():
    registry = SiteRegistry(default_search_dirs())
    assert {"local", "sandbox", "bluecloud", "generic-slurm"} <= set(registry.names())
    for name in registry.names():
        assert registry.load(name).config.name == name


def test_bluecloud_has_the_guides_partitions():
    site = load_site("bluecloud").config
    assert site.partitions["a100"].gpus_per_node == 8
    assert site.partitions["h100"].nccl_profile == "ib-ndr"
    assert site.nccl_profiles["pcie"]["NCCL_P2P_DISABLE"] == "1"  # YAML int became text
    assert site.scheduler == "slurm" and site.requeue.enabled


def test_unknown_site_suggests_close_names():
    with pytest.raises(UnknownNameError) as info:
        load_site("bluecloude")
    assert "unknown site 'bluecloude'" in str(info.value)
    assert "did you mean 'bluecloud'" in info.value.hint


def test_unknown_key_names_file_line_and_close_match(site_dir):
    write(site_dir / "mine.yaml", "scheduler: slurm\npartitions:\n  a100:\n    gpu_per_node: 8\n")
    with pytest.raises(ConfigError) as info:
        load_site("mine")
    message = str(info.value)
    assert "mine.yaml:4: partitions.a100.gpu_per_node: unknown key" in message
    assert "did you mean 'gpus_per_node'" in message


def test_wrong_type_names_expected_and_got(site_dir):
    write(site_dir / "mine.yaml", "partitions:\n  a100:\n    gpus_per_node: 8x\n")
    with pytest.raises(ConfigError) as info:
        load_site("mine")
    assert "mine.yaml:3: partitions.a100.gpus_per_node: expected an integer, got '8x'" in str(info.value)


def test_every_problem_is_reported_at_once(site_dir):
    write(site_dir / "mine.yaml", "schedular: slurm\nmaster_port: 80\ndefault_partition: gpu\npartitions:\n  cpu: {}\n")
    with pytest.raises(ConfigError) as info:
        load_site("mine")
    keys = {p.key for p in info.value.problems}
    assert {"schedular", "master_port"} <= keys
    assert "2 problems" in str(info.value)


def test_cross_field_problems(site_dir):
    write(site_dir / "mine.yaml", "default_partition: gpux\npartitions:\n  gpu:\n    nccl_profile: ibb\nnccl_profiles:\n  ib: {}\n")
    with pytest.raises(ConfigError) as info:
        load_site("mine")
    text = str(info.value)
    assert "mine.yaml:1: default_partition: no partition named 'gpux' (did you mean 'gpu'?)" in text
    assert "mine.yaml:4: partitions.gpu.nccl_profile: no NCCL profile named 'ibb' (did you mean 'ib'?)" in text


def test_yaml_syntax_error_gives_the_line(site_dir):
    write(site_dir / "mine.yaml", "scheduler: slurm\npartitions:\n  a100:\n    gpus_per_node: [8\n  h100: {}\n")
    with pytest.raises(ConfigError) as info:
        load_site("mine")
    problem = info.value.problems[0]
    assert problem.source.endswith("mine.yaml") and problem.line in (4, 5)
    assert "YAML syntax error" in problem.message


def test_duplicate_keys_are_errors(site_dir):
    write(site_dir / "mine.yaml", "env:\n  A: 1\n  A: 2\n")
    with pytest.raises(ConfigError) as info:
        load_site("mine")
    assert "mine.yaml:3: env.A: duplicate key" in str(info.value)


def test_extends_merges_and_records_provenance(site_dir):
    write(site_dir / "base.yaml", "env:\n  A: base\n  B: base\nmodules: [x, y]\n")
    write(site_dir / "child.yaml", "extends: base\nenv:\n  B: child\nmodules: [z]\n")
    resolved = load_site("child")
    assert resolved.config.env == {"A": "base", "B": "child"}
    assert resolved.config.modules == ["z"]  # lists are replaced, not appended
    assert resolved.provenance["env.A"][0].endswith("base.yaml")
    assert resolved.provenance["env.B"] == (resolved.provenance["env.B"][0], 3)
    assert resolved.provenance["env.B"][0].endswith("child.yaml")
    assert resolved.config.name == "child"
    assert [p.name for p in resolved.chain] == ["base.yaml", "child.yaml"]


def test_extends_cycle_is_an_error(site_dir):
    write(site_dir / "a.yaml", "extends: b\n")
    write(site_dir / "b.yaml", "extends: a\n")
    with pytest.raises(ConfigError) as info:
        load_site("a")
    assert "inheritance cycle" in str(info.value)


def test_extends_unknown_parent_points_at_the_line(site_dir):
    write(site_dir / "a.yaml", "description: x\nextends: generic-slurn\n")
    with pytest.raises(ConfigError) as info:
        load_site("a")
    assert "a.yaml:2: extends: unknown site 'generic-slurn'" in str(info.value)
    assert "generic-slurm" in str(info.value)


def test_site_path_overrides_builtin_and_site_may_be_a_path(site_dir, tmp_path):
    write(site_dir / "local.yaml", "scheduler: local\ndescription: mine\n")
    assert load_site("local").config.description == "mine"
    path = write(tmp_path / "elsewhere" / "cluster.yml", "description: by path\n")
    assert load_site(str(path)).config.description == "by path"


def test_missing_site_file_path():
    with pytest.raises(ConfigError) as info:
        load_site("./nope/cluster.yaml")
    assert "site file not found" in str(info.value)


def test_invalid_env_names_and_safe_partition_names(site_dir):
    write(site_dir / "mine.yaml", "env:\n  'BAD NAME': 1\npartitions:\n  'a;rm': {}\n")
    with pytest.raises(ConfigError) as info:
        load_site("mine")
    text = str(info.value)
    assert "not a valid environment variable name" in text
    assert "partition name 'a;rm' is not valid" in text
