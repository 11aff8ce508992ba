"""Where a training process is, for a watchdog in another thread: the last update boundary it reached
and its last sign of progress. Torch-free.

The trainer reports to the :class:`Heartbeat` of the :class:`~elfes.engine.StopRequest` it was given
(``stop.heartbeat``): a window starts ("training"), an update boundary is reached (the step), an
evaluation batch is done ("evaluating"), a checkpoint is being written ("checkpointing"), training
ended ("ended"). A beat before a first of its kind (:meth:`Heartbeat.beat_first`: the first window
of an epoch, the first batch of an evaluation loader) says that what follows may take several times
its kind's usual: a fresh loader iterator starts its workers, a first batch compiles or initialises
lazily. Nothing else happens on a beat: reading the clock and setting a few attributes, so a beat
costs well under a microsecond and is safe from any thread (each attribute write is atomic).

>>> stop = StopRequest()  # doctest: +SKIP
>>> state = trainer.train(config, checkpoint_dir=run_dir / "checkpoints", stop=stop)  # doctest: +SKIP
>>> stop.heartbeat.step, stop.heartbeat.updates       # the last boundary, boundaries reached in this process  # doctest: +SKIP
(16, 16)
"""

from __future__ import annotations

import time

from elfes.contract import PHASES, Phase

__all__ = ["PHASES", "Heartbeat"]


class Heartbeat:
    """The progress of one training process (one rank), as its own threads see it.

    ``step``: optimizer updates done at the last boundary reached (None before the trainer restored or
    seeded the run); ``start_step``: the step this process started training from; ``updates``: update
    boundaries reached in this process; ``phase``: one of :data:`PHASES`; ``first``: whether the work since
    the last beat is a first of its kind (:meth:`beat_first`); ``at``: ``time.monotonic()`` of the last
    beat, written first (a reader that sees ``at`` unchanged before and after reading the rest saw no beat
    half written). Written by the training thread, read by any.
    """

    def __init__(self) -> None:
        self.phase: Phase = Phase.STARTING
        self.step: int | None = None
        self.start_step: int | None = None
        self.updates = 0
        self.first = False
        self.at = time.monotonic()

    def beat(self, phase: Phase) -> None:
        """A sign of progress in ``phase`` (the training thread; e.g. once per evaluation batch)."""
        self.at = time.monotonic()
        self.phase = phase
        self.first = False

    def beat_first(self, phase: Phase) -> None:
        """A beat before a first of its kind in ``phase`` (the first window of an epoch, an evaluation
        loader's first batch), which may be several times slower than the rest of its kind."""
        self.at = time.monotonic()
        self.phase = phase
        self.first = True

    def started(self, step: int) -> None:
        """Training starts (or resumes) at ``step``: the position is known, no boundary reached yet."""
        if self.start_step is None:
            self.start_step = step
        self.step = step
        self.beat(Phase.STARTING if self.updates == 0 else Phase.TRAINING)

    def reached(self, step: int) -> None:
        """An update boundary: ``step`` updates are done."""
        self.at = time.monotonic()  # first: the new count changes the watchdog's limit
        self.step = step
        self.updates += 1
        self.phase = Phase.BOUNDARY
        self.first = False

    def failing_step(self) -> int | None:
        """The step a failure now is counted at: the update being computed while training (the last
        boundary's step + 1), else the last boundary's step."""
        if self.step is None:
            return None
        return self.step + 1 if self.phase == Phase.TRAINING else self.step
