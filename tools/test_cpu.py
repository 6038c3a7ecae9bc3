"""Where make test's CPU goes, per test: every process a test starts (its subprocesses, the Slurm jobs it
submits and their ranks) inherits PYTEST_CURRENT_TEST, so reading /proc once a second attributes each
process's CPU to the test that caused it. On this 2-core machine make test is CPU-bound (the cores ~90%
busy), so a test's CPU seconds, not its wall time, are what it costs the run.

    python tools/test_cpu.py sample OUT.json     # until SIGTERM/SIGINT (tools/make_test.sh: HPC_TRAIN_TEST_CPU=1)
    python tools/test_cpu.py report OUT.json [N]  # per file and the N costliest tests

With HPC_TRAIN_TEST_CPU_MARKS (a folder) a rank forked by tests/rank_launcher.py names its test there, and
with HPC_TRAIN_TEST_CPU_INPROC (a file) each test's CPU in its pytest worker is added (tests/cpu_meter.py).

A process that lives less than a second may be missed, and the last second of each is; without
HPC_TRAIN_TEST_CPU_INPROC the test process's own CPU (in-process tests) is not counted. Linux only,
standard library only.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import time
from pathlib import Path

MARK = b"PYTEST_CURRENT_TEST="


def _read(pid: str, tick: int, marks: Path | None) -> tuple[str, float, str] | None:
    """(start time, CPU seconds, the test) of a process that has the variable; None otherwise or gone. A rank
    forked by tests/rank_launcher.py names its test in MARKS (its environ is its server's)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes().decode(errors="replace")
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    at = env.find(MARK)
    if at < 0:
        return None
    test = env[at + len(MARK) : env.find(b"\0", at)].decode(errors="replace")
    try:
        test = (marks / f"{pid}:{fields[19]}").read_text() if marks else test
    except OSError:
        pass
    return fields[19], cpu, test.rsplit(" (", 1)[0]


def kind(pid: str) -> str:
    """What a process is, in a few words: its program and the module or script it runs ("python -m
    torch.distributed.run", "python train.py", "slurmstepd"), read once per process."""
    try:
        argv = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return "?"
    if not argv:
        return "?"
    words = [os.path.basename(argv[0])]
    rest = iter(argv[1:])
    for arg in rest:
        if arg == "-m":
            words += ["-m", next(rest, "")]
            break
        if not arg.startswith("-"):
            words.append(os.path.basename(arg))
            break
    return " ".join(words)


def sample(out: Path) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    marks = Path(os.environ["HPC_TRAIN_TEST_CPU_MARKS"]) if os.environ.get("HPC_TRAIN_TEST_CPU_MARKS") else None
    seen: dict[str, list] = {}  # "pid:start" -> [test, cpu seconds, kind]
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    rounds = 0
    while not stop:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            found = _read(pid, tick, marks)
            if found:
                start, cpu, test = found
                key = f"{pid}:{start}"
                seen[key] = [test, cpu, seen[key][2] if key in seen else kind(pid)]
        rounds += 1
        if rounds % 30 == 0 or stop:
            out.write_text(json.dumps(seen))
        time.sleep(1)
    out.write_text(json.dumps(seen))


def report(path: Path, top: int, inproc: Path | None = None) -> None:
    seen = json.loads(path.read_text())
    # the tests' own CPU in their pytest worker (tests/cpu_meter.py), as one more "process" each
    lines = inproc.read_text().splitlines() if inproc and inproc.exists() else []
    for n, line in enumerate(lines):
        test, cpu = json.loads(line)
        seen[f"inproc:{n}"] = [test, cpu, "the test itself (its pytest worker)"]
    tests: collections.Counter[str] = collections.Counter()
    files: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for test, cpu, *what in seen.values():
        tests[test] += cpu
        files[test.split("::")[0]] += cpu
        kinds[what[0] if what else "?"] += cpu
        counts[what[0] if what else "?"] += 1
    print(f"CPU of the processes the tests started: {sum(tests.values()):.0f} s in {len(seen)} processes")
    for name, cpu in files.most_common(15):
        print(f"{cpu:7.0f} s  {name}")
    print("by what the processes were (CPU, processes, mean):")
    for name, cpu in kinds.most_common(15):
        print(f"{cpu:7.0f} s  {counts[name]:5d}  {cpu / counts[name]:5.1f} s  {name}")
    print(f"the {top} costliest tests:")
    for name, cpu in tests.most_common(top):
        print(f"{cpu:7.0f} s  {name}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("sample", "report"):
        sys.exit(__doc__)
    if sys.argv[1] == "sample":
        sample(Path(sys.argv[2]))
    else:
        inproc = os.environ.get("HPC_TRAIN_TEST_CPU_INPROC")
        report(Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 20, Path(inproc) if inproc else None)
