"""What the run's tracker runs (MLflow, W&B) say of it, as ``state.json`` says it: :func:`lifecycle_of` maps the
run's status and its attempts' ends to the trackers' status (each sink says it in its own words), and :func:`publish_lifecycle` writes it for the
mirror (elfes/records/tracker_lifecycle.py) and, at an end that ends the run, sends it.

The trackers' status follows ``elfes status``: RUNNING while the run goes on (an attempt runs, a requeue or a
retried failure is under way), FINISHED, FAILED (a failure not retried, or a job lost), KILLED (cancelled, or
stopped: ``elfes resume`` or SLURM's requeue of a preempted job continues it, and its next attempt sets it
RUNNING again). Who calls it: rank 0 as an attempt begins (after its provenance is recorded) and as it ends
(launcher/job/attempt_end.py), and the rank that decides a failure (launcher/job/failed_attempt.py).
Torch-free; the trackers' libraries are imported only to send.
"""

from __future__ import annotations

import logging
import shlex
import threading
from pathlib import Path

from elfes.records.credentials import spec_params
from elfes.records.tracker_lifecycle import (
    CODE_TAG_PREFIX,
    VERSION_TAG_PREFIX,
    Lifecycle,
    TrackerStatus,
    read_lifecycle,
    write_lifecycle,
)
from elfes.records.tracking import TrackingSettings, tracking_group

from ..rundir.paths import RunPaths
from ..rundir.provenance import Provenance
from ..rundir.state import Attempt, Outcome, RunState, RunStatus, load_state
from ..rundir.sweep_record import is_sweep_dir
from ..spec import JobSpec

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 20.0  # what the end of a run waits for the trackers, all at once

TRACKER_STATUS: dict[RunStatus, TrackerStatus] = {
    RunStatus.FINISHED: TrackerStatus.FINISHED, RunStatus.FAILED: TrackerStatus.FAILED,
    RunStatus.CANCELLED: TrackerStatus.KILLED, RunStatus.STOPPED: TrackerStatus.KILLED,
}  # every other status: RUNNING


def attempt_end(attempt: Attempt) -> str | None:
    """How an ended attempt ended, in ``elfes status``'s words: ``requeued (SIGUSR2)``, ``failed (retried)``,
    ``lost``...; None while it runs."""
    if attempt.outcome is None:
        return None
    word = str(attempt.outcome)
    if attempt.outcome == Outcome.FAILED and attempt.failure is not None and attempt.failure.retried:
        return f"{word} (retried)"
    return f"{word} ({attempt.signal})" if attempt.signal else word


def provenance_tags(provenance: Provenance | None) -> dict[str, str]:
    """An attempt's provenance as tags: its snapshot under ``CODE_TAG_PREFIX``, the versions under
    ``VERSION_TAG_PREFIX``; unknowns left out."""
    if provenance is None:
        return {}
    found = {f"{VERSION_TAG_PREFIX}{name}": getattr(provenance, name)
             for name in ("python", "torch", "elfes", "cuda", "cudnn", "nccl", "accelerate")}
    found["elfes.gpu"] = provenance.gpu
    if provenance.code is not None:
        for name in ("commit", "dirty", "fingerprint", "path"):
            found[f"{CODE_TAG_PREFIX}{name}"] = getattr(provenance.code, name)
    return {key: str(value).lower() if isinstance(value, bool) else str(value)
            for key, value in found.items() if value is not None}


def lifecycle_of(state: RunState, spec: JobSpec) -> Lifecycle:
    """The run's lifecycle for its trackers: status, each ended attempt's end, the spec, the latest provenance."""
    ends = {attempt.number: end for attempt in state.attempts if (end := attempt_end(attempt)) is not None}
    provenance = next((attempt.provenance for attempt in reversed(state.attempts) if attempt.provenance), None)
    return Lifecycle(status=TRACKER_STATUS.get(state.status, TrackerStatus.RUNNING), attempt_ends=ends,
                     params=spec_params(spec.model_dump(mode="json")), provenance=provenance_tags(provenance))


def publish_lifecycle(paths: RunPaths, spec: JobSpec | None, state: RunState | None = None, *,
                      send: bool) -> list[str]:
    """Write the run's lifecycle (of ``state``, else of ``state.json``) for its trackers and, with ``send`` and a
    status that ends the run (no mirror will send it), send it. Returns what a tracker that did not take it
    says; never raises: the run's own records come first."""
    if spec is None or not spec.tracking.trackers:
        return []
    try:
        state = state if state is not None else load_state(paths)
        if state is None:
            return []
        lifecycle = lifecycle_of(state, spec)
        write_lifecycle(paths.run_dir, lifecycle)
    except Exception as error:
        log.warning(f"elfes: the trackers' lifecycle was not written ({type(error).__name__}: {error})")
        return []
    if not (send and lifecycle.terminal):
        return []
    return send_lifecycle(paths.run_dir, spec.tracking, group=tracking_group())


def tracker_group(run_dir: Path) -> str | None:
    """The group of a run's tracker runs: its sweep's name for a sweep member, else None."""
    return run_dir.parent.name if is_sweep_dir(run_dir.parent) else None


def send_lifecycle(run_dir: Path, settings: TrackingSettings, *, group: str | None = None,
                   timeout_s: float = SEND_TIMEOUT_S) -> list[str]:
    """Send the run's lifecycle to each tracker of ``settings`` that lacks it, at most ``timeout_s`` (all at
    once, each in a thread of its own). Returns one line per tracker that did not take it; never raises."""
    from elfes.records.tracker_sender import Sink, one_line, send_lifecycle_once
    from elfes.records.trackers import build_sinks

    lifecycle = read_lifecycle(run_dir)
    if lifecycle is None:
        return []
    sinks = build_sinks(settings, run_dir, group=group, sender="end")
    problems: dict[str, str] = {}

    def send(sink: Sink) -> None:
        try:
            send_lifecycle_once(sink, run_dir, lifecycle)
        except Exception as error:  # the tracker, its library or the network
            problems[sink.name] = f"{type(error).__name__}: {one_line(error)}"

    threads = [threading.Thread(target=send, args=(sink,), name=f"elfes-{sink.name}-lifecycle", daemon=True)
               for sink in sinks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    for sink, thread in zip(sinks, threads):
        if thread.is_alive():
            problems[sink.name] = f"no answer within {timeout_s:.0f} s"
    lines = [f"the {sink.name} run was not {sink.describe_status(lifecycle.status)} ({problems[sink.name]}): it "
             f"shows the status it had; the run's own records (state.json, elfes status) are complete, and `elfes "
             f"sync {shlex.quote(str(run_dir))}` sends it"
             for sink in sorted(sinks, key=lambda sink: sink.name) if sink.name in problems]
    for line in lines:
        log.warning(f"elfes: {line}")
    return lines
