"""Where remote commands go: ``--remote HOST``, and the ``remote:`` section of the user's config
(``~/.config/hpc_train/config.yaml``): the host when no flag names one, the login node's python (a venv's
``bin/python``) and the folder projects are copied to there."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_train.config.fields import Model, setting
from hpc_train.errors import ConfigError, Problem

DEFAULT_PYTHON = "python3"
DEFAULT_ROOT = "~/hpc_train/uploads"


@dataclass(frozen=True, kw_only=True)
class RemoteSettings(Model):
    """The ``remote:`` section of the user's config."""

    host: str | None = setting(None, "the login node as ssh names it (an alias of ~/.ssh/config, user@host)")
    python: str = setting(DEFAULT_PYTHON, "the login node's python with hpc_train installed (a venv's bin/python)")
    root: str = setting(DEFAULT_ROOT, "the folder on the login node that projects are copied to")


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hpc_train" / "config.yaml"


def load(path: Path | None = None) -> RemoteSettings:
    """The user's remote settings; the defaults when the file or its section is missing."""
    from hpc_train.config.errors import problems_from_validation
    from hpc_train.config.validate import ValidationError, validate
    from hpc_train.config.yaml_lines import parse_yaml, read_bytes

    path = path or config_path()
    if not path.is_file():
        return RemoteSettings()
    data, lines = parse_yaml(read_bytes(path, str(path)), str(path))
    if data is None:
        return RemoteSettings()
    if not isinstance(data, dict) or set(data) - {"remote"}:
        unknown = sorted(set(data) - {"remote"}) if isinstance(data, dict) else []
        raise ConfigError(Problem(str(path), ", ".join(unknown), "unknown key: the user's config has one section, remote"))
    section: Any = data.get("remote") or {}
    try:
        return validate(RemoteSettings, section)
    except ValidationError as exc:
        line_of = lambda loc: lines.get(("remote", *loc))  # noqa: E731
        raise ConfigError(problems_from_validation(exc, RemoteSettings, str(path), line_of, prefix=("remote",))) from None


def host_for(flag: str | None, settings: RemoteSettings) -> str | None:
    """The host a command goes to: the flag's, else the config's; None: run here."""
    return flag or settings.host
