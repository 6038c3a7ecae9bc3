"""A resolved site: the record the loader makes and its cache keeps, in a module of its own so the cache
does not import the loader that uses it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hpc_train.config.models import SiteConfig


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
