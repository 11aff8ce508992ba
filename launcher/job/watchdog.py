"""The hang watchdog (``requeue.hang_timeout_s``): a thread in every task of an entrypoint job that
watches the engine's heartbeat (``StopRequest.heartbeat``: update boundaries, evaluation batches,
checkpoint writes) and ends an attempt in which no rank makes progress.

What counts as a hang: no beat for ``hang_timeout_s`` seconds; before the first update boundary of
the attempt (data loading, compilation, the process group forming, a restore), while a checkpoint
is written and after training ended, :data:`SLOW_FACTOR` times as long. Training that is slow but
moving (a long evaluation: a beat per batch) is never one. The ranks of a job stall together (a rank
that stops computing holds the others in their next collective), so every rank's watchdog fires within
about one poll of the others; one that sees another rank's hang report fires at once.

When it fires, the watchdog writes "elfes: hang ..." and the Python stacks of every thread of its
process (``faulthandler``) into the rank's log (``logs/attempt-<A>/rank-<R>.err``), reports the hang
(launcher/job/failures.py), waits up to :data:`GRACE_S` for every rank's report (so that each has
dumped its stacks before anything is killed), and hands over to the runtime, which records the
attempt failed (retried like any failure) and leaves the process at once: the main thread is stuck.

A thread cannot see a hang that holds the GIL forever (a C extension spinning without releasing it):
there the attempt runs into its time limit as before. Torch-free.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..rundir.liveness import recorded_tasks
from ..rundir.paths import RunPaths
from .failures import FailureReport, read_reports, write_report

SLOW_FACTOR = 5  # times hang_timeout_s allowed before the first boundary, during checkpoint writes, after training
SLOW_PHASES = frozenset({"starting", "checkpointing", "ended"})  # of elfes.engine.heartbeat.PHASES
GRACE_S = 10.0  # the longest a firing watchdog waits for the other ranks' reports (and stacks)
POLL_S = 1.0
PEER_EXIT_S = 5.0  # how long the deciding rank of a local job waits for its peers to leave before killing them


class HangWatchdog:
    """A daemon thread watching ``heartbeat`` (an ``elfes.engine.Heartbeat``) while the block runs.

    >>> with HangWatchdog(stop.heartbeat, timeout_s=600, paths=paths, attempt=1, rank=0, host="node1",
    ...                   world_size=2, on_hang=runtime_hung):
    ...     main(job)
    """

    def __init__(self, heartbeat: Any, *, timeout_s: float, paths: RunPaths, attempt: int, rank: int, host: str,
                 world_size: int, on_hang: Callable[[FailureReport], None], poll_s: float = POLL_S,
                 grace_s: float = GRACE_S) -> None:
        self.heartbeat = heartbeat
        self.timeout_s = timeout_s
        self.paths, self.attempt, self.rank, self.host, self.world_size = paths, attempt, rank, host, world_size
        self.on_hang, self.poll_s, self.grace_s = on_hang, poll_s, grace_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="elfes-hang-watchdog", daemon=True)

    def __enter__(self) -> HangWatchdog:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.done.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()

    def limit_s(self, phase: str) -> float:
        """How long ``phase`` may go without a beat."""
        return self.timeout_s * (SLOW_FACTOR if phase in SLOW_PHASES else 1)

    def stalled_s(self) -> float | None:
        """Seconds since the last beat when that is past the limit of the phase, else None."""
        heartbeat = self.heartbeat
        quiet_s = time.monotonic() - heartbeat.at
        return quiet_s if quiet_s > self.limit_s(heartbeat.phase) else None

    def _peer_hang(self) -> FailureReport | None:
        return next((report for report in read_reports(self.paths, self.attempt)
                     if report.category == "hang" and report.rank != self.rank), None)

    def _watch(self) -> None:
        while not self.done.wait(self.poll_s):
            quiet_s = self.stalled_s()
            peer = self._peer_hang() if quiet_s is None else None
            if quiet_s is None and peer is None:
                continue
            if self.done.is_set():
                return
            self._fire(quiet_s, peer)
            return

    def _fire(self, quiet_s: float | None, peer: FailureReport | None) -> None:
        heartbeat = self.heartbeat
        phase, step = heartbeat.phase, heartbeat.step
        seen = (f"no progress on this rank for {quiet_s:.0f} s" if quiet_s is not None else
                f"rank {peer.rank} reported a hang")
        print(f"elfes: hang: {seen} (requeue.hang_timeout_s = {self.timeout_s:g}; {phase}"
              + (f", last update boundary: step {step}" if step is not None else ", before the first update boundary")
              + f"). The Python stacks of every thread of rank {self.rank} follow.", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        report = FailureReport(
            rank=self.rank, host=self.host, category="hang",
            cause=f"hang: no update boundary within requeue.hang_timeout_s = {self.timeout_s:g} s",
            at=time.time(), step=heartbeat.failing_step(), updated=heartbeat.updates > 0,
            peer_lost=quiet_s is None)
        write_report(self.paths, self.attempt, report)
        deadline = time.monotonic() + self.grace_s
        while len(read_reports(self.paths, self.attempt)) < self.world_size and time.monotonic() < deadline:
            time.sleep(0.2)
        self.on_hang(report)


def end_stuck_peers(paths: RunPaths, *, attempt: int, rank: int) -> None:
    """Local jobs: SIGKILL the other tasks of ``attempt`` still alive on this host (a rank whose watchdog
    could not run, e.g. one holding the GIL), so that submitit's controller, which relaunches only once
    every task exited, relaunches now. The deciding rank, after the grace its peers had to report."""
    def peers() -> list[dict]:
        return [record for record in recorded_tasks(paths) if record.get("attempt") == attempt and record.get("rank") != rank]

    deadline = time.monotonic() + PEER_EXIT_S
    while peers() and time.monotonic() < deadline:  # those that reported leave by themselves
        time.sleep(0.2)
    for record in peers():
        try:
            os.kill(int(record["pid"]), signal.SIGKILL)
        except ProcessLookupError:
            continue
        print(f"elfes: rank {record.get('rank')} did not end after the hang: killed (SIGKILL)", file=sys.stderr, flush=True)
