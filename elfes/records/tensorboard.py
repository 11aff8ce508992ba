"""The TensorBoard mirror of a run's records: scalars in ``RUN_DIR/tensorboard/`` on the optimizer step axis.

:class:`~elfes.records.RunLogger` (``tensorboard=True``, or ``ELFES_TENSORBOARD=1`` in the environment,
for instance in a job spec's ``env:``) hands every event it writes to a :class:`TensorBoardMirror` on
the main process. The mirror writes the scalars of ``train`` events as ``train/<metric>`` and those of
evaluations as ``eval/<loader>/<metric>`` (the names ``elfes plot`` uses), at the event's step.

Each start of the training loop (a ``started`` or ``resumed`` event at step ``T``) opens a new event
file with ``purge_step=T + 1``: TensorBoard then hides whatever earlier files hold past step ``T``, the
work of an attempt killed after its last checkpoint, and the redo continues the curve as one line. A
resume writes no step twice: it continues past ``T``. Every event is flushed at once, as
``events.jsonl`` is, so that a kill loses nothing that was kept.

This module imports torch (``torch.utils.tensorboard``) and needs the ``tensorboard`` package
(``pip install 'elfes[tensorboard]'``); nothing imports it unless a mirror is asked for.
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elfes.contract import START_EVENTS, TENSORBOARD_DIR_NAME
from elfes.records.timeline import event_scalars

MISSING_MESSAGE = (
    "RunLogger(tensorboard=True) writes through torch.utils.tensorboard, which needs the tensorboard "
    "package, and it is not installed; install it with: pip install 'elfes[tensorboard]' (or pip install "
    "tensorboard), or leave the TensorBoard mirror off (tensorboard=False, ELFES_TENSORBOARD unset)"
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


class TensorBoardMirror:
    """Write the scalars of a run's events to TensorBoard event files. Main process only.

    Example:
        >>> mirror = TensorBoardMirror(Path("runs/a"))  # doctest: +SKIP
        >>> mirror.write({"event": "train", "step": 5, "metrics": {"loss": 0.25}, ...})  # doctest: +SKIP
        >>> mirror.close()  # doctest: +SKIP
    """

    def __init__(self, run_dir: Path) -> None:
        check_tensorboard_installed()
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:  # torch's own check of the tensorboard version
            raise ImportError(f"{MISSING_MESSAGE} ({error})") from error
        self._summary_writer = SummaryWriter
        self.folder = tensorboard_dir(run_dir)
        self._writer: Any = None

    def write(self, event: Mapping[str, Any]) -> None:
        """Mirror one event (the one just appended to ``events.jsonl``) and flush it."""
        if event.get("event") in START_EVENTS:
            state = event.get("state")
            step = state.get("step") if isinstance(state, Mapping) else None
            self._open(purge_step=step + 1 if isinstance(step, int) else None)
            return
        scalars = event_scalars(event)
        step = event.get("step")
        if not scalars or not isinstance(step, int):
            return
        writer = self._writer if self._writer is not None else self._open(purge_step=None)
        for name, value in scalars.items():
            writer.add_scalar(name, value, global_step=step)
        writer.flush()

    def close(self) -> None:
        """Flush and close the current event file; idempotent."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _open(self, *, purge_step: int | None) -> Any:
        self.close()
        _wait_past_newest_file(self.folder)
        self._writer = self._summary_writer(log_dir=str(self.folder), purge_step=purge_step)
        self._writer.flush()  # the purge marker is on disk before the first scalar of this attempt
        return self._writer


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
