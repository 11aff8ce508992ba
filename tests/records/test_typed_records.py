"""What the records' types promise and today's readers keep: a mirror's state file belongs to the tracker it is named
after (another tracker's name in it would have the next save write that tracker's file), and every marker of a
timeline stands at a step."""

from __future__ import annotations

import json
from pathlib import Path

from elfes.records.timeline import build_timeline
from elfes.records.tracker_sender import read_mirror_state, save_mirror_state
from elfes.records.tracking import tracker_state_path


def test_a_state_file_naming_another_tracker_is_read_as_its_own_trackers_and_saved_back_there(tmp_path: Path) -> None:
    path = tracker_state_path(tmp_path, "mlflow")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"tracker": "wandb", "run_id": "r1", "offset": 120, "sent_steps": {"loss": 4}}))

    state = read_mirror_state(tmp_path, "mlflow")
    assert state is not None
    assert (state.tracker, state.run_id, state.offset, state.sent_steps) == ("mlflow", "r1", 120, {"loss": 4})

    state.offset = 240
    save_mirror_state(tmp_path, state)
    assert json.loads(path.read_text())["offset"] == 240
    assert json.loads(path.read_text())["tracker"] == "mlflow"
    assert not tracker_state_path(tmp_path, "wandb").exists()


def test_a_stop_whose_event_names_no_step_is_marked_at_the_attempts_last_step() -> None:
    timeline = build_timeline([
        {"event": "started", "state": {"step": 0}},
        {"event": "train", "step": 4, "metrics": {"loss": 1.0}},
        {"event": "stopped", "reason": "SIGTERM"},
    ])
    (stop,) = [marker for marker in timeline.markers if marker.kind == "stop"]
    assert (stop.step, stop.label) == (4, "stop (SIGTERM)")
