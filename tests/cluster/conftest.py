"""Fixtures for the sandbox self-tests (same fixtures as tests/e2e/conftest.py)."""
import importlib.util
import sys
from pathlib import Path


def _load_sandbox_fixtures():
    name = "hpc_train_sandbox_pytest"
    mod = sys.modules.get(name)
    if mod is None:
        path = Path(__file__).resolve().parent / "pytest_sandbox.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
    return mod


_fx = _load_sandbox_fixtures()
slurm_cluster = _fx.slurm_cluster
sandbox_job_root = _fx.sandbox_job_root
