"""The Weights & Biases side of the tracker mirror (elfes/records/tracker_mirror.py): one W&B run per ELFES run.

The run id is drawn once and kept in ``RUN_DIR/tracking/wandb.json`` before W&B hears of it; every attempt
calls ``wandb.init(id=..., resume="allow")`` with it, in ``RUN_DIR/tracking/wandb/`` (offline runs stay there
for ``wandb sync``). A sweep member's run has its sweep as ``group``. Metrics are logged with ``step=`` the
optimizer step, so that W&B's step is ELFES's; the mirror never sends a step twice, which W&B would refuse
for a step below its last. The TrainConfig of the first start becomes the run's config. W&B's console
capture and code saving are off: the run directory keeps the logs, and no file of the job is uploaded.

How a W&B run ends: W&B sets its state from the exit code ``finish`` sends (0 finished, anything else failed)
and has none for a run that goes on later. So the mirror finishes with 0 only after the ``finished`` record; an
attempt that ends otherwise is first marked preempting (``mark_preempting()``) and finished with
:data:`PAUSED_EXIT_CODE`, which W&B shows as preempted and the next attempt resumes. The launcher's lifecycle
(elfes/records/tracker_lifecycle.py) goes to the summary (the status, each attempt's end, the
provenance: :meth:`~elfes.records.tracker_lifecycle.Lifecycle.tags`) and the spec to the config (``spec``); at a run's end the launcher resumes the run once more to
finish it with :data:`~elfes.records.tracker_lifecycle.WANDB_EXIT_CODES` of its status, in an offline folder
of its own (``sync_dir_suffix``: two runs of the same id begun in the same second would share one).

wandb is imported in the mirror's thread only; every process checks that it is installed.
"""

from __future__ import annotations

import importlib.util
import secrets
import threading
from itertools import groupby
from pathlib import Path
from typing import Any

from .tracker_lifecycle import WANDB_EXIT_CODES
from .tracker_sender import Batch
from .tracking import Tracker, WandbSettings, wandb_dir

MISSING_MESSAGE = (
    "the job spec's tracking.wandb (or RunLogger(wandb=...)) mirrors the run to Weights & Biases, which is not "
    "installed; install it with: pip install 'elfes[wandb]', or remove the wandb tracker"
)
PAUSED_EXIT_CODE = 1  # with mark_preempting(): W&B shows the run preempted, not failed


def check_wandb_installed() -> None:
    """Raise ``ImportError`` naming the pip command when wandb is missing. Any process."""
    if importlib.util.find_spec("wandb") is None:
        raise ImportError(MISSING_MESSAGE)


class WandbSink:
    """One ELFES run as one W&B run. The mirror's thread only."""

    name: Tracker = "wandb"

    def __init__(self, settings: WandbSettings, run_dir: Path, group: str | None, *,
                 sync_dir_suffix: str | None = None) -> None:
        self.settings = settings
        self.run_dir = Path(run_dir).absolute()
        self.group = group
        self.sync_dir_suffix = sync_dir_suffix
        self._run: Any = None
        self._exit_code: int | None = None  # known once the run finished or the lifecycle ended it

    def prepare(self) -> None:
        import wandb  # noqa: F401 - seconds, before the first record comes

    def new_run_id(self) -> str:
        return secrets.token_hex(8)  # W&B run ids: letters and digits

    def open(self, run_id: str | None, elfes_run_id: str | None) -> str:
        import wandb

        if run_id is None:
            run_id = self.new_run_id()
        folder = wandb_dir(self.run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        # No metadata: W&B would record the process's command line (`train.py --hf-token ...`), which the spec's
        # credential rule keeps from the trackers (elfes/records/credentials.py), and ELFES sends its own provenance.
        settings = wandb.Settings(console="off", save_code=False, disable_git=True, silent=True, x_disable_meta=True,
                                  **({"x_sync_dir_suffix": self.sync_dir_suffix} if self.sync_dir_suffix else {}))
        with _OPEN_SINKS_LOCK:
            _OPEN_SINKS[0] += 1
        try:
            self._run = wandb.init(
                project=self.settings.project, entity=self.settings.entity, mode=self.settings.mode, id=run_id,
                resume="allow", dir=str(folder), group=self.group, name=self.run_dir.name, settings=settings,
                reinit="create_new")
        except BaseException:
            with _OPEN_SINKS_LOCK:
                _OPEN_SINKS[0] -= 1
            raise
        return run_id

    def send(self, batch: Batch) -> None:
        run = self._run
        if batch.config is not None:
            run.config.update({"config": batch.config}, allow_val_change=True)
        if batch.elfes_run_id is not None:
            run.config.update({"elfes": {"run_dir": str(self.run_dir), "run_id": batch.elfes_run_id}},
                              allow_val_change=True)
        if batch.lifecycle is not None:
            if batch.lifecycle.terminal:  # first: a send that fails below must not leave the run "preempted"
                self._exit_code = WANDB_EXIT_CODES[batch.lifecycle.status]
            run.config.update({"spec": batch.lifecycle.params}, allow_val_change=True)
            run.summary.update(batch.lifecycle.tags())
        for step, rows in groupby(batch.metrics, key=lambda row: row.step):
            run.log({row.key: row.value for row in rows}, step=step)
        if batch.finished:
            self._exit_code = 0

    def close(self) -> None:
        if self._run is None:
            return
        try:
            if self._exit_code is None:  # the attempt ends, the run goes on (or its end is for the launcher to say)
                self._run.mark_preempting()
            self._run.finish(exit_code=PAUSED_EXIT_CODE if self._exit_code is None else self._exit_code)
        finally:
            self._run = None
            with _OPEN_SINKS_LOCK:
                _OPEN_SINKS[0] -= 1
                _write_out_service()


# W&B runs the sinks of this process have open (or are opening); guarded by the lock, under which the service is
# also torn down, so that no sink opens a run on a service being torn down.
_OPEN_SINKS = [0]
_OPEN_SINKS_LOCK = threading.Lock()


def _write_out_service() -> None:
    """Make W&B's service process write out what it holds (the caller holds ``_OPEN_SINKS_LOCK``). It writes an
    offline run's last records (its exit among them) when the run's stream closes, which ``finish`` does not wait
    for, and a job's processes are reaped when it ends: so the service is torn down now (its streams closed, it
    exits), unless another sink of this process has a run open, or the process has a W&B run of its own open (the
    job's), which the service goes on serving and the exit of the process tears down. With a wandb that does not
    say which runs are open, nothing is torn down."""
    import wandb
    from wandb.sdk import wandb_setup

    setup = getattr(wandb_setup, "_singleton", None)
    if _OPEN_SINKS[0] or setup is None or not hasattr(setup, "most_recent_active_run"):
        return
    if setup.most_recent_active_run is not None:
        return
    try:
        wandb.teardown()
    except SystemExit:  # the service's own nonzero exit, which teardown raises as SystemExit: not this thread's end
        pass
