"""What the tracker mirror sends and what it has sent: the rows of ``events.jsonl`` past the offset a tracker has,
each step once (:class:`Sender`), and the state that says how far it got (:class:`MirrorState`). Used by the
mirror's thread during an attempt (elfes/records/tracker_mirror.py) and by ``elfes sync`` at any time
(elfes/records/tracker_sync.py); whoever sends holds the tracker's sender lock (``RUN_DIR/tracking/<tracker>.lock``),
so that two senders never read the same state and send the same rows twice.

Each step once: the sender keeps the last step it sent of every metric (``sent_steps``) and skips a row at or
below it. After a kill the next attempt redoes the steps past the last checkpoint and writes their records
again; ELFES resumes bitwise, so they hold the values already sent, and they are skipped. The state is
rewritten atomically after every send; a kill between a send and that write sends the same rows again, with
the same timestamps (each event's ``time``): MLflow's SQL stores keep one copy of a metric whose key, step,
value and timestamp are equal. A tracker that can hide values (TensorBoard: ``Sink.replaces_redone_steps``) gets
every row instead, with each attempt's start among them, and hides what a start redoes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from elfes.contract import START_EVENTS, EventKind, WarningKind
from elfes.files import exclusive_lock, write_text_atomically

from .credentials import without_credentials
from .schema import events_path
from .timeline import event_scalars
from .tracker_lifecycle import Lifecycle, TrackerStatus, read_lifecycle
from .tracking import tracker_state_path, tracking_dir

MAX_ROWS = 1000  # metric values per send (MLflow's log_batch takes at most 1000)
REQUEST_TIMEOUT_S = 10  # what one request to MLflow may take (its sink gives it to the client; W&B keeps its own)


def sender_lock_path(run_dir: Path, tracker: str) -> Path:
    """The lock a sender to ``tracker`` holds (``RUN_DIR/tracking/<tracker>.lock``): the mirror of a running
    attempt for its whole life, ``elfes sync`` while it sends, the launcher while it sends a run's end."""
    return tracking_dir(run_dir) / f"{tracker}.lock"


@contextmanager
def sender_lock(run_dir: Path, tracker: str, *, wait: bool = True) -> Iterator[None]:
    """Hold ``tracker``'s sender lock for the block; with ``wait=False``, :class:`BlockingIOError` when another
    sender holds it."""
    path = sender_lock_path(run_dir, tracker)
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(path, wait=wait):
        yield


@dataclass(frozen=True)
class Metric:
    key: str  # train/<metric> or eval/<loader>/<metric>, as elfes plot and TensorBoard name them
    step: int
    value: float
    timestamp_ms: int  # the event's time: the same row sent again is the same row


@dataclass
class Batch:
    """What one send carries: metric rows in file order, the run's config (once), whether the run finished, the
    run's lifecycle (new to the tracker); for a sink that replaces redone steps, each attempt's start among the
    rows."""

    metrics: list[Metric] = field(default_factory=list)
    config: dict[str, Any] | None = None
    elfes_run_id: str | None = None
    finished: bool = False
    lifecycle: Lifecycle | None = None
    starts: list[tuple[int, int | None]] = field(default_factory=list)  # (index of the next row, step resumed from)

    def __bool__(self) -> bool:
        return (bool(self.metrics) or self.config is not None or self.elfes_run_id is not None or self.finished
                or self.lifecycle is not None or bool(self.starts))


class Sink(Protocol):
    """One tracker, used by one sender at a time (the mirror's thread, ``elfes sync``, the launcher at a run's end).
    Each is registered once, with its settings, in elfes/records/trackers.py."""

    name: str  # its name in the registry, the spec's ``tracking:`` and ``RUN_DIR/tracking/<name>.json``
    # False: each step is sent once (the tracker keeps what it took first). True: every row, in file order, with
    # each attempt's start (Batch.starts), and the tracker hides what a start redoes (TensorBoard's purge).
    replaces_redone_steps: bool

    def prepare(self) -> None: ...  # import the tracker's library (seconds), before the first record comes

    def new_run_id(self) -> str | None: ...  # an id to record before opening (W&B), or None (MLflow makes one)

    def open(self, run_id: str | None, elfes_run_id: str | None) -> str: ...  # the tracker run, created or resumed

    def send(self, batch: Batch) -> None: ...  # raises when the tracker did not take it

    def close(self) -> None: ...

    def describe_status(self, status: TrackerStatus) -> str: ...  # how its run shows ``status``, for a warning


@dataclass
class MirrorState:
    """What a mirror has sent, kept in ``RUN_DIR/tracking/<tracker>.json`` across attempts."""

    tracker: str  # a name of elfes.records.trackers.REGISTRY
    run_id: str | None = None  # the tracker's run
    offset: int = 0  # bytes of events.jsonl sent (whole lines)
    sent_steps: dict[str, int] = field(default_factory=dict)  # metric -> last step sent
    elfes_run_id: str | None = None  # the run id the tracker run is tagged with
    config_sent: bool = False
    lifecycle_sent: str | None = None  # the digest of the lifecycle the tracker has
    behind: bool = False  # the tracker failed the last try; what it lacks waits in events.jsonl
    behind_since: str | None = None
    error: str | None = None

    def state_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take what ``state`` holds but its tracker: the file is the one of the tracker this state was made for."""
        for name in self.__dataclass_fields__:
            if name in state and name != "tracker":
                setattr(self, name, state[name])


def read_mirror_state(run_dir: Path, tracker: str) -> MirrorState | None:
    """The state a mirror left, or None where it has none or it cannot be read. Any process; torch-free."""
    try:
        data = json.loads(tracker_state_path(run_dir, tracker).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    state = MirrorState(tracker=tracker)
    state.load_state_dict(data)
    return state


class Sender:
    """Sends a run's records past ``state`` to one tracker, each step once, and keeps ``state`` published. The
    caller holds the tracker's sender lock. ``log`` records a warning event (the mirror's RunLogger), or None
    (``elfes sync`` writes nothing to the run's records)."""

    def __init__(self, sink: Sink, run_dir: Path, *, log: Callable[[Mapping[str, Any]], None] | None) -> None:
        self.sink = sink
        self.run_dir = Path(run_dir)
        self._events = events_path(self.run_dir)
        self.state = read_mirror_state(self.run_dir, sink.name) or MirrorState(tracker=sink.name)
        self._log = log
        self.opened = False
        self.rows_sent = 0  # metric values sent by this sender
        self.lifecycles_sent = 0  # lifecycles sent by this sender
        self.lifecycle: Lifecycle | None = None  # lifecycle.json, read once per sender at the first send
        self.lifecycle_read = False
        self._place: tuple[Any, Any] = (None, None)  # epoch and step of the last event read, for the warning

    def send_all(self) -> None:
        """Send the lifecycle the tracker lacks, then every whole line past the offset, :data:`MAX_ROWS` rows at a
        time. Raises what the tracker raises."""
        if not self.lifecycle_read:
            self.lifecycle = read_lifecycle(self.run_dir)
            if self.lifecycle is not None and self.lifecycle.digest() != self.state.lifecycle_sent:
                self.send_lifecycle(self.lifecycle)
            self.lifecycle_read = True
        if not self._events.exists():
            return
        with self._events.open("rb") as file:
            file.seek(self.state.offset)
            while True:
                batch, offset, sent_steps = self._read_batch(file)
                if offset == self.state.offset:
                    return
                if batch:
                    self.open()
                    self.sink.send(batch)
                    self.rows_sent += len(batch.metrics)
                self.state.offset, self.state.sent_steps = offset, sent_steps
                self.state.config_sent |= batch.config is not None
                if batch.elfes_run_id is not None:
                    self.state.elfes_run_id = batch.elfes_run_id
                self.save()

    def send_lifecycle(self, lifecycle: Lifecycle) -> None:
        self.open()
        self.sink.send(Batch(lifecycle=lifecycle))
        self.state.lifecycle_sent = lifecycle.digest()
        self.lifecycles_sent += 1
        self.save()

    def caught_up(self) -> None:
        """The tracker took everything tried: the state is behind no more."""
        if self.state.behind:
            self.state.behind, self.state.behind_since, self.state.error = False, None, None
            self.save()

    def fell_behind(self, error: BaseException, *, cause: str | None = None) -> None:
        """Mark the state behind with ``error``; the first time, record a warning event naming the tracker (where
        there is a ``log``). ``cause`` says what failed, instead of "cannot send the run's records"."""
        first = not self.state.behind
        self.state.behind, self.state.error = True, f"{type(error).__name__}: {one_line(error)}"
        self.state.behind_since = self.state.behind_since or datetime.now(timezone.utc).isoformat()
        self.save()
        if first and self._log is not None:
            epoch, step = self._place
            name, what = self.sink.name, cause or "cannot send the run's records"
            self._log({"event": EventKind.WARNING, "kind": WarningKind.TRACKER_BEHIND.value, "epoch": epoch, "step": step,
                       "message": f"the {name} mirror {what} ({self.state.error}); "
                       f"training goes on, the records wait in events.jsonl and are sent once {name} takes them "
                       "again, by this attempt, the next one or `elfes sync RUN_DIR` (elfes status shows the mirror "
                       "behind until then)"})

    def open(self) -> None:
        if self.opened:
            return
        if self.state.run_id is None:
            self.state.run_id = self.sink.new_run_id()
            if self.state.run_id is not None:
                self.save()  # recorded before the tracker knows it: a kill in between reuses it
        self.state.run_id = self.sink.open(self.state.run_id, self.state.elfes_run_id)
        self.save()
        self.opened = True

    def save(self) -> None:
        save_mirror_state(self.run_dir, self.state)

    def _read_batch(self, file: Any) -> tuple[Batch, int, dict[str, int]]:
        """The rows of the lines from the file's position on (at most MAX_ROWS), the offset past them, and the
        last steps sent once they are sent. A line without its newline yet is left for later."""
        batch, offset, sent_steps = Batch(), self.state.offset, dict(self.state.sent_steps)
        while len(batch.metrics) < MAX_ROWS:
            line = file.readline()
            if not line.endswith(b"\n"):
                break
            offset += len(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line torn by a kill (RunLogger isolates it on its own line)
            if not isinstance(event, dict):
                continue
            self._read_event(event, batch, sent_steps)
        return batch, offset, sent_steps

    def _read_event(self, event: dict[str, Any], batch: Batch, sent_steps: dict[str, int]) -> None:
        kind, step = event.get("event"), event.get("step")
        self._place = (event.get("epoch", self._place[0]), step if isinstance(step, int) else self._place[1])
        if kind in START_EVENTS:
            if self.sink.replaces_redone_steps:
                state = event.get("state")
                resumed = state.get("step") if isinstance(state, dict) else None
                batch.starts.append((len(batch.metrics), resumed if isinstance(resumed, int) else None))
            run_id = event.get("run_id")
            if isinstance(run_id, str) and run_id != self.state.elfes_run_id:
                batch.elfes_run_id = run_id
            if not self.state.config_sent and batch.config is None and isinstance(event.get("config"), dict):
                batch.config = without_credentials(event["config"])
            return
        if kind == EventKind.FINISHED:
            batch.finished = True
            return
        if not isinstance(step, int):
            return
        scalars = event_scalars(event)
        if not scalars:
            return
        timestamp_ms = _timestamp_ms(event.get("time"))
        for key, value in scalars.items():
            if step > sent_steps.get(key, -1) or self.sink.replaces_redone_steps:
                batch.metrics.append(Metric(key, step, value, timestamp_ms))
                sent_steps[key] = step


def save_mirror_state(run_dir: Path, state: MirrorState) -> None:
    """Publish a mirror's state atomically (``RUN_DIR/tracking/<tracker>.json``)."""
    path = tracker_state_path(run_dir, state.tracker)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(state.state_dict(), indent=1, sort_keys=True))


def send_lifecycle_once(sink: Sink, run_dir: Path, lifecycle: Lifecycle) -> None:
    """Open the run's tracker run (created if no mirror ever did), send ``lifecycle`` and close it, unless the
    tracker has it already. The launcher, at a run's end (launcher/job/tracker_publishing.py), under the sender
    lock like every sender; raises what the tracker raises."""
    with sender_lock(run_dir, sink.name):
        sender = Sender(sink, run_dir, log=None)
        if sender.state.lifecycle_sent == lifecycle.digest():
            return
        try:
            sender.send_lifecycle(lifecycle)
        finally:
            if sender.opened:
                sink.close()


def _timestamp_ms(text: Any) -> int:
    try:
        return int(datetime.fromisoformat(str(text)).timestamp() * 1000)
    except ValueError:
        return 0


def one_line(error: BaseException) -> str:
    """An error's text on one line, at most 300 characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."
