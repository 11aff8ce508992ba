"""Each batch's fetch runs under a seed of its place; mixing the epoch's part once per epoch keeps every seed."""

from __future__ import annotations

import pytest
from torch.utils.data import BatchSampler, SequentialSampler

from elfes.engine.data.fetch import PositionedBatches, batch_seed, epoch_seed, fetch_seed

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
