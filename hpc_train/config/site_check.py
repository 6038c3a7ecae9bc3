"""What a site needs the installed plugins to check: its ``backends:`` section, and its fabric warnings.

Loading a site (hpc_train.config.loader) checks everything the site file says on its own; this is
the rest, with the same file:line. ``validate`` and ``render`` both run it (hpc_train.cli.validate_cmd),
so a site one of them refuses the other refuses too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpc_train.config.errors import Loc, dotted, problems_from_validation
from hpc_train.config.loader import display_path
from hpc_train.config.resolved import ResolvedSite
from hpc_train.config.validate import ValidationError, validate
from hpc_train.errors import Problem, did_you_mean
from hpc_train.fabric import nccl


def _where(resolved: ResolvedSite, key: str) -> tuple[str, int | None]:
    """The file and line of a dotted key, or of the nearest key above it the site file wrote."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        hit = resolved.provenance.get(".".join(parts[:end]))
        if hit is not None and hit[0]:
            return hit
    return display_path(resolved.path), None


def backend_problems(resolved: ResolvedSite, backends: Mapping[str, Any]) -> list[Problem]:
    """Each ``backends.NAME`` must be an installed backend, and its options valid for it."""
    problems: list[Problem] = []
    for name, options in resolved.config.backends.items():
        prefix: Loc = ("backends", name)
        if name not in backends:
            source, line = _where(resolved, dotted(prefix))
            problems.append(Problem(source, dotted(prefix), "no such backend", line, did_you_mean(name, backends, "backend")))
            continue
        model = backends[name].Options
        try:
            validate(model, options)
        except ValidationError as exc:
            problems += problems_from_validation(
                exc,
                model,
                source=lambda loc, p=prefix: _where(resolved, dotted(p + loc))[0],  # type: ignore[misc]
                line_of=lambda loc, p=prefix: _where(resolved, dotted(p + loc))[1],  # type: ignore[misc]
                prefix=prefix,
            )
    return problems


def site_warnings(resolved: ResolvedSite) -> list[Problem]:
    """Fabric settings worth a word (a debug variable left on, a name outside NCCL's catalogue), sorted."""
    site = resolved.config
    env_maps: dict[str, Mapping[str, str]] = {"env": site.env}
    env_maps.update({f"partitions.{name}.env": part.env for name, part in site.partitions.items()})
    out = []
    for finding in nccl.site_findings(env_maps, site.nccl_profiles):
        source, line = _where(resolved, finding.key)
        out.append(Problem(source, finding.key, finding.message, line, finding.hint))
    return sorted(out, key=Problem.sort_key)
