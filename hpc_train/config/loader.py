"""Find, read, inherit (``extends:``) and validate site files.

Search order for a site name: ``$HPC_TRAIN_SITE_PATH`` folders › the user's config folder ›
folders contributed by plugins › the built-in ``site_configs/``. ``--site`` may also be a path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train._resources import builtin_dir
from hpc_train.config import site_cache
from hpc_train.config.errors import problems_from_validation
from hpc_train.config.models import SiteConfig
from hpc_train.config.validate import ValidationError, validate
from hpc_train.errors import ConfigError, PluginError, Problem, UnknownNameError

if TYPE_CHECKING:
    from hpc_train.config.yaml_lines import Loc

SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class SiteSource:
    name: str
    path: Path
    origin: str  # "builtin", "$HPC_TRAIN_SITE_PATH", "user", or "plugin <name>"


@dataclass
class ResolvedSite:
    """A validated site and, for each dotted key, the file and line its value came from."""

    config: SiteConfig
    path: Path
    chain: list[Path]
    provenance: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)  # sha256 of each chain file as it was read (site_cache)

    @property
    def name(self) -> str:
        return self.config.name


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def user_site_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hpc_train" / "sites"


def default_search_dirs(plugin_dirs: Iterable[tuple[Path, str]] = ()) -> list[tuple[Path, str]]:
    dirs: list[tuple[Path, str]] = []
    for entry in os.environ.get("HPC_TRAIN_SITE_PATH", "").split(os.pathsep):
        if entry:
            dirs.append((Path(entry).expanduser(), "$HPC_TRAIN_SITE_PATH"))
    dirs.append((user_site_dir(), "user"))
    dirs.extend(plugin_dirs)
    dirs.append((builtin_dir("site_configs"), "builtin"))
    return dirs


class SiteRegistry:
    """All site files visible from the search path; the first folder that has a name wins."""

    def __init__(self, search_dirs: Sequence[tuple[Path, str]],
                 check: Callable[[str, Collection[str]], None] | None = None) -> None:
        self.search_dirs = list(search_dirs)
        # refuses a name that a broken plugin ships (Plugins.check_site), asked by name or through extends
        self.check = check
        self._sources: dict[str, SiteSource] | None = None
        self.shadowed: list[tuple[SiteSource, SiteSource]] = []

    @property
    def sources(self) -> dict[str, SiteSource]:
        if self._sources is None:
            found: dict[str, SiteSource] = {}
            for folder, origin in self.search_dirs:
                if not folder.is_dir():
                    continue
                for path in sorted(folder.iterdir()):
                    if path.suffix not in SUFFIXES or not path.is_file():
                        continue
                    source = SiteSource(path.stem, path, origin)
                    if path.stem in found:
                        self.shadowed.append((source, found[path.stem]))
                    else:
                        found[path.stem] = source
            self._sources = found
        return self._sources

    def names(self) -> list[str]:
        return sorted(self.sources)

    def locate(self, name_or_path: str, relative_to: Path | None = None) -> Path:
        """A site name or a path to a YAML file; paths are tried first when they look like one."""
        looks_like_path = os.sep in name_or_path or name_or_path.endswith(SUFFIXES)
        if looks_like_path:
            candidate = Path(name_or_path).expanduser()
            if relative_to is not None and not candidate.is_absolute():
                candidate = relative_to / candidate
            if candidate.is_file():
                return candidate
            raise ConfigError(Problem(name_or_path, "", "site file not found"))
        if self.check is not None:
            self.check(name_or_path, self.sources)
        source = self.sources.get(name_or_path)
        if source is None:
            raise UnknownNameError("site", name_or_path, self.sources)
        return source.path

    def load(self, name_or_path: str) -> ResolvedSite:
        path = self.locate(name_or_path)
        visible = {name: source.path for name, source in self.sources.items()}
        resolved = site_cache.read(path, visible)
        if resolved is None:
            resolved = self._load(path)
            site_cache.write(resolved, visible)
        return resolved

    def _load(self, path: Path) -> ResolvedSite:
        digests: dict[str, str] = {}
        data, provenance, chain = self._load_chain(path, [], digests)
        data.setdefault("name", path.stem)  # a parent's name was dropped in the merge
        try:
            config = validate(SiteConfig, data)
        except ValidationError as exc:
            def source_of(loc: Loc) -> str:
                return _lookup(provenance, loc)[0] or display_path(path)

            def line_of(loc: Loc) -> int | None:
                return _lookup(provenance, loc)[1]

            raise ConfigError(problems_from_validation(exc, SiteConfig, source_of, line_of)) from None
        problems = check_site(config, provenance, display_path(path))
        if problems:
            raise ConfigError(problems)
        provenance.setdefault(("name",), (display_path(path), None))  # from the file name
        flat = {".".join(map(str, loc)): value for loc, value in provenance.items()}
        return ResolvedSite(config, path, chain, flat, digests)

    def _load_chain(self, path: Path, seen: list[Path], digests: dict[str, str],
                    ) -> tuple[dict[str, Any], dict[Loc, tuple[str, int | None]], list[Path]]:
        from hpc_train.config.yaml_lines import (  # YAML only when no cached site will do
            parse_yaml,
            read_bytes,
        )

        display = display_path(path)
        if path.resolve() in seen:
            cycle = " -> ".join(display_path(p) for p in seen + [path.resolve()])
            raise ConfigError(Problem(display, "extends", f"inheritance cycle: {cycle}"))
        raw = read_bytes(path, display)
        digests[str(path)] = site_cache.digest(raw)
        data, lines = parse_yaml(raw, display)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(Problem(display, "", f"a site file must be a mapping of keys, got {type(data).__name__}", 1))
        own: dict[Loc, tuple[str, int | None]] = {}
        _record(data, (), lines, display, own)
        parent_name = data.get("extends")
        if parent_name is None:
            return data, own, [path]
        if not isinstance(parent_name, str):
            raise ConfigError(Problem(display, "extends", f"expected a site name or path, got {parent_name!r}", lines.get(("extends",))))
        try:
            parent_path = self.locate(parent_name, relative_to=path.parent)
        except (UnknownNameError, PluginError) as exc:
            raise ConfigError(Problem(display, "extends", exc.message, lines.get(("extends",)), exc.hint)) from None
        parent, parent_prov, chain = self._load_chain(parent_path, seen + [path.resolve()], digests)
        parent.pop("name", None)
        merged = deep_merge(parent, data)
        provenance = dict(parent_prov)
        for loc in list(provenance):
            # a child that replaces a whole list or scalar owns everything below it
            if any(loc[: len(own_loc)] == own_loc and not isinstance(_get(data, own_loc), dict) for own_loc in own):
                del provenance[loc]
        provenance.update(own)
        return merged, provenance, chain + [path]


def _get(data: Any, loc: Loc) -> Any:
    for part in loc:
        if isinstance(data, dict) and part in data:  # noqa: SIM114 (two branches: the list one narrows part to int)
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data


def _record(data: Any, loc: Loc, lines: dict[Loc, int], display: str, out: dict[Loc, tuple[str, int | None]]) -> None:
    out[loc] = (display, lines.get(loc))
    if isinstance(data, dict):
        for key, value in data.items():
            _record(value, loc + (str(key),), lines, display, out)


def _lookup(provenance: dict[Loc, tuple[str, int | None]], loc: Loc) -> tuple[str, int | None]:
    loc = tuple(str(p) if not isinstance(p, int) else p for p in loc)
    for end in range(len(loc), -1, -1):
        hit = provenance.get(tuple(str(p) for p in loc[:end]))
        if hit is not None:
            return hit
    return ("", None)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) is replaced by the child's value."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def check_site(config: SiteConfig, provenance: dict[Loc, tuple[str, int | None]], display: str) -> list[Problem]:
    """Cross-field rules the models cannot see on their own; every problem at once."""
    problems: list[Problem] = []

    def problem(loc: Loc, message: str, hint: str | None = None) -> None:
        source, line = _lookup(provenance, loc)
        problems.append(Problem(source or display, ".".join(map(str, loc)), message, line, hint))

    from hpc_train.errors import did_you_mean

    if config.default_partition and config.partitions and config.default_partition not in config.partitions:
        problem(("default_partition",), f"no partition named {config.default_partition!r}",
                did_you_mean(config.default_partition, config.partitions, "partition"))
    for name, part in config.partitions.items():
        if part.nccl_profile and part.nccl_profile not in config.nccl_profiles:
            problem(("partitions", name, "nccl_profile"), f"no NCCL profile named {part.nccl_profile!r}",
                    did_you_mean(part.nccl_profile, config.nccl_profiles, "profile"))
    if config.container.runtime != "none" and not config.container.image:
        problem(("container", "image"), f"container runtime {config.container.runtime!r} needs an image")
    return problems


def load_site(name_or_path: str, plugin_dirs: Iterable[tuple[Path, str]] = ()) -> ResolvedSite:
    """Load one site by name or path, searching the default folders."""
    return SiteRegistry(default_search_dirs(plugin_dirs)).load(name_or_path)
