"""A run continued on another world size with the same window of microbatches per update: replicated 2 -> 4,
2 -> 1 and 4 -> 2 ranks, and sharded with FSDP2 (its folder of shards resharded by DCP) the same ways, paused
mid-epoch, with augmented, shuffled data read in the training process and in 2 DataLoader workers. Every update
after the resume trains on bitwise the same inputs as the uninterrupted run's, and the final state matches it to
float rounding (the sum over ranks is reduced in another order); a resume whose window would change is refused
naming the accumulation that keeps it, and a loader whose position is kept per rank is refused naming it.

With dropout keyed by the batch (``TrainConfig(model_randomness="per_batch")``), every sample of the continuation
also keeps the dropout mask it had in the uninterrupted run, so that run too ends within rounding of it.

Every run adds a component of its own to its checkpoint, which the continuations take over, and a resume that adds
one without saying how another world size takes it over is refused naming it.

The phases of ``resize_cases.py`` are torchrun launches on 2, 4, 1 and again 2 ranks (each reading what the
earlier ones wrote); the assertions run here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from launching import launch_torchrun

from elfes.world_size import resize_problems

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).with_name("resize_cases.py")
PHASES = (("two", 2), ("four", 4), ("one", 1), ("two-again", 2))
UPDATES = 8  # 2 epochs of 16 batches, 4 microbatches per update
WINDOW = 4  # microbatches per update, over all ranks


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("resize")
    for phase, processes in PHASES:
        launch = launch_torchrun(SCRIPT, phase, str(folder), processes=processes, timeout_s=420)
        if launch.returncode != 0:
            pytest.fail(f"torchrun resize_cases.py {phase} on {processes} ranks exited {launch.returncode}\n"
                        f"{launch.stdout[-3000:]}\n{launch.stderr[-8000:]}")
    return folder


def updates(out: Path, name: str, ranks: int) -> dict[int, list[bytes]]:
    """The bytes of every input row of each update of run ``name``, over all its ranks, sorted."""
    return {step: sorted(rows) for step, rows in dropout_masks(out, name, ranks).items()}


def dropout_masks(out: Path, name: str, ranks: int) -> dict[int, dict[bytes, bytes | None]]:
    """Each update's input rows (their bytes) over all ranks of run ``name``, with the bytes of the row's dropout
    mask (None without dropout)."""
    rows: dict[int, dict[bytes, bytes | None]] = {}
    for rank in range(ranks):
        for step, inputs, *mask in torch.load(out / f"{name}.rank{rank}.pt", weights_only=True):
            masks = mask[0] if mask else [None] * len(inputs)
            rows.setdefault(step, {}).update(
                (row.numpy().tobytes(), None if dropped is None else dropped.numpy().tobytes())
                for row, dropped in zip(inputs, masks, strict=True))
    return rows


def events(out: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / name / "events.jsonl").read_text().splitlines()]


CONTINUATIONS = [(kind, origin, target) for origin, target in ((2, 4), (2, 1), (4, 2))
                 for kind in ("main", "workers", "sharded", "dropout")
                 if not (kind == "workers" and target == 1) and not (kind == "dropout" and origin == 4)]


@pytest.mark.parametrize(("kind", "origin", "target"), CONTINUATIONS, ids=[f"{k}-{o}-to-{t}" for k, o, t in CONTINUATIONS])
def test_each_update_after_the_resume_trains_on_the_same_inputs_and_the_run_ends_within_rounding(out, kind, origin, target):
    paused = json.loads((out / f"{kind}-paused-{origin}.state.json").read_text())
    assert paused["stop_reason"] == "pause" and 0 < paused["step"] < UPDATES and paused["next_batch"] > 0, paused
    name = f"{kind}-{origin}-to-{target}"
    straight, resumed = updates(out, f"{kind}-straight-{origin}", origin), updates(out, name, target)
    assert sorted(resumed) == list(range(paused["step"] + 1, UPDATES + 1))
    for step in resumed:
        assert len(resumed[step]) == 16 and resumed[step] == straight[step], f"update {step} read other inputs"
    if kind == "dropout":  # TrainConfig(model_randomness="per_batch"): every row keeps its mask on the new size
        straight_masks, resumed_masks = dropout_masks(out, f"{kind}-straight-{origin}", origin), dropout_masks(out, name, target)
        for step in resumed:
            assert None not in resumed_masks[step].values()
            assert resumed_masks[step] == straight_masks[step], f"update {step} dropped other units"

    expected = torch.load(out / f"{kind}-straight-{origin}.final.pt", weights_only=True)
    final = torch.load(out / f"{name}.final.pt", weights_only=True)
    assert final.keys() == expected.keys()
    for tensor in expected:
        torch.testing.assert_close(final[tensor], expected[tensor], rtol=1e-9, atol=1e-12, msg=tensor)

    records = events(out, name)
    resumed_event = next(e for e in records if e["event"] == "resumed")
    assert resumed_event["world_size"] == target and resumed_event["gradient_accumulation_steps"] == 4 // target
    [warning] = [e for e in records if e["event"] == "warning"]
    assert warning["kind"] == "world_size_changed"
    assert f"written on {origin} rank{'s' if origin > 1 else ''} x accumulation {4 // origin}" in warning["message"]
    assert "to float rounding, not bitwise" in warning["message"]
    assert ("every microbatch's torch draws (dropout) stay those of its batch" in warning["message"]) == (kind == "dropout")


def test_a_resume_that_would_change_the_window_is_refused_naming_the_accumulation_that_keeps_it(out):
    refusal = json.loads((out / "window-changed.refusal.json").read_text())
    assert refusal["step"] == 0, "nothing was loaded"
    assert ("world_size: the checkpoint was written on 2 ranks x accumulation 2 (a window of 4 microbatches per "
            "update) and this run has 4 ranks x accumulation 2 (8)") in refusal["message"]
    assert "4 ranks x accumulation 1 keeps the window of 4 microbatches" in refusal["message"]


def microbatches(out: Path, name: str, ranks: int) -> list[int]:
    """The count of microbatches each rank of run ``name`` trained, as its added checkpoint component kept it."""
    return [json.loads((out / f"{name}.microbatches.rank{rank}.json").read_text()) for rank in range(ranks)]


@pytest.mark.parametrize(("kind", "origin", "target"), CONTINUATIONS, ids=[f"{k}-{o}-to-{t}" for k, o, t in CONTINUATIONS])
def test_a_component_added_to_the_checkpoint_is_taken_over_on_another_world_size(out, kind, origin, target):
    """Every run adds a per-rank component (resize_cases.MicrobatchCount: new rank 0 takes the old ranks' counts):
    after the resume, it holds what the paused run counted, and the ranks together count every microbatch once."""
    paused = json.loads((out / f"{kind}-paused-{origin}.state.json").read_text())
    assert sum(microbatches(out, f"{kind}-straight-{origin}", origin)) == UPDATES * WINDOW
    assert sum(microbatches(out, f"{kind}-paused-{origin}", origin)) == paused["step"] * WINDOW
    after = (UPDATES - paused["step"]) * WINDOW // target  # what each new rank trains after the resume
    expected = [paused["step"] * WINDOW + after] + [after] * (target - 1)
    assert microbatches(out, f"{kind}-{origin}-to-{target}", target) == expected


def test_a_component_that_does_not_say_how_another_world_size_takes_it_over_refuses_the_resize_naming_it(out):
    refusal = json.loads((out / "not-taken-over.refusal.json").read_text())
    assert refusal["step"] == 0, "nothing was loaded"
    assert ("  - microbatches: each rank saved its own Microbatches state, and this component does not say how the "
            "ranks of another world size take it over; continue on the same world size\n") in refusal["message"]


LAYOUT = {"world_size": 2, "gradient_accumulation_steps": 2, "batches_per_epoch": 8, "sharding": None}


def test_a_loader_that_keeps_its_position_per_rank_is_refused_naming_it():
    stream = "the training stream (Shards) is read by each rank from its own share"
    [problem] = resize_problems(LAYOUT, {**LAYOUT, "world_size": 4, "gradient_accumulation_steps": 1,
                                         "batches_per_epoch": 4}, per_rank_data=stream)
    assert problem.startswith(f"data: {stream}, whose position each rank keeps for itself")
    assert "DataLoader(dataset, shuffle=True)" in problem
    assert resize_problems(LAYOUT, {**LAYOUT, "world_size": 1, "gradient_accumulation_steps": 4,
                                    "batches_per_epoch": 16}, per_rank_data=None) == []


def test_a_world_size_that_divides_no_window_says_so():
    [problem] = resize_problems(LAYOUT, {**LAYOUT, "world_size": 3, "gradient_accumulation_steps": 1}, per_rank_data=None)
    assert "no accumulation on 3 ranks keeps it: use a world size that divides 4" in problem


def test_the_training_data_of_a_stream_and_of_a_stateful_sampler_name_their_per_rank_position():
    from accelerate import Accelerator
    from data_jobs import ResumableSampler
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    from elfes.engine.data import TrainingData

    class Shards(IterableDataset):
        def __iter__(self):
            return iter(torch.zeros(8, 2))

    accelerator = Accelerator(cpu=True)
    assert TrainingData(accelerator, DataLoader(Shards(), batch_size=2)).per_rank_position() == (
        "the training stream (Shards) is read by each rank from its own share")
    data = TensorDataset(torch.zeros(8, 2))
    assert TrainingData(accelerator, DataLoader(data, batch_size=2, shuffle=True)).per_rank_position() is None
    own = TrainingData(accelerator, DataLoader(data, batch_size=2, sampler=ResumableSampler(8)))
    assert own.per_rank_position() == "the training loader's sampler (TensorDataset) keeps state"


def test_generators_every_old_rank_shared_are_every_new_ranks_and_differing_ones_are_not_taken():
    from elfes.engine.resize import shared_generators
    from elfes.engine.rng import capture_rng

    torch.manual_seed(3)
    same = capture_rng()
    assert set(shared_generators([same, capture_rng()])) == {"python", "numpy", "torch", "cuda"}
    torch.rand(1)  # this rank drew once more from torch, and from nothing else
    assert set(shared_generators([same, capture_rng()])) == {"python", "numpy", "cuda"}
    assert shared_generators([{}, {}]) == {}  # nothing saved: derived streams


def test_each_start_records_what_of_the_loader_keeps_a_position_per_rank(tmp_path):
    """The `started` record names a stream's per-rank position (what `elfes resume` reads, torch-free, to refuse
    another world size before submitting: launcher/rundir/checkpoint_layout.py), and null for a map-style
    dataset read through the engine's sampler."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset
    from workloads import fresh_accelerate, mse_step, quiet_logger

    from elfes.engine import TrainConfig, Trainer
    from elfes.records import read_events

    class Shards(IterableDataset):
        def __iter__(self):
            return iter([(torch.ones(2, 1), torch.zeros(2, 1))] * 4)

    for name, loader, expected in (
            ("stream", DataLoader(Shards(), batch_size=None), "the training stream (Shards) is read by each rank from "
                                                              "its own share"),
            ("map", DataLoader(TensorDataset(torch.ones(8, 1), torch.zeros(8, 1)), batch_size=2, shuffle=True), None)):
        fresh_accelerate()
        model = torch.nn.Linear(1, 1)
        with quiet_logger(tmp_path / name) as logger:
            trainer = Trainer(Accelerator(cpu=True), model, torch.optim.SGD(model.parameters(), lr=0.1), loader,
                              mse_step, logger=logger)
            trainer.train(TrainConfig(epochs=1, max_steps=2, evaluate_every=None, checkpoint_every=None))
        [started] = [event for event in read_events(tmp_path / name) if event["event"] == "started"]
        assert started["per_rank_data"] == expected
