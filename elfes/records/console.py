"""The rich console: a progress bar on a terminal, plain lines elsewhere. The only room that imports rich."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from .plain import format_number, format_rate, plain_line


class ConsoleDisplay:
    """Show a run's events on a rich console. Main process only; :class:`~elfes.records.RunLogger` owns one.

    On an interactive terminal the train events drive a progress bar and every other event prints a
    line above it; otherwise (SLURM log files, CI) each event becomes one timestamped plain line
    without escape codes.

    Example:
        >>> display = ConsoleDisplay(Console())                               # doctest: +SKIP
        >>> display.show({"event": "export", "weights": "ema", "path": "m.pt"}, datetime.now(timezone.utc))
        >>> display.close()
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console if console is not None else Console(stderr=False)
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def show(self, event: Mapping[str, Any], now: datetime) -> None:
        """Print or draw one validated event."""
        name = event["event"]
        interactive = self.console.is_terminal
        if interactive and name in ("finished", "stopped"):
            self.close()
        if not (interactive and name == "train"):
            self.console.out(plain_line(now, event), highlight=False)
        if interactive and name in ("started", "resumed", "train"):
            self._update_bar(event)

    def close(self) -> None:
        """Stop the progress bar, leaving its last state on screen; idempotent."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._task = None

    def _update_bar(self, event: Mapping[str, Any]) -> None:
        if event["event"] == "train":
            metrics = event["metrics"]
            total, step, epoch = event["planned_steps"], event["step"], event["epoch"]
            fields = {
                "loss": format_number(metrics.get("loss")),
                "speed": format_rate(metrics.get("samples_per_second")),
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
