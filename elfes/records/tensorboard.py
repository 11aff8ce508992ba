"""The TensorBoard side of the tracker mirror (elfes/records/tracker_mirror.py): scalars in ``RUN_DIR/tensorboard/``.

Turned on as every tracker is (``RunLogger(trackers={"tensorboard": {}})``, a spec's ``tracking: {tensorboard:
{}}``), or by ``ELFES_TENSORBOARD=1`` in the environment (for instance a job spec's ``env:``). The mirror's thread
reads ``events.jsonl`` as for MLflow and W&B and hands this sink the scalars of ``train`` events as
``train/<metric>`` and those of evaluations as ``eval/<loader>/<metric>`` (the names ``elfes plot`` uses), at the
event's step and time; what an attempt did not write, the next one or ``elfes sync`` writes.

How a redone step is written: TensorBoard can hide values, so this sink takes every row in file order with each
attempt's start (``replaces_redone_steps``) instead of each step once. Each start of the training loop (a
``started`` or ``resumed`` event at step ``T``) opens a new event file with ``purge_step=T + 1``: TensorBoard then
hides whatever earlier files hold past step ``T``, the work of an attempt killed after its last checkpoint, and
the redo continues the curve as one line. A sink that begins within an attempt (it takes over from a mirror that
was killed) opens its file with ``purge_step`` at its first row, so that a row written twice is shown once.
Rows followed in the same send by a start that hides them are not written. Every send is flushed.

This module is torch-free; the sink imports ``torch.utils.tensorboard`` in the mirror's thread, and needs the
``tensorboard`` package (``pip install 'elfes[tensorboard]'``), which every process checks.
"""

from __future__ import annotations

import importlib.util
import math
import time
from pathlib import Path
from typing import Any

from elfes.contract import TENSORBOARD_DIR_NAME

from .tracker_lifecycle import TrackerStatus
from .tracker_sender import Batch, Metric
from .tracking import TensorBoardSettings

MISSING_MESSAGE = (
    "the TensorBoard tracker (RunLogger(trackers={'tensorboard': {}}), tracking.tensorboard or ELFES_TENSORBOARD=1) "
    "writes through torch.utils.tensorboard, which needs the tensorboard package, and it is not installed; install "
    "it with: pip install 'elfes[tensorboard]' (or pip install tensorboard), or leave the TensorBoard mirror off "
    "(no tensorboard tracker, ELFES_TENSORBOARD unset or 0)"
)
_EVENT_FILE_PREFIX = "events.out.tfevents."


def check_tensorboard_installed() -> None:
    """Raise ``ImportError`` naming the pip command when the tensorboard package is missing. Any process."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ImportError(MISSING_MESSAGE)


def tensorboard_dir(run_dir: Path) -> Path:
    """The mirror's folder in a run directory (point ``tensorboard --logdir`` at it or at a parent).

    Example:
        >>> tensorboard_dir(Path("runs/a"))
        PosixPath('runs/a/tensorboard')
    """
    return Path(run_dir) / TENSORBOARD_DIR_NAME


class TensorBoardSink:
    """A run's scalars as TensorBoard event files, one file per attempt's start. The mirror's thread only."""

    name = "tensorboard"
    replaces_redone_steps = True  # TensorBoard hides what a start's purge_step redoes

    def __init__(self, settings: TensorBoardSettings, run_dir: Path, group: str | None = None, *,
                 sender: str | None = None) -> None:
        self.folder = tensorboard_dir(Path(run_dir).absolute())
        self._summary_writer: Any = None
        self._writer: Any = None

    def prepare(self) -> None:
        if self._summary_writer is None:
            check_tensorboard_installed()
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as error:  # torch's own check of the tensorboard version
                raise ImportError(f"{MISSING_MESSAGE} ({error})") from error
            self._summary_writer = SummaryWriter

    def new_run_id(self) -> str | None:
        return None

    def open(self, run_id: str | None, elfes_run_id: str | None) -> str:
        return str(self.folder)  # no file yet: the first start or row opens one (a lifecycle alone opens none)

    def send(self, batch: Batch) -> None:
        starts = list(batch.starts)  # in file order
        for index, row in enumerate(batch.metrics):
            while starts and starts[0][0] <= index:
                self._open(purge_step=_purge_step(starts.pop(0)[1]))
            if _hidden_by_a_later_start(row, starts):
                continue
            writer = self._writer if self._writer is not None else self._open(purge_step=row.step)
            writer.add_scalar(row.key, row.value, global_step=row.step, walltime=row.timestamp_ms / 1000)
        for _, step in starts:  # starts after the last row: their purge markers on disk before the next rows
            self._open(purge_step=_purge_step(step))
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the current event file; idempotent."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def describe_status(self, status: TrackerStatus) -> str:
        return f"told {status} (TensorBoard has no run status)"

    def _open(self, *, purge_step: int | None) -> Any:
        self.prepare()
        self.close()
        _wait_past_newest_file(self.folder)
        self._writer = self._summary_writer(log_dir=str(self.folder), purge_step=purge_step)
        self._writer.flush()  # the purge marker is on disk before the first scalar of this attempt
        return self._writer


def _purge_step(start_step: int | None) -> int | None:
    return None if start_step is None else start_step + 1


def _hidden_by_a_later_start(row: Metric, starts: list[tuple[int, int | None]]) -> bool:
    """A row past the step a later start of the same send resumes from: that start's purge would hide it."""
    return any(step is not None and row.step > step for _, step in starts)


def _wait_past_newest_file(folder: Path) -> None:
    """Wait until the clock's second is past the newest event file's.

    TensorBoard reads a folder's event files in name order, and a name starts with the second it was
    created in; a file created in the same second as the previous attempt's could sort before it
    (the rest of the name is the host and the pid), and its purge would then come first.
    """
    stamps = []
    for path in folder.glob(_EVENT_FILE_PREFIX + "*"):
        try:
            stamps.append(int(path.name[len(_EVENT_FILE_PREFIX):].split(".")[0]))
        except ValueError:
            continue
    if stamps:
        # At most about a second, and only when an attempt starts within a second of the previous one.
        time.sleep(max(0.0, max(stamps) + 1 - time.time()))
        while math.floor(time.time()) <= max(stamps):
            time.sleep(0.01)
