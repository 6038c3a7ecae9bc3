"""Build the plugin manager and call hooks through a typed facade.

Plugins come from the ``hpc_train`` entry-point group (the built-ins too). Each entry point loads
inside its own try/except: a broken plugin is recorded and reported, the rest keep working.
``HPC_TRAIN_DISABLE_PLUGINS=name1,name2`` switches entry points off by name.

Site scoping lives here, so every caller gets it: a plugin's per-job hooks
(:data:`hpc_train.plugin.hookspecs.SITE_SCOPED_HOOKS`) are called only for the sites it serves.
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
import os
import traceback
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from hpc_train import contract
from hpc_train.errors import PluginError, UnknownNameError
from hpc_train.plugin import hookspecs
from hpc_train.plugin.entry_points import entry_points

if TYPE_CHECKING:
    from hpc_train.config.job import JobSpec
    from hpc_train.config.models import SiteConfig
    from hpc_train.jobs.handle import JobHandle
    from hpc_train.plugin.backend import Backend
    from hpc_train.plugin.hookspecs import CliCommand
    from hpc_train.submission.job_plan import JobPlan

ENTRY_POINT_GROUP = "hpc_train"
SITE_SUFFIXES = (".yaml", ".yml")
DISABLE_HINT = f"switch it off with {contract.ENV_DISABLE_PLUGINS}={{name}}"


@dataclass(frozen=True)
class PluginInfo:
    name: str
    module: str
    distribution: str | None
    version: str | None
    hooks: tuple[str, ...]
    entry_point: str | None = None  # "acme = acme_hpc.plugin"; None when registered in-process
    path: str | None = None  # the file the plugin's code lives in, when known
    sites: tuple[str, ...] | None = None  # the sites it serves; None: every site


@dataclass(frozen=True)
class PluginFailure:
    name: str
    distribution: str | None
    error: str
    detail: str
    version: str | None = None
    entry_point: str | None = None
    sites: tuple[str, ...] = ()  # site files the distribution ships (what users lose while it is broken)

    @property
    def origin(self) -> str:
        dist = f"distribution {self.distribution} {self.version or ''}".rstrip() if self.distribution else "unknown distribution"
        return f"plugin {self.name!r} ({dist})"


@dataclass(frozen=True)
class _Source:
    distribution: str | None
    version: str | None
    entry_point: str | None


@dataclass(frozen=True)
class _SiteConflict:
    site: str
    first: str
    first_path: Path
    second: str
    second_path: Path

    def __str__(self) -> str:
        return (
            f"site {self.site!r} is provided by two plugins: {self.first!r} ({self.first_path}) "
            f"and {self.second!r} ({self.second_path})"
        )


@dataclass
class _SiteFiles:
    """The site files each plugin ships through ``hpc_train_site_dirs``."""

    dirs: list[tuple[Path, str]] = field(default_factory=list)  # (folder, plugin name), in search order
    by_plugin: dict[str, dict[str, Path]] = field(default_factory=dict)  # plugin -> {site: file}
    conflicts: list[_SiteConflict] = field(default_factory=list)


class _Defaults:
    """Core fallbacks, registered like any plugin and called last."""

    @hookspecs.hookimpl(trylast=True)
    def hpc_train_detect_site(self, hostname: str, environ: Mapping[str, str]) -> str | None:
        return "local"


def _site_name(site: SiteConfig | str) -> str:
    return site if isinstance(site, str) else site.name


def _names(value: object, plugin: str, hook: str) -> list[Any]:
    """A hook's list result, with the mistake of returning a bare string caught."""
    if value is None:
        return []
    if isinstance(value, (str, bytes, os.PathLike)) or not isinstance(value, Collection):
        raise PluginError(
            f"plugin {plugin!r}: {hook}() must return a list, got {value!r}",
            hint=f"return [{value!r}]" if isinstance(value, (str, os.PathLike)) else None,
        )
    return list(value)


class Plugins:
    """A plugin manager plus typed, keyword-only calls of every hook."""

    def __init__(
        self,
        pm: pluggy.PluginManager,
        failures: list[PluginFailure],
        sources: Mapping[str, _Source | tuple[str | None, str | None]],
    ) -> None:
        self.pm = pm
        self.failures = failures
        self._sources = {name: s if isinstance(s, _Source) else _Source(s[0], s[1], None) for name, s in sources.items()}

    # -- discovery -----------------------------------------------------------------
    def info(self) -> list[PluginInfo]:
        """Every registered plugin (not the core defaults): where it came from, its hooks and sites."""
        out = []
        for name, plugin in self.pm.list_name_plugin():
            if isinstance(plugin, _Defaults):
                continue
            source = self._sources.get(name, _Source(None, None, None))
            hooks = tuple(sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or []))
            module = getattr(plugin, "__name__", None) or f"{type(plugin).__module__}.{type(plugin).__qualname__}"
            try:
                path = inspect.getsourcefile(plugin if inspect.ismodule(plugin) else type(plugin))
            except TypeError:
                path = None
            scope = self._scopes.get(name)
            out.append(
                PluginInfo(
                    name,
                    module,
                    source.distribution,
                    source.version,
                    hooks,
                    source.entry_point,
                    path,
                    tuple(sorted(scope)) if scope is not None else None,
                )
            )
        return sorted(out, key=lambda p: p.name)

    @functools.cached_property
    def backends(self) -> dict[str, type[Backend]]:
        found: dict[str, type[Backend]] = {}
        owners: dict[str, str] = {}
        for impl in self.pm.hook.hpc_train_backends.get_hookimpls():
            for cls in _names(impl.function(), impl.plugin_name, "hpc_train_backends"):
                name = getattr(cls, "name", None)
                if not isinstance(name, str):
                    raise PluginError(f"plugin {impl.plugin_name!r} returned a backend without a name: {cls!r}")
                if name in found:
                    raise PluginError(
                        f"backend {name!r} is provided by two plugins: {owners[name]!r} and {impl.plugin_name!r}",
                        hint=f"uninstall one, or disable it with {contract.ENV_DISABLE_PLUGINS}",
                    )
                found[name] = cls
                owners[name] = impl.plugin_name
        return found

    def backend(self, name: str) -> type[Backend]:
        if name not in self.backends:
            raise UnknownNameError("backend", name, self.backends)
        return self.backends[name]

    # -- sites ---------------------------------------------------------------------
    @functools.cached_property
    def _site_files(self) -> _SiteFiles:
        files = _SiteFiles()
        owner: dict[str, tuple[str, Path]] = {}
        for impl in self.pm.hook.hpc_train_site_dirs.get_hookimpls():  # registration order
            mine = files.by_plugin.setdefault(impl.plugin_name, {})
            for name in _names(impl.function(), impl.plugin_name, "hpc_train_site_dirs"):
                folder = Path(name)
                files.dirs.append((folder, impl.plugin_name))
                if not folder.is_dir():
                    continue
                for path in sorted(folder.iterdir()):
                    if path.suffix not in SITE_SUFFIXES or not path.is_file():
                        continue
                    first, first_path = owner.setdefault(path.stem, (impl.plugin_name, path))
                    if first != impl.plugin_name:
                        files.conflicts.append(_SiteConflict(path.stem, first, first_path, impl.plugin_name, path))
                    mine.setdefault(path.stem, path)
        return files

    def site_conflicts(self) -> list[str]:
        """Site names that two plugins ship (each message names both); empty when there are none."""
        return [str(c) for c in self._site_files.conflicts]

    def site_dirs(self) -> list[tuple[Path, str]]:
        """Plugin site folders in search order, each with its origin (``plugin NAME``).

        Raises PluginError when two plugins ship the same site name: which file wins would be an
        accident of installation order.
        """
        files = self._site_files
        if files.conflicts:
            raise PluginError(
                "; ".join(map(str, files.conflicts)),
                hint=f"uninstall one, or switch one off with {contract.ENV_DISABLE_PLUGINS}=" + files.conflicts[0].second,
            )
        return [(folder, f"plugin {name}") for folder, name in files.dirs]

    @functools.cached_property
    def _scopes(self) -> dict[str, frozenset[str] | None]:
        """Plugin name -> the site names (patterns) it serves; None for a plugin serving every site."""
        declared = {impl.plugin_name: impl for impl in self.pm.hook.hpc_train_site_names.get_hookimpls()}
        shipped = self._site_files.by_plugin
        scopes: dict[str, frozenset[str] | None] = {}
        for name, _plugin in self.pm.list_name_plugin():
            if name in declared:
                names = _names(declared[name].function(), name, "hpc_train_site_names")
                bad = [n for n in names if not isinstance(n, str)]
                if bad:
                    raise PluginError(f"plugin {name!r}: hpc_train_site_names() must return site names, got {bad[0]!r}")
                scopes[name] = frozenset(names)
            elif name in shipped:
                scopes[name] = frozenset(shipped[name])
            else:
                scopes[name] = None
        return scopes

    def serves(self, plugin_name: str, site: SiteConfig | str) -> bool:
        """Whether the named plugin's per-job hooks apply to jobs on ``site``."""
        scope = self._scopes.get(plugin_name)
        name = _site_name(site)
        return scope is None or any(fnmatch.fnmatchcase(name, pattern) for pattern in scope)

    def _hook(self, hook: str, site: SiteConfig | str | None) -> pluggy.HookCaller:
        """The hook with the plugins that do not serve ``site`` left out (None: only unscoped plugins)."""
        skip = [
            plugin
            for name, plugin in self.pm.list_name_plugin()
            if self._scopes.get(name) is not None and (site is None or not self.serves(name, site))
        ]
        return self.pm.subset_hook_caller(hook, skip)

    def check_site(self, name: str, known: Collection[str]) -> None:
        """Refuse a site a broken plugin would have provided, naming the plugin and its error.

        ``known`` are the site names visible now. A name the broken plugin ships is an error even
        when another folder has a file of that name: the site's policy hooks would be missing.
        """
        if os.sep in name or name.endswith(SITE_SUFFIXES):
            return  # a path: no plugin is involved in finding it
        for failure in self.failures:
            if name in failure.sites:
                raise PluginError(
                    f"site {name!r} comes from {failure.origin}, which failed to load: {failure.error}",
                    hint=f"ask your admin to fix or reinstall {failure.distribution or 'it'} "
                    "(`python -m hpc_train plugins` shows the error), or " + DISABLE_HINT.format(name=failure.name),
                )
        if name not in known:
            unsure = [f for f in self.failures if not f.sites]
            if unsure:
                broken = "; ".join(f"{f.origin}: {f.error}" for f in unsure)
                raise PluginError(
                    f"unknown site {name!r}, and plugins that may provide it failed to load: {broken}",
                    hint="`python -m hpc_train plugins` shows the errors; `python -m hpc_train sites` the known sites",
                )

    # -- calls ---------------------------------------------------------------------
    def template_dirs(self, site: SiteConfig | str | None = None) -> list[Path]:
        """Template folders of the plugins serving ``site`` (None: of plugins that serve every site)."""
        return [Path(d) for result in self._hook("hpc_train_template_dirs", site)() for d in (result or [])]

    def detect_site(self, hostname: str, environ: Mapping[str, str]) -> str:
        return self.pm.hook.hpc_train_detect_site(hostname=hostname, environ=environ)

    def validate_job(self, job: JobSpec, site: SiteConfig) -> list[str]:
        results = self._hook("hpc_train_validate_job", site)(job=job, site=site)
        return [p for result in results for p in (result or [])]

    def sbatch_directives(self, job: JobSpec, site: SiteConfig, backend: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for result in reversed(self._hook("hpc_train_sbatch_directives", site)(job=job, site=site, backend=backend)):
            merged.update(result or {})
        return merged

    def job_env(self, job: JobSpec, site: SiteConfig, backend: str) -> dict[str, str]:
        merged: dict[str, str] = {}
        for result in reversed(self._hook("hpc_train_job_env", site)(job=job, site=site, backend=backend)):
            merged.update({k: str(v) for k, v in (result or {}).items()})
        return merged

    def template_context(self, plan: JobPlan) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for result in reversed(self._hook("hpc_train_template_context", plan.site)(plan=plan)):
            merged.update(result or {})
        return merged

    def after_submit(self, handle: JobHandle, plan: JobPlan) -> None:
        self._hook("hpc_train_after_submit", plan.site)(handle=handle, plan=plan)

    def node_suspect(self, site: str, node: str, reason: str, job_id: str | None, job_folder: Path) -> None:
        self._hook("hpc_train_node_suspect", site)(site=site, node=node, reason=reason, job_id=job_id, job_folder=job_folder)

    def cli_commands(self, on_error: Callable[[str], None]) -> list[tuple[str, CliCommand]]:
        """(plugin name, command) for each plugin subcommand; problems go to ``on_error``, never raise."""
        out: list[tuple[str, CliCommand]] = []
        for impl in self.pm.hook.hpc_train_cli_commands.get_hookimpls():  # registration order
            try:
                commands = _names(impl.function(), impl.plugin_name, "hpc_train_cli_commands")
            except Exception as exc:  # a broken plugin must not break --help
                on_error(f"plugin {impl.plugin_name!r}: hpc_train_cli_commands() failed: {_describe(exc)}")
                continue
            for command in commands:
                if not isinstance(command, hookspecs.CliCommand) or not isinstance(getattr(command, "name", None), str):
                    on_error(
                        f"plugin {impl.plugin_name!r}: {command!r} is not a command "
                        "(it needs a `name`, `register(subparsers)` and `run(args)`)"
                    )
                    continue
                out.append((impl.plugin_name, command))
        return out


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def disabled_plugins(environ: Mapping[str, str] | None = None) -> set[str]:
    environ = os.environ if environ is None else environ
    return {name.strip() for name in environ.get(contract.ENV_DISABLE_PLUGINS, "").split(",") if name.strip()}


def get_plugin_manager(
    extra_plugins: tuple[object, ...] = (),
    load_entry_points: bool = True,
    *,
    distributions: Collection[str] | None = None,
) -> Plugins:
    """A fresh manager: hookspecs, core defaults, entry points (minus disabled ones), then extras.

    ``distributions`` limits the entry points to those of the named distributions (``{"hpc_train"}``:
    only the built-ins), as plugin tests want. ``extra_plugins`` are objects or modules, or
    ``(name, plugin)`` pairs to register under a chosen name.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(_Defaults(), name="hpc_train.defaults")
    failures: list[PluginFailure] = []
    sources: dict[str, _Source] = {}
    if load_entry_points:
        disabled = disabled_plugins()
        wanted = None if distributions is None else {_normalize(d) for d in distributions}
        seen: set[str] = set()
        for ep in entry_points(ENTRY_POINT_GROUP):
            dist, version = ep.distribution, ep.version
            if wanted is not None and (dist is None or _normalize(dist) not in wanted):
                continue
            if ep.name in disabled or ep.name in seen:
                continue
            seen.add(ep.name)
            where = f"{ep.name} = {ep.value}"
            try:
                plugin = ep.load()
                pm.register(plugin, name=ep.name)
                pm.check_pending()  # a hook name with a typo is this plugin's failure, not everyone's
            except Exception as exc:  # a broken plugin must not break the tool
                if pm.get_plugin(ep.name) is not None:
                    pm.unregister(name=ep.name)
                failures.append(PluginFailure(ep.name, dist, _describe(exc), traceback.format_exc(), version, where, ep.sites))
                continue
            sources[ep.name] = _Source(dist, version, where)
    for plugin in extra_plugins:
        if isinstance(plugin, tuple):
            pm.register(plugin[1], name=plugin[0])
        else:
            pm.register(plugin)
    pm.check_pending()
    return Plugins(pm, failures, sources)


def _normalize(distribution: str) -> str:
    return distribution.lower().replace("_", "-").replace(".", "-")


@functools.cache
def default_plugins() -> Plugins:
    """The process-wide manager the CLI and the Python API use unless given one."""
    return get_plugin_manager()


def hook_reference() -> str:
    """The hook reference in docs/plugins.md, generated from hookspecs.py (tests keep it in step)."""
    blocks = []
    for name, spec in vars(hookspecs).items():  # in the order of the contract
        if not (name.startswith("hpc_train_") and inspect.isfunction(spec)):
            continue
        annotations = dict(spec.__annotations__)
        returns = annotations.pop("return")
        params = ", ".join(f"{p}: {annotations[p]}" for p in inspect.signature(spec).parameters)
        opts = getattr(spec, f"{hookspecs.PROJECT}_spec", {}) or {}
        notes = []
        if opts.get("firstresult"):
            notes.append("first non-None result wins")
        notes.append(
            "site-scoped: called only for jobs on the sites the plugin serves"
            if name in hookspecs.SITE_SCOPED_HOOKS
            else "not site-scoped"
        )
        doc = inspect.getdoc(spec) or ""
        blocks.append(f"### `{name}({params}) -> {returns}`\n\n*{'; '.join(notes)}*\n\n{_md(doc)}\n")
    blocks.append(f"### `CliCommand`\n\n{_md(inspect.getdoc(hookspecs.CliCommand) or '')}\n")
    return "\n".join(blocks)


def _md(doc: str) -> str:
    """Docstring to Markdown: reST ``code`` to `code`, ``::`` blocks to fenced blocks."""
    out: list[str] = []
    lines = doc.replace("``", "`").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            out.append(line.rstrip()[:-1].rstrip() + ":" if line.strip() != "::" else "")
            i += 1
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith("    ")):
                block.append(lines[i][4:])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            while block and not block[0].strip():
                block.pop(0)
            out += ["", "```", *block, "```", ""]
            continue
        out.append(line)
        i += 1
    return "\n".join(out).replace(":class:", "").replace(":data:", "")
