"""Resolved sites from the user's cache: used only while every file they came from is unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hpc_train.config.loader import load_site
from tests.conftest import write


def test_second_load_comes_from_the_cache_without_yaml(site_dir):
    write(site_dir / "base.yaml", "env:\n  A: base\n")
    write(site_dir / "child.yaml", "extends: base\nenv:\n  B: child\n")
    first = load_site("child")
    assert list(Path(os.environ["XDG_CACHE_HOME"], "hpc_train", "sites").glob("child-*.pickle"))
    code = (
        "import sys; from hpc_train.config.loader import load_site; r = load_site('child'); "
        "print(r.config.env, r.provenance['env.B'][1], 'yaml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd(), env=os.environ)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["{'A':", "'base',", "'B':", "'child'}", "3", "False"]
    assert first.config.env == {"A": "base", "B": "child"}


def test_an_edit_to_any_file_of_the_chain_is_seen_even_within_the_same_tick(site_dir):
    base = write(site_dir / "base.yaml", "partitions:\n  p:\n    gpus_per_node: 4\n")
    write(site_dir / "child.yaml", "extends: base\n")
    assert load_site("child").config.partitions["p"].gpus_per_node == 4
    stamp = base.stat()
    base.write_text("partitions:\n  p:\n    gpus_per_node: 8\n")  # same size
    os.utime(base, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # and the same time
    assert load_site("child").config.partitions["p"].gpus_per_node == 8


def test_a_new_file_on_the_search_path_changes_what_extends_finds(site_dir, tmp_path, monkeypatch):
    write(site_dir / "base.yaml", "description: shared\n")
    write(site_dir / "child.yaml", "extends: base\n")
    assert load_site("child").config.description == "shared"
    mine = tmp_path / "mine"
    write(mine / "base.yaml", "description: mine\n")
    monkeypatch.setenv("HPC_TRAIN_SITE_PATH", os.pathsep.join([str(mine), str(site_dir)]))
    assert load_site("child").config.description == "mine"


def test_a_site_with_errors_is_never_cached(site_dir):
    bad = write(site_dir / "s.yaml", "partitions:\n  p:\n    gpus_per_node: -1\n")
    for _ in range(2):
        try:
            load_site("s")
        except Exception as exc:
            assert "gpus_per_node" in str(exc)
        else:
            raise AssertionError("a bad site loaded")
    bad.write_text("partitions:\n  p:\n    gpus_per_node: 2\n")
    assert load_site("s").config.partitions["p"].gpus_per_node == 2
