"""Run records: the event schema, the event log writer, a torch-free reader and summary.

A training run leaves one JSON object per line in ``<run_dir>/events.jsonl``.
The engine emits events as plain dicts ``{"event": kind, **fields}`` (``kind`` an
:class:`~elfes.contract.EventKind`, or its word) through :class:`RunLogger`, which validates them against :data:`EVENT_FIELDS`, stamps
them with a UTC ``time``, appends them to the file and shows them on a console.
Login-node tools read the file back with :func:`read_events` and :func:`summarize`.

Rooms: ``schema`` (the event table), ``writer`` (:class:`RunLogger`), ``reader``,
``summary``, ``plain`` (one line per event) and ``console``, the only one that
imports rich, and only when a main process constructs a :class:`RunLogger`.
Importing this package imports neither torch nor rich nor numpy: login-node
tools import it where those are absent or slow to import.

Example:
    >>> with RunLogger(run_dir, is_main_process=True) as logger:   # doctest: +SKIP
    ...     logger.log({"event": "skipped", "epoch": 1, "step": 3, "reason": "amp_overflow"})
    >>> print(format_summary(summarize(read_events(run_dir))))     # doctest: +SKIP
"""

from elfes.contract import EVENTS_FILE_NAME

from .reader import EventsFileWarning, iter_events, read_events
from .schema import (
    BUDGET_FIELDS,
    EVENT_DESCRIPTIONS,
    EVENT_FIELDS,
    STATE_FIELDS,
    epoch_number,
    event_reference,
    events_path,
)
from .summary import RunSummary, format_summary, summarize
from .writer import RunLogger

__all__ = [
    "BUDGET_FIELDS",
    "EVENTS_FILE_NAME",
    "EVENT_DESCRIPTIONS",
    "EVENT_FIELDS",
    "EventsFileWarning",
    "RunLogger",
    "RunSummary",
    "STATE_FIELDS",
    "epoch_number",
    "event_reference",
    "events_path",
    "format_summary",
    "iter_events",
    "read_events",
    "summarize",
]
