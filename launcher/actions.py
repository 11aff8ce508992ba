"""One function per verb of the ``elfes`` command, returning data; printing is the CLI's job.

Torch-free: everything here runs on a login node. The verbs that change a run (``submit``,
``resume``, ``cancel``) record what they do in ``state.json`` through launcher/state.py; ``status``
and ``logs`` only read files (and ask SLURM's ``squeue``/``sacct`` where they exist).

The verbs live in rooms of their own, and this module gathers them for the CLI:

- launcher/authoring.py: ``init`` (templates), ``schema``, ``validate``; no run is touched;
- launcher/submission.py: ``submit``, ``resume``, and a local job's requeue (``resubmit_requeued``);
- launcher/status_report.py: ``status``;
- launcher/run_output.py: ``logs`` (``log_files``, ``follow_logs``) and ``submit --follow`` (``watch``);
- launcher/signalling.py: ``preempt``, ``cancel``;
- below them, launcher/run_dir.py (opening a run directory) and launcher/liveness.py (whether the
  job is still queued or alive, and the run's state once a vanished job is counted lost).

Errors: :class:`~launcher.spec.SpecError`, :class:`~launcher.executors.ExecutorError` and
:class:`UsageError` are bad input (nothing was created); :class:`ActionFailed`,
:class:`~launcher.executors.SubmissionError` and :class:`~launcher.state.StateError` mean the verb
cannot be carried out now.

>>> result = submit("examples/quickstart/job.yaml", executor="local")
>>> status([result.run_dir])[0].status
'pending'
"""

from __future__ import annotations

from .authoring import TEMPLATES_PACKAGE, Validated, init, schema, template_names, template_text, validate
from .liveness import (
    Liveness,
    LivenessProbe,
    cancel_requested,
    effective_state,
    liveness,
    local_processes,
    recorded_tasks,
    slurm_queue_state,
)
from .run_dir import UsageError, run_paths
from .run_output import EventTail, LogFiles, Snapshot, follow_logs, log_files, watch
from .signalling import ActionFailed, Signalled, cancel, preempt
from .status_report import Status, run_status, status
from .submission import Submitted, resubmit_requeued, resume, submit

__all__ = [
    "TEMPLATES_PACKAGE", "ActionFailed", "EventTail", "Liveness", "LivenessProbe", "LogFiles", "Signalled",
    "Snapshot", "Status", "Submitted", "UsageError", "Validated", "cancel", "cancel_requested", "effective_state",
    "follow_logs", "init", "liveness", "local_processes", "log_files", "preempt", "recorded_tasks", "resubmit_requeued",
    "resume", "run_paths", "run_status", "schema", "slurm_queue_state", "status", "submit", "template_names",
    "template_text", "validate", "watch",
]
