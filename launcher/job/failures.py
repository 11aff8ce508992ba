"""What a failed attempt means (pure, torch-free): each failing rank's report, the attempt's cause among
them, and whether the run retries it from ``last``.

A rank that fails (its entrypoint raised, its command exited nonzero, its hang watchdog fired) writes
a :class:`FailureReport` (``RunPaths.failure_report``). A failure on one rank usually makes the
others fail too: their collectives lose the peer ("Connection closed by peer"). Those secondary errors
come later (the failing rank reports before its process, and so its sockets, end) and read as a lost
peer; :func:`cause_of` prefers the earliest report that is not one of them. A rank killed by a signal
reports nothing: :func:`the_rank_that_failed` names it, and the signal or exit code where its parent recorded
how it ended (a local job's controller: launcher/submit/local_controller.py; on SLURM, srun records nothing).

:func:`decide_failure` is the rule: a failure is retried (requeued from ``last``, counting against
``requeue.max_failures`` apart from ``max_requeues``) unless the budget is spent or it repeats the
previous attempt's failure: the same error at the same step, or a crash before the first update
boundary twice in a row. A repeating failure is a bug or a broken input, not bad luck; retrying it
again would spend the budget (and the allocation) on the same crash.

:func:`failed_nodes` tells where the failure happened, the host a SLURM run then leaves out of its later
jobs (``requeue.exclude_failed_nodes``): the failing rank's host for an error it raised; for a lost rank
or a hang, the hosts of the ranks that never reported (a rank that died, or is stuck holding the GIL,
writes nothing); on one host, that host. A failure that repeats on another host was the job's, not the
node's: the exclusion made for it is lifted (launcher/job/failed_attempt.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elfes.files import write_text_atomically
from elfes.refusals import ConfigurationError

from ..rundir.json_fields import FieldError, read_record
from ..rundir.paths import RunPaths
from ..rundir.state import Attempt, Failure, FailureCategory, Outcome

# Why a refusal of the run's own settings is not retried (elfes/refusals.py: the engine's, by type).
CONFIGURATION_REFUSED = ("the engine refused the run's configuration, which a retry would refuse again: fix it, then "
                         "`elfes resume RUN_DIR`")

# A cause longer than this (a message with a dump in it) keeps its first and last lines.
MAX_CAUSE_CHARS = 2000

# What a rank's collectives raise when a peer's process or node is gone (gloo, NCCL, the TCP store).
_PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET|EPIPE|"
    r"Socket Timeout|recvValue failed|Failed to recv|Failed to send|failed to recv|"
    r"NCCL communicator was aborted|NCCL error|ncclRemoteError|ProcessGroupNCCL|"
    r"TCPStore|DistNetworkError|DistBackendError|Timed out waiting|Application timeout caused pair closure",
)


@dataclass(frozen=True)
class FailureReport:
    """One rank's failure in one attempt, as it wrote it (``RunPaths.failure_report``)."""

    rank: int
    host: str
    category: FailureCategory
    cause: str  # "RuntimeError: boom", or what the watchdog or the command's exit says
    at: float  # time.time() when the rank reported
    step: int | None = None  # the step it failed at (the update being computed), if known
    updated: bool = False  # whether this rank reached an update boundary in this attempt
    peer_lost: bool = False  # a collective's error for a vanished peer: a consequence, not the cause
    final: str | None = None  # why this failure cannot pass on a retry (e.g. the resume point was refused)

    @classmethod
    def of_exception(cls, error: BaseException, *, rank: int, host: str, at: float, step: int | None,
                     updated: bool) -> FailureReport:
        if isinstance(error, SystemExit):
            return cls.of_exit(error, rank=rank, host=host, at=at, step=step, updated=updated)
        cause = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        peer_lost = bool(_PEER_LOST.search(f"{type(error).__name__}: {error}"))
        final = CONFIGURATION_REFUSED if isinstance(error, ConfigurationError) else None
        category = FailureCategory.LOST if peer_lost else FailureCategory.EXCEPTION
        return cls(rank=rank, host=host, category=category, cause=_one_line(cause), at=at,
                   step=step, updated=updated, peer_lost=peer_lost, final=final)

    @classmethod
    def of_exit(cls, error: SystemExit, *, rank: int, host: str, at: float, step: int | None,
                updated: bool) -> FailureReport:
        """The report of a rank that leaves through ``sys.exit(code)`` with a code that is not 0: ``"rank 0 exited
        with code 3 (SystemExit) at step 12"`` (a message passed as the code exits 1, as Python does)."""
        code = error.code if isinstance(error.code, int) else 1
        said = f": {_one_line(str(error.code))}" if error.code is not None and not isinstance(error.code, int) else ""
        at_step = f" at step {step}" if step is not None else ""
        return cls(rank=rank, host=host, category=FailureCategory.EXIT, cause=f"rank {rank} exited with code {code} (SystemExit"
                   f"{said}){at_step}", at=at, step=step, updated=updated)


def _one_line(text: str) -> str:
    """The whole message on one line (a refusal lists its reasons, and what to do, on lines of their own); one too
    long for a status line keeps its first and last lines."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    whole = " ".join(lines)
    return whole if len(whole) <= MAX_CAUSE_CHARS or len(lines) <= 1 else f"{lines[0]} ... {lines[-1]}"


def write_report(paths: RunPaths, attempt: int, report: FailureReport) -> None:
    """Publish ``report`` for ``attempt`` (atomically: the other ranks read it)."""
    file = paths.failure_report(attempt, report.rank)
    file.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(file, json.dumps(dataclasses.asdict(report)) + "\n")


def withdraw_report(paths: RunPaths, attempt: int, report: FailureReport) -> None:
    """Remove ``report`` for ``attempt`` (a hang watchdog that stood down), unless its rank has since
    reported something else (its main thread failed meanwhile)."""
    if report in read_reports(paths, attempt):
        paths.failure_report(attempt, report.rank).unlink(missing_ok=True)


def read_reports(paths: RunPaths, attempt: int) -> list[FailureReport]:
    """The failure reports of ``attempt`` written so far, by rank (unreadable ones skipped)."""
    folder = paths.attempt_logs(attempt)
    reports = []
    for file in sorted(folder.glob("rank-*.failure.json")) if folder.is_dir() else ():
        try:
            reports.append(read_record(FailureReport, json.loads(file.read_text(encoding="utf-8"))))
        except (OSError, ValueError, FieldError, TypeError):
            continue
    return sorted(reports, key=lambda report: report.rank)


def rank_records(paths: RunPaths, attempt: int) -> dict[int, dict[str, Any]]:
    """Each rank's pid record in ``attempt`` (``RunPaths.pid_file``: its host and pid; a task that died keeps
    its record)."""
    records = {}
    for file in sorted(paths.pids.glob("rank-*.json")) if paths.pids.is_dir() else ():
        try:
            record = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("attempt") == attempt and isinstance(record.get("rank"), int) \
                and isinstance(record.get("host"), str):
            records[record["rank"]] = record
    return records


def rank_hosts(paths: RunPaths, attempt: int) -> dict[int, str]:
    """Each rank's host in ``attempt``, as its pid record says (:func:`rank_records`)."""
    return {rank: record["host"] for rank, record in rank_records(paths, attempt).items()}


def await_first_hand(paths: RunPaths, attempt: int, world_size: int, grace_s: float) -> list[FailureReport]:
    """The reports of ``attempt`` once every rank reported, or one reported a cause of its own (not a lost
    peer), or ``grace_s`` passed: a rank that saw its peer vanish waits this long before deciding, so that
    the ranks still alive have reported and the silent ones (:func:`failed_nodes`) are those that died."""
    deadline = time.monotonic() + grace_s
    while True:
        reports = read_reports(paths, attempt)
        if (len(reports) >= world_size or any(not report.peer_lost for report in reports)
                or time.monotonic() >= deadline):
            return reports
        time.sleep(0.2)


def failed_nodes(cause: FailureReport, reports: list[FailureReport], *, hosts: tuple[str, ...],
                 ranks: dict[int, str]) -> tuple[str, ...]:
    """Where the attempt's failure happened: ``hosts`` (the attempt's) when it ran on one; the failing rank's
    host for an error it raised or exited with; for a lost rank or a hang, the hosts of the ranks (``ranks``:
    rank -> host) that never reported. Empty when that cannot be told (every rank of a multi-host hang
    reported: the one that stalled the others is not known)."""
    if len(set(hosts)) == 1:
        return (hosts[0],)
    if cause.category in (FailureCategory.EXCEPTION, FailureCategory.EXIT) and not cause.peer_lost:
        return (cause.host,)
    reported = {report.rank for report in reports}
    return tuple(dict.fromkeys(host for rank, host in sorted(ranks.items()) if rank not in reported))


def cause_of(reports: list[FailureReport]) -> FailureReport:
    """The attempt's cause: the earliest report that is not a lost peer's consequence, else the earliest."""
    if not reports:
        raise ValueError("cause_of needs at least one report")
    first_hand = [report for report in reports if not report.peer_lost]
    return min(first_hand or reports, key=lambda report: report.at)


def the_rank_that_failed(cause: FailureReport, reports: list[FailureReport], *, world_size: int,
                         hosts: dict[int, str], gone: Callable[[int], bool],
                         exit_status: Callable[[int], int | None] = lambda rank: None) -> FailureReport:
    """The attempt's cause, naming the rank that failed: where every rank that reported only lost a peer
    (:func:`cause_of` found nothing first-hand), the first rank of ``world_size`` that never reported, which
    ended without a word; ``hosts``: rank -> host; ``exit_status(rank)``: its process's exit code, or minus the
    signal that killed it, where its parent recorded one (a local job's controller), else None; ``gone(rank)``:
    whether its process is known to be gone (a rank on this host). Else ``cause`` itself. The survivors' lost
    connections are the consequence: "rank 1 was killed by SIGKILL at step 12"."""
    reported = {report.rank for report in reports}
    silent = [rank for rank in range(world_size) if rank not in reported]
    if not cause.peer_lost or not silent:
        return cause
    rank = silent[0]
    lost = dataclasses.replace(cause, rank=rank, host=hosts.get(rank, "an unknown host"), peer_lost=False)
    returncode = exit_status(rank)
    at_step = f" at step {cause.step}" if cause.step is not None else ""
    if returncode is not None and returncode < 0:
        return dataclasses.replace(lost, cause=f"rank {rank} was killed by {signal_name(-returncode)}{at_step}")
    if returncode is not None:
        return dataclasses.replace(lost, category=FailureCategory.EXIT, cause=f"rank {rank} exited with code {returncode}{at_step}")
    how = ("its process ended without reporting an error: killed by a signal, e.g. SIGKILL or the out-of-memory "
           "killer" if gone(rank) else "it ended without reporting an error: killed, or its node failed")
    return dataclasses.replace(lost, cause=f"rank {rank} was lost: {how}")


def signal_name(number: int) -> str:
    """``"SIGKILL"`` for 9; ``"signal 77"`` for a number without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe(report: FailureReport) -> str:
    """``"RuntimeError: boom (rank 1 on node2, step 7)"``."""
    where = [f"rank {report.rank} on {report.host}"]
    if report.step is not None:
        where.append(f"step {report.step}")
    prefix = "a peer rank was lost: " if report.category == FailureCategory.LOST and report.peer_lost else ""
    return f"{prefix}{report.cause} ({', '.join(where)})"


def decide_failure(
    cause: FailureReport, *, previous: Attempt | None, failures_used: int, max_failures: int
) -> Failure:
    """Whether the attempt that failed with ``cause`` is retried; ``previous``: the run's attempt before
    it; ``failures_used``: failures retried before it. Every rank decides alike from the same inputs."""
    failure = Failure(category=cause.category, cause=cause.cause, retried=True, rank=cause.rank, host=cause.host,
                      step=cause.step, updated=cause.updated)
    if cause.final is not None:
        return dataclasses.replace(failure, retried=False, reason=f"not retried: {cause.final}")
    if repeats(failure, previous):
        where = f"at step {cause.step}" if cause.step is not None else "before its first update"
        reason = f"failed twice {where}: not retried"
        return dataclasses.replace(failure, retried=False, reason=reason)
    if failures_used >= max_failures:
        reason = (f"failure limit reached ({failures_used} of requeue.max_failures={max_failures} retried since the "
                  "latest submit or resume): not "
                  "retried; fix the cause, then `elfes resume RUN_DIR` continues from `last`")
        return dataclasses.replace(failure, retried=False, reason=reason)
    return failure


def repeats(failure: Failure, previous: Attempt | None) -> bool:
    """Whether ``failure`` repeats the failure of ``previous`` (the attempt before): the same error at the same
    step, or a crash before the first update boundary in both."""
    earlier = previous.failure if previous is not None and previous.outcome == Outcome.FAILED else None
    return earlier is not None and (failure.same_as(earlier) or not (failure.updated or earlier.updated))


def failure_error(failure: Failure, cause: FailureReport) -> str:
    """The attempt's ``error`` in state.json: the cause, where, and why it was not retried."""
    described = describe(cause)
    if failure.retried:
        return f"{described}; retried from `last`"
    return f"{described}; {failure.reason}"
