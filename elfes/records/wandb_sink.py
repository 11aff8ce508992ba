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
provenance: :meth:`~elfes.records.tracker_lifecycle.Lifecycle.tags`) and the spec to the config (``spec``); at a
run's end the launcher resumes the run once more to finish it with the exit code of its status
(:attr:`WandbSink.EXIT_CODES`), in an offline folder of its own (``sender``: two runs of the same id begun in the
same second would share one).

The runs this process's sinks have open share W&B's service process, whose lifetime :data:`SERVICE` owns: it
counts them and tears the service down when the last one closes (see :class:`WandbService`).

wandb is imported in the mirror's thread only; every process checks that it is installed.
"""

from __future__ import annotations

import importlib.util
import secrets
import threading
from collections.abc import Callable
from itertools import groupby
from pathlib import Path
from typing import Any, ClassVar

from .tracker_lifecycle import TrackerStatus
from .tracker_sender import Batch
from .tracking import WandbSettings, wandb_dir

MISSING_MESSAGE = (
    "the job spec's tracking.wandb (or RunLogger(trackers={'wandb': ...})) mirrors the run to Weights & Biases, "
    "which is not installed; install it with: pip install 'elfes[wandb]', or remove the wandb tracker"
)
PAUSED_EXIT_CODE = 1  # with mark_preempting(): W&B shows the run preempted, not failed


def check_wandb_installed() -> None:
    """Raise ``ImportError`` naming the pip command when wandb is missing. Any process."""
    if importlib.util.find_spec("wandb") is None:
        raise ImportError(MISSING_MESSAGE)


class WandbService:
    """W&B's service process as this process's sinks share it: the runs they have open, counted under a lock, and
    its teardown when the last one closes.

    W&B's service writes an offline run's last records (its exit among them) when the run's stream closes, which
    ``finish`` does not wait for, and a job's processes are reaped when it ends: so once no sink has a run open,
    the service is torn down (its streams closed, it exits). Not while the process has a W&B run of its own open
    (the job's), which the service goes on serving and the process's exit tears down. The lock is held while the
    count changes and during the teardown, so that no sink opens a run on a service being torn down.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open_runs = 0

    @property
    def open_runs(self) -> int:
        """The runs this process's sinks have open (or are opening)."""
        with self._lock:
            return self._open_runs

    def open_run(self, init: Callable[[], Any]) -> Any:
        """The run ``init`` opens (``wandb.init``), counted from before the call until :meth:`finish_run`."""
        with self._lock:
            self._open_runs += 1
        try:
            return init()
        except BaseException:
            self._closed(tear_down=False)
            raise

    def finish_run(self, run: Any, exit_code: int) -> None:
        """Finish ``run`` with ``exit_code``; the last run of the sinks to close tears the service down."""
        try:
            run.finish(exit_code=exit_code)
        finally:
            self._closed(tear_down=True)

    def _closed(self, *, tear_down: bool) -> None:
        with self._lock:
            self._open_runs -= 1
            if tear_down and self._open_runs == 0 and not _process_has_a_run_open():
                _tear_down()


def _process_has_a_run_open() -> bool:
    """Whether a W&B run of this process is open (one of its own, the sinks' being finished); True where the
    installed wandb does not say, so that nothing is torn down under it."""
    from wandb.sdk import wandb_setup

    singleton = getattr(wandb_setup, "singleton", None)
    setup = singleton() if callable(singleton) else None
    if setup is None or not hasattr(setup, "most_recent_active_run"):
        return True
    return setup.most_recent_active_run is not None


def _tear_down() -> None:
    import wandb

    try:
        wandb.teardown()
    except SystemExit:  # the service's own nonzero exit, which teardown raises as SystemExit: not this thread's end
        pass


SERVICE = WandbService()  # the one of this process


class WandbSink:
    """One ELFES run as one W&B run. The mirror's thread only."""

    name = "wandb"
    replaces_redone_steps = False  # W&B refuses a step below its last: each step is sent once
    # W&B's run state follows the exit code alone: 0 finished, any other failed (it has no "killed" an SDK sets).
    EXIT_CODES: ClassVar[dict[TrackerStatus, int]] = {
        TrackerStatus.FINISHED: 0, TrackerStatus.FAILED: 1, TrackerStatus.KILLED: 143}

    def __init__(self, settings: WandbSettings, run_dir: Path, group: str | None = None, *,
                 sender: str | None = None) -> None:
        self.settings = settings
        self.run_dir = Path(run_dir).absolute()
        self.group = group
        self.sender = sender  # who sends outside an attempt ("sync", "end"): its offline run has a folder of its own
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
                                  **({"x_sync_dir_suffix": self.sender} if self.sender else {}))
        self._run = SERVICE.open_run(lambda: wandb.init(
            project=self.settings.project, entity=self.settings.entity, mode=self.settings.mode, id=run_id,
            resume="allow", dir=str(folder), group=self.group, name=self.run_dir.name, settings=settings,
            reinit="create_new"))
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
                self._exit_code = self.EXIT_CODES[batch.lifecycle.status]
            run.config.update({"spec": batch.lifecycle.params}, allow_val_change=True)
            run.summary.update(batch.lifecycle.tags())
        for step, rows in groupby(batch.metrics, key=lambda row: row.step):
            run.log({row.key: row.value for row in rows}, step=step)
        if batch.finished:
            self._exit_code = self.EXIT_CODES[TrackerStatus.FINISHED]

    def close(self) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        try:
            if self._exit_code is None:  # the attempt ends, the run goes on (or its end is for the launcher to say)
                run.mark_preempting()
        finally:
            SERVICE.finish_run(run, PAUSED_EXIT_CODE if self._exit_code is None else self._exit_code)

    def describe_status(self, status: TrackerStatus) -> str:
        return f"finished with exit code {self.EXIT_CODES[status]}" if status.terminal else "resumed"
