"""Who is behind in a hang: read the ranks' heartbeats and stacks, name the rank(s) and host(s).

Pure functions over what the watchdog collected, so the rule is tested without a hang. The order of
evidence: a rank that never beat; a rank with fewer steps than the others; a rank that has not entered
a collective its peers wait in (the flight recorder's sequence numbers); a rank that did not answer
the request for stacks (stopped, or holding the GIL); a rank whose main thread is not waiting on the
others (not inside a collective or backward) while they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# frames of a main thread that waits on its peers: a collective, DDP's backward, a launcher's allreduce
# (MPI's and Horovod's waits are in C: the last Python frame is the runtime's gradient averaging)
_WAITING = re.compile(
    r"torch/distributed/|torch/autograd/|horovod/|mpi4py|deepspeed/(comm|runtime)|_runtime\.py|"
    r"in (all_reduce|allreduce|barrier|broadcast|all_gather|allgather|reduce_scatter|wait|"
    r"synchronize_gradients|any_ranks?|gather_object)\b"
)
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+", re.MULTILINE)
_CPU = re.compile(r", cpu ([0-9]+(?:\.[0-9]+)?) s$")  # the end of a dump's first line: the process's CPU time


@dataclass
class Culprit:
    rank: int
    host: str
    reason: str
    steps: int | None = None
    top: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "reason": self.reason, "steps": self.steps, "top": self.top}


def main_stack(dump: str) -> list[str]:
    """The frames (most recent first) of the thread that runs the script: the one with a <module> frame
    (the last one for ``python train.py``; ``python -m`` adds runpy's frames below it)."""
    blocks = [b for b in _THREAD.split(dump) if b.strip()]
    for block in blocks:
        frames = [line.strip() for line in block.splitlines() if line.strip().startswith("File ")]
        if any(frame.endswith("in <module>") for frame in frames):
            return frames
    return []


def cpu_seconds(dump: str) -> float | None:
    """The CPU time the rank's process had used when it wrote ``dump`` (its first line); None if not said."""
    found = _CPU.search(dump.split("\n", 1)[0])
    return float(found.group(1)) if found else None


def waiting(frames: list[str]) -> bool:
    return any(_WAITING.search(frame) for frame in frames)


def behind(
    beats: dict[int, dict[str, Any]], world: int, dumps: dict[int, str], flight: dict[int, dict[str, Any]] | None = None
) -> list[Culprit]:
    """The ranks holding the others up; [] when the evidence does not single anyone out."""
    missing = [rank for rank in range(world) if rank not in beats]
    if missing and len(missing) < world:
        return [Culprit(r, "?", "never started training (no heartbeat)") for r in missing]
    steps = {rank: int(beat.get("steps", 0)) for rank, beat in beats.items()}
    low, high = min(steps.values()), max(steps.values())
    if low < high:
        return [
            _culprit(r, beats, dumps, f"stopped at step {low} of this run; the others reached {high}")
            for r in sorted(steps)
            if steps[r] == low
        ]
    lagging = behind_in_collectives(flight or {})
    if lagging:
        return [_culprit(r, beats, dumps, why) for r, why in sorted(lagging.items())]
    silent = [rank for rank in beats if rank not in dumps]
    if silent and len(silent) < len(beats):
        return [
            _culprit(r, beats, dumps, "did not answer the request for stacks (stopped, or stuck holding the GIL)")
            for r in sorted(silent)
        ]
    stacks = {rank: main_stack(text) for rank, text in dumps.items()}
    busy = [rank for rank, frames in stacks.items() if frames and not waiting(frames)]
    if busy and len(busy) < len(stacks):
        return [_culprit(r, beats, dumps, "not inside the collective the others wait in") for r in sorted(busy)]
    return []


def last_collectives(record: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """From one rank's flight record: per process group, the newest collective it entered (number, name)."""
    newest: dict[str, tuple[int, str]] = {}
    for entry in record.get("entries") or []:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        group = entry.get("process_group") or ["?"]
        name, seq = str(group[0]), int(entry.get("collective_seq_id") or 0)
        if seq > newest.get(name, (-1, ""))[0]:
            newest[name] = (seq, str(entry.get("profiling_name") or "collective"))
    return newest


def behind_in_collectives(flight: dict[int, dict[str, Any]]) -> dict[int, str]:
    """Ranks that have not entered a collective their peers in the same process group have: the others
    wait inside it for them (the flight recorder's sequence numbers, hpc_train.runtime.lifecycle.heartbeat)."""
    newest = {rank: last_collectives(record) for rank, record in flight.items()}
    for group in sorted({g for groups in newest.values() for g in groups}):
        seqs = {rank: groups[group] for rank, groups in newest.items() if group in groups}
        top = max(seqs.values())
        if len(seqs) > 1 and min(seqs.values())[0] < top[0]:
            return {
                rank: f"has not entered collective #{top[0]} ({top[1]}, process group {group}) that the others "
                f"wait in; its last was #{seq}"
                for rank, (seq, _) in seqs.items()
                if seq < top[0]
            }
    return {}


def _culprit(rank: int, beats: dict[int, dict[str, Any]], dumps: dict[int, str], reason: str) -> Culprit:
    beat = beats.get(rank, {})
    top = main_stack(dumps.get(rank, ""))[:3]
    return Culprit(rank, str(beat.get("host", "?")), reason, beat.get("steps"), top)


# errors a rank gets because a peer died, not because of its own node
_CONSEQUENCE = re.compile(
    r"DistBackendError|DistNetworkError|Connection (closed|reset)|peer|Broken pipe|"
    r"timed? ?out|NCCL communicator|ProcessGroup|MPI_ERR|HorovodInternalError",
    re.IGNORECASE,
)


def first_failures(beats: dict[int, dict[str, Any]], wave_s: float = 1.0) -> list[Culprit]:
    """After a crash: the ranks that failed of their own accord, if they share one host that others do not.

    A rank that loses a peer fails too, moments later, with a communication error: those are not
    causes. A bug in the script fails every rank with its own error, on every node: no node is to
    blame then. A sick node fails its own ranks; the others only lose them.
    """
    failed = sorted((beat["at"], rank) for rank, beat in beats.items() if beat.get("state") == "failed")
    causes = [(at, rank) for at, rank in failed if not _CONSEQUENCE.search(str(beats[rank].get("error") or ""))]
    if not failed:
        return []
    first_at = (causes or failed)[0][0]
    wave = [rank for at, rank in (causes or failed) if at - first_at <= wave_s]
    hosts = {beats[rank].get("host") for rank in wave}
    others = {beat.get("host") for rank, beat in beats.items() if rank not in wave}
    if len(hosts) != 1 or not others - hosts:
        return []
    return [
        Culprit(rank, str(beats[rank].get("host")), f"failed first ({beats[rank].get('error') or 'no error recorded'})")
        for rank in sorted(wave)
    ]
