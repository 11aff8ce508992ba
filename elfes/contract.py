"""The words the engine writes and the launcher reads: one home for each, both sides import it. Torch-free.

- Checkpoint files and pointers: a checkpoint is ``step-<step>-batches-<batches>.pt`` (:class:`CheckpointName`)
  in the ``checkpoint_dir``, or a folder ``step-<step>-batches-<batches>.dcp`` for a sharded (FSDP2) model; :class:`Pointer` names its ``last``, ``best`` and ``final`` symlinks.
- Heartbeat phases (:class:`Phase`): where a training process is, for the launcher's hang watchdog.
- Stop reasons: a stop on a terminating signal (:data:`TERMINATING_SIGNALS`) is final; one of
  :data:`FINISHING_REASONS` (the monitor stopped improving) ends the run finished, not stopped.
- Why a checkpoint was written (:class:`SaveReason`, the ``reason`` of a ``checkpoint`` record).
- Run records (:class:`EventKind`): the ``event`` of each line of ``events.jsonl``, the words the engine writes
  and every reader compares with (elfes/records/schema.py gives each kind its fields).
- Run-directory names: what the engine writes there (``events.jsonl``, ``timings.json``, ``tracking/``,
  ``tensorboard/``), one definition each for the engine and the launcher's ``RunPaths``.

The launcher imports this module on login nodes, so it imports nothing heavy; the engine's live objects the
launcher holds (``Heartbeat``, ``StopRequest``) it types under ``typing.TYPE_CHECKING`` only.

>>> CheckpointName.parse("step-00000016-batches-0000000064.pt")
CheckpointName(step=16, batches=64, sharded=False)
>>> CheckpointName(16, 64, sharded=True).filename
'step-00000016-batches-0000000064.dcp'
>>> f"{Pointer.LAST}", Phase.ENDED == "ended"
('last', True)
>>> EventKind("stopped") in END_EVENTS, {"event": "train"}["event"] == EventKind.TRAIN
(True, True)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class StrEnum(str, Enum):
    """A closed set of words that reads and prints as its words: ``str()``, f-strings, ``repr()`` and JSON
    give the value (``"running"``), and a member equals (and hashes as) its string, so files and messages stay
    plain text. Python 3.11's ``enum.StrEnum``, for 3.10 too."""

    _value_: str  # every member's value is its word

    def __str__(self) -> str:
        return self.value

    def __format__(self, format_spec: str) -> str:
        return self.value.__format__(format_spec)

    def __repr__(self) -> str:
        return repr(self.value)

    def __hash__(self) -> int:
        return hash(self.value)


# -- checkpoints ------------------------------------------------------------------------------------------------

CHECKPOINT_FILE = re.compile(r"^step-(\d+)-batches-(\d+)\.(pt|dcp)$")


@dataclass(frozen=True, order=True)
class CheckpointName:
    """A published checkpoint's name: the optimizer steps and the batches it was saved after, and whether it
    is a folder of shards (an FSDP2 model's, written by every rank) rather than one file."""

    step: int
    batches: int
    sharded: bool = False

    @property
    def filename(self) -> str:
        return f"step-{self.step:08d}-batches-{self.batches:010d}.{'dcp' if self.sharded else 'pt'}"

    @classmethod
    def parse(cls, filename: str) -> CheckpointName | None:
        """The name of a checkpoint file or folder, or None for any other entry (a temporary, a pointer)."""
        match = CHECKPOINT_FILE.match(filename)
        return cls(int(match[1]), int(match[2]), match[3] == "dcp") if match else None


class Pointer(StrEnum):
    """The symlinks of a checkpoint folder: ``last`` (a resume starts there), ``best`` (the monitor's best),
    ``final`` (the end of training)."""

    LAST = "last"
    BEST = "best"
    FINAL = "final"


POINTERS: tuple[Pointer, ...] = tuple(Pointer)


class SaveReason(StrEnum):
    """Why the engine wrote a checkpoint: every ``checkpoint_every`` updates, a new best, a stop, the end."""

    INTERVAL = "interval"
    BEST = "best"
    STOP = "stop"
    FINAL = "final"


class WarningKind(StrEnum):
    """The ``kind`` of a ``warning`` run event: what the run cannot do exactly or cheaply (the rehearsal's likely
    causes and ``elfes status`` read it)."""

    INEXACT_STREAM = "inexact_stream"  # a stream whose state_dict leaves out part of its place (a shuffle buffer)
    STREAM_REPLAY = "stream_replay"  # a resume read and discarded a stream's consumed batches
    TRACKER_BEHIND = "tracker_behind"  # an experiment tracker (MLflow, W&B) did not take the records sent to it
    WORLD_SIZE_CHANGED = "world_size_changed"  # a run continued on another world size: equal to float rounding


# -- run records ----------------------------------------------------------------------------------------------


class EventKind(StrEnum):
    """What a run record says happened: the ``event`` of a line of ``events.jsonl``. The engine writes these
    words and no other; readers compare an event's ``"event"`` with the members, which equal their words, so
    the file is plain JSON either way. A new kind is a member here, its fields in elfes/records/schema.py and
    its line in elfes/records/plain.py (docs/where-things-live.md)."""

    STARTED = "started"  # a run began from scratch
    RESUMED = "resumed"  # a run continued from a checkpoint
    TRAIN = "train"  # progress at the logging interval
    SKIPPED = "skipped"  # a window's optimizer update was skipped
    EVALUATION = "evaluation"  # an evaluation finished
    CHECKPOINT = "checkpoint"  # a checkpoint was published
    EXPORT = "export"  # model weights were exported
    STOP_SIGNAL = "stop_signal"  # the loop noticed a stop request
    STOP_REQUESTED = "stop_requested"  # all ranks agreed to stop at this boundary
    WARNING = "warning"  # what the run cannot do exactly or cheaply (its ``kind``: :class:`WarningKind`)
    FINISHED = "finished"  # the run reached its budget or stopped early on the monitor
    STOPPED = "stopped"  # the run paused on a stop request after saving ``last``
    FAILED = "failed"  # an exception ended the run


START_EVENTS: tuple[EventKind, ...] = (EventKind.STARTED, EventKind.RESUMED)  # each start of the training loop
END_EVENTS: tuple[EventKind, ...] = (EventKind.FINISHED, EventKind.STOPPED, EventKind.FAILED)  # how a start ended
STOP_EVENTS: tuple[EventKind, ...] = (EventKind.STOP_SIGNAL, EventKind.STOP_REQUESTED)  # a stop on its way


# -- run directory ------------------------------------------------------------------------------------------
# What the engine writes in a run directory, by name: the engine's modules and the launcher's RunPaths
# (launcher/rundir/paths.py) build their paths from these, and no other module spells them.

EVENTS_FILE_NAME = "events.jsonl"  # the run records (elfes.records)
TIMINGS_FILE_NAME = "timings.json"  # their running totals of each start's phase times (elfes.records.timings)
TRACKING_DIR_NAME = "tracking"  # the experiment trackers' mirror (elfes.records.tracking)
LIFECYCLE_FILE_NAME = "lifecycle.json"  # in the tracking folder: what the trackers say of the run
TENSORBOARD_DIR_NAME = "tensorboard"  # the TensorBoard mirror (elfes.records.tensorboard)


def tracker_state_file_name(tracker: str) -> str:
    """The file in the tracking folder that holds one tracker's mirror state (``mlflow.json``)."""
    return f"{tracker}.json"


# -- heartbeat ------------------------------------------------------------------------------------------------


class Phase(StrEnum):
    """What a training process did at its last beat (``Heartbeat.phase``)."""

    STARTING = "starting"  # before the first window of this process (restored or seeded)
    TRAINING = "training"  # a window started
    BOUNDARY = "boundary"  # an update boundary was reached
    EVALUATING = "evaluating"  # an evaluation batch is done
    CHECKPOINTING = "checkpointing"  # a checkpoint is being written
    ENDED = "ended"  # train() returned


PHASES: tuple[Phase, ...] = tuple(Phase)


# -- stop reasons ---------------------------------------------------------------------------------------------

# Stop signals whose stop is final (`elfes cancel`, `scancel`, plain preemption): they never requeue by
# themselves, and when ranks saw different signals one of these decides the outcome.
TERMINATING_SIGNALS: tuple[str, ...] = ("SIGINT", "SIGTERM")
# The stop reason the trainer sets when the monitor stopped improving: the run ends finished.
EARLY_STOPPING = "early_stopping"
FINISHING_REASONS: tuple[str, ...] = (EARLY_STOPPING,)
