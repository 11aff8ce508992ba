"""A local sweep's scheduler: a small detached process that submits the sweep's waiting members, in
order, as slots free, so that at most ``max_parallel`` run at once on this machine.

Why a process of its own (and not each member's job waiting on a slot): a waiting member holds no
submitit controller, no time limit runs out while it waits, and the order is the queue's. It is robust
to kills by construction:

- the queue lives in ``sweep.json`` (each entry with the time it was queued), changed under
  ``.sweep.lock``; a member is popped only after its hand-over (``elfes submit``/``resume`` of its run
  directory, the usual transaction) recorded its job, and an entry whose member was submitted after it
  was queued is popped without a second hand-over: a scheduler killed at any point loses no member
  and starts none twice;
- the live scheduler holds ``.scheduler.lock`` (an ``flock``, released by the kernel when it dies); a
  second one started while it lives exits at once, and ``elfes resume SWEEP_DIR`` starts a new one when
  the lock is free;
- it is started by a double fork in a session of its own (its parent exits at once and is waited for),
  so the init process reaps it, and a Ctrl-C in the submitter's terminal does not reach it; it exits when
  the queue is empty (``elfes cancel SWEEP_DIR`` empties it);
- one member's problem (its ``state.json`` damaged, its hand-over refused) is recorded on that member
  (``sweep.json``'s ``problems``, shown by ``elfes status SWEEP_DIR``) and the scheduler goes on with the
  next; a scheduler that dies anyway leaves a sweep that every sweep verb calls stalled, and ``elfes
  resume SWEEP_DIR`` starts a new one.

A running member keeps its slot through preemptions: submitit's controller relaunches it as for any run.
Torch-free.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import replace
from functools import partial
from pathlib import Path

from ...backends import Executor
from ...rundir import state as run_state
from ...rundir.paths import RunPaths, SweepPaths
from ...rundir.status_reading import ProcessTable
from ...rundir.sweep_record import SweepRecord, change_sweep, load_sweep, sweep_lock, take_scheduler_lock, update_sweep
from ...rundir.sweep_status import member_is_live

POLL_S = 0.5


def start_scheduler(paths: SweepPaths) -> int:
    """Start ``python -m elfes.launcher.commands.sweep.local SWEEP_DIR`` detached (double fork, own session, streams
    on ``scheduler.log``); returns its pid, or 0 when a scheduler is alive already. The scheduler lock is taken
    before the fork and handed down to the scheduler, so that from the moment this returns every look at
    the sweep finds a live scheduler (none is called stalled while the new one is still starting)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # the intermediate child: take the lock, start the scheduler, report its pid, exit
        try:
            os.close(reader)
            lock = take_scheduler_lock(paths)
            if lock is None:
                os.write(writer, b"0")  # a scheduler works the sweep already
                os._exit(0)
            os.setsid()
            log = os.open(paths.scheduler_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            stdin = os.open(os.devnull, os.O_RDONLY)
            grandchild = os.fork()
            if grandchild == 0:
                os.close(writer)
                os.dup2(stdin, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.set_inheritable(lock, True)  # the lock's open file description, and so the lock, goes along
                for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2):
                    signal.signal(signum, signal.SIG_DFL)
                os.chdir(paths.sweep_dir)
                os.execv(sys.executable, [sys.executable, "-m", "elfes.launcher.commands.sweep.local",
                                          str(paths.sweep_dir), str(lock)])
            os.write(writer, str(grandchild).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as stream:
        reply = stream.read()
    os.waitpid(child, 0)
    return int(reply or 0)


def _handed_over_since(paths: RunPaths, queued_at: str) -> bool:
    """Whether the member got a job since it was queued. A hand-over recorded ahead whose job was never
    recorded (a scheduler killed in the middle of it) does not count: the next one settles it (adopting the
    job it started, if any)."""
    state = run_state.load_state(paths)
    if state is None or not state.submissions:
        return False
    latest = state.submissions[-1]
    return latest.at >= queued_at and latest.job_id is not None


def _hand_over(paths: RunPaths) -> None:
    """Submit (never started) or resume (ended, not finished) one member, through the usual transaction."""
    from ..submission import resume, submit

    if run_state.load_state(paths) is None:
        result = submit(paths.spec, executor=Executor.LOCAL, code="recorded")  # the sweep's snapshot
    else:
        result = resume(paths.run_dir, executor=Executor.LOCAL)
    print(f"{run_state.now()} {paths.run_dir.name}: {result.executor} job {result.job_id}", flush=True)


def _with_queue(record: SweepRecord, *, queue: tuple[dict[str, str], ...], problems: dict[str, str]) -> SweepRecord:
    return replace(record, queue=queue, problems=problems)


def _slots_used(record: SweepRecord, processes: ProcessTable) -> int:
    return sum(member_is_live(RunPaths(Path(member.run_dir)), processes) for member in record.members)


def _work_queue(paths: SweepPaths, scheduler_lock: int) -> bool:
    """Hand over as many queued members as slots allow; False once the queue is empty (the scheduler
    is then unregistered and lets go of the scheduler lock, under the sweep's lock, so that a resume that
    queues members from then on starts a new one)."""
    with sweep_lock(paths):
        record = load_sweep(paths)
        if not record.queue:
            change_sweep(paths, lambda r: replace(r, scheduler=None))
            fcntl.flock(scheduler_lock, fcntl.LOCK_UN)
            return False
        free = record.max_parallel - _slots_used(record, ProcessTable.snapshot())
        queue = list(record.queue)
        problems = dict(record.problems)
        while queue and free > 0:
            entry = queue[0]
            member = RunPaths(Path(record.member(entry["name"]).run_dir))
            try:
                if not _handed_over_since(member, entry["at"]):
                    _hand_over(member)
                    free -= 1
            except Exception as error:  # one member's problem (a damaged state.json, a refusal): recorded, the others go on
                problems[entry["name"]] = f"{type(error).__name__}: {error}"
                print(f"{run_state.now()} {entry['name']}: not started: {error}", flush=True)
            queue.pop(0)
            change_sweep(paths, partial(_with_queue, queue=tuple(queue), problems=dict(problems)))
    return True


def run_scheduler(sweep_dir: str, lock_descriptor: int | None = None) -> int:
    """Work the sweep's queue until it is empty. ``lock_descriptor``: the scheduler lock, already held (taken
    by :func:`start_scheduler` before it started this process); else it is taken here, or this exits at once
    when another scheduler holds it."""
    paths = SweepPaths(Path(sweep_dir))
    descriptor = lock_descriptor
    if descriptor is None:
        descriptor = take_scheduler_lock(paths)
        if descriptor is None:
            print(f"{run_state.now()} another scheduler works this sweep; exiting", flush=True)
            return 0
    try:
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": run_state.now()}
        update_sweep(paths, lambda r: replace(r, scheduler=me))
        print(f"{run_state.now()} scheduler {json.dumps(me)} started", flush=True)
        while _work_queue(paths, descriptor):
            time.sleep(POLL_S)
    except Exception:  # e.g. sweep.json damaged: every sweep verb then says so, and resume starts another
        traceback.print_exc()
        return 1
    finally:
        os.close(descriptor)
    print(f"{run_state.now()} the queue is empty; scheduler exits", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_scheduler(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None))
