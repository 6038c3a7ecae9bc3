"""The plugin manager: entry points, failure containment, disabling, duplicates, hook docs."""

from __future__ import annotations

import inspect
import sys

import pytest

from hpc_train import Backend, hookimpl
from hpc_train.api import make_job, render_plan, resolve_site
from hpc_train.cli import main
from hpc_train.errors import ConfigError, PluginError
from hpc_train.plugin import hookspecs
from hpc_train.plugin.manager import default_plugins, get_plugin_manager
from hpc_train.submission.plan import build_plan
from tests.conftest import write


@pytest.fixture
def fake_distribution(tmp_path, monkeypatch):
    """Install a distribution with hpc_train entry points onto sys.path (real importlib.metadata)."""

    def make(name: str, entry_points: dict[str, str], modules: dict[str, str], files: dict[str, str] | None = None) -> None:
        root = tmp_path / f"dist-{name}"
        info = root / f"{name}-1.2.3.dist-info"
        write(info / "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
        lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
        write(info / "entry_points.txt", f"[hpc_train]\n{lines}\n")
        for module, text in modules.items():
            write(root / f"{module.replace('.', '/')}.py", text)
        for path, text in (files or {}).items():
            write(root / path, text)
        # RECORD lists what the distribution installed, as pip writes it
        record = [f"{m.replace('.', '/')}.py,," for m in modules] + [f"{p},," for p in files or {}]
        write(info / "RECORD", "\n".join(record) + "\n")
        monkeypatch.syspath_prepend(str(root))
        for module in modules:
            for loaded in [m for m in sys.modules if m == module or m.startswith(module.split(".")[0] + ".")]:
                sys.modules.pop(loaded, None)
            sys.modules.pop(module.split(".")[0], None)

    return make


def test_builtin_torchrun_comes_through_the_entry_point_group(plugins):
    assert "torchrun" in plugins.backends
    info = {p.name: p for p in plugins.info()}
    assert info["torchrun"].distribution == "hpc_train"
    assert "hpc_train_backends" in info["torchrun"].hooks


def test_broken_plugin_is_reported_and_the_rest_work(fake_distribution):
    fake_distribution(
        "broken-site", {"broken": "broken_mod"}, {"broken_mod": "raise ImportError('no module named cuda_stuff')\n"}
    )
    plugins = get_plugin_manager()
    assert "torchrun" in plugins.backends
    [failure] = [f for f in plugins.failures if f.name == "broken"]
    assert failure.distribution == "broken-site"
    assert "no module named cuda_stuff" in failure.error


def test_disable_plugins_by_name(monkeypatch):
    monkeypatch.setenv("HPC_TRAIN_DISABLE_PLUGINS", "torchrun")
    assert "torchrun" not in get_plugin_manager().backends


def test_duplicate_backend_names_both_plugins(fake_distribution):
    fake_distribution(
        "other-torchrun",
        {"other": "other_mod"},
        {
            "other_mod": (
                "from hpc_train import Backend, hookimpl\n"
                "class T(Backend):\n    name = 'torchrun'\n"
                "@hookimpl\ndef hpc_train_backends():\n    return [T]\n"
            )
        },
    )
    with pytest.raises(PluginError) as info:
        _ = get_plugin_manager().backends  # the duplicate is found when the backends are collected
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
        assert any(
            word in doc
            for word in ("concatenated", "collected", "first non-None", "Merged", "merged", "searched", "ignored", "Precedence")
        ), spec.__name__
        assert "return" in spec.__annotations__, spec.__name__


def test_the_core_never_imports_the_builtin_plugins():
    import re

    from tests.conftest import REPO

    imports = re.compile(r"^\s*(from|import)\s+hpc_train_backends\b|import_module\([\"']hpc_train_backends", re.M)
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "hpc_train").rglob("*.py") if imports.search(p.read_text())]
    assert offenders == [], f"core modules import plugins/: {offenders}"


# -- site scoping -------------------------------------------------------------------------
def plan_on(plugins, site, **options):
    job = make_job(site=site, script="train.py", workdir="/home/alice/project", python="/opt/venv/bin/python", **options)
    return build_plan(job, resolve_site(site, plugins), plugins)


def env_of(plan):
    return {e.name: (e.value, e.source) for e in plan.env}


class Policy:
    """A site plugin's per-job hooks; ``sites`` is what it declares (None: it declares nothing)."""

    def __init__(self, tag, sites=None):
        self.tag = tag
        if sites is not None:
            self.hpc_train_site_names = hookimpl(lambda: sites)

    @hookimpl
    def hpc_train_job_env(self, job, site, backend):
        return {f"{self.tag}_ENV": "1"}

    @hookimpl
    def hpc_train_sbatch_directives(self, job, site, backend):
        return {"comment": self.tag}

    @hookimpl
    def hpc_train_validate_job(self, job, site):
        return [f"{self.tag} says no"] if job.nodes > 1 else []

    @hookimpl
    def hpc_train_template_context(self, plan):
        return {self.tag: True}


def test_a_plugins_hooks_apply_only_to_the_sites_it_names():
    plugins = get_plugin_manager(extra_plugins=(("acme", Policy("ACME", ["bluecloud"])),))
    on_site = plan_on(plugins, "bluecloud")
    assert env_of(on_site)["ACME_ENV"] == ("1", "plugins")
    assert ("comment", "ACME") in on_site.directives and on_site.extra == {"ACME": True}
    other = plan_on(plugins, "sandbox", nodes=2)  # the policy would refuse 2 nodes, but not here
    assert "ACME_ENV" not in env_of(other) and ("comment", "ACME") not in other.directives and other.extra == {}
    with pytest.raises(ConfigError) as info:
        plan_on(plugins, "bluecloud", nodes=2)
    assert "site policy (bluecloud): ACME says no" in str(info.value)


def test_site_names_are_patterns_and_plugins_that_name_none_apply_everywhere():
    plugins = get_plugin_manager(extra_plugins=(("blue", Policy("BLUE", ["blue*"])), ("audit", Policy("AUDIT"))))
    assert plugins.serves("blue", "bluecloud") and not plugins.serves("blue", "sandbox")
    sandbox = env_of(plan_on(plugins, "sandbox"))
    assert "AUDIT_ENV" in sandbox and "BLUE_ENV" not in sandbox
    assert {"AUDIT_ENV", "BLUE_ENV"} <= set(env_of(plan_on(plugins, "bluecloud")))
    assert {p.name: p.sites for p in plugins.info()}["audit"] is None


def test_a_plugin_serves_the_sites_it_ships_unless_it_names_them(tmp_path):
    write(tmp_path / "sites" / "acme.yaml", "extends: generic-slurm\n")

    class Shipper(Policy):
        @hookimpl
        def hpc_train_site_dirs(self):
            return [tmp_path / "sites"]

    plugins = get_plugin_manager(extra_plugins=(("acme", Shipper("ACME")),))
    assert {p.name: p.sites for p in plugins.info()}["acme"] == ("acme",)
    assert "ACME_ENV" in env_of(plan_on(plugins, "acme"))
    assert "ACME_ENV" not in env_of(plan_on(plugins, "sandbox"))


def test_template_overrides_apply_only_to_the_plugins_sites(tmp_path):
    write(tmp_path / "sites" / "acme.yaml", "extends: generic-slurm\n")
    write(
        tmp_path / "templates" / "sbatch" / "base.sh.j2",
        '{% extends "default:sbatch/base.sh.j2" %}\n{% block setup %}\nsource /etc/acme.sh\n{{ super() }}{% endblock %}\n',
    )

    class Acme:
        @hookimpl
        def hpc_train_site_dirs(self):
            return [tmp_path / "sites"]

        @hookimpl
        def hpc_train_template_dirs(self):
            return [tmp_path / "templates"]

    plugins = get_plugin_manager(extra_plugins=(("acme", Acme()),))
    assert "source /etc/acme.sh" in render_plan(plan_on(plugins, "acme"), plugins)
    assert "source /etc/acme.sh" not in render_plan(plan_on(plugins, "sandbox"), plugins)
    assert plugins.template_dirs() == []  # no site: only plugins that serve every site


def test_site_names_must_be_a_list():
    class Oops:
        @hookimpl
        def hpc_train_site_names(self):
            return "acme"

    with pytest.raises(PluginError, match=r"(?s)hpc_train_site_names\(\) must return a list.*hint: return \['acme'\]"):
        get_plugin_manager(extra_plugins=(("oops", Oops()),)).info()


# -- two plugins, one site; broken plugins and their sites -----------------------------------
def site_plugin(folder):
    class Sites:
        @hookimpl
        def hpc_train_site_dirs(self):
            return [folder]

    return Sites()


def test_two_plugins_shipping_one_site_is_an_error_naming_both(tmp_path):
    for who in ("one", "two"):
        write(tmp_path / who / "acme.yaml", "extends: generic-slurm\n")
    plugins = get_plugin_manager(
        extra_plugins=(("acme-one", site_plugin(tmp_path / "one")), ("acme-two", site_plugin(tmp_path / "two")))
    )
    with pytest.raises(PluginError) as info:
        resolve_site("sandbox", plugins)
    message = str(info.value)
    assert "site 'acme' is provided by two plugins: 'acme-one'" in message and "'acme-two'" in message
    assert "HPC_TRAIN_DISABLE_PLUGINS=acme-two" in message


BROKEN = "import acme_fabric_bindings\n"  # not installed: ModuleNotFoundError


def test_a_site_from_a_broken_plugin_is_an_error_naming_plugin_distribution_and_error(fake_distribution):
    fake_distribution(
        "acme-hpc",
        {"acme": "acme_hpc.plugin"},
        {"acme_hpc.__init__": "", "acme_hpc.plugin": BROKEN},
        files={"acme_hpc/sites/acme.yaml": "extends: generic-slurm\n"},
    )
    plugins = get_plugin_manager()
    [failure] = [f for f in plugins.failures if f.name == "acme"]
    assert failure.sites == ("acme",) and failure.entry_point == "acme = acme_hpc.plugin"
    with pytest.raises(PluginError) as info:
        resolve_site("acme", plugins)
    message = str(info.value)
    assert "site 'acme' comes from plugin 'acme' (distribution acme-hpc 1.2.3), which failed to load" in message
    assert "No module named 'acme_fabric_bindings'" in message and "HPC_TRAIN_DISABLE_PLUGINS=acme" in message
    assert resolve_site("sandbox", plugins).name == "sandbox"  # the rest keep working


def test_a_user_file_does_not_hide_the_broken_plugin_behind_its_site(fake_distribution, site_dir):
    write(site_dir / "acme.yaml", "extends: generic-slurm\n")
    fake_distribution(
        "acme-hpc",
        {"acme": "acme_hpc.plugin"},
        {"acme_hpc.__init__": "", "acme_hpc.plugin": BROKEN},
        files={"acme_hpc/sites/acme.yaml": "extends: generic-slurm\n"},
    )
    with pytest.raises(PluginError, match="failed to load"):
        resolve_site("acme", get_plugin_manager())


def test_a_user_site_extending_a_broken_plugins_site_names_the_plugin(fake_distribution, site_dir):
    write(site_dir / "mine.yaml", "description: my tweaks\nextends: acme\n")
    fake_distribution(
        "acme-hpc",
        {"acme": "acme_hpc.plugin"},
        {"acme_hpc.__init__": "", "acme_hpc.plugin": BROKEN},
        files={"acme_hpc/sites/acme.yaml": "extends: generic-slurm\n"},
    )
    with pytest.raises(ConfigError) as info:
        resolve_site("mine", get_plugin_manager())
    message = str(info.value)
    assert "mine.yaml:2: extends: site 'acme' comes from plugin 'acme' (distribution acme-hpc 1.2.3)" in message
    assert "No module named 'acme_fabric_bindings'" in message


def test_unknown_site_with_a_broken_plugin_of_unknown_sites_names_the_plugin(fake_distribution):
    fake_distribution("mystery", {"mystery": "mystery_mod"}, {"mystery_mod": "raise RuntimeError('bad licence file')\n"})
    with pytest.raises(PluginError) as info:
        resolve_site("acme", get_plugin_manager())
    assert "unknown site 'acme'" in str(info.value) and "plugin 'mystery' (distribution mystery 1.2.3)" in str(info.value)
    assert "RuntimeError: bad licence file" in str(info.value)


def test_a_misspelt_hook_fails_that_plugin_only(fake_distribution):
    fake_distribution(
        "typo",
        {"typo": "typo_mod"},
        {"typo_mod": ("from hpc_train import hookimpl\n@hookimpl\ndef hpc_train_job_envs(job, site, backend):\n    return {}\n")},
    )
    plugins = get_plugin_manager()
    [failure] = [f for f in plugins.failures if f.name == "typo"]
    assert "unknown hook 'hpc_train_job_envs'" in failure.error
    assert "typo" not in {p.name for p in plugins.info()} and "torchrun" in plugins.backends


def test_only_the_named_distributions(fake_distribution):
    fake_distribution("other-torchrun", {"other": "other_mod"}, {"other_mod": "x = 1\n"})
    names = {p.name for p in get_plugin_manager(distributions={"hpc_train"}).info()}
    assert "torchrun" in names and "other" not in names


# -- plugins command and plugin subcommands --------------------------------------------------
@pytest.fixture
def fresh_default_plugins():
    default_plugins.cache_clear()
    yield
    default_plugins.cache_clear()


def test_plugins_lists_origin_hooks_sites_and_failures(fake_distribution, fresh_default_plugins, capsys):
    fake_distribution(
        "acme-hpc",
        {"acme": "acme_mod"},
        {
            "acme_mod": (
                "from hpc_train import hookimpl\n@hookimpl\ndef hpc_train_site_names():\n    return ['acme', 'acme-*']\n"
                "@hookimpl\ndef hpc_train_job_env(job, site, backend):\n    return {}\n"
            )
        },
    )
    fake_distribution(
        "broken-site", {"broken": "broken_mod"}, {"broken_mod": "raise ImportError('no module named cuda_stuff')\n"}
    )
    assert main(["plugins"]) == 1
    out = capsys.readouterr().out
    assert "acme (acme-hpc 1.2.3)" in out and "from:  entry point acme = acme_mod (" in out
    assert "hooks: hpc_train_job_env, hpc_train_site_names" in out and "sites: acme, acme-*" in out
    assert "broken (broken-site 1.2.3): FAILED to load: ImportError: no module named cuda_stuff" in out


COMMAND = """
from hpc_train import hookimpl
import types, argparse

def _register(sub):
    p = sub.add_parser("{name}", help="says hello")
    p.add_argument("who")
    return p

cmd = types.SimpleNamespace(name="{name}", register=_register, run=lambda args: print("hello", args.who) or 3)

@hookimpl
def hpc_train_cli_commands():
    return [cmd]
"""


def test_a_plugin_adds_a_subcommand(fake_distribution, fresh_default_plugins, capsys):
    fake_distribution("greeter", {"greeter": "greeter_mod"}, {"greeter_mod": COMMAND.format(name="greet")})
    assert main(["greet", "world"]) == 3
    assert capsys.readouterr().out == "hello world\n"


def test_broken_or_clashing_subcommands_never_break_help(fake_distribution, fresh_default_plugins, capsys):
    fake_distribution("clash", {"clash": "clash_mod"}, {"clash_mod": COMMAND.format(name="sites")})
    fake_distribution(
        "raiser",
        {"raiser": "raiser_mod"},
        {
            "raiser_mod": (
                "from hpc_train import hookimpl\n@hookimpl\ndef hpc_train_cli_commands():\n    raise KeyError('boom')\n"
            )
        },
    )
    fake_distribution("broken-site", {"broken": "broken_mod"}, {"broken_mod": "raise ImportError('nope')\n"})
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    captured = capsys.readouterr()
    assert "render" in captured.out and "sites" in captured.out
    assert "plugin 'clash': command 'sites' is already provided by a built-in command; skipped" in captured.err
    assert "plugin 'raiser': hpc_train_cli_commands() failed: KeyError: 'boom'" in captured.err
