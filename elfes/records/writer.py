"""The writer: :class:`RunLogger` validates events, appends them to ``events.jsonl`` and shows them."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from elfes.contract import EventKind

from .schema import event_json_line, events_path, validate_event
from .timings import TimingsWriter

if TYPE_CHECKING:
    from rich.console import Console

    from elfes.records.tensorboard import TensorBoardMirror

    from .console import ConsoleDisplay
    from .tracker_mirror import TrackerMirror
    from .tracking import MlflowSettings, WandbSettings

# Turns the TensorBoard mirror on where RunLogger is not told (tensorboard=None): "1" on, "0" or unset off.
TENSORBOARD_VARIABLE = "ELFES_TENSORBOARD"


class RunLogger:
    """Validate, record and display the events of one training run.

    Every process constructs one and calls :meth:`log` with the same events, so
    that a schema error is raised on all ranks alike; only the main process
    (``is_main_process=True``) writes ``events.jsonl`` and prints. The run
    directory is created on the first event. On an interactive console the
    train events drive a progress bar; otherwise (SLURM log files, CI) each
    event becomes one timestamped plain line without escape codes.

    ``tensorboard=True`` also mirrors the scalars to ``run_dir/tensorboard/`` (see
    :mod:`elfes.records.tensorboard`; needs the ``tensorboard`` package and imports torch); the default, None,
    takes ``ELFES_TENSORBOARD`` from the environment (``1`` or ``0``; unset is off), so a job spec's
    ``env:`` turns it on without code changes. Without it this class imports no torch.

    ``mlflow`` and ``wandb`` (settings or mappings, :mod:`elfes.records.tracking`) mirror the records to
    experiment trackers, each step once across attempts (:mod:`elfes.records.tracker_mirror`); the default,
    None for both, takes the job spec's ``tracking:`` section, which the job runtime exports as
    ``ELFES_TRACKING``. The trackers' libraries are imported in the mirrors' threads of the main process only.

    Example:
        >>> with RunLogger(Path("runs/a"), is_main_process=rank == 0) as logger:  # doctest: +SKIP
        ...     logger.log({"event": "export", "weights": "ema", "path": "runs/a/model.pt"})
    """

    def __init__(
        self, run_dir: Path, *, is_main_process: bool, console: Console | None = None, tensorboard: bool | None = None,
        mlflow: MlflowSettings | Mapping[str, Any] | None = None, wandb: WandbSettings | Mapping[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.path = events_path(self.run_dir)
        self.is_main_process = is_main_process
        self._display: ConsoleDisplay | None = None
        if is_main_process:
            # Imported here so that `import elfes.records` stays free of rich for login-node readers.
            from .console import ConsoleDisplay

            self._display = ConsoleDisplay(console, run_dir=self.run_dir)
        self.console = None if self._display is None else self._display.console
        self._tensorboard: TensorBoardMirror | None = None
        if tensorboard_enabled(tensorboard):
            # Imported here: the mirror imports torch, and only runs that ask for it pay for that.
            from elfes.records.tensorboard import TensorBoardMirror, check_tensorboard_installed

            check_tensorboard_installed()  # on every process, so that every rank refuses alike
            if is_main_process:
                self._tensorboard = TensorBoardMirror(self.run_dir)
        from .tracking import resolve_tracking  # pydantic: only where a RunLogger is made

        self._trackers: list[TrackerMirror] = []
        self._trackers_settings = resolve_tracking(mlflow, wandb)  # on every process: every rank refuses alike
        if self._trackers_settings.trackers:
            self._start_trackers()
        self._file: TextIO | None = None
        self._size = 0  # the bytes of events.jsonl once the last line is written
        # The running totals of the phases' times (timings.json), which `elfes status` reads for the goodput.
        self._timings = TimingsWriter(self.run_dir, self.path) if is_main_process else None
        self._closed = False
        self._stopping = False  # a stop was logged: the attempt ends within a preemption's short grace time
        # Checkpoint or evaluation code may log from a helper thread; lines must not interleave.
        self._lock = threading.Lock()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def log(self, event: Mapping[str, Any]) -> None:
        """Validate an event, append it to ``events.jsonl`` and show it. Any process.

        The event is ``{"event": name, **fields}`` with the fields of
        :data:`~elfes.records.EVENT_FIELDS`; ``time`` is added here. Non-finite
        floats are recorded as null and paths as strings. The line is flushed
        before returning. On other than the main process nothing is written or shown.

        Raises ``ValueError`` for an unknown event name or a missing field and
        ``TypeError`` for a value that has no JSON form, on every process.

        Example:
            >>> logger.log({"event": "skipped", "epoch": 1, "step": 7,  # doctest: +SKIP
            ...             "reason": "amp_overflow"})
        """
        name = validate_event(event)
        now = datetime.now(timezone.utc)
        line = event_json_line(event, name, now.isoformat())
        if self._closed:
            raise RuntimeError(
                f"RunLogger for {self.run_dir} is closed; create a new RunLogger to log more events"
            )
        if self._display is None:
            return
        with self._lock:
            events_file = self._open()
            events_file.write(line + "\n")
            events_file.flush()
            self._size += len(line.encode("utf-8")) + 1
            if self._timings is not None:
                self._timings.add(event, now.isoformat(), self._size)
            if self._tensorboard is not None:
                self._tensorboard.write(event)
            self._stopping |= name == EventKind.STOPPED
            for tracker in self._trackers:
                tracker.notify()
            self._display.show(event, now)

    def close(self) -> None:
        """Stop the progress bar and close the events file. Any process; idempotent.

        Example:
            >>> logger.close()  # doctest: +SKIP
        """
        # Outside the lock: a mirror that falls behind while it sends the rest records a warning through log().
        for tracker in self._trackers:
            tracker.close(stopping=self._stopping)
        self._trackers = []
        with self._lock:
            self._closed = True
            if self._display is not None:
                self._display.close()
            if self._tensorboard is not None:
                self._tensorboard.close()
            if self._file is not None:
                self._file.close()
                self._file = None

    def _start_trackers(self) -> None:
        """Check the trackers' libraries on every process; start one mirror per tracker on the main process."""
        from .mlflow_sink import MlflowSink, check_mlflow_installed
        from .tracker_mirror import TrackerMirror
        from .tracking import tracking_group
        from .wandb_sink import WandbSink, check_wandb_installed

        settings, group = self._trackers_settings, tracking_group()
        sinks: list[MlflowSink | WandbSink] = []
        if settings.mlflow is not None:
            check_mlflow_installed()
            sinks.append(MlflowSink(settings.mlflow, self.run_dir, group))
        if settings.wandb is not None:
            check_wandb_installed()
            sinks.append(WandbSink(settings.wandb, self.run_dir, group))
        if self.is_main_process:
            self._trackers = [TrackerMirror(sink, self.run_dir, log=self.log) for sink in sinks]

    def _open(self) -> TextIO:
        if self._file is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            torn = self.path.exists() and not _ends_with_newline(self.path)
            self._file = self.path.open("a", encoding="utf-8")
            if torn:
                # A kill mid-write left a partial line; isolate it so ours stay parseable.
                self._file.write("\n")
            self._file.flush()
            self._size = self.path.stat().st_size
            if self._timings is not None:
                self._timings.open()
        return self._file


def tensorboard_enabled(tensorboard: bool | None) -> bool:
    """Whether a RunLogger mirrors to TensorBoard: ``tensorboard`` when given, else ``ELFES_TENSORBOARD``.

    Example:
        >>> tensorboard_enabled(True), tensorboard_enabled(False)
        (True, False)
    """
    if tensorboard is not None:
        if not isinstance(tensorboard, bool):
            raise TypeError(f"tensorboard must be True, False or None, got {tensorboard!r}")
        return tensorboard
    value = os.environ.get(TENSORBOARD_VARIABLE, "").strip().lower()
    if value in ("", "0", "false"):
        return False
    if value in ("1", "true"):
        return True
    raise ValueError(
        f"{TENSORBOARD_VARIABLE}={os.environ[TENSORBOARD_VARIABLE]!r} is not understood; set it to 1 to mirror "
        "the run records to TensorBoard, or to 0 (or unset it) to leave the mirror off"
    )


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as file:
        if file.seek(0, 2) == 0:
            return True
        file.seek(-1, 2)
        return file.read(1) == b"\n"
