"""Build the plugin manager and call hooks through a typed facade.

Plugins come from the ``hpc_train`` entry-point group (the built-ins too). Each entry point loads
inside its own try/except: a broken plugin is recorded and reported, the rest keep working.
``HPC_TRAIN_DISABLE_PLUGINS=name1,name2`` switches entry points off by name.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from hpc_train import hookspecs
from hpc_train.errors import PluginError, UnknownNameError

if TYPE_CHECKING:
    from hpc_train.backend import Backend
    from hpc_train.config.job import JobSpec
    from hpc_train.config.models import SiteConfig
    from hpc_train.handle import JobHandle
    from hpc_train.plan import JobPlan

ENTRY_POINT_GROUP = "hpc_train"


@dataclass(frozen=True)
class PluginInfo:
    name: str
    module: str
    distribution: str | None
    version: str | None
    hooks: tuple[str, ...]


@dataclass(frozen=True)
class PluginFailure:
    name: str
    distribution: str | None
    error: str
    detail: str


class _Defaults:
    """Core fallbacks, registered like any plugin and called last."""

    @hookspecs.hookimpl(trylast=True)
    def hpc_train_detect_site(self, hostname: str, environ: Mapping[str, str]) -> str | None:
        return "local"


class Plugins:
    """A plugin manager plus typed, keyword-only calls of every hook."""

    def __init__(self, pm: pluggy.PluginManager, failures: list[PluginFailure], dists: dict[str, tuple[str | None, str | None]]) -> None:
        self.pm = pm
        self.failures = failures
        self._dists = dists

    # -- discovery -----------------------------------------------------------------
    def info(self) -> list[PluginInfo]:
        out = []
        for name, plugin in self.pm.list_name_plugin():
            if isinstance(plugin, _Defaults):
                continue
            dist, version = self._dists.get(name, (None, None))
            hooks = tuple(sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or []))
            out.append(PluginInfo(name, getattr(plugin, "__name__", type(plugin).__name__), dist, version, hooks))
        return sorted(out, key=lambda p: p.name)

    def _owner(self, impl: pluggy.HookImpl) -> str:
        return impl.plugin_name

    @functools.cached_property
    def backends(self) -> dict[str, type[Backend]]:
        found: dict[str, type[Backend]] = {}
        owners: dict[str, str] = {}
        for impl in self.pm.hook.hpc_train_backends.get_hookimpls():
            for cls in impl.function() or []:
                name = getattr(cls, "name", None)
                if not isinstance(name, str):
                    raise PluginError(f"plugin {impl.plugin_name!r} returned a backend without a name: {cls!r}")
                if name in found:
                    raise PluginError(
                        f"backend {name!r} is provided by two plugins: {owners[name]!r} and {impl.plugin_name!r}",
                        hint="uninstall one, or disable it with HPC_TRAIN_DISABLE_PLUGINS",
                    )
                found[name] = cls
                owners[name] = impl.plugin_name
        return found

    def backend(self, name: str) -> type[Backend]:
        if name not in self.backends:
            raise UnknownNameError("backend", name, self.backends)
        return self.backends[name]

    def site_dirs(self) -> list[tuple[Path, str]]:
        dirs = []
        for impl in self.pm.hook.hpc_train_site_dirs.get_hookimpls():
            for folder in impl.function() or []:
                dirs.append((Path(folder), f"plugin {impl.plugin_name}"))
        return dirs

    def template_dirs(self) -> list[Path]:
        return [Path(d) for result in self.pm.hook.hpc_train_template_dirs() for d in (result or [])]

    # -- calls ---------------------------------------------------------------------
    def detect_site(self, hostname: str, environ: Mapping[str, str]) -> str:
        return self.pm.hook.hpc_train_detect_site(hostname=hostname, environ=environ)

    def validate_job(self, job: JobSpec, site: SiteConfig) -> list[str]:
        return [p for result in self.pm.hook.hpc_train_validate_job(job=job, site=site) for p in (result or [])]

    def sbatch_directives(self, job: JobSpec, site: SiteConfig, backend: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for result in reversed(self.pm.hook.hpc_train_sbatch_directives(job=job, site=site, backend=backend)):
            merged.update(result or {})
        return merged

    def job_env(self, job: JobSpec, site: SiteConfig, backend: str) -> dict[str, str]:
        merged: dict[str, str] = {}
        for result in reversed(self.pm.hook.hpc_train_job_env(job=job, site=site, backend=backend)):
            merged.update({k: str(v) for k, v in (result or {}).items()})
        return merged

    def template_context(self, plan: JobPlan) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for result in reversed(self.pm.hook.hpc_train_template_context(plan=plan)):
            merged.update(result or {})
        return merged

    def after_submit(self, handle: JobHandle, plan: JobPlan) -> None:
        self.pm.hook.hpc_train_after_submit(handle=handle, plan=plan)


def disabled_plugins(environ: Mapping[str, str] | None = None) -> set[str]:
    environ = os.environ if environ is None else environ
    return {name.strip() for name in environ.get("HPC_TRAIN_DISABLE_PLUGINS", "").split(",") if name.strip()}


def get_plugin_manager(extra_plugins: tuple[object, ...] = (), load_entry_points: bool = True) -> Plugins:
    """A fresh manager: hookspecs, core defaults, entry points (minus disabled ones), then extras."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(_Defaults(), name="hpc_train.defaults")
    failures: list[PluginFailure] = []
    dists: dict[str, tuple[str | None, str | None]] = {}
    if load_entry_points:
        disabled = disabled_plugins()
        seen: set[str] = set()
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist.metadata["Name"] if ep.dist else None
            version = ep.dist.version if ep.dist else None
            if ep.name in disabled or ep.name in seen:
                continue
            seen.add(ep.name)
            try:
                plugin = ep.load()
                pm.register(plugin, name=ep.name)
            except Exception as exc:  # a broken plugin must not break the tool
                failures.append(PluginFailure(ep.name, dist, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
                continue
            dists[ep.name] = (dist, version)
    for plugin in extra_plugins:
        pm.register(plugin)
    pm.check_pending()
    return Plugins(pm, failures, dists)


@functools.cache
def default_plugins() -> Plugins:
    """The process-wide manager the CLI and the Python API use unless given one."""
    return get_plugin_manager()
