"""The plugin manager: entry points, failure containment, disabling, duplicates, hook docs."""

from __future__ import annotations

import inspect
import sys

import pytest

from hpc_train import Backend, hookimpl, hookspecs
from hpc_train.errors import PluginError
from hpc_train.plugins import get_plugin_manager
from tests.conftest import write


@pytest.fixture
def fake_distribution(tmp_path, monkeypatch):
    """Install a distribution with hpc_train entry points onto sys.path (real importlib.metadata)."""

    def make(name: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
        root = tmp_path / f"dist-{name}"
        info = root / f"{name}-1.2.3.dist-info"
        write(info / "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
        lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
        write(info / "entry_points.txt", f"[hpc_train]\n{lines}\n")
        for module, text in modules.items():
            write(root / f"{module}.py", text)
        monkeypatch.syspath_prepend(str(root))
        for module in modules:
            sys.modules.pop(module, None)

    return make


def test_builtin_torchrun_comes_through_the_entry_point_group(plugins):
    assert "torchrun" in plugins.backends
    info = {p.name: p for p in plugins.info()}
    assert info["torchrun"].distribution == "hpc_train"
    assert "hpc_train_backends" in info["torchrun"].hooks


def test_broken_plugin_is_reported_and_the_rest_work(fake_distribution):
    fake_distribution("broken-site", {"broken": "broken_mod"}, {"broken_mod": "raise ImportError('no module named cuda_stuff')\n"})
    plugins = get_plugin_manager()
    assert "torchrun" in plugins.backends
    [failure] = [f for f in plugins.failures if f.name == "broken"]
    assert failure.distribution == "broken-site"
    assert "no module named cuda_stuff" in failure.error


def test_disable_plugins_by_name(monkeypatch):
    monkeypatch.setenv("HPC_TRAIN_DISABLE_PLUGINS", "torchrun")
    assert "torchrun" not in get_plugin_manager().backends


def test_duplicate_backend_names_both_plugins(fake_distribution):
    fake_distribution("other-torchrun", {"other": "other_mod"}, {"other_mod": (
        "from hpc_train import Backend, hookimpl\n"
        "class T(Backend):\n    name = 'torchrun'\n"
        "@hookimpl\ndef hpc_train_backends():\n    return [T]\n")})
    with pytest.raises(PluginError) as info:
        get_plugin_manager().backends
    assert "'torchrun' is provided by two plugins" in str(info.value)
    assert "'other'" in str(info.value) and "'torchrun'" in str(info.value)


def test_third_party_backend_and_site_dirs(tmp_path):
    write(tmp_path / "sites" / "acme.yaml", "extends: generic-slurm\ndescription: ACME\n")

    class Echo(Backend):
        name = "echo"

        def launch(self, info):
            return ["echo", info.script]

    class Acme:
        @hookimpl
        def hpc_train_backends(self):
            return [Echo]

        @hookimpl
        def hpc_train_site_dirs(self):
            return [tmp_path / "sites"]

        @hookimpl
        def hpc_train_detect_site(self, hostname, environ):
            return "acme" if environ.get("ACME") else None

    plugins = get_plugin_manager(extra_plugins=(Acme(),))
    assert plugins.backends["echo"] is Echo
    assert plugins.detect_site(hostname="x", environ={"ACME": "1"}) == "acme"
    assert plugins.detect_site(hostname="x", environ={}) == "local"  # the trylast fallback
    from hpc_train.api import site_registry

    assert site_registry(plugins).sources["acme"].origin.startswith("plugin ")


def test_every_hookspec_is_typed_and_says_how_results_combine():
    specs = [f for name, f in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("hpc_train_")]
    assert len(specs) >= 9
    for spec in specs:
        doc = inspect.getdoc(spec) or ""
        assert "Return" in doc or "Called" in doc, spec.__name__
        assert any(word in doc for word in ("concatenated", "collected", "first non-None", "Merged", "merged",
                                             "searched", "ignored", "Precedence")), spec.__name__
        assert "return" in spec.__annotations__, spec.__name__


def test_the_core_never_imports_the_builtin_plugins():
    from tests.conftest import REPO

    offenders = [str(p.relative_to(REPO)) for p in (REPO / "hpc_train").rglob("*.py")
                 if "hpc_train_plugins" in p.read_text()]
    assert offenders == [], f"core modules import plugins/: {offenders}"
