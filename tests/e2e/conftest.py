"""End-to-end fixtures: a real multi-node Slurm cluster on this machine.

  slurm_cluster     (session) brings tests/cluster/sandbox.sh up, sets os.environ["SLURM_CONF"]
                    for the session, yields a SandboxCluster (tests/cluster/harness.py) with
                    .up() .down() .env() .slurm_conf .run(cmd); tears down at the end unless
                    HPC_TRAIN_SANDBOX_KEEP=1 (which also reuses a cluster that is already up).
                    Missing Slurm binaries or non-root: the test FAILS with the install hint
                    (bash tests/cluster/install-deps.sh); it never skips.
  sandbox_job_root  a fresh job-folder root under $HPC_TRAIN_SANDBOX_DIR/jobs/ that every node
                    sees at the same path.

The fixture code lives in tests/cluster/pytest_sandbox.py and is loaded by file path, so this
works whatever pytest's rootdir or import mode, with or without __init__.py files.
"""
import importlib.util
import sys
from pathlib import Path


def _load_sandbox_fixtures():
    name = "hpc_train_sandbox_pytest"
    mod = sys.modules.get(name)
    if mod is None:
        path = Path(__file__).resolve().parent.parent / "cluster" / "pytest_sandbox.py"
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
SandboxCluster = _fx.SandboxCluster
slurm_cluster = _fx.slurm_cluster
sandbox_job_root = _fx.sandbox_job_root
