"""The Weights & Biases side of the tracker mirror (elfes/records/tracker_mirror.py): one W&B run per ELFES run.

The run id is drawn once and kept in ``RUN_DIR/tracking/wandb.json`` before W&B hears of it; every attempt
calls ``wandb.init(id=..., resume="allow")`` with it, in ``RUN_DIR/tracking/wandb/`` (offline runs stay there
for ``wandb sync``). A sweep member's run has its sweep as ``group``. Metrics are logged with ``step=`` the
optimizer step, so that W&B's step is ELFES's; the mirror never sends a step twice, which W&B would refuse
for a step below its last. The TrainConfig of the first start becomes the run's config. W&B's console
capture and code saving are off: the run directory keeps the logs, and no file of the job is uploaded.

wandb is imported in the mirror's thread only; every process checks that it is installed.
"""

from __future__ import annotations

import importlib.util
import secrets
from itertools import groupby
from pathlib import Path
from typing import Any

from .tracker_mirror import Batch
from .tracking import Tracker, WandbSettings, wandb_dir

MISSING_MESSAGE = (
    "the job spec's tracking.wandb (or RunLogger(wandb=...)) mirrors the run to Weights & Biases, which is not "
    "installed; install it with: pip install 'elfes[wandb]', or remove the wandb tracker"
)


def check_wandb_installed() -> None:
    """Raise ``ImportError`` naming the pip command when wandb is missing. Any process."""
    if importlib.util.find_spec("wandb") is None:
        raise ImportError(MISSING_MESSAGE)


class WandbSink:
    """One ELFES run as one W&B run. The mirror's thread only."""

    name: Tracker = "wandb"

    def __init__(self, settings: WandbSettings, run_dir: Path, group: str | None) -> None:
        self.settings = settings
        self.run_dir = Path(run_dir).absolute()
        self.group = group
        self._run: Any = None

    def new_run_id(self) -> str:
        return secrets.token_hex(8)  # W&B run ids: letters and digits

    def open(self, run_id: str | None, elfes_run_id: str | None) -> str:
        import wandb

        if run_id is None:
            run_id = self.new_run_id()
        folder = wandb_dir(self.run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(console="off", save_code=False, disable_git=True, silent=True)
        self._run = wandb.init(
            project=self.settings.project, entity=self.settings.entity, mode=self.settings.mode, id=run_id,
            resume="allow", dir=str(folder), group=self.group, name=self.run_dir.name, settings=settings,
            reinit="create_new")
        return run_id

    def send(self, batch: Batch) -> None:
        run = self._run
        if batch.config is not None:
            run.config.update({"config": batch.config}, allow_val_change=True)
        if batch.elfes_run_id is not None:
            run.config.update({"elfes": {"run_dir": str(self.run_dir), "run_id": batch.elfes_run_id}},
                              allow_val_change=True)
        for step, rows in groupby(batch.metrics, key=lambda row: row.step):
            run.log({row.key: row.value for row in rows}, step=step)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
