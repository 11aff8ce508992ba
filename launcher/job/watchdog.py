"""The hang watchdog (``requeue.hang_timeout_s``): a thread in every task of an entrypoint job that
watches the engine's heartbeat (``StopRequest.heartbeat``: window starts, update boundaries, evaluation
batches, checkpoint writes) and ends an attempt in which no rank makes progress.

What counts as a hang: no beat for longer than the present stretch's limit (:meth:`HangWatchdog.limit_s`):

- before the attempt's first update boundary (the engine's import to the first window's end: the
  process group forming, data loading, a restore, a compilation): ``requeue.startup_timeout_s``, which
  does not depend on the step's timeout; null: no limit;
- a first of its kind (the first window of an epoch: a fresh loader iterator and its workers; the first
  batch of an evaluation loader) and a checkpoint write: :data:`SLOW_FACTOR` times ``hang_timeout_s``;
- anything else (a window, an evaluation batch, a boundary's work): ``hang_timeout_s``;
- once ``train()`` returned (phase "ended"), nothing: what the job does then (saving the model, a test
  pass, an upload) is its own, until a next ``train()`` call.

Training that is slow but moving (a long evaluation: a beat per batch) is never a hang. The ranks of a
job stall together (a rank that stops computing holds the others in their next collective), so every
rank's watchdog fires within about one poll of the others; one that sees another rank's report of its
own stall fires at once.

When it fires, the watchdog writes "elfes: hang ..." and the Python stacks of every thread of its
process (``faulthandler``) into the rank's log (``logs/attempt-<A>/rank-<R>.err``), reports the hang
(launcher/job/failures.py) and waits :data:`GRACE_S` (so that every rank dumps its stacks before
anything is killed). It stands down (withdraws its report, says so in the log and watches on) when,
during that grace, its rank beats again (for a rank that fired on its own stall), no other rank's
report of its own stall stands any longer (for a rank that fired on a peer's), or the watched block
ends. Else the hang stands: it hands a report made at that moment (the heartbeat's step, whether any
update happened) to the runtime, which records the attempt failed (retried like any failure) and
leaves the process at once: the main thread is stuck.

A thread cannot see a hang that holds the GIL forever (a C extension spinning without releasing it):
there the attempt runs into its time limit as before. Torch-free.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from elfes.contract import Phase

from ..rundir.liveness import recorded_tasks
from ..rundir.paths import RunPaths
from ..rundir.state import FailureCategory
from .failures import FailureReport, read_reports, withdraw_report, write_report

if TYPE_CHECKING:  # torch-free at run time: the heartbeat comes from the job's StopRequest
    from elfes.engine import Heartbeat

SLOW_FACTOR = 5  # times hang_timeout_s allowed for a first of its kind and a checkpoint write
SLOW_PHASES = frozenset({Phase.CHECKPOINTING})
GRACE_S = 10.0  # how long a firing watchdog waits for a beat (and the other ranks' stacks) before the hang stands
POLL_S = 1.0
PEER_EXIT_S = 5.0  # how long the deciding rank of a local job waits for its peers to leave before killing them

log = logging.getLogger(__name__)


class HangWatchdog:
    """A daemon thread watching ``heartbeat`` (the job's ``StopRequest.heartbeat``) while the block runs.

    >>> with HangWatchdog(stop.heartbeat, timeout_s=600, startup_timeout_s=1800, paths=paths, attempt=1,  # doctest: +SKIP
    ...                   rank=0, host="node1", world_size=2, on_hang=runtime_hung):
    ...     main(job)
    """

    def __init__(self, heartbeat: Heartbeat, *, timeout_s: float, startup_timeout_s: float | None, paths: RunPaths,
                 attempt: int, rank: int, host: str, world_size: int, on_hang: Callable[[FailureReport], None],
                 poll_s: float = POLL_S, grace_s: float = GRACE_S) -> None:
        self.heartbeat = heartbeat
        self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
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

    def limit_s(self) -> float | None:
        """How long the heartbeat's present stretch may go without a beat; None: not watched."""
        heartbeat = self.heartbeat
        if heartbeat.phase == Phase.ENDED:
            return None  # train() returned: what follows is the job's own code
        if heartbeat.updates == 0:
            return self.startup_timeout_s
        if heartbeat.first or heartbeat.phase in SLOW_PHASES:
            return self.timeout_s * SLOW_FACTOR
        return self.timeout_s

    def setting(self) -> str:
        """The setting whose limit the present stretch is held to, as the user writes it."""
        if self.heartbeat.updates == 0 and self.startup_timeout_s is not None:
            return f"requeue.startup_timeout_s = {self.startup_timeout_s:g}"
        return f"requeue.hang_timeout_s = {self.timeout_s:g}"

    def stalled_s(self) -> float | None:
        """Seconds since the last beat when that is past the limit of the present stretch, else None."""
        at = self.heartbeat.at
        limit_s = self.limit_s()
        if limit_s is None or self.heartbeat.at != at:  # not watched, or a beat came while the limit was read
            return None
        quiet_s = time.monotonic() - at
        return quiet_s if quiet_s > limit_s else None

    def _stalls(self) -> list[FailureReport]:
        """The other ranks' standing reports of a stall of their own (not of a peer's report)."""
        return [report for report in read_reports(self.paths, self.attempt)
                if report.category == FailureCategory.HANG and not report.peer_lost and report.rank != self.rank]

    def _watch(self) -> None:
        answered: set[tuple[int, float]] = set()  # peers' reports this rank fired on already
        while not self.done.wait(self.poll_s):
            beat_at = self.heartbeat.at  # a beat after this reading stands a firing for this stall down
            quiet_s = self.stalled_s()
            peer = None
            if quiet_s is None and self.heartbeat.phase != Phase.ENDED:
                peer = next((r for r in self._stalls() if (r.rank, r.at) not in answered), None)
            if quiet_s is None and peer is None:
                continue
            if peer is not None:
                answered.add((peer.rank, peer.at))
            if self._fire(quiet_s, peer, beat_at):
                return

    def _report(self, *, peer_lost: bool) -> FailureReport:
        heartbeat = self.heartbeat
        return FailureReport(
            rank=self.rank, host=self.host, category=FailureCategory.HANG,
            cause=f"hang: no update boundary within {self.setting()} s",
            at=time.time(), step=heartbeat.failing_step(), updated=heartbeat.updates > 0, peer_lost=peer_lost)

    def _fire(self, quiet_s: float | None, peer: FailureReport | None, beat_at: float) -> bool:
        """Report a hang, wait the grace, then hand the hang over (True) or stand down (False)."""
        if quiet_s is None and peer is None:
            raise ValueError("a hang fires on this rank's quiet time or on a peer's report; neither was given")
        peer_rank = peer.rank if peer is not None else None
        heartbeat = self.heartbeat
        phase, step = heartbeat.phase, heartbeat.step
        seen = (f"no progress on this rank for {quiet_s:.0f} s" if quiet_s is not None else
                f"rank {peer_rank} reported a hang")
        log.error(f"elfes: hang: {seen} ({self.setting()}; {phase}"
                  + (f", last update boundary: step {step}" if step is not None
                     else ", before the first update boundary")
                  + f"). The Python stacks of every thread of rank {self.rank} follow.")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        report = self._report(peer_lost=quiet_s is None)
        write_report(self.paths, self.attempt, report)
        deadline = time.monotonic() + self.grace_s
        while True:
            if self.done.is_set():
                why = "the watched block ended"
            elif quiet_s is not None and heartbeat.at != beat_at:
                why = f"rank {self.rank} beat again ({heartbeat.phase}, step {heartbeat.step})"
            elif quiet_s is None and not self._stalls():
                why = f"rank {peer_rank} withdrew its report"
            elif time.monotonic() < deadline:
                self.done.wait(0.2)
                continue
            else:
                break
            withdraw_report(self.paths, self.attempt, report)
            log.warning(f"elfes: hang: stood down, {why} during the grace; watching on")
            return False
        self.on_hang(self._report(peer_lost=quiet_s is None))  # the heartbeat as it is now
        return True


def end_stuck_peers(paths: RunPaths, *, attempt: int, rank: int) -> None:
    """Local jobs: SIGKILL the other tasks of ``attempt`` still alive on this host (a rank whose watchdog
    could not run, e.g. one holding the GIL), so that submitit's controller, which relaunches only once
    every task exited, relaunches now. The deciding rank, after the grace its peers had to report."""
    def peers() -> list[dict[str, Any]]:
        return [record for record in recorded_tasks(paths) if record.get("attempt") == attempt and record.get("rank") != rank]

    deadline = time.monotonic() + PEER_EXIT_S
    while peers() and time.monotonic() < deadline:  # those that reported leave by themselves
        time.sleep(0.2)
    for record in peers():
        try:
            os.kill(int(record["pid"]), signal.SIGKILL)
        except ProcessLookupError:
            continue
        log.warning(f"elfes: rank {record.get('rank')} did not end after the hang: killed (SIGKILL)")
