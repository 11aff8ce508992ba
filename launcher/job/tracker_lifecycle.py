"""What the run's tracker runs (MLflow, W&B) say of it, as ``state.json`` says it: :func:`lifecycle_of` maps the
run's status and its attempts' ends to the trackers' words, and :func:`publish_lifecycle` writes it for the
mirror (elfes/records/tracker_lifecycle.py) and, at an end that ends the run, sends it.

The trackers' status follows ``elfes status``: RUNNING while the run goes on (an attempt runs, a requeue or a
retried failure is under way), FINISHED, FAILED (a failure not retried, or a job lost), KILLED (cancelled, or
stopped: ``elfes resume`` or SLURM's requeue of a preempted job continues it, and its next attempt sets it
RUNNING again). Who calls it: rank 0 as an attempt begins (after its provenance is recorded) and as it ends
(launcher/job/attempt_end.py), the rank that decides a failure (launcher/job/failed_attempt.py), and ``elfes
status --sync-trackers``. Torch-free; the trackers' libraries are imported only to send.
"""

from __future__ import annotations

import logging

from elfes.records.tracker_lifecycle import Lifecycle, send_lifecycle, spec_params, write_lifecycle
from elfes.records.tracking import tracking_group

from ..rundir.paths import RunPaths
from ..rundir.provenance import Provenance
from ..rundir.state import Attempt, Outcome, RunState, RunStatus, load_state
from ..spec import JobSpec

log = logging.getLogger(__name__)

TRACKER_STATUS: dict[RunStatus, str] = {
    RunStatus.FINISHED: "FINISHED", RunStatus.FAILED: "FAILED", RunStatus.CANCELLED: "KILLED",
    RunStatus.STOPPED: "KILLED",
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
    """An attempt's provenance as tags: ``elfes.code.*`` (its snapshot) and ``elfes.version.*``; unknowns left out."""
    if provenance is None:
        return {}
    found = {f"elfes.version.{name}": getattr(provenance, name)
             for name in ("python", "torch", "elfes", "cuda", "cudnn", "nccl", "accelerate")}
    found["elfes.gpu"] = provenance.gpu
    if provenance.code is not None:
        for name in ("commit", "dirty", "fingerprint", "path"):
            found[f"elfes.code.{name}"] = getattr(provenance.code, name)
    return {key: str(value).lower() if isinstance(value, bool) else str(value)
            for key, value in found.items() if value is not None}


def lifecycle_of(state: RunState, spec: JobSpec) -> Lifecycle:
    """The run's lifecycle for its trackers: status, each ended attempt's end, the spec, the latest provenance."""
    ends = {attempt.number: end for attempt in state.attempts if (end := attempt_end(attempt)) is not None}
    provenance = next((attempt.provenance for attempt in reversed(state.attempts) if attempt.provenance), None)
    return Lifecycle(status=TRACKER_STATUS.get(state.status, "RUNNING"), attempt_ends=ends,  # type: ignore[arg-type]
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
        log.warning(f"elfes: warning: the trackers' lifecycle was not written ({type(error).__name__}: {error})")
        return []
    if not (send and lifecycle.terminal):
        return []
    return send_lifecycle(paths.run_dir, spec.tracking, group=tracking_group())
