"""The tracker run's lifecycle: its status, how each attempt ended, the job spec and the provenance.

The launcher decides all of it (``state.json``); elfes only carries it to the trackers. The launcher writes
:class:`Lifecycle` to ``RUN_DIR/tracking/lifecycle.json`` when an attempt begins (status RUNNING, the ends of
the attempts before, the spec, the attempt's provenance) and when one ends. The mirror of a running attempt
sends what is new with its first send (elfes/records/tracker_mirror.py); at an end that ends the run
(FINISHED, FAILED, KILLED) no mirror runs any more, so the launcher sends it itself
(:func:`elfes.records.tracker_sender.send_lifecycle_once`, from launcher/job/tracker_publishing.py). An attempt whose end leaves the run going on (requeued, a failure retried) is told
by the next attempt's mirror: no tracker call delays a preemption's short grace time.

What each tracker gets (:meth:`Lifecycle.tags`: one dictionary, tags in MLflow, the run summary in W&B):
:data:`STATUS_TAG`, a tag per ended attempt (:func:`attempt_end_tag`), and the provenance
(:data:`CODE_TAG_PREFIX`, :data:`VERSION_TAG_PREFIX`); the spec as parameters ``spec.<field>``, without its ``env`` and
what looks like a credential (:func:`elfes.records.credentials.spec_params`; MLflow keeps a parameter's first value and
refuses to change it, so one a later attempt changes keeps its first; W&B's config ``spec`` shows the
latest). The status is :class:`TrackerStatus`, ELFES's word for the run; each sink says it in its tracker's
words (MLflow's run status: ``MlflowSink.RUN_STATUS``; W&B, which has no status an SDK may set, an exit code:
``WandbSink.EXIT_CODES``), and the launcher asks the sink (``describe_status``) when a tracker did not take it.

Torch-free, pydantic-free; the trackers' libraries are imported by their sinks only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elfes.contract import StrEnum
from elfes.files import write_text_atomically

from .credentials import sendable_params
from .tracking import lifecycle_path

STATUS_TAG = "elfes.status"
CODE_TAG_PREFIX = "elfes.code."  # the attempt's code snapshot: commit, dirty, fingerprint, path
VERSION_TAG_PREFIX = "elfes.version."  # python, torch, elfes, cuda, cudnn, nccl, accelerate


class TrackerStatus(StrEnum):
    """What the run is, for its trackers (``elfes status``'s status in four words; the tag :data:`STATUS_TAG`).
    Each sink says it in its own tracker's words."""

    RUNNING = "RUNNING"  # an attempt runs, or the run goes on (a requeue, a failure retried)
    FINISHED = "FINISHED"
    FAILED = "FAILED"  # a failure not retried, or a job lost
    KILLED = "KILLED"  # cancelled, or stopped (`elfes resume` continues it)

    @property
    def terminal(self) -> bool:
        """The run has ended (for now: a stopped run's next attempt sets it RUNNING again)."""
        return self is not TrackerStatus.RUNNING


def attempt_end_tag(number: int) -> str:
    """The tag of attempt ``number``'s end (``attempt.<n>.end`` after the ``elfes`` of every tag of ours)."""
    return f"elfes.attempt.{number}.end"


@dataclass(frozen=True)
class Lifecycle:
    """What the trackers should say of the run now (``RUN_DIR/tracking/lifecycle.json``)."""

    status: TrackerStatus
    attempt_ends: dict[int, str] = field(default_factory=dict)  # attempt number -> its end, e.g. "requeued (SIGUSR2)"
    params: dict[str, str] = field(default_factory=dict)  # spec.<field> -> value (elfes/records/credentials.py)
    provenance: dict[str, str] = field(default_factory=dict)  # tags under CODE_TAG_PREFIX and VERSION_TAG_PREFIX

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", TrackerStatus(self.status))  # "FINISHED" given as a string: the member

    @property
    def terminal(self) -> bool:
        return self.status.terminal

    def tags(self) -> dict[str, str]:
        """The status, each attempt's end and the provenance: MLflow tags, W&B summary keys."""
        ends = {attempt_end_tag(number): end for number, end in sorted(self.attempt_ends.items())}
        return {STATUS_TAG: self.status.value, **ends, **self.provenance}

    def to_json(self) -> dict[str, Any]:
        ends = {str(n): end for n, end in sorted(self.attempt_ends.items())}
        return {"status": self.status.value, "attempt_ends": ends,
                "params": dict(sorted(self.params.items())), "provenance": dict(sorted(self.provenance.items()))}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Lifecycle:
        return cls(status=data["status"], attempt_ends={int(n): str(end) for n, end in data["attempt_ends"].items()},
                   params=sendable_params({str(k): str(v) for k, v in data["params"].items()}),
                   provenance={str(k): str(v) for k, v in data["provenance"].items()})

    def digest(self) -> str:
        """What a mirror records as sent: equal digests, nothing new to send."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode("utf-8")).hexdigest()[:16]


def write_lifecycle(run_dir: Path, lifecycle: Lifecycle) -> None:
    """Publish ``lifecycle`` atomically (the launcher: rank 0, or the rank that decides a failure)."""
    path = lifecycle_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(lifecycle.to_json(), indent=1) + "\n")


def read_lifecycle(run_dir: Path) -> Lifecycle | None:
    """The lifecycle the launcher wrote, or None (a plain script's run, or a file that cannot be read)."""
    try:
        return Lifecycle.from_json(json.loads(lifecycle_path(run_dir).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
