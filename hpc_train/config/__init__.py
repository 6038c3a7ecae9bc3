"""Typed configuration: site files (YAML) and job specs, with errors that name file, key and line.

Submodules load on first use: ``hpc_train.plugin.backend`` needs only ``fields``, and a command that reads
no site file should not pay for the YAML loader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpc_train.lazy import lazy_names

if TYPE_CHECKING:
    from hpc_train.config.job import JobSpec
    from hpc_train.config.loader import SiteRegistry, load_site
    from hpc_train.config.models import Partition, SiteConfig

_WHERE = {
    "JobSpec": "hpc_train.config.job",
    "SiteRegistry": "hpc_train.config.loader",
    "load_site": "hpc_train.config.loader",
    "Partition": "hpc_train.config.models",
    "SiteConfig": "hpc_train.config.models",
}

__getattr__, __dir__ = lazy_names(globals(), _WHERE)


__all__ = ["JobSpec", "Partition", "SiteConfig", "SiteRegistry", "load_site"]
