"""What `elfes resume` can tell, torch-free, of a world size before anything is submitted: the layout of the
checkpoint `last` names, read from the run's records (launcher/rundir/checkpoint_layout.py), and why no run on the
new world size can continue it, in the engine's own words (elfes/world_size.py). The refusal end to end, on a
real run: test_continuing_runs.py."""

from __future__ import annotations

import json
from pathlib import Path

from elfes.contract import CheckpointName
from elfes.launcher.rundir.checkpoint_layout import last_checkpoint_layout
from elfes.launcher.rundir.paths import RunPaths
from elfes.world_size import world_size_problems

LAYOUT = {"world_size": 2, "gradient_accumulation_steps": 2, "batches_per_epoch": 8, "per_rank_data": None}
STREAM = "the training stream (Shards) is read by each rank from its own share"


def start(event: str, world: int, accumulation: int, batches: int | None, **fields: object) -> dict:
    return {"event": event, "world_size": world, "gradient_accumulation_steps": accumulation,
            "budget": {"batches_per_epoch": batches}, "state": {"step": 0}, **fields}


def run_with_records(folder: Path, events: list[dict], last: CheckpointName) -> RunPaths:
    paths = RunPaths(folder / "run")
    paths.checkpoints.mkdir(parents=True)
    for event in events:
        if event["event"] == "checkpoint":
            Path(event["path"]).write_bytes(b"")
    paths.last.symlink_to(last.filename)
    paths.events.write_text("".join(json.dumps(event) + "\n" for event in events) + '{"event": "tr')  # a torn line
    return paths


def checkpoint(paths_folder: Path, name: CheckpointName) -> dict:
    return {"event": "checkpoint", "path": str(paths_folder / "run" / "checkpoints" / name.filename)}


def test_the_layout_of_last_is_the_start_that_wrote_it(tmp_path: Path):
    first, second = CheckpointName(4, 16), CheckpointName(8, 32)
    events = [start("started", 2, 2, 8, per_rank_data=STREAM), checkpoint(tmp_path, first),
              start("resumed", 1, 4, 16, per_rank_data=None), checkpoint(tmp_path, second)]
    paths = run_with_records(tmp_path, events, first)
    assert last_checkpoint_layout(paths) == (first.filename, {**LAYOUT, "per_rank_data": STREAM})
    paths.last.unlink()
    paths.last.symlink_to(second.filename)
    assert last_checkpoint_layout(paths) == (second.filename, {"world_size": 1, "gradient_accumulation_steps": 4,
                                                               "batches_per_epoch": 16, "per_rank_data": None})


def test_a_layout_the_records_do_not_tell_is_none(tmp_path: Path):
    written = CheckpointName(4, 16)
    paths = run_with_records(tmp_path, [start("started", 2, 2, 8)], written)  # a kill cut off its record
    paths.checkpoints.joinpath(written.filename).write_bytes(b"")
    assert last_checkpoint_layout(paths) is None
    paths.events.unlink()
    assert last_checkpoint_layout(paths) is None
    paths.last.unlink()
    assert last_checkpoint_layout(paths) is None


def test_a_world_size_no_accumulation_keeps_the_window_on_names_those_that_do():
    [problem] = world_size_problems(LAYOUT, 3, per_rank_data=None)
    assert problem == (
        "world_size: the checkpoint was written on 2 ranks x accumulation 2 (a window of 4 microbatches per update) "
        "and the spec asks for 3 ranks; continuing needs the same window, so that every update trains on the same "
        "samples: no accumulation on 3 ranks keeps it: use a world size that divides 4 (1, 2 or 4)")
    assert world_size_problems(LAYOUT, 4, per_rank_data=None) == []  # 4 x 1 keeps it: the job's accumulation decides
    assert world_size_problems(LAYOUT, 1, per_rank_data=None) == []
    assert world_size_problems(LAYOUT, 2, per_rank_data=STREAM) == []  # the same world size: nothing to refuse


def test_an_epoch_the_world_size_cannot_share_and_a_per_rank_stream_are_refused():
    odd = {**LAYOUT, "gradient_accumulation_steps": 6, "batches_per_epoch": 9}  # a window of 12, 18 batches an epoch
    [problem] = world_size_problems(odd, 4, per_rank_data=None)
    assert problem == ("batches_per_epoch: the checkpoint's epoch has 18 batches over all ranks, which 4 ranks cannot "
                       "share equally; use a world size that divides 18 (1, 2, 3, 6, 9 or 18)")
    [problem] = world_size_problems(LAYOUT, 4, per_rank_data=STREAM)
    assert problem.startswith(f"data: {STREAM}, whose position each rank keeps for itself")
    assert problem.endswith("(DataLoader(dataset, shuffle=True), with or without workers), whose position is the run's")
