"""``python -m hpc_train.runtime.launch.signal_guard --ignore USR2 -- -m torch.distributed.run ARGS``

``scancel --signal=USR2 JOB`` (an administrator, a preemption script) reaches every process of
every step: the ranks, which stop cleanly on it, and the launcher that forked them (torchrun), which
does not handle USR2 and dies of it, taking the step down while the ranks are still saving. A
signal ignored before ``exec`` stays ignored, so this guard ignores the job's stop signal and then
becomes the launcher. The ranks inherit the ignored disposition; hpc_train's runtime installs its
own handler for it (preemption.StopWatcher), so they still see the stop. Imports nothing heavy.
"""

from __future__ import annotations

import os
import signal
import sys

USAGE = "usage: python -m hpc_train.runtime.launch.signal_guard [--ignore SIGNAL]... -- PYTHON-ARGS..."


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ignored: list[signal.Signals] = []
    while argv and argv[0] != "--":
        flag = argv.pop(0)
        name = flag.partition("=")[2] if flag.startswith("--ignore=") else (argv.pop(0) if flag == "--ignore" and argv else "")
        try:
            ignored.append(signal.Signals["SIG" + name.upper().removeprefix("SIG")])
        except KeyError:
            print(f"hpc_train.runtime.launch.signal_guard: not a signal option: {flag!r} {name!r}\n{USAGE}", file=sys.stderr)
            return 2
    if len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    for signum in ignored:
        signal.signal(signum, signal.SIG_IGN)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, *argv[1:]])
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
