"""Typed configuration: site files (YAML) and job specs, with errors that name file, key and line."""

from hpc_train.config.job import JobSpec
from hpc_train.config.loader import SiteRegistry, load_site
from hpc_train.config.models import Partition, SiteConfig

__all__ = ["JobSpec", "Partition", "SiteConfig", "SiteRegistry", "load_site"]
