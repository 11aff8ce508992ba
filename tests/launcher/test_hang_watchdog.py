"""When the hang watchdog (launcher/job/watchdog.py) fires, stands down and decides, on the engine's real
Heartbeat driven by the test's thread; and a command job with requeue.hang_timeout_s is refused. The
jobs themselves (ranks that start apart, slow firsts, code after train(), a real hang):
test_failure_retries.py."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from local_runs import write_spec

from elfes.engine import Heartbeat
from elfes.launcher.cli.main import main as elfes
from elfes.launcher.job.failures import FailureReport, read_reports, withdraw_report, write_report
from elfes.launcher.job.job_log import job_logging
from elfes.launcher.job.watchdog import SLOW_FACTOR, HangWatchdog
from elfes.launcher.rundir.paths import RunPaths

GRACE_S = 0.3  # the grace of the watchdogs below, where the test does not act during it
ACTING_GRACE_S = 3.0  # where the test's thread beats or withdraws during the grace: room on a loaded machine


def trained_to(step: int) -> Heartbeat:
    """A heartbeat that reached ``step`` update boundaries in this process and computes the next update."""
    heartbeat = Heartbeat()
    heartbeat.started(0)
    for reached in range(1, step + 1):
        heartbeat.reached(reached)
    heartbeat.beat("training")
    return heartbeat


class Watched:
    def __init__(self, folder: Path) -> None:
        self.paths = RunPaths(folder)
        self.log = folder / "rank-0.err"
        self.fired: list[tuple[float, FailureReport]] = []  # (time.monotonic() of the decision, its report)

    def reports(self) -> list[FailureReport]:
        return read_reports(self.paths, 1)

    def own_report(self) -> FailureReport | None:
        return next((report for report in self.reports() if report.rank == 0), None)


@contextmanager
def watching(folder: Path, heartbeat: Heartbeat, *, timeout_s: float, startup_timeout_s: float | None = None,
             world_size: int = 1, grace_s: float = GRACE_S) -> Iterator[Watched]:
    """Rank 0's watchdog over ``heartbeat`` while the block runs; its log (stacks included) in ``Watched.log``."""
    folder.mkdir(parents=True, exist_ok=True)
    watched = Watched(folder)
    with open(watched.log, "w") as stream, job_logging():  # the runtime's logging, as in a job's task
        saved, sys.stderr = sys.stderr, stream  # faulthandler writes to the file's descriptor
        try:
            with HangWatchdog(heartbeat, timeout_s=timeout_s, startup_timeout_s=startup_timeout_s,
                              paths=watched.paths, attempt=1, rank=0, host="node1", world_size=world_size,
                              on_hang=lambda report: watched.fired.append((time.monotonic(), report)),
                              poll_s=0.05, grace_s=grace_s):
                yield watched
        finally:
            sys.stderr = saved


def wait_for(condition: Callable[[], object], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true"
        time.sleep(0.01)


def peer_stall(paths: RunPaths) -> FailureReport:
    """Rank 1 reports a stall of its own."""
    report = FailureReport(rank=1, host="node2", category="hang", cause="hang: no update boundary", at=time.time(),
                           step=7, updated=True)
    write_report(paths, 1, report)
    return report


# -- what fires ---------------------------------------------------------------------------------------------------
def test_the_watchdog_dumps_every_threads_stack_and_reports_a_hang(tmp_path: Path) -> None:
    stuck = threading.Event()
    helper = threading.Thread(target=stuck.wait, name="a-helper-thread", daemon=True)
    helper.start()
    with watching(tmp_path, trained_to(6), timeout_s=0.5) as watched:
        wait_for(lambda: watched.fired)
    stuck.set()
    (_, hang), log = watched.fired[0], watched.log.read_text()
    assert (hang.category, hang.step, hang.rank, hang.updated, hang.peer_lost) == ("hang", 7, 0, True, False)
    assert hang.cause == "hang: no update boundary within requeue.hang_timeout_s = 0.5 s"
    assert "elfes: hang: no progress on this rank for" in log and "last update boundary: step 6" in log
    assert "Current thread" in log and "test_the_watchdog_dumps_every_threads_stack" in log  # all threads
    assert watched.reports()[0].step == 7


def test_firsts_of_their_kind_and_checkpoint_writes_get_5x_and_the_start_up_its_own_allowance(tmp_path: Path) -> None:
    """The first window of an epoch, an evaluation's first batch and a checkpoint write: SLOW_FACTOR times the
    timeout; before the first update boundary: startup_timeout_s, whatever the timeout (none when null)."""
    timeout_s = 0.1
    for name, phase, first in (("epoch", "training", True), ("evaluation", "evaluating", True),
                               ("checkpoint", "checkpointing", False)):
        heartbeat = trained_to(6)
        (heartbeat.beat_first if first else heartbeat.beat)(phase)
        with watching(tmp_path / name, heartbeat, timeout_s=timeout_s) as watched:
            wait_for(lambda: watched.fired)
        decided_at, hang = watched.fired[0]
        assert decided_at - heartbeat.at >= SLOW_FACTOR * timeout_s + GRACE_S, name
        assert (hang.step, hang.updated) == ((7, True) if phase == "training" else (6, True)), name

    starting = Heartbeat()
    with watching(tmp_path / "start", starting, timeout_s=timeout_s, startup_timeout_s=1) as watched:
        wait_for(lambda: watched.fired)
    decided_at, hang = watched.fired[0]
    assert decided_at - starting.at >= 1 + GRACE_S  # not 5 x 0.1 s
    assert (hang.step, hang.updated) == (None, False)
    assert "before the first update boundary" in watched.log.read_text()
    assert hang.cause == "hang: no update boundary within requeue.startup_timeout_s = 1 s"  # the limit that applied

    starting = Heartbeat()
    with watching(tmp_path / "no-start-limit", starting, timeout_s=timeout_s, startup_timeout_s=None) as watched:
        wait_for(lambda: time.monotonic() - starting.at > 2 * SLOW_FACTOR * timeout_s)
    assert watched.fired == [] and watched.reports() == []


def test_after_train_returns_nothing_is_watched_not_even_a_peers_report(tmp_path: Path) -> None:
    heartbeat = trained_to(8)
    heartbeat.beat("ended")
    with watching(tmp_path, heartbeat, timeout_s=0.1, world_size=2) as watched:
        peer_stall(watched.paths)
        wait_for(lambda: time.monotonic() - heartbeat.at > 2 * SLOW_FACTOR * 0.1)
    assert watched.fired == [] and watched.own_report() is None


# -- standing down and deciding -----------------------------------------------------------------------------------
def test_a_beat_during_the_grace_stands_the_watchdog_down_and_it_watches_on(tmp_path: Path) -> None:
    heartbeat = trained_to(6)
    with watching(tmp_path, heartbeat, timeout_s=0.2, grace_s=ACTING_GRACE_S) as watched:
        wait_for(watched.own_report)  # fired: its report is out
        heartbeat.reached(7)  # and the rank moves on
        wait_for(lambda: watched.own_report() is None)  # withdrawn
        assert watched.fired == []
        wait_for(lambda: watched.fired)  # stuck at the boundary of step 7 this time: the hang stands
    assert "elfes: hang: stood down, rank 0 beat again (boundary, step 7)" in watched.log.read_text()
    hang = watched.fired[0][1]
    assert (hang.step, hang.updated) == (7, True)


def test_a_watchdog_whose_block_ends_during_the_grace_stands_down(tmp_path: Path) -> None:
    with watching(tmp_path, trained_to(6), timeout_s=0.2, grace_s=ACTING_GRACE_S) as watched:
        wait_for(watched.own_report)
    assert watched.fired == [] and watched.own_report() is None  # main returned: not a hang


def test_a_rank_that_fires_on_a_peers_stall_decides_with_its_heartbeat_as_it_then_is(tmp_path: Path) -> None:
    """A rank still starting (no update) fires at once on rank 1's report of its own stall; it trains on during
    the grace while rank 1's report stands, so the hang stands, reported at the step it has reached by then."""
    heartbeat = Heartbeat()
    with watching(tmp_path, heartbeat, timeout_s=60, world_size=2, grace_s=ACTING_GRACE_S) as watched:
        peer_stall(watched.paths)
        wait_for(watched.own_report)
        assert (watched.own_report().step, watched.own_report().updated) == (None, False)
        heartbeat.started(0)
        heartbeat.reached(1)
        wait_for(lambda: watched.fired)
    hang = watched.fired[0][1]
    assert (hang.step, hang.updated, hang.peer_lost) == (1, True, True)
    assert "rank 1 reported a hang" in watched.log.read_text()


def test_a_rank_that_fired_on_a_peers_stall_stands_down_when_the_peer_withdraws(tmp_path: Path) -> None:
    with watching(tmp_path, trained_to(6), timeout_s=60, world_size=2, grace_s=ACTING_GRACE_S) as watched:
        peer = peer_stall(watched.paths)
        wait_for(watched.own_report)
        withdraw_report(watched.paths, 1, peer)  # rank 1 beat again
        wait_for(lambda: watched.own_report() is None)
    assert watched.fired == []
    assert "elfes: hang: stood down, rank 1 withdrew its report" in watched.log.read_text()


# -- the spec -----------------------------------------------------------------------------------------------------
def test_a_command_job_with_a_hang_timeout_is_refused_naming_the_field(tmp_path: Path, capsys) -> None:
    spec = write_spec(tmp_path, "command-hang", entrypoint=None, command=["python", "-c", "pass"],
                      requeue={"hang_timeout_s": 60})
    assert elfes(["validate", str(spec)]) == 2
    output = capsys.readouterr().err
    assert "requeue.hang_timeout_s = 60: the hang watchdog reads an entrypoint's trainer heartbeat" in output
    assert "remove requeue.hang_timeout_s or run the training as an entrypoint" in output
    spec = write_spec(tmp_path, "entrypoint-hang", requeue={"hang_timeout_s": 60, "startup_timeout_s": None})
    assert elfes(["validate", str(spec)]) == 0
