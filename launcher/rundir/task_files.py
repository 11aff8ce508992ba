"""What one task writes and reads in the run directory for its attempt: its standard streams on the
attempt's logs, its pid file (so ``elfes preempt`` can signal it), and the cancel marker's meaning; and how a
task ended, as a local job's controller, its parent, recorded it. Inside the job; torch-free. File names come
from :class:`~launcher.rundir.paths.RunPaths`.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from typing import Any, TextIO

from elfes.files import write_text_atomically

from . import state as run_state
from .paths import RunPaths, Stream

# The in-job runtime's own lines in a rank's logs (launcher/job/job_log.py writes them, launcher/rundir/lost_cause.py
# reads them back): "2026-12-05 14:03:07,512 ERROR elfes: attempt 2 failed on rank 1: ...".
LOG_LINE_FORMAT = "%(asctime)s %(levelname)s %(message)s"
LOG_LINE_PREFIX = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ "  # what LOG_LINE_FORMAT puts before the message


def redirect_standard_streams(paths: RunPaths, *, attempt: int, rank: int) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so children too) to the attempt's
    logs. Opened for appending: a relaunch that reuses an attempt's number keeps what was there."""
    folder = paths.attempt_logs(attempt)
    folder.mkdir(parents=True, exist_ok=True)
    streams: tuple[tuple[TextIO, int, Stream], ...] = ((sys.stdout, 1, "out"), (sys.stderr, 2, "err"))
    for stream, descriptor, name in streams:
        stream.flush()
        target = os.open(paths.rank_log(attempt, rank, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, descriptor)
        os.close(target)


def write_pid_file(paths: RunPaths, record: dict[str, Any]) -> None:
    """Record this task (``record`` plus its pid and the time) in ``pids/rank-<R>.json``."""
    paths.pids.mkdir(parents=True, exist_ok=True)
    full = {"pid": os.getpid(), **record, "started_at": run_state.now()}
    write_text_atomically(paths.pid_file(int(record["rank"])), json.dumps(full) + "\n")


def remove_pid_file(paths: RunPaths, rank: int) -> None:
    """Remove this task's pid file (only if it still names this process)."""
    file = paths.pid_file(rank)
    try:
        if json.loads(file.read_text(encoding="utf-8")).get("pid") == os.getpid():
            file.unlink()
    except (FileNotFoundError, ValueError):
        pass


def cancel_requested(paths: RunPaths, state: run_state.RunState | None) -> bool:
    """Whether ``elfes cancel`` left its marker for the current submission (an older one is stale).

    The one rule both the runtime (cancelled or stopped) and ``elfes status`` (a lost job) apply.
    """
    try:
        marked = paths.cancel_marker.stat().st_mtime
    except FileNotFoundError:
        return False
    if state is None or not state.submissions:
        return True
    return marked >= datetime.fromisoformat(state.submissions[-1].at).timestamp()


def write_command_record(paths: RunPaths, rank: int, record: dict[str, Any]) -> None:
    """Record the process group of this task's command in ``pids/command-<R>.json`` (``record`` plus this
    task's pid): liveness counts its members as the run's, and a later task ends what it left behind."""
    paths.pids.mkdir(parents=True, exist_ok=True)
    full = {**record, "rank": int(rank), "task_pid": os.getpid(), "updated_at": run_state.now()}
    write_text_atomically(paths.command_group(rank), json.dumps(full) + "\n")


def remove_command_record(paths: RunPaths, rank: int) -> None:
    """Remove this task's command record once its group is reaped (only if it is this task's)."""
    file = paths.command_group(rank)
    try:
        if json.loads(file.read_text(encoding="utf-8")).get("task_pid") == os.getpid():
            file.unlink()
    except (FileNotFoundError, ValueError):
        pass


def command_records(paths: RunPaths, *, host: str) -> list[dict[str, Any]]:
    """The command records of the run's tasks on ``host`` (groups that may still have members)."""
    records = []
    for file in sorted(paths.pids.glob("command-*.json")) if paths.pids.is_dir() else ():
        try:
            record = json.loads(file.read_text(encoding="utf-8"))
            record["pgid"] = int(record["pgid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # gone meanwhile, or torn
        if record.get("host") in (None, host):
            records.append(record)
    return records


def write_task_exit(paths: RunPaths, *, job_id: str, rank: int, pid: int, returncode: int) -> None:
    """Record how the task ``pid`` of ``rank`` in local job ``job_id`` ended (``pids/exit-<R>.json``):
    ``returncode`` as ``Popen`` gives it, its exit code or minus the signal that killed it. Its controller, the
    moment it sees the exit (launcher/submit/local_controller.py)."""
    paths.pids.mkdir(parents=True, exist_ok=True)
    record = {"job": str(job_id), "rank": int(rank), "pid": int(pid), "returncode": int(returncode),
              "at": run_state.now()}
    write_text_atomically(paths.task_exit(rank), json.dumps(record) + "\n")


def task_exit_status(paths: RunPaths, rank: int, *, job_id: str, pid: int) -> int | None:
    """The exit status recorded for the task ``pid`` of ``rank`` in local job ``job_id`` (its code, or minus the
    signal that killed it); None when none is recorded for that process (yet, or a SLURM job: never)."""
    try:
        record = json.loads(paths.task_exit(rank).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("job") != str(job_id) or record.get("pid") != pid:
        return None
    returncode = record.get("returncode")
    return returncode if isinstance(returncode, int) and not isinstance(returncode, bool) else None
