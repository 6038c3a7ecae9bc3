"""The ``hpc_train`` entry points: read through importlib.metadata once, then from the user's cache.

Listing entry points makes importlib.metadata import its parsers and read every installed
distribution: tens of milliseconds on each command, on a login node. The list changes only when a
distribution is installed, removed or rewritten, which adds or removes a metadata folder on
``sys.path`` or rewrites its ``entry_points.txt``; the cache entry records those folders and times and
is used only while they all still match.

Listed without a cache (the first command after an install, or ``HPC_TRAIN_NO_CACHE=1``), the same
folders are read directly, as importlib.metadata finds them, without importing it (17 ms with the
email parser it needs); the site files a distribution ships are looked up only when its plugin fails
to load, the one time they are named (reading the file lists took 25 ms on every command).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hpc_train._resources import cache_dir, write_atomic

FORMAT = 2
METADATA_SUFFIXES = (".dist-info", ".egg-info")
SITE_SUFFIXES = (".yaml", ".yml")
#: Folder names in a distribution's file list that hold site files (see ``shipped_sites``).
SITE_FOLDERS = ("sites", "site_configs")


@dataclass(frozen=True)
class EntryPoint:
    name: str
    value: str  # "package.module:attr"
    distribution: str | None
    version: str | None
    metadata_dir: str | None = None  # the distribution's .dist-info or .egg-info folder

    @property
    def sites(self) -> tuple[str, ...]:
        """The site files the distribution ships (named when the plugin is broken)."""
        return shipped_sites(self.module, self.metadata_dir)

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()

    def load(self) -> Any:
        """The object the entry point names (``module`` or ``module:attr.attr``; ``[extras]`` ignored)."""
        target = importlib.import_module(self.module)
        attrs = self.value.partition(":")[2].split("[")[0].strip()
        for attr in attrs.split(".") if attrs else ():
            target = getattr(target, attr)
        return target


def entry_points(group: str) -> list[EntryPoint]:
    """Every entry point of ``group``, in importlib.metadata's order."""
    stamps = _stamps()
    entry = _entry_file(group)
    if entry is not None:
        try:
            stored = json.loads(entry.read_text())
            if stored["format"] == FORMAT and stored["stamps"] == stamps:
                return [EntryPoint(**e) for e in stored["entry_points"]]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # missing or damaged: list them again
    found = _read(group)
    if entry is not None:
        _write(entry, {"format": FORMAT, "stamps": stamps, "entry_points": [asdict(e) for e in found]})
    return found


def _read(group: str) -> list[EntryPoint]:
    """As ``importlib.metadata.entry_points(group=group)``: the folders on sys.path in order, in each its
    .dist-info then its .egg-info folders, the first distribution of each name only."""
    found, seen = [], set()
    for folder in sys.path:
        dirs = sorted(_metadata_dirs(folder or os.getcwd()), key=lambda path: path.endswith(".egg-info"))
        for path in dirs:
            key = _normalized(os.path.basename(path).rpartition(".")[0].partition("-")[0])
            if key in seen:
                continue
            seen.add(key)
            entries = _group(os.path.join(path, "entry_points.txt"), group)
            if entries:
                name, version = _name_and_version(path)
                found += [EntryPoint(ep, value, name, version, path) for ep, value in entries]
    return found


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _group(path: str, group: str) -> list[tuple[str, str]]:
    """``name = value`` lines of section ``[group]`` of an entry_points.txt (an ini file)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    out, section = [], None
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == group and "=" in line:
            name, _, value = line.partition("=")
            out.append((name.strip(), value.strip()))
    return out


def _name_and_version(path: str) -> tuple[str | None, str | None]:
    """Name and Version from the header of METADATA (PKG-INFO in an .egg-info), which ends at a blank line."""
    fields: dict[str, str] = {}
    for file in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(path, file), encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.strip():
                        break
                    key, sep, value = line.partition(":")
                    if sep and key in ("Name", "Version"):
                        fields.setdefault(key, value.strip())
            break
        except OSError:
            continue
    return fields.get("Name"), fields.get("Version")


@functools.cache
def shipped_sites(module: str, metadata_dir: str | None) -> tuple[str, ...]:
    """The site files the distribution in ``metadata_dir`` ships, by name.

    Read from the distribution's file list (RECORD), so it works when the plugin cannot be
    imported. Only ``*.yaml`` files in a folder named ``sites`` or ``site_configs`` count; an
    editable install lists no package files, and then nothing is known.
    """
    if metadata_dir is None:
        return ()
    import importlib.metadata

    top = module.split(".")[0]
    try:
        files = importlib.metadata.PathDistribution(Path(metadata_dir)).files or []
    except Exception:  # a damaged RECORD must not turn one broken plugin into two
        return ()
    names = set()
    for file in files:
        path = PurePosixPath(str(file))
        if path.parts and path.parts[0] == top and path.suffix in SITE_SUFFIXES and path.parent.name in SITE_FOLDERS:
            names.add(path.stem)
    return tuple(sorted(names))


def _stamps() -> list[list[Any]]:
    """Every distribution's metadata folder on sys.path with its entry_points.txt time: a distribution
    installed, removed or rewritten changes the list (unrelated files, in the working folder say, do not)."""
    out: list[list[Any]] = []
    for folder in sys.path:
        for path in _metadata_dirs(folder or os.getcwd()):
            try:
                out.append([path, os.stat(os.path.join(path, "entry_points.txt")).st_mtime_ns])
            except OSError:
                out.append([path, None])
    return out


def _metadata_dirs(folder: str) -> Iterator[str]:
    try:
        with os.scandir(folder) as it:
            for item in it:
                if item.name.endswith(METADATA_SUFFIXES):
                    yield item.path
    except OSError:  # a file (a zip on sys.path) or an unreadable folder
        return


def _entry_file(group: str) -> Path | None:
    folder = cache_dir("entry_points")
    if folder is None:
        return None
    key = "\0".join([group, sys.executable])
    return folder / f"{group}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def _write(entry: Path, data: dict[str, Any]) -> None:
    write_atomic(entry, json.dumps(data).encode())
