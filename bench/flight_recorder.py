"""The flight recorder's cost per collective: all_reduce of a small tensor on gloo, with the recorder on
(TORCH_FR_BUFFER_SIZE=2000, as the plan sets it where the watchdog runs) against off, in the same run.

    python bench/flight_recorder.py [--calls 5000] [--repeats 3]

A small tensor on one process is the worst case: the collective itself costs almost nothing, so the
recorder's share shows; a real step's collectives take milliseconds.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys

PROBE = """
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1)
t, calls = torch.ones(1000), int(sys.argv[1])
for _ in range(200):
    dist.all_reduce(t)
start = time.perf_counter()
for _ in range(calls):
    dist.all_reduce(t)
print((time.perf_counter() - start) / calls)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def per_call(buffer: int, calls: int) -> float:
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": str(buffer), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    out = subprocess.run([sys.executable, "-c", PROBE, str(calls)], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    off, on = [], []
    for _ in range(args.repeats):  # interleaved: the machine's load drifts alike for both
        off.append(per_call(0, args.calls))
        on.append(per_call(2000, args.calls))
    base, recorded = statistics.median(off), statistics.median(on)
    print(f"all_reduce of 1000 floats, gloo, 1 process: recorder off {base * 1e6:.1f} us, on {recorded * 1e6:.1f} us")
    print(
        f"flight recorder: +{(recorded - base) * 1e6:.1f} us per collective (ratio {recorded / base:.2f} on this "
        "worst case: a tiny collective)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
