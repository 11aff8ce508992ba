"""The event schema: which events a run records, their fields, and how one becomes a JSON line.

This table is the single definition of the events: :class:`~elfes.records.RunLogger` validates against
it and :func:`event_reference` renders it for the README (a test keeps the two identical).
Torch-free and rich-free: login-node tools import it.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from elfes.contract import EVENTS_FILE_NAME, EventKind

STATE_FIELDS: tuple[str, ...] = (
    "epoch",
    "next_batch",
    "step",
    "batches",
    "samples",
    "best_metric",
    "best_step",
    "evaluations_without_improvement",
    "stop_reason",
)
"""Keys required in the ``state`` dict of started/resumed/finished/stopped."""

BUDGET_FIELDS: tuple[str, ...] = (
    "epochs",
    "max_steps",
    "planned_steps",
    "updates_per_epoch",
    "batches_per_epoch",
)
"""Keys required in the ``budget`` dict of started/resumed."""


@dataclass(frozen=True)
class EventSpec:
    """One event kind: what it means, the fields it must carry, and documented fields it may carry.

    Optional fields are checked by nobody and rendered when present; readers treat them as absent
    in events written before they existed.
    """

    description: str
    fields: tuple[str, ...]
    optional: tuple[str, ...] = ()


_RUN_FIELDS = (
    "world_size",
    "precision",
    "device",
    "gradient_accumulation_steps",
    "config",
    "budget",
    "optimizer",
    "ema_decay",
    "objective",
    "metadata",
    "state",
)
_TOTALS_FIELDS = ("state", "train_s", "evaluation_s", "checkpoint_s", "wall_s")

EVENT_SPECS: dict[EventKind, EventSpec] = {
    EventKind.STARTED: EventSpec(
        "A run began from scratch. Records the world size, precision (no/fp16/bf16), device, gradient "
        "accumulation, the TrainConfig fields (config), the step budget, the optimizer class and parameter "
        "groups (name, lr, weight_decay, num_parameters), the EMA decay or null, the objective term weights "
        "or null, user metadata and the initial training state. per_rank_data names what of the training loader "
        "keeps a position per rank (a stream, a stateful sampler), which no other world size can continue, or is "
        "null; records written before it existed lack it.",
        _RUN_FIELDS,
        optional=("per_rank_data",),
    ),
    EventKind.RESUMED: EventSpec(
        "A run continued from a checkpoint (resumed_from). Same fields as started; state is the restored "
        "training state. past_budget is true when the restored step is already beyond budget.planned_steps "
        "(a run resumed with fewer epochs or a smaller max_steps): there is nothing left to train; where it "
        "is absent (older records) readers compare state.step with budget.planned_steps.",
        (*_RUN_FIELDS, "resumed_from"),
        optional=("past_budget", "per_rank_data"),
    ),
    EventKind.TRAIN: EventSpec(
        "Training progress at the logging interval: metrics holds loss, lr/<group> (the parameter group's "
        "name, such as lr/decay and lr/no_decay, or lr/<index> for a group without one), grad_norm, "
        "last_update_samples, samples_per_second and the user's metrics.",
        ("epoch", "step", "planned_steps", "samples", "metrics"),
    ),
    EventKind.SKIPPED: EventSpec(
        "A window's optimizer update was skipped while its data still counted as consumed (reason: "
        "amp_overflow or unlabelled_window).",
        ("epoch", "step", "reason"),
    ),
    EventKind.EVALUATION: EventSpec(
        "An evaluation finished: metrics maps loader name to metric name to value, computed with the raw or "
        "ema weights; monitor, improved, best_metric and best_step describe model selection (null when "
        "nothing is monitored).",
        ("epoch", "step", "weights", "metrics", "duration_s", "monitor", "improved", "best_metric", "best_step"),
    ),
    EventKind.CHECKPOINT: EventSpec(
        "A checkpoint was published at path (reason: interval, best, stop or final); best and final say which "
        "pointers now name it (last always does), bytes is its size and duration_s the time to write it. "
        "blocked_s is the time the training loop stood still for it at its boundary, waited_s of which it "
        "waited for the previous write to end. asynchronous is true for an interval or best checkpoint "
        "written in the background (TrainConfig.async_checkpoints): the loop was blocked only for a copy "
        "of the payload, the event is recorded once the file and its pointers are published, and "
        "epoch, step and next_batch are those of its boundary. Events written before these fields "
        "existed lack them (synchronous saves, blocked for duration_s).",
        ("path", "epoch", "step", "next_batch", "reason", "best", "final", "bytes", "duration_s"),
        optional=("blocked_s", "waited_s", "asynchronous"),
    ),
    EventKind.EXPORT: EventSpec(
        "Model weights (raw or ema) were exported to path.",
        ("weights", "path"),
    ),
    EventKind.STOP_SIGNAL: EventSpec(
        "The training loop noticed a stop request before the current window ends (signal is its name such as "
        "SIGTERM, or null when stop.request(reason) was called from code); training goes on to the end of the "
        "window, where all ranks agree (stop_requested) and last is saved. Consoles print it at once: "
        "`stop requested (SIGTERM): saving at the end of this window`.",
        ("signal", "reason", "epoch", "step"),
    ),
    EventKind.STOP_REQUESTED: EventSpec(
        "All ranks agreed to stop at this window boundary (reason; signal is the signal name such as "
        "SIGTERM, or null); last is saved next.",
        ("reason", "signal", "epoch", "step"),
    ),
    EventKind.WARNING: EventSpec(
        "Something the run does not do exactly, or does at a cost, said when it is found (message; kind: "
        "inexact_stream, a stream whose state_dict leaves out part of its place, such as a Hugging Face "
        "stream shuffled with a buffer, warned at every start; stream_replay, a resume that read and "
        "discarded a stream's consumed batches, with the time it took; tracker_behind, an experiment tracker "
        "(MLflow, W&B) that did not take the records sent to it, said once until it takes them again; "
        "world_size_changed, a run continued on another world size, which then matches an uninterrupted one to "
        "float rounding, not bitwise, with what its generators keep). `elfes status` shows the warnings "
        "recorded since the run's latest start.",
        ("kind", "message", "epoch", "step"),
    ),
    EventKind.FINISHED: EventSpec(
        "The run reached its budget or stopped early on the monitor (state.stop_reason early_stopping). "
        "Records the final state and the seconds spent training, evaluating, checkpointing and in total "
        "(wall_s) since this start.",
        _TOTALS_FIELDS,
    ),
    EventKind.STOPPED: EventSpec(
        "The run paused on a stop request (reason) after saving last; resume from it. Same fields as "
        "finished.",
        (*_TOTALS_FIELDS, "reason"),
    ),
    EventKind.FAILED: EventSpec(
        "An exception ended the run at epoch and step (exception is its type name, message its text); the "
        "engine re-raises it after recording it. summarize reports the run as failed; fix the cause and "
        "resume from last.",
        ("exception", "message", "epoch", "step"),
    ),
}
"""Event kind -> :class:`EventSpec`: the single definition of the schema, one entry per :class:`~elfes.contract.EventKind`
(a test holds the two equal)."""

EVENT_FIELDS: dict[EventKind, tuple[str, ...]] = {name: spec.fields for name, spec in EVENT_SPECS.items()}
"""Event name -> required fields beyond ``event`` and ``time``. Extra fields are allowed.

Example:
    >>> EVENT_FIELDS["export"]
    ('weights', 'path')
"""

EVENT_DESCRIPTIONS: dict[EventKind, str] = {name: spec.description for name, spec in EVENT_SPECS.items()}
"""Event name -> one-paragraph description, for generated documentation."""

FIELD_NOTES: dict[str, str] = {
    "time": "UTC ISO 8601 time, added by RunLogger.",
    "epoch": (
        "The 1-based number of the epoch the run is in; a boundary at the end of an epoch belongs to the "
        "epoch that just ended. A 3-epoch run starts in epoch 1, its train event and evaluation after the "
        "last update of epoch 1 both say 1, and it finishes in epoch 3. Consoles show it as `epoch 1/3`."
    ),
    "state": (
        "The training state (STATE_FIELDS). `state.epoch` counts completed epochs and `state.next_batch` the "
        "batches already consumed of the next one; consoles show `elfes.records.epoch_number(state.epoch, "
        "state.next_batch)`, the same number as the `epoch` field."
    ),
    "budget": "The step budget (BUDGET_FIELDS): `epochs`, `max_steps`, `planned_steps`, `updates_per_epoch`, `batches_per_epoch`.",
}
"""Field name -> meaning, for fields shared by several events."""

# Nested dicts whose keys are part of the contract, checked when present.
_NESTED_FIELDS: dict[str, tuple[str, ...]] = {
    "state": STATE_FIELDS,
    "budget": BUDGET_FIELDS,
}


def epoch_number(completed_epochs: int, next_batch: int) -> int:
    """The 1-based epoch a run is in, from its state (completed epochs and batches consumed since).

    A boundary at the end of an epoch belongs to the epoch that just ended; a fresh run is in epoch 1.

    Example:
        >>> epoch_number(0, 0), epoch_number(0, 7), epoch_number(1, 0), epoch_number(1, 3)
        (1, 1, 1, 2)
    """
    if completed_epochs > 0 and next_batch == 0:
        return completed_epochs
    return completed_epochs + 1


def events_path(run_dir: Path) -> Path:
    """Return the events file of a run directory. Any process.

    Example:
        >>> events_path(Path("runs/a"))
        PosixPath('runs/a/events.jsonl')
    """
    return Path(run_dir) / EVENTS_FILE_NAME


def validate_event(event: Mapping[str, Any]) -> EventKind:
    """Check an event against the schema and return its name; ``ValueError`` says what to add or remove.

    Example:
        >>> validate_event({"event": "export", "weights": "ema", "path": "model.pt"})
        'export'
    """
    name = event.get("event")
    if not isinstance(name, str) or name not in EVENT_FIELDS:
        known = ", ".join(EVENT_FIELDS)
        raise ValueError(f"unknown event name {name!r}; use one of: {known} (schema: elfes.records.EVENT_FIELDS)")
    if "time" in event:
        raise ValueError(
            f"event {name!r} already has a 'time' field; RunLogger stamps the time itself, so remove it"
        )
    required = EVENT_FIELDS[EventKind(name)]
    missing = [field for field in required if field not in event]
    if missing:
        raise ValueError(
            f"event {name!r} is missing required field(s) {', '.join(map(repr, missing))}; "
            "add them (schema: elfes.records.EVENT_FIELDS)"
        )
    for field, keys in _NESTED_FIELDS.items():
        if field not in required:
            continue
        value = event[field]
        if not isinstance(value, Mapping):
            raise ValueError(
                f"event {name!r} field {field!r} must be a dict, got {type(value).__name__}; "
                f"pass a dict with keys {', '.join(keys)}"
            )
        missing = [key for key in keys if key not in value]
        if missing:
            raise ValueError(
                f"event {name!r} field {field!r} is missing key(s) {', '.join(map(repr, missing))}; add them "
                f"(schema: elfes.records.{field.upper()}_FIELDS)"
            )
    return EventKind(name)


def _jsonable(value: Any, where: str) -> Any:
    """Convert a value to JSON-ready data: non-finite floats become None, paths str."""
    if value is None or isinstance(value, (bool, str)):
        return value
    # numbers.* also accepts numpy scalars without importing numpy.
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {key: _jsonable(item, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item, f"{where}[{index}]") for index, item in enumerate(value)]
    raise TypeError(
        f"event field {where!r} holds a {type(value).__module__}.{type(value).__name__}, which cannot be "
        "written as JSON; convert it to a number, string, list or dict first (for a tensor: .item() or .tolist())"
    )


def event_json_line(event: Mapping[str, Any], name: str, time: str) -> str:
    """The JSON line of a validated event, stamped with ``time``; ``TypeError`` names a value without a JSON form.

    Example:
        >>> event_json_line({"event": "export", "weights": "ema", "path": Path("m.pt")}, "export", "T")
        '{"event": "export", "time": "T", "weights": "ema", "path": "m.pt"}'
    """
    record = {"event": name, "time": time}
    for key, value in event.items():
        if key != "event":
            record[key] = _jsonable(value, f"{name}.{key}")
    try:
        return json.dumps(record, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(f"event {name!r} cannot be written as JSON ({error}); use str keys and plain values") from error


def event_reference() -> str:
    """The event schema as Markdown (a table, then shared fields), for the README; a test keeps the two identical.

    Example:
        >>> event_reference().splitlines()[0]
        '| event | fields | meaning |'
    """
    rows = ["| event | fields | meaning |", "| --- | --- | --- |"]
    for name, spec in EVENT_SPECS.items():
        fields = [f"`{field}`" for field in spec.fields] + [f"`{field}` (optional)" for field in spec.optional]
        rows.append(f"| `{name}` | {', '.join(fields)} | {spec.description} |")
    rows.append("")
    rows += [f"- `{field}`: {meaning}" for field, meaning in FIELD_NOTES.items()]
    return "\n".join(rows)
