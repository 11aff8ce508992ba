"""``elfes sync``'s sending: what a run's tracker lacks, from the run directory's records, at any time.

It sends as the mirror of an attempt does (elfes/records/tracker_sender.py: the rows past the offset the tracker
has, each step once, then the state published), so a second sync sends nothing new and a sync never sends a row
the mirror sent. It holds the tracker's sender lock while it sends; a running attempt's mirror holds it for its
whole life, and the sync then leaves that tracker to it (:class:`TrackerBusy`). Opening the tracker run to send
sets it RUNNING (a W&B run is resumed), so a sync that sent anything sends the run's lifecycle again when the
run has ended: the tracker run ends as ``elfes status`` says the run ended. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .tracker_sender import Sender, Sink, sender_lock, sender_lock_path


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
    try:
        with sender_lock(run_dir, sink.name, wait=False):
            return _send(sink, run_dir)
    except BlockingIOError:
        raise TrackerBusy(f"another sender to {sink.name} holds {sender_lock_path(run_dir, sink.name)} (a running "
                          "attempt's mirror, which sends what the tracker lacks, or another `elfes sync`); run "
                          "`elfes sync` again once it has ended") from None


def _send(sink: Sink, run_dir: Path) -> Synced:
    sender = Sender(sink, run_dir, log=None)
    try:
        sender.send_all()
        lifecycle = sender.lifecycle
        if sender.opened and sender.lifecycles_sent == 0 and lifecycle is not None and lifecycle.terminal:
            sender.send_lifecycle(lifecycle)  # the open set the tracker run RUNNING; the run has ended
    except Exception as error:
        sender.fell_behind(error)
        raise
    finally:
        if sender.opened:
            sink.close()
    sender.caught_up()
    return Synced(sink.name, sender.rows_sent, sender.lifecycles_sent > 0, sender.state.run_id)
