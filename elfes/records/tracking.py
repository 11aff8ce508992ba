"""Which trackers a run's records are mirrored to (MLflow, Weights & Biases, TensorBoard), and the mirror's files.

The settings are one model for both doors: a job spec's ``tracking:`` section (launcher/spec/models.py holds
:class:`TrackingSettings` as it is) and ``RunLogger(trackers={...})`` in a plain script. The job runtime hands the
spec's section to the RunLogger of the entrypoint or command through ``ELFES_TRACKING`` (JSON), and a sweep
member's group through ``ELFES_TRACKING_GROUP``; ``ELFES_TENSORBOARD=1`` (or ``0``) turns TensorBoard on (or
off) besides, without code changes. Each tracker's sink is registered once in elfes/records/trackers.py.

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

from elfes.contract import LIFECYCLE_FILE_NAME, TRACKING_DIR_NAME, tracker_state_file_name

from .credentials import credential_in_uri

TRACKING_VARIABLE = "ELFES_TRACKING"
GROUP_VARIABLE = "ELFES_TRACKING_GROUP"
# Turns the TensorBoard mirror on where RunLogger is not told its trackers: "1" on, "0" off, unset as the spec says.
TENSORBOARD_VARIABLE = "ELFES_TENSORBOARD"


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


class TensorBoardSettings(_Settings):
    """Mirror the run's scalars to TensorBoard event files in RUN_DIR/tensorboard/ (`tensorboard --logdir` it); a
    redone step's value replaces the one a killed attempt wrote. Nothing to set: {}."""


class TrackingSettings(_Settings):
    """Experiment trackers that mirror the run's records: every train and evaluation metric at its optimizer step,
    each step sent once across all attempts (TensorBoard: a redone step's value shown instead; see the Trackers
    section of docs/writing-a-job.md)."""

    mlflow: MlflowSettings | None = Field(None, description=MlflowSettings.__doc__)
    wandb: WandbSettings | None = Field(None, description=WandbSettings.__doc__)
    tensorboard: TensorBoardSettings | None = Field(None, description=TensorBoardSettings.__doc__)

    @property
    def trackers(self) -> tuple[str, ...]:
        """The trackers turned on, in the fields' order."""
        return tuple(name for name in TRACKERS if getattr(self, name) is not None)


TRACKERS: tuple[str, ...] = tuple(TrackingSettings.model_fields)  # every tracker's name, in a fixed order


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


def tracker_state_path(run_dir: Path, tracker: str) -> Path:
    """The state file of one tracker's mirror (``RUN_DIR/tracking/mlflow.json``)."""
    return tracking_dir(run_dir) / tracker_state_file_name(tracker)


def lifecycle_path(run_dir: Path) -> Path:
    """The lifecycle the launcher has the trackers say (``RUN_DIR/tracking/lifecycle.json``)."""
    return tracking_dir(run_dir) / LIFECYCLE_FILE_NAME


def wandb_dir(run_dir: Path) -> Path:
    """The W&B SDK's folder for the run (``RUN_DIR/tracking/wandb``; W&B adds its own ``wandb/`` below)."""
    return tracking_dir(run_dir) / "wandb"


def resolve_tracking(trackers: TrackingSettings | Mapping[str, Any] | None) -> TrackingSettings:
    """The trackers of a RunLogger: those given (a mapping as the spec's ``tracking:`` section), else the
    environment's (:func:`environment_tracking`).

    Raises ``ValueError`` naming the tracker or field and the fix for settings that do not fit.

    Example:
        >>> resolve_tracking({"mlflow": {"tracking_uri": "sqlite:///m.db"}, "tensorboard": {}}).trackers
        ('mlflow', 'tensorboard')
    """
    if trackers is None:
        return environment_tracking()
    if isinstance(trackers, TrackingSettings):
        return trackers
    unknown = sorted(str(name) for name in trackers if name not in TRACKERS)
    if unknown:
        raise ValueError(f"RunLogger(trackers=...) names {', '.join(map(repr, unknown))}, which is not a tracker; "
                         f"give one of {', '.join(TRACKERS)} (elfes/records/trackers.py registers them)")
    return TrackingSettings.model_validate(dict(trackers))


def deprecated_tracking(tensorboard: bool | None, mlflow: MlflowSettings | Mapping[str, Any] | None,
                        wandb: WandbSettings | Mapping[str, Any] | None) -> TrackingSettings:
    """What ``RunLogger(tensorboard=..., mlflow=..., wandb=...)`` meant, as ``trackers=``: MLflow and W&B as given
    (neither given: the environment's), TensorBoard as told (None: the environment's)."""
    if tensorboard is not None and not isinstance(tensorboard, bool):
        raise TypeError(f"tensorboard must be True, False or None, got {tensorboard!r}")
    if mlflow is not None or wandb is not None:
        chosen: dict[str, Any] = {"mlflow": mlflow, "wandb": wandb}
        on = bool(_tensorboard_variable()) if tensorboard is None else tensorboard
    else:
        environment = environment_tracking()
        chosen = {"mlflow": environment.mlflow, "wandb": environment.wandb}
        on = environment.tensorboard is not None if tensorboard is None else tensorboard
    return TrackingSettings.model_validate({**chosen, "tensorboard": TensorBoardSettings() if on else None})


def environment_tracking() -> TrackingSettings:
    """The trackers the environment asks for: ``ELFES_TRACKING`` (the job spec's section), with TensorBoard turned
    on or off by ``ELFES_TENSORBOARD`` (``1`` or ``0``; unset leaves it as the section says)."""
    text = os.environ.get(TRACKING_VARIABLE, "").strip()
    settings = TrackingSettings()
    if text:
        try:
            settings = TrackingSettings.model_validate(json.loads(text))
        except ValueError as error:
            raise ValueError(
                f"{TRACKING_VARIABLE} is not a tracking section ({error}); the job runtime sets it from the spec's "
                f"tracking: section; unset it or give JSON such as "
                '{"mlflow": {"tracking_uri": "sqlite:///mlflow.db", "experiment": "demo"}}') from None
    tensorboard = _tensorboard_variable()
    if tensorboard is None:
        return settings
    return settings.model_copy(update={"tensorboard": TensorBoardSettings() if tensorboard else None})


def _tensorboard_variable() -> bool | None:
    """``ELFES_TENSORBOARD``: True for ``1``, False for ``0``, None where unset."""
    value = os.environ.get(TENSORBOARD_VARIABLE, "").strip().lower()
    if value in ("1", "true"):
        return True
    if value in ("0", "false"):
        return False
    if not value:
        return None
    raise ValueError(
        f"{TENSORBOARD_VARIABLE}={os.environ[TENSORBOARD_VARIABLE]!r} is not understood; set it to 1 to mirror "
        "the run records to TensorBoard, or to 0 (or unset it) to leave the mirror off"
    )


def tracking_group() -> str | None:
    """The group of the run's tracker runs (a sweep's name), from ``ELFES_TRACKING_GROUP``; None when unset."""
    return os.environ.get(GROUP_VARIABLE) or None
