"""The generators a process owns are listed once (``elfes.engine.rng.GENERATORS``): one added to the list is
captured into every checkpoint and restored from it, seeded for each batch a DataLoader worker fetches and for a
rank of a resized run, and named by ``elfes rehearse``; a checkpoint older than a generator leaves it as it is."""

from __future__ import annotations

import random

import pytest
import torch

from elfes.engine import rng
from elfes.engine.rng import Generator, capture_rng, restore_rng, seed_every_generator, seed_fetch_generators


@pytest.fixture
def private(monkeypatch: pytest.MonkeyPatch) -> random.Random:
    """A generator added to the list, as a maintainer adds one: a ``random.Random`` of its own."""
    generator = random.Random(0)
    added = Generator("private", "the job's private random.Random", generator.getstate, generator.setstate, generator.seed)
    monkeypatch.setattr(rng, "GENERATORS", (*rng.GENERATORS, added))
    return generator


def test_an_added_generator_is_captured_and_restored_and_a_state_older_than_it_leaves_it_as_it_is(private):
    state = capture_rng()
    assert list(state) == ["python", "numpy", "torch", "cuda", "private"]
    drawn = [private.random() for _ in range(3)]
    restore_rng(state)
    assert [private.random() for _ in range(3)] == drawn
    position = private.getstate()
    restore_rng({name: value for name, value in state.items() if name != "private"})
    assert private.getstate() == position


@pytest.mark.parametrize("seed_generators", [seed_fetch_generators, seed_every_generator])
def test_an_added_generator_is_seeded_for_each_fetch_and_for_a_rank_of_a_resized_run(private, seed_generators):
    seed_generators(2**63 + 5)
    first = [private.random() for _ in range(3)]
    seed_generators(2**63 + 5)
    assert [private.random() for _ in range(3)] == first
    seed_generators(6)
    assert [private.random() for _ in range(3)] != first


def test_the_rehearsal_names_an_added_generator_by_its_description(private):
    from elfes.launcher.commands.rehearsal.compare import generator_note

    assert generator_note("private").startswith("the job's private random.Random is never seeded; ")
    assert generator_note("numpy").startswith("NumPy's global generator is never seeded; ")


def test_a_checkpoint_holds_an_added_generator_and_a_resume_restores_it(private, tmp_path):
    from workloads import RunSpec, build, fresh_accelerate

    fresh_accelerate()
    run = build(RunSpec(epochs=1))
    run.trainer.train(run.config, checkpoint_dir=tmp_path)
    saved = torch.load(tmp_path / "final", weights_only=True)["ranks"][0]["rng"]["private"]
    assert saved == private.getstate()
    private.random()
    fresh_accelerate()
    again = build(RunSpec(epochs=1))
    again.trainer.train(again.config, checkpoint_dir=tmp_path, resume_from=tmp_path / "final")
    assert private.getstate() == saved
