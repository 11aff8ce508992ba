"""The tracker mirror: one thread per tracker (MLflow, W&B, TensorBoard) that sends it the run's records.

What it reads: ``events.jsonl`` as the run writes it, from the byte offset it has sent up to, never the
events in memory. The file is the queue: memory stays bounded (at most :data:`MAX_ROWS` rows in hand), a
tracker that is down or slow leaves the mirror behind in the file, nothing is dropped, and whatever an
attempt did not send is sent by the next one, or by ``elfes sync RUN_DIR`` at any time. :meth:`TrackerMirror.notify`
(RunLogger, after each line) only wakes the thread: training never waits for a tracker. What is sent and how
each step is sent once: elfes/records/tracker_sender.py.

The thread starts with its RunLogger: it takes the tracker's sender lock (``RUN_DIR/tracking/<tracker>.lock``,
which ``elfes sync`` takes too), reads its state and imports the tracker's library before the first record comes.
Each request to MLflow has its own timeout (:data:`REQUEST_TIMEOUT_S`), so a server that accepts connections and
never answers is a failure within seconds, not a hang (W&B keeps its library's own waits). A failure marks the state behind (``elfes status``
shows it), records one ``warning`` event of kind ``tracker_behind`` naming the tracker, and is retried every
:data:`RETRY_S` seconds.

The close of a RunLogger (the attempt's end) waits for the mirror in two bounded steps: first for it to have
started (its library imported, the tracker tried once: at most :func:`start_timeout_s`, 120 s), then for it to
send the rest (at most :func:`flush_timeout_s`, 20 s; one more try when it is behind already). A mirror that
misses either is marked behind, with a warning, so that ``elfes status`` says so and names ``elfes sync``.

The run's lifecycle (its status, the attempts' ends, the spec, the provenance: ``RUN_DIR/tracking/lifecycle.json``,
written by the launcher before the attempt's code runs; elfes/records/tracker_lifecycle.py) goes with the
attempt's first send, unless the tracker has it already (``lifecycle_sent``).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .tracker_sender import REQUEST_TIMEOUT_S, MirrorState, Sender, Sink, sender_lock

log = logging.getLogger(__name__)

RETRY_S = 1.0  # between tries while the tracker cannot be reached
FLUSH_TIMEOUT_S = 20.0  # what a RunLogger's close waits for a started mirror to send the rest
FLUSH_TIMEOUT_VARIABLE = "ELFES_TRACKER_FLUSH_TIMEOUT_S"  # another wait, in seconds
START_TIMEOUT_S = 120.0  # what a RunLogger's close waits for a mirror to start (import, first try), first
START_TIMEOUT_VARIABLE = "ELFES_TRACKER_START_TIMEOUT_S"  # another wait, in seconds


def flush_timeout_s() -> float:
    """What a close waits for the rest: ``ELFES_TRACKER_FLUSH_TIMEOUT_S`` when it holds a positive number, else
    FLUSH_TIMEOUT_S."""
    return _seconds(FLUSH_TIMEOUT_VARIABLE, FLUSH_TIMEOUT_S)


def start_timeout_s() -> float:
    """What a close waits for the mirror to start: ``ELFES_TRACKER_START_TIMEOUT_S`` when it holds a positive
    number, else START_TIMEOUT_S."""
    return _seconds(START_TIMEOUT_VARIABLE, START_TIMEOUT_S)


def _seconds(variable: str, default: float) -> float:
    try:
        value = float(os.environ.get(variable, ""))
    except ValueError:
        return default
    return value if math.isfinite(value) and value > 0 else default


class TrackerMirror:
    """Send a run's records to one tracker from a thread of its own. Main process only.

    Example:
        >>> mirror = TrackerMirror(MlflowSink(settings, run_dir), run_dir, log=logger.log)  # doctest: +SKIP
        >>> mirror.notify()  # after each line RunLogger appends   # doctest: +SKIP
        >>> mirror.close()   # waits for it to start, then sends the rest within FLUSH_TIMEOUT_S   # doctest: +SKIP
    """

    def __init__(self, sink: Sink, run_dir: Path, *, log: Callable[[Mapping[str, Any]], None]) -> None:
        self.sink = sink
        self.run_dir = Path(run_dir)
        self.sender: Sender | None = None  # made by the thread once it holds the sender lock
        self._log = log
        self._started = threading.Event()  # the first try to send is over (library imported, tracker tried)
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._deadline = math.inf
        self._thread = threading.Thread(target=self._run, name=f"elfes-{sink.name}-mirror", daemon=True)
        self._thread.start()

    @property
    def state(self) -> MirrorState | None:
        return None if self.sender is None else self.sender.state

    def notify(self) -> None:
        """New lines are in ``events.jsonl``: wake the thread. Never blocks."""
        self._wake.set()

    def close(self, timeout_s: float | None = None, *, stopping: bool = False) -> bool:
        """Wait for the mirror to start (at most :func:`start_timeout_s`), then for it to send what is left (at
        most ``timeout_s``, :func:`flush_timeout_s` when None); True when the tracker has every record.

        A mirror already behind (its tracker down) tries once more and leaves the rest to the next attempt or
        ``elfes sync``: a tracker that is down never delays the end of an attempt (a preemption's grace time is
        short). When the attempt is ``stopping`` (a preemption, a time limit) the wait for the start is at most the
        flush's too. One that misses a wait is marked behind, with a warning."""
        timeout_s = flush_timeout_s() if timeout_s is None else timeout_s
        self._closing.set()
        self._wake.set()
        start_s = min(start_timeout_s(), timeout_s) if stopping else start_timeout_s()
        if not self._started.wait(start_s):
            self._give_up(f"had not started {start_s:g} s after the attempt's end began",
                          f"importing {self.sink.name} and trying it once took longer "
                          f"({FLUSH_TIMEOUT_VARIABLE if stopping else START_TIMEOUT_VARIABLE} sets another wait)")
            return False
        sender = self.sender
        self._deadline = time.monotonic() + (0.0 if sender is None or sender.state.behind else timeout_s)
        self._wake.set()
        self._thread.join(timeout_s + REQUEST_TIMEOUT_S + 5.0)
        if self._thread.is_alive():  # a call that hangs past the tracker's own timeout: leave it behind
            self._give_up(f"had not sent the rest {timeout_s:g} s after the attempt's end",
                          f"a request to {self.sink.name} did not return")
            return False
        return sender is not None and not sender.state.behind

    def _give_up(self, cause: str, why: str) -> None:
        self._deadline = time.monotonic()  # the thread stops after the try it is in
        log.warning(f"elfes: warning: the {self.sink.name} mirror {cause}; the next attempt or `elfes sync RUN_DIR` "
                    "sends what it lacks")
        if self.sender is not None:
            self.sender.fell_behind(TimeoutError(why), cause=cause)

    # -- the thread -----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            with sender_lock(self.run_dir, self.sink.name):  # an `elfes sync` ends first
                self.sender = Sender(self.sink, self.run_dir, log=self._log)
                self._send_until_closed(self.sender)
        except Exception as error:  # the run directory cannot be written: the run's own records say so
            log.warning(f"elfes: warning: the {self.sink.name} mirror stopped: {type(error).__name__}: {error}")
        finally:
            self._started.set()

    def _send_until_closed(self, sender: Sender) -> None:
        try:
            self.sink.prepare()  # the library's import takes seconds: before the first record comes
        except Exception as error:
            log.debug(f"the {self.sink.name} library did not load: {error}")  # the first send says so, and retries
        while True:
            self._wake.wait(RETRY_S if sender.state.behind else None)
            self._wake.clear()
            closing = self._closing.is_set()
            try:
                sender.send_all()
            except Exception as error:  # the tracker, its client library or the network: all retried
                sender.fell_behind(error)
            else:
                sender.caught_up()
            self._started.set()
            if closing and (not sender.state.behind or time.monotonic() >= self._deadline):
                break
        try:
            self.sink.close()
        except Exception as error:
            log.warning(f"elfes: the {self.sink.name} mirror could not close its run: {error}")
