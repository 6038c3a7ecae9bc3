"""The hpc_train entry points from the user's cache, listed again when what is installed changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hpc_train.plugin.entry_points import EntryPoint, entry_points
from tests.conftest import write

PROBE = """
import json, sys
sys.path[:0] = {extra!r}
from hpc_train.plugin.entry_points import entry_points
eps = entry_points("hpc_train")
print(json.dumps({{"eps": [[e.name, e.value, e.distribution, e.version] for e in eps],
                   "metadata": "importlib.metadata" in sys.modules}}))
"""


def probe(extra: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE.format(extra=extra)], capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def fake_dist(root, name: str, lines: str) -> None:
    info = root / f"{name}-1.0.dist-info"
    write(info / "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    write(info / "entry_points.txt", f"[hpc_train]\n{lines}\n")


def test_listed_once_then_read_from_the_cache(tmp_path):
    folder = tmp_path / "dists"
    fake_dist(folder, "acme-plugin", "acme = acme_mod")
    cold = probe([str(folder)])
    assert ["acme", "acme_mod", "acme-plugin", "1.0"] in cold["eps"]
    assert ["torchrun", "hpc_train_backends.torchrun", "hpc_train", "0.1.0"] in cold["eps"]
    warm = probe([str(folder)])
    assert warm["eps"] == cold["eps"] and not warm["metadata"]


def test_installing_removing_or_rewriting_a_distribution_is_seen(tmp_path):
    folder = tmp_path / "dists"
    folder.mkdir()
    probe([str(folder)])
    fake_dist(folder, "late-plugin", "late = late_mod")
    assert ["late", "late_mod", "late-plugin", "1.0"] in probe([str(folder)])["eps"]
    entry = folder / "late-plugin-1.0.dist-info" / "entry_points.txt"
    entry.write_text("[hpc_train]\nlate = late_mod2\n")
    os.utime(entry, ns=(entry.stat().st_atime_ns, entry.stat().st_mtime_ns + 10**9))
    assert ["late", "late_mod2", "late-plugin", "1.0"] in probe([str(folder)])["eps"]
    for f in (folder / "late-plugin-1.0.dist-info").iterdir():
        f.unlink()
    (folder / "late-plugin-1.0.dist-info").rmdir()
    assert not [e for e in probe([str(folder)])["eps"] if e[0] == "late"]


def test_load_follows_module_and_attribute_path(tmp_path, monkeypatch):
    write(tmp_path / "epmod.py", "class Outer:\n    class Inner:\n        value = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert EntryPoint("x", "epmod:Outer.Inner [extra]", None, None).load().value == 42
    assert EntryPoint("x", "epmod", None, None).load().__name__ == "epmod"


def test_builtins_come_through(monkeypatch, tmp_path):
    monkeypatch.setenv("HPC_TRAIN_NO_CACHE", "1")
    names = {e.name for e in entry_points("hpc_train")}
    assert {"torchrun", "deepspeed", "horovod", "mpi"} <= names


def test_read_without_importlib_metadata_finds_what_it_finds(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    fake_dist(first, "acme_plugin", "acme = acme_mod:Plugin [extra]\n# a comment\n\n[other_group]\nnot = ours")
    fake_dist(second, "acme_plugin", "acme = shadowed_mod")  # the same distribution further down sys.path
    egg = second / "eggy.egg-info"
    write(egg / "PKG-INFO", "Metadata-Version: 1.2\nName: eggy\nVersion: 2.0\n\nName: not-the-header\n")
    write(egg / "entry_points.txt", "[hpc_train]\n  eggy=eggy.plugin  \n")
    monkeypatch.syspath_prepend(str(second))
    monkeypatch.syspath_prepend(str(first))
    monkeypatch.setenv("HPC_TRAIN_NO_CACHE", "1")
    import importlib.metadata

    theirs = [
        (e.name, e.value, e.dist.metadata["Name"], e.dist.version) for e in importlib.metadata.entry_points(group="hpc_train")
    ]
    ours = [(e.name, e.value, e.distribution, e.version) for e in entry_points("hpc_train")]
    assert ours == theirs
    assert ("acme", "acme_mod:Plugin [extra]", "acme_plugin", "1.0") in ours and ("eggy", "eggy.plugin", "eggy", "2.0") in ours
    assert not [e for e in ours if e[1] == "shadowed_mod"]


def test_the_sites_a_distribution_ships_are_read_from_its_file_list(tmp_path):
    info = tmp_path / "acme_hpc-1.0.dist-info"
    write(info / "METADATA", "Metadata-Version: 2.1\nName: acme-hpc\nVersion: 1.0\n")
    write(
        info / "RECORD", "acme_hpc/__init__.py,,\nacme_hpc/sites/acme.yaml,,\nacme_hpc/sites/notes.txt,,\nother/sites/x.yaml,,\n"
    )
    assert EntryPoint("acme", "acme_hpc.plugin", "acme-hpc", "1.0", str(info)).sites == ("acme",)
    assert EntryPoint("acme", "acme_hpc.plugin", None, None).sites == ()
