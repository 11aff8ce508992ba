"""Each batch's fetch runs under a seed of its place; mixing the epoch's part once per epoch keeps every seed."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import BatchSampler, IterableDataset, SequentialSampler, TensorDataset

from elfes.engine.data.fetch import (
    PositionedBatch,
    PositionedBatches,
    SeededFetches,
    SeededStream,
    batch_seed,
    batch_seeds,
    collated_already,
    epoch_seed,
    fetch_seed,
)

# Seeds that runs recorded before the epoch's part was mixed once per epoch drew their batches under:
# a change here would change every augmented batch of a resumed run.
RECORDED = [
    ((0, 0, 0), 2558736989570252433),
    ((1234567890123, 2, 17), 13321492002827514001),
    ((2**62 - 1, 0, 9), 11585291183169563494),
    ((-5, 3, 4), 9541742480385037520),
]


@pytest.mark.parametrize(("place", "seed"), RECORDED)
def test_a_batch_seed_is_the_one_earlier_runs_drew_under(place: tuple[int, int, int], seed: int) -> None:
    data_seed, epoch, index = place
    assert fetch_seed(data_seed, epoch, index) == seed
    assert batch_seed(epoch_seed(data_seed, epoch), index) == seed


def test_the_sampler_tags_each_batch_with_the_seed_of_its_place_also_after_a_resume_within_the_epoch() -> None:
    batches = PositionedBatches(BatchSampler(SequentialSampler(range(20)), batch_size=4, drop_last=False))
    batches.start_epoch(1234567890123, 2)
    assert [batch.seed for batch in batches] == [fetch_seed(1234567890123, 2, index) for index in range(5)]
    batches.start_epoch(99, 3)
    batches.continue_at(3)
    assert [batch.seed for batch in batches] == [fetch_seed(99, 3, index) for index in range(3, 8)]


@pytest.mark.parametrize("data_seed", [0, 1234567890123, 2**62 - 1, -5, 2**64 - 1])
@pytest.mark.parametrize("first", [0, 17, 2**40])
def test_seeds_mixed_together_are_the_seeds_mixed_one_by_one(data_seed: int, first: int) -> None:
    for epoch in (0, 3, 2**40):
        seeds = epoch_seed(data_seed, epoch)
        assert batch_seeds(seeds, first, 300) == [batch_seed(seeds, first + offset) for offset in range(300)]


def test_the_sampler_tags_batches_past_a_block_of_mixed_seeds() -> None:
    rest = PositionedBatches(BatchSampler(SequentialSampler(range(600)), batch_size=1, drop_last=False))
    rest.start_epoch(7, 1)
    rest.continue_at(100)  # a sampler resumed from its state yields the epoch's batches from index 100 on
    assert [batch.seed for batch in rest] == [fetch_seed(7, 1, index) for index in range(100, 700)]


def test_a_positioned_batch_reaches_a_worker_with_its_seed() -> None:
    batch = pickle.loads(pickle.dumps(PositionedBatch.of([3, 1, 2], 2**63 + 5)))
    assert type(batch) is PositionedBatch and batch == [3, 1, 2] and batch.seed == 2**63 + 5


class _Unsized(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(3))


def test_a_wrapped_dataset_has_the_users_length_and_lens_type_error_where_it_has_none() -> None:
    assert len(SeededFetches(TensorDataset(torch.arange(7)), collated_already)) == 7
    assert len(SeededStream(_Sized())) == 5
    with pytest.raises(TypeError, match="'_Unsized' has no len()"):
        len(SeededStream(_Unsized()))


class _Sized(_Unsized):
    def __len__(self) -> int:
        return 5
