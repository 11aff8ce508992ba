"""RunPaths names what the engine writes into a run directory by the engine's own names."""

from __future__ import annotations

from elfes.launcher.rundir.paths import RunPaths
from elfes.records import EVENTS_FILE_NAME
from elfes.records.tensorboard import TENSORBOARD_DIR_NAME, tensorboard_dir
from elfes.records.timings import timings_path
from elfes.records.tracking import tracker_state_path, tracking_dir, wandb_dir


def test_run_paths_agree_with_the_engines_file_names(tmp_path):
    paths = RunPaths(tmp_path / "run")
    assert paths.events.name == EVENTS_FILE_NAME
    assert paths.tensorboard == tensorboard_dir(tmp_path / "run")
    assert paths.tensorboard.name == TENSORBOARD_DIR_NAME
    assert paths.tracking == tracking_dir(tmp_path / "run") and paths.tracking / "wandb" == wandb_dir(tmp_path / "run")
    assert paths.tracker_state("mlflow") == tracker_state_path(tmp_path / "run", "mlflow")
    assert (paths.checkpoints, paths.last) == (tmp_path / "run" / "checkpoints", tmp_path / "run" / "checkpoints" / "last")
    assert paths.plot == tmp_path / "run" / "plot.png"
    assert paths.timings == timings_path(tmp_path / "run")
