"""What the tracker tests of this folder share: an MLflow store per file, W&B offline in the test's folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from elfes.records.tracker_mirror import FLUSH_TIMEOUT_VARIABLE


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for the file (creating its tables takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B offline, its files in the test's folder, no key, and no tracker or TensorBoard asked for by the
    environment this suite runs in."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for name in ("ELFES_TRACKING", "ELFES_TENSORBOARD", "ELFES_TRACKING_GROUP"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def patient_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """A close waits for the tracker as long as a loaded machine needs: a stopped attempt gives the mirror only
    the flush's wait to import MLflow and create its tables, or W&B's service to start (20 s by default)."""
    monkeypatch.setenv(FLUSH_TIMEOUT_VARIABLE, "300")
