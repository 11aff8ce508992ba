"""Synthetic events of every kind, as the engine emits them, for the records tests."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console


def state(step: int, epoch: int = 0, **overrides):
    fields = {
        "epoch": epoch,
        "next_batch": 0,
        "step": step,
        "batches": step,
        "samples": step * 32,
        "best_metric": None,
        "best_step": None,
        "evaluations_without_improvement": 0,
        "stop_reason": None,
    }
    return {**fields, **overrides}


def started(step: int = 0, *, resumed_from: str | None = None, planned_steps: int = 100, epochs: int = 2, **state_fields):
    event = {
        "event": "started" if resumed_from is None else "resumed",
        "world_size": 2,
        "precision": "bf16",
        "device": "cuda:0",
        "gradient_accumulation_steps": 1,
        "config": {"lr": 1e-3, "epochs": epochs},
        "budget": {
            "epochs": epochs,
            "max_steps": None,
            "planned_steps": planned_steps,
            "updates_per_epoch": planned_steps // epochs,
            "batches_per_epoch": planned_steps // epochs,
        },
        "optimizer": {
            "class": "AdamW",
            "groups": [{"name": "decay", "lr": 1e-3, "weight_decay": 0.01, "num_parameters": 10}],
        },
        "ema_decay": None,
        "objective": None,
        "metadata": {},
        "state": state(step, **state_fields),
    }
    if resumed_from is not None:
        event["resumed_from"] = resumed_from
    return event


def train(step: int, loss: float = 0.1234, epoch: int = 1, planned_steps: int = 100):
    return {
        "event": "train",
        "epoch": epoch,
        "step": step,
        "planned_steps": planned_steps,
        "samples": step * 32,
        "metrics": {
            "loss": loss,
            "lr/0": 1e-3,
            "grad_norm": 1.5,
            "last_update_samples": 32,
            "samples_per_second": 5012.34,
            "accuracy": 0.5,
        },
    }


def evaluation(step: int, value: float, *, improved: bool, best: float, best_step: int, epoch: int = 1):
    return {
        "event": "evaluation",
        "epoch": epoch,
        "step": step,
        "weights": "ema",
        "metrics": {"val": {"accuracy": value, "loss": 0.3}},
        "duration_s": 1.5,
        "monitor": "val/accuracy",
        "improved": improved,
        "best_metric": best,
        "best_step": best_step,
    }


def checkpoint(step: int, reason: str = "interval", size_bytes: int = 2_500_000, epoch: int = 1):
    return {
        "event": "checkpoint",
        "path": f"/runs/a/checkpoints/step-{step}",
        "epoch": epoch,
        "step": step,
        "next_batch": step,
        "reason": reason,
        "best": False,
        "final": reason == "final",
        "bytes": size_bytes,
        "duration_s": 0.25,
    }


def run_end(step: int, reason: str | None = None, **state_fields):
    event = {
        "event": "finished" if reason is None else "stopped",
        "state": state(step, **state_fields),
        "train_s": 10.0,
        "evaluation_s": 2.0,
        "checkpoint_s": 0.5,
        "wall_s": 13.0,
    }
    if reason is not None:
        event["reason"] = reason
    return event


def stop_requested(step: int, epoch: int = 1):
    return {"event": "stop_requested", "reason": "signal", "signal": "SIGTERM", "epoch": epoch, "step": step}


def stop_signal(step: int, signal: str | None = "SIGTERM", reason: str = "SIGTERM", epoch: int = 1):
    return {"event": "stop_signal", "signal": signal, "reason": reason, "epoch": epoch, "step": step}


def failed(step: int, exception: str = "ValueError", message: str = "bad batch", epoch: int = 1):
    return {"event": "failed", "exception": exception, "message": message, "epoch": epoch, "step": step}


def every_event_kind():
    """A paused run, resumed, that fails: every event kind once, finished excepted."""
    return [
        started(),
        train(20),
        {"event": "skipped", "epoch": 1, "step": 21, "reason": "amp_overflow"},
        evaluation(40, 0.7, improved=True, best=0.7, best_step=40),
        checkpoint(40),
        {"event": "export", "weights": "ema", "path": Path("/runs/a/model.pt")},
        stop_signal(44),
        stop_requested(45),
        run_end(45, reason="signal", best_metric=0.7, best_step=40, next_batch=45),
        started(45, resumed_from="/runs/a/checkpoints/step-45", best_metric=0.7, best_step=40, next_batch=45),
        {"event": "warning", "kind": "stream_replay", "epoch": 2, "step": 45,
         "message": "Resumed the training stream at batch 45 by reading and discarding the 45 batches before it"},
        failed(47),
    ]


def plain_console() -> Console:
    return Console(file=io.StringIO(), force_terminal=False, width=100)


def terminal_console() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=120)
