"""The layout of the checkpoint a run's ``last`` names, as the run's records tell it (torch-free: read on a login
node by ``elfes resume``, which refuses a world size that cannot continue it before anything is submitted).

The engine records each start of training (``started``, ``resumed``: the world size, the accumulation, the
batches per epoch of one rank, and what of the loader keeps a position per rank) and each published checkpoint
(``checkpoint``, with its path); the checkpoint ``last`` names was written by the start recorded before it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from elfes.contract import START_EVENTS, EventKind
from elfes.records import EventsFileWarning, iter_events

from .paths import RunPaths


def last_checkpoint_layout(paths: RunPaths) -> tuple[str, dict[str, Any]] | None:
    """The file name of the checkpoint ``last`` names and its layout (``world_size``,
    ``gradient_accumulation_steps``, ``batches_per_epoch`` of one rank, ``per_rank_data``); None where the records
    do not tell it: no ``last``, no records (a job without a RunLogger), a checkpoint whose record a kill cut off."""
    try:
        name = paths.last.resolve(strict=True).name
    except (OSError, RuntimeError):
        return None
    if not paths.events.is_file():
        return None
    start: dict[str, Any] | None = None
    layout = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EventsFileWarning)  # a line torn by a kill: the others still tell it
        for event in iter_events(paths.events):
            kind = event.get("event")
            if kind in START_EVENTS:
                start = event
            elif kind == EventKind.CHECKPOINT and start is not None and Path(str(event.get("path", ""))).name == name:
                layout = _layout(start)
    return (name, layout) if layout is not None else None


def _layout(start: dict[str, Any]) -> dict[str, Any] | None:
    world, accumulation = start.get("world_size"), start.get("gradient_accumulation_steps")
    if not (isinstance(world, int) and isinstance(accumulation, int) and world > 0 and accumulation > 0):
        return None
    batches = (start.get("budget") or {}).get("batches_per_epoch")
    per_rank_data = start.get("per_rank_data")
    return {"world_size": world, "gradient_accumulation_steps": accumulation,
            "batches_per_epoch": batches if isinstance(batches, int) and batches > 0 else None,
            "per_rank_data": per_rank_data if isinstance(per_rank_data, str) else None}
