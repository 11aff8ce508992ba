"""The writer: :class:`RunLogger` validates events, appends them to ``events.jsonl`` and shows them."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from elfes.contract import EventKind

from .schema import event_json_line, events_path, validate_event
from .timings import TimingsWriter

if TYPE_CHECKING:
    from rich.console import Console

    from .console import ConsoleDisplay
    from .tracker_mirror import TrackerMirror
    from .tracking import MlflowSettings, TrackingSettings, WandbSettings


class RunLogger:
    """Validate, record and display the events of one training run.

    Every process constructs one and calls :meth:`log` with the same events, so
    that a schema error is raised on all ranks alike; only the main process
    (``is_main_process=True``) writes ``events.jsonl`` and prints. The run
    directory is created on the first event. On an interactive console the
    train events drive a progress bar; otherwise (SLURM log files, CI) each
    event becomes one timestamped plain line without escape codes.

    ``trackers`` mirrors the records to trackers, from a thread per tracker that reads ``events.jsonl``
    (:mod:`elfes.records.tracker_mirror`): a mapping as a job spec's ``tracking:`` section, tracker name to
    settings (``{"mlflow": {"tracking_uri": ...}, "wandb": {...}, "tensorboard": {}}``, see
    :mod:`elfes.records.tracking`), or :class:`~elfes.records.tracking.TrackingSettings`; ``{}`` mirrors to none.
    The default, None, takes the job spec's ``tracking:`` section, which the job runtime exports as
    ``ELFES_TRACKING``, and ``ELFES_TENSORBOARD`` (``1`` or ``0``), so a spec's ``env:`` turns TensorBoard on
    without code changes. The trackers' libraries are imported in the mirrors' threads of the main process only;
    without TensorBoard this class imports no torch. ``tensorboard=``, ``mlflow=`` and ``wandb=`` are deprecated
    spellings of ``trackers=``.

    Example:
        >>> with RunLogger(Path("runs/a"), is_main_process=rank == 0) as logger:  # doctest: +SKIP
        ...     logger.log({"event": "export", "weights": "ema", "path": "runs/a/model.pt"})
    """

    def __init__(
        self, run_dir: Path, *, is_main_process: bool, console: Console | None = None,
        trackers: TrackingSettings | Mapping[str, Any] | None = None, tensorboard: bool | None = None,
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
        from .tracking import deprecated_tracking, resolve_tracking  # pydantic: only where a RunLogger is made

        if tensorboard is not None or mlflow is not None or wandb is not None:
            if trackers is not None:
                raise TypeError("RunLogger takes trackers= or the deprecated tensorboard=, mlflow= and wandb=, not "
                                "both; give every tracker in trackers=")
            warnings.warn("RunLogger(tensorboard=, mlflow=, wandb=) is deprecated; give the trackers as "
                          "trackers={'mlflow': {...}, 'wandb': {...}, 'tensorboard': {}}", DeprecationWarning,
                          stacklevel=2)
            settings = deprecated_tracking(tensorboard, mlflow, wandb)
        else:
            settings = resolve_tracking(trackers)  # on every process: every rank refuses alike
        self._trackers: list[TrackerMirror] = []
        self._trackers_settings = settings
        if settings.trackers:
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
            if self._file is not None:
                self._file.close()
                self._file = None

    def _start_trackers(self) -> None:
        """Check the trackers' libraries on every process; start one mirror per tracker on the main process."""
        from .tracker_mirror import TrackerMirror
        from .trackers import build_sinks, check_installed
        from .tracking import tracking_group

        check_installed(self._trackers_settings)
        if self.is_main_process:
            sinks = build_sinks(self._trackers_settings, self.run_dir, group=tracking_group())
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


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as file:
        if file.seek(0, 2) == 0:
            return True
        file.seek(-1, 2)
        return file.read(1) == b"\n"
