"""Find, read, inherit (``extends:``) and validate site files.

Search order for a site name: ``$HPC_TRAIN_SITE_PATH`` folders › the user's config folder ›
folders contributed by plugins › the built-in ``site_configs/``. ``--site`` may also be a path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_train import contract
from hpc_train._resources import builtin_dir
from hpc_train.config import site_cache
from hpc_train.config.errors import problems_from_validation
from hpc_train.config.models import SiteConfig
from hpc_train.config.resolved import ResolvedSite
from hpc_train.config.slurm_time import format_slurm_time, parse_slurm_time
from hpc_train.config.text import kind_of, unsafe_char
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
    for entry in os.environ.get(contract.ENV_SITE_PATH, "").split(os.pathsep):
        if entry:
            dirs.append((Path(entry).expanduser(), f"${contract.ENV_SITE_PATH}"))
    dirs.append((user_site_dir(), "user"))
    dirs.extend(plugin_dirs)
    dirs.append((builtin_dir("site_configs"), "builtin"))
    return dirs


class SiteRegistry:
    """All site files visible from the search path; the first folder that has a name wins."""

    def __init__(
        self, search_dirs: Sequence[tuple[Path, str]], check: Callable[[str, Collection[str]], None] | None = None
    ) -> None:
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
                for path in _listing(folder):
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
            what = "is a folder, not a site file" if candidate.is_dir() else "site file not found"
            raise ConfigError(Problem(name_or_path, "", what))
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
        unsafe: list[Problem] = []  # characters no value may hold, found file by file
        data, provenance, chain = self._load_chain(path, [], digests, unsafe)
        data.setdefault("name", path.stem)  # a parent's name was dropped in the merge
        try:
            config = validate(SiteConfig, data)
        except ValidationError as exc:

            def source_of(loc: Loc) -> str:
                return _lookup(provenance, loc)[0] or display_path(path)

            def line_of(loc: Loc) -> int | None:
                return _lookup(provenance, loc)[1]

            found = problems_from_validation(exc, SiteConfig, source_of, line_of)
            raise ConfigError(sorted(unsafe + _not_about(found, unsafe), key=Problem.sort_key)) from None
        problems = unsafe + check_site(config, provenance, display_path(path))
        if problems:
            raise ConfigError(sorted(problems, key=Problem.sort_key))
        provenance.setdefault(("name",), (display_path(path), None))  # from the file name
        flat = {".".join(map(str, loc)): value for loc, value in provenance.items()}
        return ResolvedSite(config, path, chain, flat, digests)

    def _load_chain(
        self,
        path: Path,
        seen: list[Path],
        digests: dict[str, str],
        unsafe: list[Problem],
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
        if data is None:  # an empty file, or only comments: a file that lost its contents, not a site
            raise ConfigError(
                Problem(
                    display, "", "the site file is empty", hint="a site needs at least one key, e.g. 'extends: generic-slurm'"
                )
            )
        if not isinstance(data, dict):
            raise ConfigError(Problem(display, "", f"a site file must be a mapping of keys, got {type(data).__name__}", 1))
        unsafe.extend(unsafe_text(data, lines, display))
        own: dict[Loc, tuple[str, int | None]] = {}
        _record(data, (), lines, display, own)
        parent_name = data.get("extends")
        if parent_name is None:
            return data, own, [path]
        if not isinstance(parent_name, str):
            raise ConfigError(
                Problem(display, "extends", f"expected a site name or path, got {parent_name!r}", lines.get(("extends",)))
            )
        try:
            parent_path = self.locate(parent_name, relative_to=path.parent)
        except (UnknownNameError, PluginError) as exc:
            raise ConfigError(Problem(display, "extends", exc.message, lines.get(("extends",)), exc.hint)) from None
        except ConfigError:  # a path with nothing there: name the line that points at it
            folder = (path.parent / Path(parent_name).expanduser()).is_dir()
            message = f"{parent_name!r} is a folder, not a site file" if folder else f"no site file at {parent_name!r}"
            raise ConfigError(Problem(display, "extends", message, lines.get(("extends",)))) from None
        parent, parent_prov, chain = self._load_chain(parent_path, seen + [path.resolve()], digests, unsafe)
        parent.pop("name", None)
        merged = deep_merge(parent, data)
        provenance = dict(parent_prov)
        # a child that replaces a whole list or scalar owns everything below it
        replaced = {own_loc for own_loc in own if not isinstance(_get(data, own_loc), dict)}
        for loc in list(provenance):
            if any(loc[:n] in replaced for n in range(len(loc) + 1)):
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


def _listing(folder: Path) -> list[Path]:
    """A search folder's entries; one that cannot be read is skipped like one that does not exist."""
    try:
        return sorted(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        return []


# setup lines are shell the admin writes: a multi-line block is fine there, nowhere else
_MULTILINE_OK: dict[Loc, str] = {("setup",): "\n\t"}


def unsafe_text(data: Any, lines: dict[Loc, int], display: str, loc: Loc = ()) -> list[Problem]:
    """Keys and text holding control or invisible formatting characters (hpc_train.config.text):
    they reach the job script, the terminal and squeue, where they hide or change what a value says."""
    problems: list[Problem] = []
    if isinstance(data, dict):
        for key, value in data.items():
            here = loc + (str(key),)
            char = unsafe_char(str(key))
            if char is not None:
                problems.append(
                    Problem(display, ".".join(map(str, here)), f"a key must not contain {kind_of(char)}", lines.get(here))
                )
                continue
            problems += unsafe_text(value, lines, display, here)
    elif isinstance(data, list):
        for index, item in enumerate(data):
            problems += unsafe_text(item, lines, display, loc + (index,))
    elif isinstance(data, str):
        char = unsafe_char(data, allow=_MULTILINE_OK.get(loc[:-1], ""))
        if char is not None:
            problems.append(
                Problem(display, ".".join(map(str, loc)), f"must not contain {kind_of(char)}", _lookup_line(lines, loc))
            )
    return problems


def _lookup_line(lines: dict[Loc, int], loc: Loc) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _not_about(found: list[Problem], unsafe: list[Problem]) -> list[Problem]:
    """The model's problems, less those about a value already reported for its characters."""

    def covered(problem: Problem) -> bool:
        return any(
            u.source == problem.source
            and (u.key == problem.key or u.key.startswith(problem.key + ".") or problem.key.startswith(u.key + "."))
            for u in unsafe
        )

    return [p for p in found if not covered(p)]


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
        problem(
            ("default_partition",),
            f"no partition named {config.default_partition!r}",
            did_you_mean(config.default_partition, config.partitions, "partition"),
        )
    for name, part in config.partitions.items():
        if part.nccl_profile is not None and part.nccl_profile not in config.nccl_profiles:
            problem(
                ("partitions", name, "nccl_profile"),
                f"no NCCL profile named {part.nccl_profile!r}",
                did_you_mean(part.nccl_profile, config.nccl_profiles, "profile"),
            )
    if config.container.runtime != "none" and not config.container.image:
        problem(("container", "image"), f"container runtime {config.container.runtime!r} needs an image")
    for name, part in config.partitions.items():
        for loc, message in _time_problems(config, part):
            problem(("partitions", name, *loc), message)
    return problems


def _time_problems(config: SiteConfig, part: Any) -> list[tuple[Loc, str]]:
    """A partition's default time against its limit and the requeue warning: what every job there would hit."""
    if part.default_time is None:
        return []
    default = parse_slurm_time(part.default_time)
    if part.max_time is not None and default > parse_slurm_time(part.max_time):
        return [
            (
                ("default_time",),
                f"{format_slurm_time(default)} is longer than max_time {format_slurm_time(parse_slurm_time(part.max_time))}",
            )
        ]
    grace = config.requeue.grace_seconds
    if config.scheduler == "slurm" and config.requeue.enabled and grace >= default:
        return [
            (
                ("default_time",),
                f"{format_slurm_time(default)} leaves no time before the requeue warning "
                f"(requeue.grace_seconds: {grace} s before the limit)",
            )
        ]
    return []


def load_site(name_or_path: str, plugin_dirs: Iterable[tuple[Path, str]] = ()) -> ResolvedSite:
    """Load one site by name or path, searching the default folders."""
    return SiteRegistry(default_search_dirs(plugin_dirs)).load(name_or_path)
