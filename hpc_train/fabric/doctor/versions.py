"""The software: torch's build (read from its files, never imported) against the driver and the site's
modules, NCCL's wheel, and the backends' Python packages.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpc_train.fabric.doctor.report import FAIL, OK, WARN, Check


def torch_build() -> tuple[str | None, str | None]:
    """(torch version, CUDA it was built for) from the installed files, without importing torch."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None, None
    spec = importlib.util.find_spec("torch")
    cuda = None
    if spec is not None and spec.origin:
        text = (
            (Path(spec.origin).parent / "version.py").read_text(errors="replace")
            if (Path(spec.origin).parent / "version.py").is_file()
            else ""
        )
        found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([0-9.]+)['\"]", text, re.MULTILINE)
        cuda = found.group(1) if found else None
    return version, cuda


def nccl_wheel() -> str | None:
    for name in ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _major_minor(version: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_versions(
    driver_cuda: str | None,
    have_gpu: bool,
    site_modules: list[str],
    build: tuple[str | None, str | None] | None = None,
    nccl: str | None = None,
    in_job: bool = True,
) -> Check:
    version, torch_cuda = build if build is not None else torch_build()
    nccl = nccl if build is not None else nccl_wheel()
    if version is None and not in_job:  # the login side never imports torch; the jobs' python must have it
        return Check(
            "versions",
            WARN,
            "torch is not installed in this Python (a login node needs none)",
            "jobs do: install torch in the python they run (the site's `python`, else this one)",
        )
    if version is None:
        return Check("versions", FAIL, "torch is not installed in this Python", "pip install torch (the build for your CUDA)")
    parts = [f"torch {version}", f"built for CUDA {torch_cuda}" if torch_cuda else "CPU build"]
    parts.append(f"NCCL {nccl}" if nccl else "no NCCL wheel")
    if driver_cuda:
        parts.append(f"driver supports CUDA {driver_cuda}")
    summary = ", ".join(parts)
    module = next((m for m in site_modules if m.lower().startswith("nccl/")), None)
    if have_gpu and torch_cuda is None:
        return Check(
            "versions",
            FAIL,
            summary,
            "this torch cannot use the GPUs: install a CUDA build (pip install torch --index-url .../cu121)",
        )
    need, have = _major_minor(torch_cuda), _major_minor(driver_cuda)
    if have_gpu and need and have:
        if need[0] > have[0]:
            return Check(
                "versions",
                FAIL,
                summary,
                f"the driver is too old for this torch: upgrade the driver or install torch built for CUDA {have[0]}.x",
            )
        if need > have:
            return Check(
                "versions",
                WARN,
                summary,
                "torch was built for a newer CUDA minor than the driver supports: "
                "most kernels run (minor version compatibility), PTX JIT ones fail; upgrade the driver",
            )
    if module and nccl and module.split("/", 1)[1] != nccl:
        return Check(
            "versions",
            WARN,
            summary,
            f"the site loads module {module} but torch uses its bundled NCCL {nccl}; "
            "only LD_PRELOAD or a source build uses the module's",
        )
    return Check("versions", OK, summary)


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_packages(backends: Mapping[str, Any], installed: Callable[[str], str | None] = _installed) -> Check:
    ready: list[str] = []
    missing: list[str] = []
    wanted: dict[str, None] = {}  # what the unavailable backends declare they need, in order, once each
    for name, cls in sorted(backends.items()):
        absent = [pkg for pkg in cls.requires if installed(pkg) is None]
        wanted.update(dict.fromkeys(absent))
        (missing if absent else ready).append(f"{name} (needs {', '.join(absent)})" if absent else name)
    summary = f"backends ready: {', '.join(ready) or 'none'}" + (f"; unavailable: {', '.join(missing)}" if missing else "")
    install = f"pip install {' '.join(wanted)}"
    if not ready:
        return Check("python packages", FAIL, summary, f"{install} (or only what the backend you use needs)")
    if missing:
        return Check("python packages", WARN, summary, f"install what a backend needs before using it: {install}")
    return Check("python packages", OK, summary)
