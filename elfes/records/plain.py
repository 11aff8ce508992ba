"""Plain rendering: one human line per event, for log files, CI and the rich console alike.

Torch-free and rich-free; the lines carry no control characters, whatever strings users put in
metric names or paths.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from elfes.contract import START_EVENTS, EventKind

from .schema import epoch_number


def format_number(value: Any) -> str:
    """A metric value for humans: 4 significant digits for floats, ``n/a`` for None.

    Example:
        >>> format_number(0.123456), format_number(None), format_number(7)
        ('0.1235', 'n/a', '7')
    """
    if isinstance(value, float):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


def format_rate(value: Any) -> str:
    """A throughput with one decimal, ``n/a`` when unknown.

    Example:
        >>> format_rate(5012.34)
        '5012.3'
    """
    return f"{value:.1f}" if isinstance(value, (int, float)) else "n/a"


def format_seconds(value: Any) -> str:
    """A duration in seconds with two decimals, ``n/a`` when unknown.

    Example:
        >>> format_seconds(1.5)
        '1.50s'
    """
    return f"{value:.2f}s" if isinstance(value, (int, float)) else "n/a"


def format_bytes(size: Any) -> str:
    """A size for humans in B, KB, MB or GB (decimal units, 1 KB = 1000 bytes), ``n/a`` when unknown.

    Example:
        >>> format_bytes(512), format_bytes(27_000), format_bytes(2_500_000)
        ('512 B', '27.0 KB', '2.5 MB')
    """
    if not isinstance(size, (int, float)):
        return "n/a"
    if size < 1000:
        return f"{size:.0f} B"
    for unit in ("KB", "MB"):
        size /= 1000
        if round(size, 1) < 1000:
            return f"{size:.1f} {unit}"
    return f"{size / 1000:.1f} GB"


def _pairs(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    return [f"{prefix}{key}={format_number(value)}" for key, value in values.items()]


def _render_run_start(event: Mapping[str, Any], epoch: str) -> str:
    state, budget = event["state"], event["budget"]
    parts = [
        event["event"],
        f"epoch={epoch}",
        f"step={state['step']}/{budget['planned_steps']}",
        f"world_size={event['world_size']}",
        f"precision={event['precision']}",
        f"device={event['device']}",
        f"grad_accum={event['gradient_accumulation_steps']}",
    ]
    if event["event"] == EventKind.RESUMED:
        parts.append(f"from={event['resumed_from']}")
        if is_past_budget(event):
            parts.append(
                f"- already at step {state['step']}, past the {budget['planned_steps']} steps this budget "
                "allows: nothing to train"
            )
    return " ".join(parts)


def is_past_budget(event: Mapping[str, Any]) -> bool:
    """Whether a ``resumed`` event restored a run already beyond its new budget: nothing left to train.

    Its ``past_budget`` field says so; records written before that field existed compare steps.

    Example:
        >>> is_past_budget({"event": "resumed", "state": {"step": 320}, "budget": {"planned_steps": 160}})
        True
    """
    if event.get("event") != EventKind.RESUMED:
        return False
    if "past_budget" in event:
        return bool(event["past_budget"])
    return bool(event["state"]["step"] > event["budget"]["planned_steps"])


def _render_train(event: Mapping[str, Any], epoch: str) -> str:
    metrics = dict(event["metrics"])
    loss = metrics.pop("loss", None)
    speed = metrics.pop("samples_per_second", None)
    metrics.pop("last_update_samples", None)
    # Learning rates of every group (lr/<group name> or lr/<index>) come first after the loss.
    learning_rates = {name: value for name, value in metrics.items() if name.startswith("lr/")}
    others = {name: value for name, value in metrics.items() if name not in learning_rates}
    return " ".join(
        [
            "train",
            f"epoch={epoch}",
            f"step={event['step']}/{event['planned_steps']}",
            f"loss={format_number(loss)}",
            *_pairs(learning_rates),
            *_pairs(others),
            f"samples/s={format_rate(speed)}",
        ]
    )


def _render_skipped(event: Mapping[str, Any], epoch: str) -> str:
    return f"skipped epoch={epoch} step={event['step']} reason={event['reason']}"


def _render_evaluation(event: Mapping[str, Any], epoch: str) -> str:
    parts = ["evaluation", f"epoch={epoch}", f"step={event['step']}", f"weights={event['weights']}"]
    for loader, metrics in event["metrics"].items():
        parts += _pairs(metrics, prefix=f"{loader}/")
    parts.append(f"duration={format_seconds(event['duration_s'])}")
    if event["improved"]:
        parts.append("best")
    return " ".join(parts)


def _render_checkpoint(event: Mapping[str, Any], epoch: str) -> str:
    parts = [
        "checkpoint",
        f"epoch={epoch}",
        f"step={event['step']}",
        f"reason={event['reason']}",
        f"size={format_bytes(event['bytes'])}",
        f"duration={format_seconds(event['duration_s'])}",
        f"path={event['path']}",
    ]
    parts += [flag for flag in ("best", "final") if event[flag]]
    return " ".join(parts)


def _render_export(event: Mapping[str, Any], epoch: str) -> str:
    return f"export weights={event['weights']} path={event['path']}"


def _render_stop_requested(event: Mapping[str, Any], epoch: str) -> str:
    return (
        f"stop_requested epoch={epoch} step={event['step']} "
        f"reason={event['reason']} signal={event['signal']}"
    )


def _render_stop_signal(event: Mapping[str, Any], epoch: str) -> str:
    cause = event["signal"] or event["reason"]
    return f"stop requested ({cause}): saving at the end of this window; epoch={epoch} step={event['step']}"


def _render_failed(event: Mapping[str, Any], epoch: str) -> str:
    message = " | ".join(str(event["message"]).splitlines())
    return f"failed epoch={epoch} step={event['step']} {event['exception']}: {message}"


def _render_warning(event: Mapping[str, Any], epoch: str) -> str:
    return f"warning epoch={epoch} step={event['step']} {event['kind']}: {event['message']}"


def _render_run_end(event: Mapping[str, Any], epoch: str) -> str:
    state = event["state"]
    parts = [event["event"]]
    if event["event"] == EventKind.STOPPED:
        parts.append(f"reason={event['reason']}")
    parts += [f"epoch={epoch}", f"step={state['step']}", f"samples={state['samples']}"]
    if state["best_metric"] is not None:
        parts.append(f"best={format_number(state['best_metric'])}@{state['best_step']}")
    parts += [
        f"train={format_seconds(event['train_s'])}",
        f"evaluation={format_seconds(event['evaluation_s'])}",
        f"checkpoint={format_seconds(event['checkpoint_s'])}",
        f"wall={format_seconds(event['wall_s'])}",
    ]
    return " ".join(parts)


_RENDERERS: dict[EventKind, Callable[[Mapping[str, Any], str], str]] = {
    EventKind.STARTED: _render_run_start,
    EventKind.RESUMED: _render_run_start,
    EventKind.TRAIN: _render_train,
    EventKind.SKIPPED: _render_skipped,
    EventKind.EVALUATION: _render_evaluation,
    EventKind.CHECKPOINT: _render_checkpoint,
    EventKind.EXPORT: _render_export,
    EventKind.STOP_SIGNAL: _render_stop_signal,
    EventKind.STOP_REQUESTED: _render_stop_requested,
    EventKind.FINISHED: _render_run_end,
    EventKind.STOPPED: _render_run_end,
    EventKind.FAILED: _render_failed,
    EventKind.WARNING: _render_warning,
}

# Log files must stay plain text, whatever strings users put in metric names or paths.
_CONTROL_CHARACTERS = {code: "?" for code in (*range(0x20), *range(0x7F, 0xA0))}


def event_epoch(event: Mapping[str, Any]) -> int | None:
    """The 1-based epoch the run is in at an event: its ``epoch`` field, else derived from its ``state``.

    Example:
        >>> event_epoch({"event": "finished", "state": {"epoch": 3, "next_batch": 0}})
        3
    """
    if "epoch" in event:
        epoch: int | None = event["epoch"]
        return epoch
    state = event.get("state")
    if isinstance(state, Mapping) and "epoch" in state:
        return epoch_number(state["epoch"], state.get("next_batch", 0))
    return None


class PlainLines:
    """One timestamped line per event, without control characters; remembers the run's epoch budget.

    Epochs show as ``epoch=<epoch the run is in>/<epochs of the budget>`` once a ``started`` or
    ``resumed`` event has named the budget.

    Example:
        >>> lines = PlainLines()
        >>> lines.line(datetime(2026, 1, 2, 3, 4, 5), {"event": "export", "weights": "ema", "path": "m.pt"})
        '2026-01-02T03:04:05Z export weights=ema path=m.pt'
    """

    def __init__(self) -> None:
        self.epochs: int | None = None

    def epoch_label(self, event: Mapping[str, Any]) -> str:
        """``1/3`` for the epoch an event is in, or ``1`` while the budget is unknown."""
        epoch = format_number(event_epoch(event))
        return epoch if self.epochs is None else f"{epoch}/{self.epochs}"

    def line(self, stamp: datetime, event: Mapping[str, Any]) -> str:
        """The line of a validated event; a started or resumed event sets the epoch budget first."""
        if event["event"] in START_EVENTS:
            self.epochs = event["budget"].get("epochs")
        text = f"{stamp:%Y-%m-%dT%H:%M:%SZ} {_RENDERERS[event['event']](event, self.epoch_label(event))}"
        return text.translate(_CONTROL_CHARACTERS)
