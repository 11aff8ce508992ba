"""Which experiment trackers a run's records are mirrored to (MLflow, Weights & Biases), and the mirror's files.

The settings are one model for both doors: a job spec's ``tracking:`` section (launcher/spec/models.py holds
:class:`TrackingSettings` as it is) and ``RunLogger(mlflow=..., wandb=...)`` in a plain script. The job
runtime hands the spec's section to the RunLogger of the entrypoint or command through ``ELFES_TRACKING``
(JSON), as ``ELFES_TENSORBOARD`` hands the TensorBoard switch, and a sweep member's group through
``ELFES_TRACKING_GROUP``.

Files, in ``RUN_DIR/tracking/`` (``RunPaths.tracking`` names the folder): ``<tracker>.json``, the mirror's
state (the tracker's run id, how far into ``events.jsonl`` it has sent, the last step sent per metric, whether
it is behind and why), written atomically after every send, read by ``elfes status``; ``lifecycle.json``, what
the launcher has the trackers say of the run (its status, each attempt's end, the spec and the provenance;
elfes/records/tracker_lifecycle.py); ``wandb/``, the W&B SDK's own folder (its offline runs, for ``wandb sync``).

Torch-free; pydantic only (login-node commands validate specs with it). No credential is ever part of these
settings: a tracking URI holding a password is refused, tokens and API keys stay in the environment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationInfo, field_validator

from .credentials import credential_in_uri

TRACKING_DIR_NAME = "tracking"
TRACKING_VARIABLE = "ELFES_TRACKING"
GROUP_VARIABLE = "ELFES_TRACKING_GROUP"
Tracker = Literal["mlflow", "wandb"]
TRACKERS: tuple[Tracker, ...] = ("mlflow", "wandb")
LIFECYCLE_FILE_NAME = "lifecycle.json"


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MlflowSettings(_Settings):
    """Mirror the run to one MLflow run, tagged with the run directory and the run id, kept across attempts."""

    tracking_uri: StrictStr = Field(
        ..., min_length=1,
        description="The MLflow tracking URI: a server (http://host:5000) or a store such as sqlite:///runs/mlflow.db. "
        "Credentials go in the job's environment (MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_USERNAME and "
        "MLFLOW_TRACKING_PASSWORD), never in the URI. A relative store path (sqlite:///runs/mlflow.db, file:mlruns) is "
        "resolved against the spec file's folder, as the spec's other paths.",
    )
    experiment: StrictStr = Field(
        "Default", min_length=1, description="The MLflow experiment, created when missing.",
    )

    @field_validator("tracking_uri")
    @classmethod
    def _no_password(cls, uri: str) -> str:
        if credential_in_uri(uri):
            raise ValueError(
                "holds a user name or password, which would be recorded in the run directory; give the URI without "
                "them and set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) in the "
                "environment the job inherits")
        return uri

    @field_validator("tracking_uri")
    @classmethod
    def _store_path_from_the_spec(cls, uri: str, info: ValidationInfo) -> str:
        """A job spec's relative store path is the spec folder's (``info.context["base"]``, as the spec's paths),
        never each attempt's working folder (its code snapshot); without a spec, as MLflow reads it."""
        base = (info.context or {}).get("base")
        return uri if base is None else absolute_store_uri(uri, Path(base))


class WandbSettings(_Settings):
    """Mirror the run to one Weights & Biases run, its id kept in the run directory and resumed by every attempt."""

    project: StrictStr = Field(..., min_length=1, description="The W&B project.")
    entity: StrictStr | None = Field(None, min_length=1, description="The W&B entity (user or team), or null for "
                                     "the default of the API key.")
    mode: Literal["online", "offline"] = Field(
        "online", description="online sends to the W&B server (WANDB_API_KEY in the environment the job inherits); "
        "offline writes RUN_DIR/tracking/wandb/ for a later `wandb sync`.",
    )


class TrackingSettings(_Settings):
    """Experiment trackers that mirror the run's records: every train and evaluation metric at its optimizer step,
    each step sent once across all attempts (see the Trackers section of docs/writing-a-job.md)."""

    mlflow: MlflowSettings | None = Field(None, description=MlflowSettings.__doc__)
    wandb: WandbSettings | None = Field(None, description=WandbSettings.__doc__)

    @property
    def trackers(self) -> tuple[Tracker, ...]:
        """The trackers turned on, in a fixed order."""
        return tuple(name for name in TRACKERS if getattr(self, name) is not None)


def absolute_store_uri(uri: str, base: Path) -> str:
    """``uri`` with a relative SQLite or file store path resolved against ``base``; any other URI as it is.

    Example:
        >>> absolute_store_uri("sqlite:///runs/mlflow.db", Path("/home/me"))
        'sqlite:////home/me/runs/mlflow.db'
        >>> absolute_store_uri("file:mlruns", Path("/home/me")), absolute_store_uri("http://host:5000", Path("/x"))
        ('file:///home/me/mlruns', 'http://host:5000')
    """
    for scheme, absolute in (("sqlite:///", "sqlite:///"), ("file:", "file://")):
        if not uri.startswith(scheme):
            continue
        path, question, query = uri[len(scheme):].partition("?")
        if not path or path.startswith("/") or path == ":memory:":
            return uri
        return f"{absolute}{os.path.abspath(base / os.path.expanduser(path))}{question}{query}"
    return uri


def tracking_dir(run_dir: Path) -> Path:
    """The mirror's folder in a run directory.

    Example:
        >>> tracking_dir(Path("runs/a"))
        PosixPath('runs/a/tracking')
    """
    return Path(run_dir) / TRACKING_DIR_NAME


def tracker_state_path(run_dir: Path, tracker: Tracker) -> Path:
    """The state file of one tracker's mirror (``RUN_DIR/tracking/mlflow.json``)."""
    return tracking_dir(run_dir) / f"{tracker}.json"


def lifecycle_path(run_dir: Path) -> Path:
    """The lifecycle the launcher has the trackers say (``RUN_DIR/tracking/lifecycle.json``)."""
    return tracking_dir(run_dir) / LIFECYCLE_FILE_NAME


def wandb_dir(run_dir: Path) -> Path:
    """The W&B SDK's folder for the run (``RUN_DIR/tracking/wandb``; W&B adds its own ``wandb/`` below)."""
    return tracking_dir(run_dir) / "wandb"


def resolve_tracking(
    mlflow: MlflowSettings | Mapping[str, Any] | None, wandb: WandbSettings | Mapping[str, Any] | None
) -> TrackingSettings:
    """The trackers of a RunLogger: those given, else those of ``ELFES_TRACKING`` (the job spec's section).

    Raises ``ValueError`` naming the field and the fix for settings that do not fit.

    Example:
        >>> resolve_tracking({"tracking_uri": "sqlite:///m.db"}, None).trackers
        ('mlflow',)
    """
    if mlflow is not None or wandb is not None:
        return TrackingSettings.model_validate({"mlflow": mlflow, "wandb": wandb})
    text = os.environ.get(TRACKING_VARIABLE, "").strip()
    if not text:
        return TrackingSettings()
    try:
        return TrackingSettings.model_validate(json.loads(text))
    except ValueError as error:
        raise ValueError(
            f"{TRACKING_VARIABLE} is not a tracking section ({error}); the job runtime sets it from the spec's "
            f"tracking: section; unset it or give JSON such as "
            '{"mlflow": {"tracking_uri": "sqlite:///mlflow.db", "experiment": "demo"}}') from None


def tracking_group() -> str | None:
    """The group of the run's tracker runs (a sweep's name), from ``ELFES_TRACKING_GROUP``; None when unset."""
    return os.environ.get(GROUP_VARIABLE) or None
