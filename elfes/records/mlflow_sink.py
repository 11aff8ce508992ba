"""The MLflow side of the tracker mirror (elfes/records/tracker_mirror.py): one MLflow run per ELFES run.

The run is tagged with the run directory's absolute path (:data:`RUN_DIR_TAG`) and the engine's run id
(:data:`RUN_ID_TAG`); its id is kept in ``RUN_DIR/tracking/mlflow.json``, and a run directory whose state file
lost it (a kill right after the run was created) finds its run again by the first tag. A sweep member's run
is tagged :data:`GROUP_TAG` with its sweep. Each attempt sets the run RUNNING; the ``finished`` event sets it
FINISHED, and the launcher's lifecycle (elfes/records/tracker_lifecycle.py) sets the end of a run in MLflow's words
(:attr:`MlflowSink.RUN_STATUS`: FINISHED, FAILED or KILLED), with a tag per attempt's end, the provenance as tags and the job spec as parameters ``spec.<field>``
(those the run has not yet: MLflow refuses to change a parameter). The TrainConfig of the first start is logged
as parameters ``config.<field>``.

mlflow is imported in the mirror's thread (it takes seconds) or by ``elfes sync``; every process checks that it is
installed.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any, ClassVar

from .tracker_lifecycle import Lifecycle, TrackerStatus
from .tracker_sender import MAX_ROWS, REQUEST_TIMEOUT_S, Batch
from .tracking import MlflowSettings

log = logging.getLogger(__name__)

MISSING_MESSAGE = (
    "the job spec's tracking.mlflow (or RunLogger(trackers={'mlflow': ...})) mirrors the run to MLflow, which is not installed; "
    "install it with: pip install 'elfes[mlflow]', or remove the mlflow tracker"
)
RUN_DIR_TAG = "elfes.run_dir"
RUN_ID_TAG = "elfes.run_id"
MAX_PARAMS, MAX_TAGS = 100, 100  # per log_batch call (MLflow's limits)
GROUP_TAG = "elfes.group"
# The mirror retries on its own schedule: one try per call, not minutes of the client's backoff, and each request
# gives up after REQUEST_TIMEOUT_S (a server that accepts connections and never answers).
_CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S)}


def check_mlflow_installed() -> None:
    """Raise ``ImportError`` naming the pip command when mlflow is missing. Any process."""
    if importlib.util.find_spec("mlflow") is None:
        raise ImportError(MISSING_MESSAGE)


class MlflowSink:
    """One ELFES run as one MLflow run. The mirror's thread only."""

    name = "mlflow"
    replaces_redone_steps = False  # MLflow keeps every value sent: each step is sent once
    # The run's status in MLflow's words (its RunStatus names).
    RUN_STATUS: ClassVar[dict[TrackerStatus, str]] = {
        TrackerStatus.RUNNING: "RUNNING", TrackerStatus.FINISHED: "FINISHED", TrackerStatus.FAILED: "FAILED",
        TrackerStatus.KILLED: "KILLED"}

    def __init__(self, settings: MlflowSettings, run_dir: Path, group: str | None = None, *,
                 sender: str | None = None) -> None:
        self.settings = settings
        self.run_dir = Path(run_dir).absolute()
        self.group = group
        self._client: Any = None
        self._run_id: str | None = None

    def prepare(self) -> None:
        self._connect()

    def new_run_id(self) -> str | None:
        return None  # MLflow names its runs

    def open(self, run_id: str | None, elfes_run_id: str | None) -> str:
        client = self._connect()
        if run_id is None:
            run_id = self._find_or_create(client)
        client.update_run(run_id, status=self.RUN_STATUS[TrackerStatus.RUNNING])
        self._run_id = run_id
        return run_id

    def send(self, batch: Batch) -> None:
        from mlflow.entities import Metric, Param, RunTag

        client, run_id = self._client, self._run_id
        tags = [RunTag(RUN_ID_TAG, batch.elfes_run_id)] if batch.elfes_run_id is not None else []
        params = [Param(f"config.{key}", _param_value(value)) for key, value in (batch.config or {}).items()]
        if tags or params:
            client.log_batch(run_id, params=params, tags=tags)
        if batch.lifecycle is not None:
            self._send_lifecycle_tags(batch.lifecycle)
        for start in range(0, len(batch.metrics), MAX_ROWS):
            rows = batch.metrics[start:start + MAX_ROWS]
            client.log_batch(run_id, metrics=[Metric(row.key, row.value, row.timestamp_ms, row.step) for row in rows])
        if batch.finished:
            client.set_terminated(run_id, status=self.RUN_STATUS[TrackerStatus.FINISHED])
        elif batch.lifecycle is not None and batch.lifecycle.terminal:
            client.set_terminated(run_id, status=self.RUN_STATUS[batch.lifecycle.status])

    def _send_lifecycle_tags(self, lifecycle: Lifecycle) -> None:
        """The spec's parameters the run lacks (a parameter's value cannot change), every lifecycle tag."""
        from mlflow.entities import Param, RunTag

        client, run_id = self._client, self._run_id
        assert run_id is not None  # open() came first
        known = client.get_run(run_id).data.params
        params = [Param(key, value[:6000]) for key, value in lifecycle.params.items() if key not in known]
        tags = [RunTag(key, value) for key, value in lifecycle.tags().items()]
        for start in range(0, len(params), MAX_PARAMS):
            _log_params(client, run_id, params[start:start + MAX_PARAMS])
        for start in range(0, len(tags), MAX_TAGS):
            client.log_batch(run_id, tags=tags[start:start + MAX_TAGS])

    def close(self) -> None:
        self._client = None

    def describe_status(self, status: TrackerStatus) -> str:
        return f"set {self.RUN_STATUS[status]}"

    def _connect(self) -> Any:
        if self._client is None:
            for name, value in _CLIENT_DEFAULTS.items():
                os.environ.setdefault(name, value)
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.settings.tracking_uri)
        return self._client

    def _find_or_create(self, client: Any) -> str:
        from mlflow.exceptions import MlflowException

        name = self.settings.experiment
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            try:
                experiment_id = client.create_experiment(name)
            except MlflowException:  # another run (a sweep member) created it meanwhile
                experiment = client.get_experiment_by_name(name)
                if experiment is None:
                    raise
                experiment_id = experiment.experiment_id
        else:
            experiment_id = experiment.experiment_id
        run_dir = str(self.run_dir)
        if "'" not in run_dir:  # MLflow's filter strings have no escape for a quote
            found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_DIR_TAG}` = '{run_dir}'",
                                       max_results=1)
            if found:
                return str(found[0].info.run_id)
        tags = {RUN_DIR_TAG: run_dir, **({GROUP_TAG: self.group} if self.group else {})}
        run = client.create_run(experiment_id, run_name=self.run_dir.name, tags=tags)
        return str(run.info.run_id)


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text[:6000]  # MLflow's longest parameter value


def _log_params(client: Any, run_id: str, params: list[Any]) -> None:
    """Log ``params``; where MLflow refuses the batch as invalid (a name it does not take: ``spec.config.lr@warmup``,
    one over 250 characters), each alone, leaving out those it refuses with a warning: one bad name must not keep
    the others, the status and every later metric out."""
    from mlflow.exceptions import MlflowException

    try:
        client.log_batch(run_id, params=params)
        return
    except MlflowException as error:
        if error.error_code != "INVALID_PARAMETER_VALUE":
            raise
    for param in params:
        try:
            client.log_batch(run_id, params=[param])
        except MlflowException as error:
            if error.error_code != "INVALID_PARAMETER_VALUE":
                raise
            log.warning(f"elfes: warning: MLflow refused the parameter {param.key!r}, which is left out: "
                        f"{' '.join(str(error).split())[:200]}")

