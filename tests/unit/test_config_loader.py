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
    write(
        site_dir / "mine.yaml", "default_partition: gpux\npartitions:\n  gpu:\n    nccl_profile: ibb\nnccl_profiles:\n  ib: {}\n"
    )
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


# --- site files are hostile input -------------------------------------------------------------------


def _problems(site_dir, text: str | bytes, name: str = "mine") -> str:
    path = site_dir / f"{name}.yaml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(ConfigError) as info:
        load_site(name)
    return str(info.value)


def test_storage_keys_must_make_a_variable_name(site_dir):
    text = _problems(site_dir, 'storage:\n  datasets: /d\n  "a;touch /tmp/x;b": /e\n  my-data: /f\n')
    assert "mine.yaml:3: storage.a;touch /tmp/x;b: 'a;touch /tmp/x;b' is not a storage name" in text
    assert "mine.yaml:4: storage.my-data:" in text and "did you mean 'my_data'?" in text


def test_site_sbatch_keys_are_checked_like_the_jobs(site_dir):
    text = _problems(site_dir, 'sbatch:\n  "mail-type\\nnodes": END\npartitions:\n  p:\n    sbatch: {time: 5, "a b": 1}\n')
    assert "mine.yaml:2: sbatch.mail-type\\nnodes: a key must not contain newlines" in text
    assert "mine.yaml:5: partitions.p.sbatch.time: --time is set by hpc_train; use --time, or a partition's default_time" in text
    assert "partitions.p.sbatch.a B" not in text and "'a b' is not an sbatch long option name" in text


@pytest.mark.parametrize(
    "value, found",
    [
        ('"a\\x01"', "U+0001"),
        ('"x\\ny"', "U+000A (a newline)"),
        ('"evil\\u202egnp"', "U+202E RIGHT-TO-LEFT OVERRIDE"),
        ('"zero\\u200bwidth"', "U+200B ZERO WIDTH SPACE"),
        ('"x\\u2028y"', "U+2028 LINE SEPARATOR"),
    ],
)
def test_control_and_formatting_characters_are_refused_with_their_line(site_dir, value, found):
    text = _problems(site_dir, f"description: ok\npartitions:\n  p:\n    gpu_type: {value}\n    constraint: {value}\n")
    assert "mine.yaml:4: partitions.p.gpu_type: must not contain" in text and found in text
    assert "mine.yaml:5: partitions.p.constraint:" in text
    assert "\u202e" not in text and "\x01" not in text  # shown escaped, never as themselves


def test_setup_lines_may_be_a_multi_line_block(site_dir):
    write(site_dir / "mine.yaml", "setup:\n  - |\n    if true; then\n    \techo hi\n    fi\n")
    assert "echo hi" in load_site("mine").config.setup[0]


def test_alias_bomb_is_refused_at_once(site_dir):
    bomb = 'a0: &a0 ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10)
    )
    import time

    started = time.monotonic()
    text = _problems(site_dir, bomb)
    assert time.monotonic() - started < 10  # an unbounded expansion takes minutes; 10 s holds on a loaded machine
    assert "mine.yaml:6: this value holds more than 100000 values once its aliases are expanded" in text


@pytest.mark.parametrize(
    "yaml_text, fragment",
    [
        ("env: &e {A: *e}\n", "mine.yaml:1: an alias refers to the value that contains it"),
        ("backends:\n  torchrun: " + "{a: " * 80 + "1" + "}" * 80 + "\n", "mine.yaml:2: values are nested more than 64 levels"),
        ("env: " + "[" * 2000 + "]" * 2000 + "\n", "YAML syntax error"),
        ("master_port: !!int abc\n", "mine.yaml:1: master_port: cannot read 'abc' as a number"),
        ("description: !!binary aGVsbG8=\n", "mine.yaml:1: description: YAML tag !!binary is not supported here"),
        (
            "partitions:\n  3090: {}\n",
            "mine.yaml:2: partitions.3090: a key must be a name, this one is read as a number (quote it)",
        ),
        ("", "mine.yaml: the site file is empty"),
        ("# only a comment\n", "mine.yaml: the site file is empty"),
        ("extends: ./\n", "mine.yaml:1: extends: './' is a folder, not a site file"),
        ("extends: ./nope.yaml\n", "mine.yaml:1: extends: no site file at './nope.yaml'"),
        (
            "partitions:\n  p:\n    gpus_per_node: true\n",
            "mine.yaml:3: partitions.p.gpus_per_node: expected an integer, got True",
        ),
        ("partitions:\n  p:\n    mem_per_node: lots\n", "mine.yaml:3: partitions.p.mem_per_node: 'lots' is not a memory size"),
        ("template: ../../etc/passwd\n", "mine.yaml:1: template: '../../etc/passwd' is not a template name"),
        (
            'partitions:\n  p:\n    max_time: "1:00:00"\n    default_time: "2:00:00"\n',
            "mine.yaml:4: partitions.p.default_time: 02:00:00 is longer than max_time 01:00:00",
        ),
        (
            "requeue: {enabled: true}\npartitions:\n  p: {default_time: 1}\n",
            "mine.yaml:3: partitions.p.default_time: 00:01:00 leaves no time before the requeue warning",
        ),
        ("partitions:\n  p:\n    default_time: 1.5\n", "got 1.5 (quote it)"),
    ],
)
def test_broken_files_say_file_line_and_key(site_dir, yaml_text, fragment):
    assert fragment in _problems(site_dir, yaml_text)


def test_non_utf8_and_huge_files(site_dir):
    assert "mine.yaml:2: the file is not UTF-8 text" in _problems(site_dir, b"description: a\nenv: {A: caf\xe9}\n")
    assert "larger than 1 MiB" in _problems(site_dir, b"description: a\n#" + b"x" * (2 << 20) + b"\n")


def test_unquoted_times_mean_what_slurm_means(site_dir):
    from hpc_train.config.slurm_time import parse_slurm_time

    write(site_dir / "mine.yaml", "partitions:\n  p:\n    max_time: 12:00:00\n    default_time: 30:00\nenv: {T: 1:30}\n")
    site = load_site("mine").config
    assert parse_slurm_time(site.partitions["p"].max_time) == 12 * 3600  # not 43200 minutes
    assert parse_slurm_time(site.partitions["p"].default_time) == 30 * 60  # MM:SS, as sbatch reads it
    assert site.env["T"] == "1:30"


def test_merge_keys_share_partition_settings(site_dir):
    write(
        site_dir / "mine.yaml",
        "partitions:\n  a: &gpu\n    gpus_per_node: 8\n    max_nodes: 2\n  b:\n    <<: *gpu\n    max_nodes: 4\n",
    )
    resolved = load_site("mine")
    assert resolved.config.partitions["b"].gpus_per_node == 8 and resolved.config.partitions["b"].max_nodes == 4
    assert resolved.provenance["partitions.b.max_nodes"][1] == 7
    assert resolved.provenance["partitions.b.gpus_per_node"][1] == 3  # where the shared value is written


def test_a_bad_file_on_the_site_path_does_not_break_sites(site_dir):
    from hpc_train.cli.sites_cmd import run

    write(site_dir / "ok.yaml", "description: fine\n")
    write(
        site_dir / "bomb.yaml",
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"{c}: &{c} [" + ", ".join([f"*{p}"] * 10) + "]\n" for p, c in zip("abcde", "bcdef")),
    )
    write(site_dir / "ev\u202eil.yaml", "description: x\n")
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run(None) == 0
    text = out.getvalue()
    assert "fine" in text and "INVALID: " in text and "alias bomb" in text
    assert "\u202e" not in text and "ev\\u202eil" in text
