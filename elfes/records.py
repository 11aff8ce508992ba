"""Run records: the event schema, the event log writer and a torch-free reader.

A training run leaves one JSON object per line in ``<run_dir>/events.jsonl``.
The engine emits events as plain dicts ``{"event": name, **fields}`` through
:class:`RunLogger`, which validates them against :data:`EVENT_FIELDS`, stamps
them with a UTC ``time``, appends them to the file and shows them on a rich
console. Login-node tools read the file back with :func:`read_events` and
:func:`summarize`.

This module must never import torch, directly or indirectly: it is imported
by tools that run where torch is absent or slow to import.

Example:
    >>> with RunLogger(run_dir, is_main_process=True) as logger:   # doctest: +SKIP
    ...     logger.log({"event": "skipped", "epoch": 0, "step": 3, "reason": "amp_overflow"})
    >>> print(format_summary(summarize(read_events(run_dir))))     # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import numbers
import threading
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any, Literal, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

__all__ = [
    "BUDGET_FIELDS",
    "EVENTS_FILE_NAME",
    "EVENT_DESCRIPTIONS",
    "EVENT_FIELDS",
    "EventsFileWarning",
    "RunLogger",
    "RunSummary",
    "STATE_FIELDS",
    "event_reference",
    "events_path",
    "format_summary",
    "read_events",
    "summarize",
]

# ---------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------

EVENTS_FILE_NAME = "events.jsonl"

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

# The single definition of the schema: event name -> (description, required fields).
_SCHEMA: dict[str, tuple[str, tuple[str, ...]]] = {
    "started": (
        "A run began from scratch. Records the world size, precision (no/fp16/bf16), "
        "device, gradient accumulation, the TrainConfig fields (config), the step "
        "budget, the optimizer class and parameter groups (name, lr, weight_decay, "
        "num_parameters), the EMA decay or null, the objective term weights or null, "
        "user metadata and the initial training state.",
        _RUN_FIELDS,
    ),
    "resumed": (
        "A run continued from a checkpoint (resumed_from). Same fields as started; "
        "state is the restored training state.",
        (*_RUN_FIELDS, "resumed_from"),
    ),
    "train": (
        "Training progress at the logging interval: metrics holds loss, lr/<group>, "
        "grad_norm, last_update_samples, samples_per_second and the user's metrics.",
        ("epoch", "step", "planned_steps", "samples", "metrics"),
    ),
    "skipped": (
        "A window's optimizer update was skipped while its data still counted as "
        "consumed (reason: amp_overflow or unlabelled_window).",
        ("epoch", "step", "reason"),
    ),
    "evaluation": (
        "An evaluation finished: metrics maps loader name to metric name to value, "
        "computed with the raw or ema weights; monitor, improved, best_metric and "
        "best_step describe model selection (null when nothing is monitored).",
        (
            "epoch",
            "step",
            "weights",
            "metrics",
            "duration_s",
            "monitor",
            "improved",
            "best_metric",
            "best_step",
        ),
    ),
    "checkpoint": (
        "A checkpoint was published at path (reason: interval, best, stop or final); "
        "best and final say which pointers now name it (last always does), bytes is "
        "its size and duration_s the time to write it.",
        (
            "path",
            "epoch",
            "step",
            "next_batch",
            "reason",
            "best",
            "final",
            "bytes",
            "duration_s",
        ),
    ),
    "export": (
        "Model weights (raw or ema) were exported to path.",
        ("weights", "path"),
    ),
    "stop_requested": (
        "All ranks agreed to stop at this window boundary (reason; signal is the "
        "signal name such as SIGTERM, or null); last is saved next.",
        ("reason", "signal", "epoch", "step"),
    ),
    "finished": (
        "The run reached its budget or stopped early on the monitor "
        "(state.stop_reason early_stopping). Records the final state and the seconds "
        "spent training, evaluating, checkpointing and in total (wall_s) since "
        "this start.",
        _TOTALS_FIELDS,
    ),
    "stopped": (
        "The run paused on a stop request (reason) after saving last; resume from "
        "it. Same fields as finished.",
        (*_TOTALS_FIELDS, "reason"),
    ),
}

EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    name: fields for name, (_, fields) in _SCHEMA.items()
}
"""Event name -> required fields beyond ``event`` and ``time``. Extra fields are allowed.

Example:
    >>> EVENT_FIELDS["export"]
    ('weights', 'path')
"""

EVENT_DESCRIPTIONS: dict[str, str] = {
    name: description for name, (description, _) in _SCHEMA.items()
}
"""Event name -> one-paragraph description, for generated documentation."""

# Nested dicts whose keys are part of the contract, checked when present.
_NESTED_FIELDS: dict[str, tuple[str, ...]] = {
    "state": STATE_FIELDS,
    "budget": BUDGET_FIELDS,
}


def events_path(run_dir: Path) -> Path:
    """Return the events file of a run directory. Any process.

    Example:
        >>> events_path(Path("runs/a"))
        PosixPath('runs/a/events.jsonl')
    """
    return Path(run_dir) / EVENTS_FILE_NAME


def _validate(event: Mapping[str, Any]) -> str:
    """Check an event against the schema and return its name."""
    name = event.get("event")
    if name not in EVENT_FIELDS:
        known = ", ".join(EVENT_FIELDS)
        raise ValueError(
            f"unknown event name {name!r}; use one of: {known} "
            "(schema: elfes.records.EVENT_FIELDS)"
        )
    if "time" in event:
        raise ValueError(
            f"event {name!r} already has a 'time' field; RunLogger stamps the time "
            "itself, so remove it"
        )
    missing = [field for field in EVENT_FIELDS[name] if field not in event]
    if missing:
        raise ValueError(
            f"event {name!r} is missing required field(s) {', '.join(map(repr, missing))}; "
            "add them (schema: elfes.records.EVENT_FIELDS)"
        )
    for field, keys in _NESTED_FIELDS.items():
        if field not in EVENT_FIELDS[name]:
            continue
        value = event[field]
        if not isinstance(value, Mapping):
            raise ValueError(
                f"event {name!r} field {field!r} must be a dict, got "
                f"{type(value).__name__}; pass a dict with keys {', '.join(keys)}"
            )
        missing = [key for key in keys if key not in value]
        if missing:
            raise ValueError(
                f"event {name!r} field {field!r} is missing key(s) "
                f"{', '.join(map(repr, missing))}; add them "
                f"(schema: elfes.records.{field.upper()}_FIELDS)"
            )
    return name


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
        f"event field {where!r} holds a {type(value).__module__}.{type(value).__name__}, "
        "which cannot be written as JSON; convert it to a number, string, list or dict "
        "first (for a tensor: .item() or .tolist())"
    )


def _serialise(event: Mapping[str, Any], name: str, time: str) -> str:
    record = {"event": name, "time": time}
    for key, value in event.items():
        if key != "event":
            record[key] = _jsonable(value, f"{name}.{key}")
    try:
        return json.dumps(record, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"event {name!r} cannot be written as JSON ({error}); use str keys and "
            "plain values"
        ) from error


# ---------------------------------------------------------------------------
# Console rendering: one plain line per event kind
# ---------------------------------------------------------------------------


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


def _rate(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "n/a"


def _seconds(value: Any) -> str:
    return f"{value:.2f}s" if isinstance(value, (int, float)) else "n/a"


def _pairs(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    return [f"{prefix}{key}={_number(value)}" for key, value in values.items()]


def _render_run_start(event: Mapping[str, Any]) -> str:
    state, budget = event["state"], event["budget"]
    parts = [
        event["event"],
        f"epoch={state['epoch']}",
        f"step={state['step']}/{budget['planned_steps']}",
        f"world_size={event['world_size']}",
        f"precision={event['precision']}",
        f"device={event['device']}",
        f"grad_accum={event['gradient_accumulation_steps']}",
    ]
    if event["event"] == "resumed":
        parts.append(f"from={event['resumed_from']}")
    return " ".join(parts)


def _render_train(event: Mapping[str, Any]) -> str:
    metrics = dict(event["metrics"])
    loss = metrics.pop("loss", None)
    speed = metrics.pop("samples_per_second", None)
    metrics.pop("last_update_samples", None)
    return " ".join(
        [
            "train",
            f"epoch={event['epoch']}",
            f"step={event['step']}/{event['planned_steps']}",
            f"loss={_number(loss)}",
            *_pairs(metrics),
            f"samples/s={_rate(speed)}",
        ]
    )


def _render_skipped(event: Mapping[str, Any]) -> str:
    return f"skipped epoch={event['epoch']} step={event['step']} reason={event['reason']}"


def _render_evaluation(event: Mapping[str, Any]) -> str:
    parts = [
        "evaluation",
        f"epoch={event['epoch']}",
        f"step={event['step']}",
        f"weights={event['weights']}",
    ]
    for loader, metrics in event["metrics"].items():
        parts += _pairs(metrics, prefix=f"{loader}/")
    parts.append(f"duration={_seconds(event['duration_s'])}")
    if event["improved"]:
        parts.append("best")
    return " ".join(parts)


def _render_checkpoint(event: Mapping[str, Any]) -> str:
    parts = [
        "checkpoint",
        f"epoch={event['epoch']}",
        f"step={event['step']}",
        f"reason={event['reason']}",
        f"size={event['bytes'] / 1e6:.1f}MB",
        f"duration={_seconds(event['duration_s'])}",
        f"path={event['path']}",
    ]
    parts += [flag for flag in ("best", "final") if event[flag]]
    return " ".join(parts)


def _render_export(event: Mapping[str, Any]) -> str:
    return f"export weights={event['weights']} path={event['path']}"


def _render_stop_requested(event: Mapping[str, Any]) -> str:
    return (
        f"stop_requested epoch={event['epoch']} step={event['step']} "
        f"reason={event['reason']} signal={event['signal']}"
    )


def _render_run_end(event: Mapping[str, Any]) -> str:
    state = event["state"]
    parts = [event["event"]]
    if event["event"] == "stopped":
        parts.append(f"reason={event['reason']}")
    parts += [
        f"epoch={state['epoch']}",
        f"step={state['step']}",
        f"samples={state['samples']}",
    ]
    if state["best_metric"] is not None:
        parts.append(f"best={_number(state['best_metric'])}@{state['best_step']}")
    parts += [
        f"train={_seconds(event['train_s'])}",
        f"evaluation={_seconds(event['evaluation_s'])}",
        f"checkpoint={_seconds(event['checkpoint_s'])}",
        f"wall={_seconds(event['wall_s'])}",
    ]
    return " ".join(parts)


_RENDERERS = {
    "started": _render_run_start,
    "resumed": _render_run_start,
    "train": _render_train,
    "skipped": _render_skipped,
    "evaluation": _render_evaluation,
    "checkpoint": _render_checkpoint,
    "export": _render_export,
    "stop_requested": _render_stop_requested,
    "finished": _render_run_end,
    "stopped": _render_run_end,
}

# Log files must stay plain text, whatever strings users put in metric names or paths.
_CONTROL_CHARACTERS = {code: "?" for code in (*range(0x20), *range(0x7F, 0xA0))}


def _plain_line(stamp: datetime, event: Mapping[str, Any]) -> str:
    text = f"{stamp:%Y-%m-%dT%H:%M:%SZ} {_RENDERERS[event['event']](event)}"
    return text.translate(_CONTROL_CHARACTERS)


# ---------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------


class RunLogger:
    """Validate, record and display the events of one training run.

    Every process constructs one and calls :meth:`log` with the same events, so
    that a schema error is raised on all ranks alike; only the main process
    (``is_main_process=True``) writes ``events.jsonl`` and prints. The run
    directory is created on the first event. On an interactive console the
    train events drive a progress bar; otherwise (SLURM log files, CI) each
    event becomes one timestamped plain line without escape codes.

    Example:
        >>> with RunLogger(Path("runs/a"), is_main_process=rank == 0) as logger:  # doctest: +SKIP
        ...     logger.log({"event": "export", "weights": "ema", "path": "runs/a/model.pt"})
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        is_main_process: bool,
        console: Console | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.path = events_path(self.run_dir)
        self.is_main_process = is_main_process
        if console is None and is_main_process:
            console = Console(stderr=False)
        self.console = console
        self._file: TextIO | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._closed = False
        # Checkpoint or evaluation code may log from a helper thread; lines must not interleave.
        self._lock = threading.Lock()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def log(self, event: Mapping[str, Any]) -> None:
        """Validate an event, append it to ``events.jsonl`` and show it. Any process.

        The event is ``{"event": name, **fields}`` with the fields of
        :data:`EVENT_FIELDS`; ``time`` is added here. Non-finite floats are
        recorded as null and paths as strings. The line is flushed before
        returning. On other than the main process nothing is written or shown.

        Raises ``ValueError`` for an unknown event name or a missing field and
        ``TypeError`` for a value that has no JSON form, on every process.

        Example:
            >>> logger.log({"event": "skipped", "epoch": 0, "step": 7,  # doctest: +SKIP
            ...             "reason": "amp_overflow"})
        """
        name = _validate(event)
        now = datetime.now(timezone.utc)
        line = _serialise(event, name, now.isoformat())
        if self._closed:
            raise RuntimeError(
                f"RunLogger for {self.run_dir} is closed; create a new RunLogger "
                "to log more events"
            )
        if not self.is_main_process:
            return
        with self._lock:
            events_file = self._open()
            events_file.write(line + "\n")
            events_file.flush()
            self._show(event, now)

    def close(self) -> None:
        """Stop the progress bar and close the events file. Any process; idempotent.

        Example:
            >>> logger.close()  # doctest: +SKIP
        """
        with self._lock:
            self._closed = True
            self._stop_bar()
            if self._file is not None:
                self._file.close()
                self._file = None

    def _open(self) -> TextIO:
        if self._file is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            torn = self.path.exists() and not _ends_with_newline(self.path)
            self._file = self.path.open("a", encoding="utf-8")
            if torn:
                # A kill mid-write left a partial line; isolate it so ours stay parseable.
                self._file.write("\n")
        return self._file

    def _show(self, event: Mapping[str, Any], now: datetime) -> None:
        assert self.console is not None
        name = event["event"]
        interactive = self.console.is_terminal
        if interactive and name in ("finished", "stopped"):
            self._stop_bar()
        if not (interactive and name == "train"):
            self.console.out(_plain_line(now, event), highlight=False)
        if interactive and name in ("started", "resumed", "train"):
            self._update_bar(event)

    def _update_bar(self, event: Mapping[str, Any]) -> None:
        if event["event"] == "train":
            metrics = event["metrics"]
            total, step, epoch = event["planned_steps"], event["step"], event["epoch"]
            fields = {
                "loss": _number(metrics.get("loss")),
                "speed": _rate(metrics.get("samples_per_second")),
            }
        else:
            state = event["state"]
            total, step, epoch = event["budget"]["planned_steps"], state["step"], state["epoch"]
            fields = {}
        if self._progress is None:
            self._progress = Progress(
                TextColumn("epoch {task.fields[epoch]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[speed]} samples/s"),
                TimeRemainingColumn(),
                console=self.console,
            )
            # Start at the current step so a resume does not count as instant progress in the ETA.
            self._task = self._progress.add_task(
                "train", total=total, completed=step, epoch=epoch, loss="n/a", speed="n/a"
            )
            self._progress.start()
        assert self._task is not None
        self._progress.update(self._task, total=total, completed=step, epoch=epoch, **fields)

    def _stop_bar(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as file:
        if file.seek(0, 2) == 0:
            return True
        file.seek(-1, 2)
        return file.read(1) == b"\n"


# ---------------------------------------------------------------------------
# Reader
# ---------------------------------------------------------------------------


class EventsFileWarning(UserWarning):
    """An events file contains a line that is not a JSON event (e.g. torn by a kill)."""


def read_events(run_dir_or_file: Path) -> list[dict[str, Any]]:
    """Read all events of a run, oldest first. Any process; torch-free.

    Accepts the run directory or the events file itself. Lines that are not
    JSON objects, such as a line torn when the run was killed mid-write, are
    skipped with an :class:`EventsFileWarning` naming the file and line.

    Example:
        >>> [e["event"] for e in read_events(Path("runs/a"))]  # doctest: +SKIP
        ['started', 'train', 'evaluation', 'checkpoint', 'finished']
    """
    path = Path(run_dir_or_file)
    if path.is_dir():
        path = events_path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no events file at {path}: the run has not started logging yet; check the "
            "run directory, or wait for the job to start"
        )
    events = []
    with path.open(encoding="utf-8", errors="replace") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = None
            if not isinstance(event, dict) or "event" not in event:
                warnings.warn(
                    f"{path}:{number}: skipping a line that is not a JSON event "
                    "(probably torn when the run was killed); the other events are intact",
                    EventsFileWarning,
                    stacklevel=2,
                )
                continue
            events.append(event)
    return events


@dataclass(frozen=True)
class RunSummary:
    """Where a run stands, as derived by :func:`summarize`.

    ``status`` is "finished" or "stopped" when the last start (started or
    resumed) was followed by that event, else "running", which also covers a
    job killed without a stop: compare ``last_event_time`` with the clock.
    Progress fields come from the last event that carries them and are None
    when no event does. Durations are summed over finished/stopped events.
    """

    status: Literal["running", "finished", "stopped"]
    step: int | None
    planned_steps: int | None
    epoch: int | None
    samples: int | None
    best_metric: float | None
    best_step: int | None
    monitor: str | None
    starts: int
    resumes: int
    stops: tuple[str, ...]
    checkpoints: int
    last_checkpoint: str | None
    train_s: float
    evaluation_s: float
    checkpoint_s: float
    last_event_time: str | None


_PROGRESS_KEYS = ("step", "epoch", "samples", "best_metric", "best_step")


def summarize(events: Iterable[Mapping[str, Any]]) -> RunSummary:
    """Summarise a run's events (as returned by :func:`read_events`). Any process.

    Unknown event names are ignored, so older tools can read newer runs.
    ``stops`` lists the reasons of ``stopped`` events, in order.

    Example:
        >>> summarize(read_events(Path("runs/a"))).status  # doctest: +SKIP
        'finished'
    """
    events = list(events)
    if not events:
        raise ValueError(
            "no events to summarise; the events file is empty or holds only torn "
            "lines, so wait for the run to log its first event"
        )
    status: Literal["running", "finished", "stopped"] = "running"
    progress: dict[str, Any] = dict.fromkeys(_PROGRESS_KEYS)
    planned_steps = monitor = last_checkpoint = None
    starts = resumes = checkpoints = 0
    stops: list[str] = []
    totals = dict.fromkeys(("train_s", "evaluation_s", "checkpoint_s"), 0.0)

    for event in events:
        name = event.get("event")
        state = event.get("state")
        state = state if isinstance(state, Mapping) else {}
        for key in _PROGRESS_KEYS:
            if key in event:
                progress[key] = event[key]
            elif key in state:
                progress[key] = state[key]
        budget = event.get("budget")
        if isinstance(budget, Mapping) and "planned_steps" in budget:
            planned_steps = budget["planned_steps"]
        elif "planned_steps" in event:
            planned_steps = event["planned_steps"]

        if name in ("started", "resumed"):
            status = "running"
            starts += 1
            if name == "resumed":
                resumes += 1
        elif name in ("finished", "stopped"):
            status = name
            for key in totals:
                totals[key] += event.get(key) or 0.0
            if name == "stopped":
                stops.append(str(event.get("reason")))
        elif name == "evaluation":
            monitor = event.get("monitor")
        elif name == "checkpoint":
            checkpoints += 1
            last_checkpoint = event.get("path")

    return RunSummary(
        status=status,
        planned_steps=planned_steps,
        monitor=monitor,
        starts=starts,
        resumes=resumes,
        stops=tuple(stops),
        checkpoints=checkpoints,
        last_checkpoint=last_checkpoint,
        last_event_time=events[-1].get("time"),
        **progress,
        **totals,
    )


def format_summary(summary: RunSummary) -> str:
    """Render a :class:`RunSummary` as a few plain lines for humans. Any process.

    Example:
        >>> print(format_summary(summarize(read_events(Path("runs/a")))))  # doctest: +SKIP
        status: finished (1 start(s), 0 resume(s))
        progress: epoch 2, step 100/100, 6400 samples
        ...
    """
    status = summary.status
    if status == "running":
        status = "running (or killed: no finish or stop after the last start)"
    lines = [
        f"status: {status} ({summary.starts} start(s), {summary.resumes} resume(s))",
        f"progress: epoch {_number(summary.epoch)}, step {_number(summary.step)}/"
        f"{_number(summary.planned_steps)}, {_number(summary.samples)} samples",
    ]
    if summary.best_metric is not None:
        lines.append(
            f"best: {summary.monitor or 'metric'} = {_number(summary.best_metric)} "
            f"at step {_number(summary.best_step)}"
        )
    if summary.stops:
        lines.append(f"stops: {', '.join(summary.stops)}")
    lines.append(
        f"checkpoints: {summary.checkpoints}, last: {summary.last_checkpoint or 'none'}"
    )
    lines.append(
        f"time: train {_seconds(summary.train_s)}, evaluation "
        f"{_seconds(summary.evaluation_s)}, checkpoint {_seconds(summary.checkpoint_s)}"
    )
    lines.append(f"last event: {summary.last_event_time or 'n/a'}")
    return "\n".join(lines)


def event_reference() -> str:
    """The event schema as a Markdown table, for the README (a test keeps the two identical)."""
    rows = ["| event | fields | meaning |", "| --- | --- | --- |"]
    for name, description in EVENT_DESCRIPTIONS.items():
        fields = ", ".join(f"`{field}`" for field in EVENT_FIELDS[name])
        rows.append(f"| `{name}` | {fields} | {description} |")
    return "\n".join(rows)
