"""The job's hang watchdog: outside the training processes, it ends a run that stopped making progress.

The batch script starts it next to the srun step (``python -m hpc_train.runtime.supervise.watchdog --step-pid PID``).
It reads the ranks' heartbeats (hpc_train.runtime.lifecycle.heartbeat) from the shared job folder. No rank
active for the hang timeout is a hang: it asks every rank for its stacks, names the rank(s) and
host(s) behind (hpc_train.runtime.supervise.hang_report), writes that down, and kills the step. The batch
script then restarts the run from the last checkpoint, avoiding the suspect node where it can.

The timeout: ``--hang-timeout`` (HPC_TRAIN_HANG_TIMEOUT) when given, else learned from the run:
``max(FLOOR_S, K x the observed step time)``. Until every rank finished its first step the allowance
is START_S (compilation, data loading, a slow first checkpoint load); PLAIN_START_S for a script that
does not use hpc_train.runtime, which is judged by its collectives until its first optimizer step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_train import contract
from hpc_train.runtime.lifecycle.heartbeat import FLIGHT_RECORD_SUFFIX, REQUEST, dump_folder
from hpc_train.runtime.log import log
from hpc_train.runtime.supervise.hang_report import Culprit, behind, cpu_seconds, last_collectives, main_stack, waiting
from hpc_train.runtime.supervise.outside_stacks import dump_from_outside
from hpc_train.runtime.supervise.suspects import record_suspect

# A learned timeout never goes below this: a synchronous checkpoint save of a large model, or an
# evaluation that does not go through the prepared model, may take minutes. Killing a healthy run
# costs more than a few minutes of a hung one; --hang-timeout is there for tighter watching.
FLOOR_S = 300.0
K = 20.0  # x the step time: far beyond any step's jitter, yet minutes, not hours, for a slow model
START_S = 900.0  # before the first step: imports, compilation, data loading
PLAIN_FLOOR_S = 1800.0  # the learned limit's floor when no rank uses hpc_train.runtime (see limit())
# A plain script before its first optimizer step (its heartbeat starts at `import torch`): torch's own
# default timeout for a collective, so the watch ends nothing that torch would not have ended itself,
# but with the stacks, the culprit and a restart instead of a timeout error.
PLAIN_START_S = 1800.0
RECHECK_S = 5.0  # between the two looks at a plain script's collectives (or stacks and CPU) when quiet
# CPU a rank may use between those looks and still sit still: its heartbeat thread and the answer itself
# take milliseconds; a rank that computes (an evaluation, data preparation) takes about RECHECK_S
IDLE_CPU_S = 0.25
NO_RECORD = "no flight record tells whether its collectives go on"
POLL_S = 1.0
# py-spy, one srun step per rank, in turn: a second or two each; the culprits are few, a whole silent job is not
OUTSIDE_MAX = 8
DUMP_WAIT_S = 5.0  # how long the ranks get to write their stacks (a stopped one never does)


@dataclass
class Settings:
    job_folder: Path
    heartbeats: Path
    run: int
    world: int
    timeout: float | None  # None: learn it
    stop_file: Path | None
    job_id: str | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        raw = (env.get(contract.ENV_HANG_TIMEOUT) or "").strip()
        return cls(
            job_folder=Path(env[contract.ENV_JOB_FOLDER]),
            heartbeats=Path(env[contract.ENV_HEARTBEATS]),
            run=int(env.get(contract.ENV_RUN) or 1),
            world=int(env.get(contract.ENV_NODES) or 1) * int(env.get(contract.ENV_PROCS_PER_NODE) or 1),
            timeout=float(raw) if raw else None,
            stop_file=Path(env[contract.ENV_STOP_FILE]) if env.get(contract.ENV_STOP_FILE) else None,
            job_id=env.get("SLURM_JOB_ID"),
        )


class StepClock:
    """The run's step time, learned from the heartbeats: the fastest rank's steps over the run so far."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None

    def observe(self, steps: int, at: float) -> None:
        if steps <= 0:
            return
        if self.first is None:
            self.first = (steps, at)
        self.last = (steps, at)

    def step_s(self) -> float | None:
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return None
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])


def read_beats(folder: Path, run: int) -> dict[int, dict[str, Any]]:
    beats = {}
    for path in folder.glob("rank-*.json"):
        try:
            beat = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced this instant, or torn by a full disk: read again next poll
        if beat.get("run") == run:
            beats[int(beat["rank"])] = beat
    return beats


def stepped(beats: dict[int, dict[str, Any]]) -> bool:
    """Every rank has made its first optimizer step."""
    return all(int(b.get("steps", 0)) > 0 for b in beats.values())


def limit(settings: Settings, beats: dict[int, dict[str, Any]], clock: StepClock) -> tuple[float, str]:
    """How long no rank may be active before it is a hang, and why that long."""
    if len(beats) < settings.world or not stepped(beats):
        start = PLAIN_START_S if all(b.get("plain") for b in beats.values()) else START_S
        return max(start, settings.timeout or 0.0), "start-up allowance"
    if settings.timeout:
        return settings.timeout, "--hang-timeout"
    step_s = clock.step_s()
    # a plain script's ranks beat only at optimizer steps: rank 0 saving or evaluating alone while the
    # others wait in a barrier looks like a hang, so the learned limit allows for a long one
    floor = PLAIN_FLOOR_S if all(b.get("plain") for b in beats.values()) else FLOOR_S
    learned = max(floor, K * step_s) if step_s else floor
    return learned, f"learned: max({floor:g} s, {K:g} x {step_s or 0:.3f} s/step)"


def watch(settings: Settings, step_alive: Any, now: Any = time.time, since: float | None = None) -> dict[str, Any] | None:
    """Poll until the step ends (None) or hangs (the hang's record); no verdict counts quiet before ``since``."""
    clock = StepClock()
    started = now() if since is None else since
    # quiet at the poll before the verdict: that the verdict came at the first poll past the limit is
    # checkable however late a loaded machine ran the polls
    previous: float | None = None
    while step_alive():
        time.sleep(POLL_S)
        if settings.stop_file is not None and settings.stop_file.exists():
            continue  # saving for a requeue: the stop path has its own grace and Slurm's limit
        beats = read_beats(settings.heartbeats, settings.run)
        if not beats:
            continue  # a script that does not use hpc_train.runtime leaves no trace to judge by
        if all(b.get("state") in ("finishing", "failed") for b in beats.values()):
            return None
        for beat in beats.values():
            clock.observe(int(beat.get("steps", 0)), float(beat["at"]))
        active = max([float(b["at"]) for b in beats.values()] + [started])
        allowed, why = limit(settings, beats, clock)
        quiet = now() - active
        if quiet > allowed:
            return {
                "run": settings.run,
                "quiet_s": round(quiet, 1),
                "quiet_at_last_poll_s": None if previous is None else round(previous, 1),
                "limit_s": round(allowed, 1),
                "limit": why,
                "beats": beats,
            }
        previous = quiet
    return None


def flight_records(folder: Path, ranks: Any) -> dict[int, dict[str, Any]]:
    records = {}
    for rank in ranks:
        try:
            record = json.loads((folder / f"rank-{rank}{FLIGHT_RECORD_SUFFIX}").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            records[rank] = record
    return records


def collect_dumps(settings: Settings, beats: dict[int, dict[str, Any]], attempt: int = 1) -> tuple[Path, dict[int, str]]:
    folder = dump_folder(settings.job_folder, settings.run)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("rank-*"):  # an earlier request's answers (a quiet spell that was no hang)
        old.unlink(missing_ok=True)
    (folder / REQUEST).write_text(f"{attempt}\n")  # numbered: a rank answers each request once
    deadline = time.time() + DUMP_WAIT_S
    # a rank's file appears whole (written aside, then renamed), so it can be read as soon as it is there
    while time.time() < deadline and not all((folder / f"rank-{r}.txt").exists() for r in beats):
        time.sleep(0.1)
    dumps = {}
    for rank in beats:
        try:
            dumps[rank] = (folder / f"rank-{rank}.txt").read_text(errors="replace")
        except OSError:
            continue
    return folder, dumps


def wait_for_hang(settings: Settings, step_alive: Any) -> tuple[dict[str, Any], Path, dict[int, str]] | None:
    """The hang, with every rank's stacks; None when the step ends first.

    A plain script's ranks beat only at optimizer steps (runtime/boot/hpc_train_watch): no forward hook
    tells an evaluation pass from a hang. So where every rank is plain, a quiet spell is a hang only if a
    rank waits in a collective (for one that never comes) that does not move, or if every rank sits still
    (sat_still); otherwise the watch goes on from now."""
    since, attempt = None, 0
    while (hang := watch(settings, step_alive, since=since)) is not None:
        attempt += 1
        try:
            folder, dumps = collect_dumps(settings, hang["beats"], attempt)
            if not step_alive():
                return None  # it ended while it was asked for its stacks: the ones that did not answer had left
            if resumed(hang["beats"], read_beats(settings.heartbeats, settings.run)):
                log(
                    f"run {settings.run}: quiet for {hang['quiet_s']:g} s, then active again while asked for its stacks: not a hang"
                )
                since = time.time()
                continue
            if not all(b.get("plain") for b in hang["beats"].values()):
                return hang, folder, dumps
            attempt += 1  # the plain rules may look once more
            why, dumps = plain_moves(settings, hang, folder, dumps, attempt, step_alive)
            if not why:
                return hang, folder, dumps
            log(f"run {settings.run}: {why}: not a hang")
        except OSError as exc:  # no report, but the hang is still ended
            log(f"hang in run {settings.run}; its stacks could not be collected: {exc}")
            return hang, dump_folder(settings.job_folder, settings.run), {}
        since = time.time()
    return None


def plain_moves(
    settings: Settings, hang: dict[str, Any], folder: Path, dumps: dict[int, str], attempt: int, step_alive: Any
) -> tuple[str, dict[int, str]]:
    """Why a quiet plain script is not stuck ("" when it is), and the newest stacks. A rank that waits in
    a collective or does not answer is stuck once the script has stepped; before, only if the collectives
    do not move (an evaluation that never steps communicates), or, with no flight record (no process group
    yet), if every rank sits still. With no rank in a collective, every rank must sit still."""
    beats = hang["beats"]
    if len(dumps) < len(beats) or any(waiting(main_stack(d)) for d in dumps.values()):
        if stepped(beats):
            return "", dumps
        moved, second = collectives_moved(settings, beats, folder, attempt)
        if moved == NO_RECORD:  # a rendezvous that one rank never joins
            moved = sat_still(dumps, second)
        return (f"no optimizer step yet after {hang['quiet_s']:g} s, but {moved}" if moved else ""), second
    time.sleep(RECHECK_S)
    _, second = collect_dumps(settings, beats, attempt)
    why = sat_still(dumps, second)
    if not why and (not step_alive() or resumed(beats, read_beats(settings.heartbeats, settings.run))):
        why = "it moved again or ended"
    quiet = f"no optimizer step for {hang['quiet_s']:g} s"
    return (f"{quiet}, but no rank waits in a collective and {why}" if why else ""), second


def resumed(before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]]) -> bool:
    """Some rank made progress (or finished) since ``before`` was read."""
    return any(float(beat.get("at", 0)) > float(before.get(rank, {}).get("at", 0)) for rank, beat in after.items())


def collectives_moved(
    settings: Settings, beats: dict[int, dict[str, Any]], folder: Path, attempt: int
) -> tuple[str, dict[int, str]]:
    """Look at the ranks' collectives twice, RECHECK_S apart: why the run is not stuck ("" if it is), and
    the second look's stacks. Without a flight record to compare, nothing says it is stuck."""
    before = {rank: last_collectives(record) for rank, record in flight_records(folder, beats).items()}
    time.sleep(RECHECK_S)
    folder, dumps = collect_dumps(settings, beats, attempt)
    after = {rank: last_collectives(record) for rank, record in flight_records(folder, beats).items()}
    if not before or not after:
        return NO_RECORD, dumps
    if before != after:
        return "its collectives go on", dumps
    return "", dumps


def sat_still(first: dict[int, str], second: dict[int, str]) -> str:
    """Two looks at the ranks' stacks, RECHECK_S apart: "" when every rank sat still in both (the same
    frames, next to no CPU used: blocked, not working), else why the run is not stuck."""
    if not second or set(first) != set(second):
        return "not every rank answered both looks"
    for rank in sorted(second):
        if main_stack(first[rank]) != main_stack(second[rank]):
            return f"rank {rank} moves (its stack changed)"
        before, after = cpu_seconds(first[rank]), cpu_seconds(second[rank])
        if before is None or after is None:
            return f"rank {rank} does not say its CPU time"
        if after - before > IDLE_CPU_S:
            return f"rank {rank} works ({after - before:.1f} s of CPU in {RECHECK_S:g} s)"
    return ""


def read_silent_ranks(
    settings: Settings, beats: dict[int, dict[str, Any]], dumps: dict[int, str], folder: Path, culprits: list[Culprit]
) -> None:
    """Stacks of the ranks that did not answer (stopped, or holding the GIL), read from outside with py-spy;
    they go beside the others' and into the culprits' report, the verdict stays the one the answers gave."""
    silent = [(rank, beat) for rank, beat in sorted(beats.items()) if rank not in dumps and beat.get("pid") and beat.get("host")]
    if len(silent) > OUTSIDE_MAX:
        log(f"hang: {len(silent)} ranks did not answer; reading the stacks of the first {OUTSIDE_MAX} from outside")
    for rank, beat in silent[:OUTSIDE_MAX]:
        stacks, how = dump_from_outside(str(beat["host"]), int(beat["pid"]), settings.job_id)
        if stacks is None:
            log(f"hang: no stacks of rank {rank}: {how}")
            continue
        with contextlib.suppress(OSError):
            (folder / f"rank-{rank}.txt").write_text(
                f"rank {rank} on {beat['host']} (pid {beat['pid']}), no answer from inside; {how}\n{stacks}"
            )
        for culprit in culprits:
            if culprit.rank == rank and not culprit.top:
                culprit.top = main_stack(stacks)[:3]


def report(settings: Settings, hang: dict[str, Any], folder: Path, culprits: list[Culprit]) -> None:
    beats = hang.pop("beats")
    record = {
        **hang,
        "at": time.time(),
        "dumps": str(folder),
        "culprits": [c.as_dict() for c in culprits],
        "ranks": {str(r): {"host": b.get("host"), "steps": b.get("steps"), "at": b.get("at")} for r, b in sorted(beats.items())},
    }
    _append(settings.job_folder / contract.HANGS, record)
    (settings.job_folder / contract.HANG_RUN).write_text(f"{settings.run}\n")
    hosts = {c.host for c in culprits if c.host != "?"}
    if hosts and len(hosts) < len({b.get("host") for b in beats.values()}):
        for host in sorted(hosts):
            try:
                record_suspect(settings.job_folder, host, settings.run, "hang", os.environ)
            except OSError as exc:
                log(f"could not name {host} a suspect: {exc}")
    log(
        f"hang in run {settings.run}: no rank active for {hang['quiet_s']:.0f} s "
        f"(limit {hang['limit_s']:g} s, {hang['limit']}); stacks in {folder}"
    )
    for c in culprits:
        log(f"hang: rank {c.rank} on {c.host} {c.reason}" + (f"; at {c.top[0]}" if c.top else ""))
    if not culprits:
        log("hang: no rank stands out (every rank waits); see the stacks")


def _append(path: Path, record: dict[str, Any]) -> None:
    try:
        with open(path, "a") as out:
            out.write(json.dumps(record) + "\n")
    except OSError as exc:  # the report is lost, the hang is still ended and said in the log
        log(f"could not write {path}: {exc}")


def end_step(settings: Settings, step_pid: int) -> None:
    """Kill every srun step of this run (the training processes with them); the batch script goes on."""
    steps = []
    if settings.job_id:
        out = subprocess.run(
            ["squeue", "-h", "-s", "-j", settings.job_id, "-o", "%i"], capture_output=True, text=True, timeout=60
        )
        steps = [s for s in out.stdout.split() if s.rpartition(".")[2].isdigit()]
    for step in steps:
        subprocess.run(["scancel", "--signal=KILL", step], capture_output=True, timeout=60)
    if not steps:
        try:
            os.kill(step_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> Any:
    def check() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        try:  # ended, not yet reaped by its parent (a zombie): its step is over
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return True

    return check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc_train.runtime.supervise.watchdog")
    parser.add_argument("--step-pid", type=int, required=True, help="the batch script's srun")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    found = wait_for_hang(settings, _alive(args.step_pid))
    if found is None:
        return 0
    hang, folder, dumps = found
    try:
        culprits = behind(hang["beats"], settings.world, dumps, flight_records(folder, hang["beats"]))
        read_silent_ranks(settings, hang["beats"], dumps, folder, culprits)
        report(settings, hang, folder, culprits)
    except OSError as exc:  # a report that cannot be written never hides the hang
        log(f"hang in run {settings.run}; its report could not be written: {exc}")
        with contextlib.suppress(OSError):
            (settings.job_folder / contract.HANG_RUN).write_text(f"{settings.run}\n")
    end_step(settings, args.step_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
