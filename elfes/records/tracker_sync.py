"""``elfes sync``'s sending: what a run's tracker lacks, from the run directory's records, at any time.

It sends as the mirror of an attempt does (elfes/records/tracker_sender.py: the rows past the offset the tracker
has, each step once, then the state published), so a second sync sends nothing new and a sync never sends a row
the mirror sent. It holds the tracker's sender lock while it sends; a running attempt's mirror holds it for its
whole life, and the sync then leaves that tracker to it (:class:`TrackerBusy`). Opening the tracker run to send
sets it RUNNING (a W&B run is resumed), so a sync that sent anything sends the run's lifecycle again when the
run has ended: the tracker run ends as ``elfes status`` says the run ended. Torch-free.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .tracker_lifecycle import read_lifecycle
from .tracker_sender import Sender, Sink, sender_lock_path


class TrackerBusy(Exception):
    """Another sender (a running attempt's mirror, another ``elfes sync``) holds the tracker's sender lock."""


@dataclass(frozen=True)
class Synced:
    """What one sync sent to one tracker."""

    tracker: str
    rows: int  # metric values sent (each step of each metric once)
    lifecycle: bool  # the run's lifecycle (status, attempts' ends, spec, provenance) sent
    run_id: str | None  # the tracker's run, where there is one


def sync_tracker(sink: Sink, run_dir: Path) -> Synced:
    """Send what ``sink``'s tracker lacks of the run in ``run_dir``. Raises :class:`TrackerBusy` while another
    sender holds the lock, and what the tracker raises (the mirror's state then says it is behind, and why)."""
    lock = sender_lock_path(run_dir, sink.name)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with _held_now(lock, sink.name):
        sender = Sender(sink, run_dir, log=None)
        try:
            sender.send_all()
            lifecycle = read_lifecycle(run_dir)
            if sender.opened and lifecycle is not None and lifecycle.terminal:
                sender.send_lifecycle(lifecycle)  # the open set the tracker run RUNNING; the run has ended
        except Exception as error:
            sender.fell_behind(error)
            raise
        finally:
            if sender.opened:
                sink.close()
        sender.caught_up()
        return Synced(sink.name, sender.rows_sent, sender.lifecycles_sent > 0, sender.state.run_id)


@contextmanager
def _held_now(path: Path, tracker: str) -> Iterator[None]:
    """Hold the exclusive ``flock`` on ``path`` for the block, or raise :class:`TrackerBusy` when it is held."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TrackerBusy(f"the {tracker} mirror of a running attempt sends the run's records (it holds {path}); "
                              "it sends what the tracker lacks, or `elfes sync` does once the attempt ended") from None
        yield
    finally:
        os.close(descriptor)
