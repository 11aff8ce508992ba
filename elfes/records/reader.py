"""The reader: the events of a run, oldest first, from its ``events.jsonl``. Torch-free and rich-free."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from .schema import events_path


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
