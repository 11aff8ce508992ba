"""The tracker registry: every tracker a run's records are mirrored to, registered once with its settings, its sink
and its check that the library is installed. Whoever builds sinks builds them here: RunLogger (an attempt's
mirrors, elfes/records/writer.py), ``elfes sync`` and the launcher at a run's end (launcher/job/tracker_publishing.py).

A new tracker is a new sink module (the :class:`~elfes.records.tracker_sender.Sink` protocol, its status in its own
words), its settings model and field on :class:`~elfes.records.tracking.TrackingSettings`, and one entry in
:data:`REGISTRY` (see "Where a new piece goes" in docs/where-things-live.md). Torch-free: a sink imports its
tracker's library in the mirror's thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from .mlflow_sink import MlflowSink, check_mlflow_installed
from .tensorboard import TensorBoardSink, check_tensorboard_installed
from .tracker_sender import Sink
from .tracking import MlflowSettings, TensorBoardSettings, TrackingSettings, WandbSettings
from .wandb_sink import WandbSink, check_wandb_installed


class SinkClass(Protocol):
    """How every sink is built: its settings, the run directory, the run's group (a sweep's name) and who sends
    (None: an attempt's mirror; "sync" or "end" outside an attempt, for a tracker that keeps a folder per sender)."""

    def __call__(self, settings: Any, run_dir: Path, group: str | None = None, *,
                 sender: str | None = None) -> Sink: ...


@dataclass(frozen=True)
class RegisteredTracker:
    settings: type[BaseModel]  # its field's type on TrackingSettings
    sink: SinkClass
    check_installed: Callable[[], None]  # raises ImportError naming the pip command; on every process


REGISTRY: Mapping[str, RegisteredTracker] = {
    "mlflow": RegisteredTracker(MlflowSettings, MlflowSink, check_mlflow_installed),
    "wandb": RegisteredTracker(WandbSettings, WandbSink, check_wandb_installed),
    "tensorboard": RegisteredTracker(TensorBoardSettings, TensorBoardSink, check_tensorboard_installed),
}


def check_installed(settings: TrackingSettings) -> None:
    """Raise ``ImportError`` naming the pip command for the first tracker of ``settings`` whose library is missing."""
    for name in settings.trackers:
        REGISTRY[name].check_installed()


def build_sinks(settings: TrackingSettings, run_dir: Path, *, group: str | None,
                sender: str | None = None) -> list[Sink]:
    """One sink per tracker of ``settings``, in their fixed order.

    Example:
        >>> [sink.name for sink in build_sinks(TrackingSettings(tensorboard={}), Path("runs/a"), group=None)]
        ['tensorboard']
    """
    return [REGISTRY[name].sink(getattr(settings, name), run_dir, group, sender=sender) for name in settings.trackers]
