"""A file planted as ``checkpoints/last`` (launcher/job/resume_point.py): said to be no checkpoint ELFES can load
safely, by name, with nothing of it built or run; not "a checkpoint of run None"."""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from elfes.engine.checkpoint import CheckpointError
from elfes.launcher.job.resume_point import resume_point
from elfes.launcher.rundir.paths import RunPaths


class Planted:
    """Unpickling it would create ``marker``: the proof that the planted file ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def bare_pickle(marker: Path) -> bytes:
    return pickle.dumps({"format": "elfes-checkpoint", "version": 3, "run_id": "ours", "x": Planted(marker)})


def torch_archive(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save({"format": "elfes-checkpoint", "version": 3, "run_id": "ours", "x": Planted(marker)}, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("planted", [bare_pickle, torch_archive])
@pytest.mark.parametrize("recorded", [True, False])
def test_a_pickle_planted_as_last_is_refused_as_no_safe_checkpoint_and_never_runs(planted, recorded, tmp_path: Path):
    paths = RunPaths(tmp_path / "run")
    paths.checkpoints.mkdir(parents=True)
    if recorded:  # the run's records name its id, as after a start
        paths.events.write_text(json.dumps({"event": "started", "time": "2026-12-02T00:00:00+00:00",
                                            "run_id": "ours"}) + "\n")
    own = paths.checkpoints / "step-00000004-batches-0000000016.pt"
    torch.save({"format": "elfes-checkpoint", "version": 3, "run_id": "ours"}, own)
    marker = tmp_path / "it-ran"
    file = paths.checkpoints / "step-00000008-batches-0000000032.pt"
    file.write_bytes(planted(marker))
    os.symlink(file.name, paths.last)

    with pytest.raises(CheckpointError) as refused:
        resume_point(paths)
    message = str(refused.value)
    assert f"{paths.last} points to {file.name}, which is not a checkpoint ELFES can load safely" in message, message
    assert "nothing of it was loaded" in message and "ln -sfn FILE" in message and "run None" not in message
    assert not marker.exists()  # the planted object was never built
    os.unlink(paths.last)
    os.symlink(own.name, paths.last)
    assert resume_point(paths) == (paths.last, None)  # the run's own checkpoint is taken as before
