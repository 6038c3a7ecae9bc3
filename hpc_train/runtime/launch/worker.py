"""``python -m hpc_train.runtime.launch.worker [--local-rank-arg] -- SCRIPT ARGS``: one task → one worker.

srun and mpirun start one process per rank but set only their own variables. This shim exports the
torch.distributed ones (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...) so any script, gloo and
DeepSpeed included, finds its place, then replaces itself with the script. It imports no framework.
``--local-rank-arg`` adds ``--local_rank=N`` as the deepspeed launcher does, and records that it did
(``hpc_train.runtime.launch.argv``): a script that imports ``hpc_train.runtime`` gets it taken off again.
"""

from __future__ import annotations

import os
import sys

from hpc_train.runtime.launch.argv import mark
from hpc_train.runtime.launch.environment import detect


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    local_rank_arg = False
    while argv and argv[0] != "--":
        flag = argv.pop(0)
        if flag == "--local-rank-arg":
            local_rank_arg = True
        else:
            print(f"hpc_train.runtime.launch.worker: unknown option {flag!r}", file=sys.stderr)
            return 2
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python -m hpc_train.runtime.launch.worker [--local-rank-arg] -- SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script, *args = argv[1:]
    env = detect()
    os.environ.update(env.as_torch_env())
    if local_rank_arg:
        added = [f"--local_rank={env.local_rank}"]
        args = [*added, *args]
        # execv keeps the process id: the record is for the script this process becomes, not its children
        os.environ.update(mark(added, os.getpid()))
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-u", script, *args])
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
