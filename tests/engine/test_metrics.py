"""Metrics reduce exactly from sufficient statistics, whatever the batch sizes."""

from __future__ import annotations

import math

import pytest
import torch
from accelerate import Accelerator

from elfes.engine import MaxMetric, MeanMetric, RootMeanSquareMetric, SumMetric
from elfes.engine.metrics import MetricAccumulator


def test_mean_over_uneven_batches_is_the_sample_mean_not_the_mean_of_means():
    accumulator = MetricAccumulator()
    accumulator.add("mae", MeanMetric(torch.tensor(6.0), 3))  # 3 samples, mean 2
    accumulator.add("mae", MeanMetric(6.0, torch.tensor(1)))  # 1 sample, mean 6
    assert accumulator.compute() == {"mae": 3.0}  # not 4


def test_root_mean_square_reduces_sums_of_squares_then_takes_the_root():
    errors = [torch.tensor([1.0, 2.0, 2.0]), torch.tensor([4.0])]
    accumulator = MetricAccumulator()
    for error in errors:
        accumulator.add("rmse", RootMeanSquareMetric(error.square().sum(), error.numel()))
    expected = math.sqrt((1 + 4 + 4 + 16) / 4)
    assert accumulator.compute()["rmse"] == pytest.approx(expected, abs=1e-15)
    # neither the mean of the batch RMS values nor the RMS of the batch RMS values
    batch_rms = [math.sqrt(3.0), 4.0]
    assert abs(expected - sum(batch_rms) / 2) > 1e-3
    assert abs(expected - math.sqrt(sum(r * r for r in batch_rms) / 2)) > 1e-3


def test_sum_and_max_reduce_over_batches():
    accumulator = MetricAccumulator()
    for total, worst in [(2.5, -7.0), (1.0, -3.0), (0.5, -5.0)]:
        accumulator.update({"labels": SumMetric(total), "worst": MaxMetric(torch.tensor(worst))})
    # the maximum of negative values is not clipped at an initial zero
    assert accumulator.compute() == {"labels": 4.0, "worst": -3.0}


def test_merge_equals_accumulating_everything_in_one():
    batches = [
        {"mae": MeanMetric(3.0, 2), "rmse": RootMeanSquareMetric(5.0, 2), "n": SumMetric(2), "max": MaxMetric(1.5)},
        {"mae": MeanMetric(1.0, 5), "rmse": RootMeanSquareMetric(1.0, 5), "n": SumMetric(5), "max": MaxMetric(4.0)},
        {"mae": MeanMetric(8.0, 1), "rmse": RootMeanSquareMetric(9.0, 1), "n": SumMetric(1), "max": MaxMetric(-2.0)},
    ]
    whole = MetricAccumulator()
    for batch in batches:
        whole.update(batch)
    first, second = MetricAccumulator(), MetricAccumulator()
    first.update(batches[0])
    second.update(batches[1])
    second.update(batches[2])
    first.merge(second)
    assert first.compute() == whole.compute() == {
        "mae": 12.0 / 8,
        "rmse": math.sqrt(15.0 / 8),
        "n": 8.0,
        "max": 4.0,
    }


def test_merge_into_an_empty_accumulator_and_of_disjoint_names():
    a, b = MetricAccumulator(), MetricAccumulator()
    b.add("x", MeanMetric(4.0, 2))
    a.merge(b)
    a.add("y", SumMetric(3.0))
    assert a.compute() == {"x": 2.0, "y": 3.0}
    assert b.compute() == {"x": 2.0}  # merging does not alter the source


def test_unobserved_mean_and_rms_are_omitted_but_zero_sums_are_reported():
    accumulator = MetricAccumulator()
    accumulator.update({
        "aux_mae": MeanMetric(0.0, 0),
        "aux_rmse": RootMeanSquareMetric(0.0, 0),
        "aux_count": SumMetric(0),
    })
    assert accumulator.compute() == {"aux_count": 0.0}
    accumulator.add("aux_mae", MeanMetric(3.0, 2))
    assert accumulator.compute() == {"aux_count": 0.0, "aux_mae": 1.5}


def test_compute_with_a_single_process_accelerator_matches_local_compute():
    accelerator = Accelerator(cpu=True)
    accumulator = MetricAccumulator()
    accumulator.update({"mae": MeanMetric(6.0, 4), "worst": MaxMetric(2.0), "n": SumMetric(4)})
    assert accumulator.compute(accelerator) == accumulator.compute() == {"mae": 1.5, "worst": 2.0, "n": 4.0}


def test_reset_and_truthiness():
    accumulator = MetricAccumulator()
    assert not accumulator
    accumulator.add("mae", MeanMetric(1.0, 1))
    assert accumulator
    accumulator.reset()
    assert not accumulator and accumulator.compute() == {}
    accumulator.add("mae", SumMetric(1.0))  # after a reset a name may change its kind
    assert accumulator.compute() == {"mae": 1.0}


def test_statistics_are_float64_and_detached():
    parameter = torch.tensor(0.1, dtype=torch.float32, requires_grad=True)
    metric = MeanMetric(parameter * 3, 1)
    assert all(s.dtype == torch.float64 and not s.requires_grad for s in metric.statistics)
    accumulator = MetricAccumulator()
    for _ in range(10):
        accumulator.add("x", MeanMetric(torch.tensor(0.1, dtype=torch.float64), 1))
    assert accumulator.compute()["x"] == pytest.approx(0.1, abs=1e-15)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (MeanMetric(1.0, 1), SumMetric(1.0)),
        (SumMetric(1.0), MaxMetric(1.0)),
        (MeanMetric(1.0, 1), RootMeanSquareMetric(1.0, 1)),
    ],
)
def test_reporting_one_name_as_two_kinds_is_an_error(first, second):
    accumulator = MetricAccumulator()
    accumulator.add("m", first)
    with pytest.raises(ValueError, match=f"reported as a {first.kind} metric and now as a {second.kind} metric"):
        accumulator.add("m", second)
    other = MetricAccumulator()
    other.add("m", second)
    with pytest.raises(ValueError, match="'m'"):
        accumulator.merge(other)


@pytest.mark.parametrize(
    "build",
    [
        lambda: MeanMetric(torch.ones(3), 3),
        lambda: MeanMetric(1.0, torch.tensor([1, 2])),
        lambda: RootMeanSquareMetric(torch.ones(2, 2), 4),
        lambda: SumMetric(torch.ones(2)),
        lambda: MaxMetric(torch.zeros(0)),
    ],
)
def test_non_scalar_statistics_are_refused(build):
    with pytest.raises(ValueError, match="must be a scalar"):
        build()


def test_one_element_tensors_of_any_shape_are_accepted():
    accumulator = MetricAccumulator()
    accumulator.add("m", MeanMetric(torch.tensor([[6.0]]), torch.tensor([3])))
    assert accumulator.compute() == {"m": 2.0}


def test_non_metric_values_are_refused():
    accumulator = MetricAccumulator()
    with pytest.raises(TypeError, match="MeanMetric"):
        accumulator.add("mae", 0.5)
