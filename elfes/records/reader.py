"""The reader: the events of a run, oldest first, from its ``events.jsonl``. Torch-free and rich-free.

:func:`iter_events` streams them (``elfes plot`` of a run with a million events holds none of them at
once); :func:`read_events` returns them as a list.
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .schema import events_path

# Lines parsed together as one JSON array (a call per line costs more than the parsing of a short line).
CHUNK_LINES = 4096


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
    return list(iter_events(run_dir_or_file))


def iter_events(run_dir_or_file: Path) -> Iterator[dict[str, Any]]:
    """The events of :func:`read_events`, one at a time, as the file is read (FileNotFoundError at once
    when there is no events file). Any process; torch-free.

    Example:
        >>> sum(1 for event in iter_events(Path("runs/a")) if event["event"] == "train")  # doctest: +SKIP
        1500
    """
    path = Path(run_dir_or_file)
    if path.is_dir():
        path = events_path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no events file at {path}: the run has not started logging yet; check the "
            "run directory, or wait for the job to start"
        )
    return _events(path)


def _events(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8", errors="replace") as file:
        first = 1  # the number of the block's first line
        while block := list(itertools.islice(file, CHUNK_LINES)):
            yield from _parse_chunk(path, first, block)
            first += len(block)


def _parse_chunk(path: Path, first: int, block: list[str]) -> list[dict[str, Any]]:
    """The events of ``block`` (lines numbered from ``first``), as a per-line ``json.loads`` gives them: parsed as
    one array when every line holds one object (``{`` to ``}``) and the array has one element per line and each
    is an event, else line by line, skipping (and naming) the lines that are not events. Blank lines are no
    events."""
    lines = [line for line in map(str.strip, block) if line]
    # A newline ends each line and is in none, so the lines are all objects when every boundary is "}\n{".
    joined = "\n".join(lines)
    if joined[:1] == "{" and joined[-1:] == "}" and joined.count("}\n{") == len(lines) - 1:
        try:
            events: list[dict[str, Any]] | None = json.loads("[" + joined.replace("\n", ",") + "]")
        except json.JSONDecodeError:
            events = None
        if events is not None and len(events) == len(lines) and all(
                type(event) is dict and "event" in event for event in events):
            return events
    events = []
    for number, line in enumerate(block, start=first):
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
                stacklevel=4,
            )
            continue
        events.append(event)
    return events


def events_of_bytes(data: bytes) -> list[dict[str, Any]]:
    """The events in ``data`` (whole lines of ``events.jsonl``); lines that are not JSON events are skipped."""
    events = []
    for line in data.split(b"\n"):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event:
            events.append(event)
    return events
