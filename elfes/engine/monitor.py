"""The monitor's bookkeeping: best metric, patience, the plateau scheduler, and undoing an evaluation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

from elfes.contract import CheckpointName

from .config import Monitor, Progress, TrainState


def monitored_value(results: Mapping[str, Mapping[str, float]], monitor: Monitor) -> float | None:
    return results.get(monitor.loader, {}).get(monitor.name)


def missing_metric_message(results: Mapping[str, Mapping[str, float]], monitor: Monitor) -> str:
    available = sorted(f"{key}/{inner}" for key, values in results.items() for inner in values)
    return (
        f"Monitor metric {monitor.metric!r} is not among the evaluation results {available}; name one of them "
        "(an unobserved mean is omitted rather than reported as zero)."
    )


def update_monitor(
    monitor: Monitor, value: float, state: TrainState, progress: Progress, scheduler: Any, sharded: bool = False
) -> tuple[bool, bool]:
    """Record an evaluation's monitored ``value`` (``sharded``: checkpoints are folders); returns (improved,
    patience exhausted)."""
    improved = monitor.improves(value, state.best_metric)
    if improved:
        state.best_metric, state.best_step = value, state.step
        state.evaluations_without_improvement = 0
        progress.best_checkpoint = CheckpointName(state.step, state.batches, sharded).filename
    else:
        state.evaluations_without_improvement += 1
    if isinstance(scheduler, ReduceLROnPlateau):
        scheduler.step(value)
    exhausted = monitor.patience is not None and state.evaluations_without_improvement >= monitor.patience
    return improved, exhausted


def snapshot_monitor(state: TrainState, progress: Progress, scheduler: Any, optimizer: Optimizer) -> dict[str, Any]:
    """Everything an evaluation can change besides the run records, for :func:`restore_monitor`."""
    return {
        "best_metric": state.best_metric,
        "best_step": state.best_step,
        "evaluations_without_improvement": state.evaluations_without_improvement,
        "best_checkpoint": progress.best_checkpoint,
        "last_evaluation": progress.last_evaluation,
        "plateau": scheduler.state_dict() if isinstance(scheduler, ReduceLROnPlateau) else None,
        "learning_rates": [group["lr"] for group in optimizer.param_groups],
    }


def restore_monitor(snapshot: Mapping[str, Any], state: TrainState, progress: Progress, scheduler: Any, optimizer: Optimizer) -> None:
    state.best_metric = snapshot["best_metric"]
    state.best_step = snapshot["best_step"]
    state.evaluations_without_improvement = snapshot["evaluations_without_improvement"]
    progress.best_checkpoint = snapshot["best_checkpoint"]
    progress.last_evaluation = snapshot["last_evaluation"]
    if snapshot["plateau"] is not None:
        scheduler.load_state_dict(snapshot["plateau"])
    for group, lr in zip(optimizer.param_groups, snapshot["learning_rates"]):
        group["lr"] = lr
