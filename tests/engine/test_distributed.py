"""The engine on two real gloo ranks (torchrun): exact window normalisation, refusals of inexact
sharding, evaluation over uneven and empty shards, and bitwise pause/resume with a stop requested on
one rank only.

Each case of ``distributed_cases.py`` is one launch on two ranks forked from one process (forked_ranks.py); the
ranks write what they observed into a temporary folder and the assertions run here. Tests that read the same case share
its launch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from forked_ranks import ForkedRanks
from launching import launch_environment
from workloads import assert_bitwise_equal, build, snapshot

from elfes.records import read_events

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).with_name("distributed_cases.py")
RANKS = (0, 1)
_launched: dict[str, Path] = {}


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedRanks]:
    """Launches of ``distributed_cases.py`` whose ranks fork from one process that imported torch once."""
    ranks = ForkedRanks(SCRIPT, launch_environment())
    yield ranks
    ranks.close()


@pytest.fixture
def launch(forked, tmp_path_factory):
    """``launch(case)``: run ``distributed_cases.py case`` on two ranks once per session; its output folder."""

    def launch(case: str) -> Path:
        if case not in _launched:
            output = tmp_path_factory.mktemp(case)
            [(statuses, log)] = forked.launch([case, str(output)], ranks=len(RANKS))
            if statuses != [0] * len(RANKS):
                pytest.fail(f"distributed_cases.py {case} ended with statuses {statuses}\n{log[-8000:]}")
            _launched[case] = output
        return _launched[case]

    return launch


def per_rank_json(output: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads((output / f"{name}.rank{rank}.json").read_text()) for rank in RANKS]


def per_rank_tensors(output: Path, name: str) -> list[dict[str, torch.Tensor]]:
    return [torch.load(output / f"{name}.rank{rank}.pt", weights_only=True) for rank in RANKS]


def assert_two_gloo_ranks(accelerators: list[dict[str, Any]]) -> None:
    """Guard against Accelerate silently training each process alone."""
    assert [a["num_processes"] for a in accelerators] == [2, 2], accelerators
    assert [a["process_index"] for a in accelerators] == list(RANKS), accelerators
    assert all(a["distributed_type"] == "DistributedType.MULTI_CPU" for a in accelerators), accelerators


# ------------------------------------------------------------------------------------------------
# 1. The hand example


def test_hand_example_updates_with_the_window_mean_loss(launch):
    """Batches of 3 samples (mean loss 2) and 1 sample (mean loss 6) on two ranks: the loss is 3, not 4.

    Per-sample loss v_i + w * g_i with w = 0, v = [2, 2, 2] | [6], g = [1, 1, 1] | [5], SGD with lr = 1:
    the window gradient is (3 * 1 + 1 * 5) / 4 = 2, so w = -2 exactly; averaging the two local means
    would give (1 + 5) / 2 = 3 and w = -3.
    """
    output = launch("hand")
    reports = per_rank_json(output, "hand")
    assert_two_gloo_ranks([r["accelerator"] for r in reports])
    assert [r["seen"] for r in reports] == [[[2.0, 2.0, 2.0]], [[6.0]]], "the sharding this example relies on"
    assert [r["w"] for r in reports] == [-2.0, -2.0]
    for report in reports:
        assert report["state"] == {
            "epoch": 1, "next_batch": 0, "step": 1, "batches": 2, "samples": 4, "best_metric": None,
            "best_step": None, "evaluations_without_improvement": 0, "stop_reason": None,
        }

    events = read_events(output / "hand_run")
    train = [event for event in events if event["event"] == "train"]
    assert len(train) == 1, [event["event"] for event in events]
    assert train[0]["metrics"]["loss"] == 3.0
    assert train[0]["metrics"]["last_update_samples"] == 4
    assert train[0]["samples"] == 4
    assert [event["world_size"] for event in events if event["event"] == "started"] == [2]


# ------------------------------------------------------------------------------------------------
# 2. Two ranks with accumulation k equal one rank with accumulation 2k


@pytest.mark.parametrize("name", ["shuffle0", "shuffle1", "objective"], ids=["in_order", "shuffled", "objective"])
def test_two_ranks_equal_one_rank_with_the_same_global_windows(launch, name):
    """37 samples in batches of 4: 10 batches, the last one of a single sample; 2 epochs.

    Two ranks with accumulation 2 (per-rank windows of 2, 2, 1 batches: the tail window pairs a full
    batch on rank 0 with the one-sample batch on rank 1) against one rank with accumulation 4 over the
    same batch sequence (windows of 4, 4, 2 batches). Global batch i goes to rank i % 2, so both
    optimise the same window means; a mean of per-rank means weights the tail window's 1-sample batch
    like the 4-sample one and fails this. The objective case trains a sparse auxiliary term whose
    count differs between the ranks' halves of a window: it passes only if each term is divided by its
    count summed over both ranks.
    """
    from distributed_cases import EQUIVALENCE_SPECS

    spec = EQUIVALENCE_SPECS[name]
    output = launch("equivalence")
    reports = per_rank_json(output, f"equivalence-{name}")
    two_ranks = per_rank_tensors(output, f"equivalence-{name}")
    assert_two_gloo_ranks([r["accelerator"] for r in reports])
    assert_bitwise_equal(two_ranks[0], two_ranks[1], "rank 0 vs rank 1 after a 2-rank run")

    one = build(spec.with_(accumulation=2 * spec.accumulation))
    assert one.accelerator.num_processes == 1
    state = one.trainer.train(one.config)
    one_rank = snapshot(one.trainer)

    two_state = reports[0]["state"]
    for key in ("epoch", "step", "batches", "samples"):
        assert two_state[key] == getattr(state, key), key
    assert (state.step, state.batches, state.samples) == (6, 20, 74)

    seeds = f"data seeds: one rank {one.trainer.progress.data_seed}, two ranks {reports[0]['data_seed']}"
    assert one_rank.keys() == two_ranks[0].keys()
    differences = {
        key: (one_rank[key].double() - two_ranks[0][key].double()).abs().max().item() for key in one_rank
    }
    too_far = {key: difference for key, difference in differences.items() if not difference <= 1e-12}
    assert not too_far, f"2-rank run differs from the 1-rank run ({seeds}): {too_far}"


# ------------------------------------------------------------------------------------------------
# 3. Refusals


def test_inexact_distributed_batching_is_refused_with_the_setting_to_change(launch):
    reports = per_rank_json(launch("refusals"), "refusals")
    assert reports[0] == reports[1], "every rank refuses alike"
    messages = reports[0]
    assert messages["accepted"] is None, "the control (even_batches=False, 4 batches) must be accepted"

    assert messages["even_batches"].startswith("ConfigurationError: ")
    assert "even_batches=True" in messages["even_batches"]
    assert "DataLoaderConfiguration(even_batches=False)" in messages["even_batches"]

    assert messages["split_batches"].startswith("ConfigurationError: ")
    assert "split_batches=True" in messages["split_batches"]
    assert "split_batches=False" in messages["split_batches"]

    assert messages["indivisible"].startswith("ConfigurationError: ")
    assert "5 batches" in messages["indivisible"]
    assert "multiple of 2" in messages["indivisible"]
    assert "batch_size" in messages["indivisible"]


# ------------------------------------------------------------------------------------------------
# 4. Evaluation over uneven and empty shards


def test_evaluator_counts_every_sample_once_over_uneven_and_empty_shards(launch):
    from distributed_cases import EVALUATION_VALUES

    reports = per_rank_json(launch("evaluator"), "evaluator")
    assert_two_gloo_ranks([r["accelerator"] for r in reports])

    for mode in ("train", "eval"):
        runs = [report["runs"][mode] for report in reports]
        # The shards this test is about: 2 batches and 1 batch, then 1 batch and none.
        assert [[seen["ids"] for seen in run["seen"]] for run in runs] == [
            [[0, 1, 2], [6], [0, 1]],
            [[3, 4, 5]],
        ], mode
        for run in runs:
            assert all(not seen["training"] for seen in run["seen"]), f"{mode}: steps must run in eval mode"
            assert all(not seen["ddp"] for seen in run["seen"]), f"{mode}: steps must get the unwrapped module"
            assert run["rng_restored"] == {"torch": True, "python": True, "numpy": True}, mode
            assert run["training_after"] is (mode == "train")
            assert run["submodules_training_after"] == [mode == "train"] * 4
        assert runs[0]["results"] == runs[1]["results"], f"{mode}: ranks disagree"

        results = runs[0]["results"]
        assert results.keys() == EVALUATION_VALUES.keys()
        for name, values in EVALUATION_VALUES.items():
            exact_mean = torch.tensor(values, dtype=torch.float64).sum().item() / len(values)
            expected = {
                "count": float(len(values)),
                "id_bits": float(2 ** len(values) - 1),  # each sample exactly once: no pad, no drop
                "value": exact_mean,
                "prediction": exact_mean,  # the model is the identity only in eval mode (dropout)
                "loss": exact_mean,
                "largest": max(values),
            }
            if name == "three":
                expected |= {"only_rank1": 1.0, "only_rank0": values[6]}
            assert results[name] == expected, f"{mode}/{name}"
            assert math.isclose(exact_mean, sum(values) / len(values))


# ------------------------------------------------------------------------------------------------
# 5./6. Bitwise pause/resume at every window boundary; a stop requested on rank 1 only


@pytest.mark.parametrize("case", ["resume", "resume_workers"])
def test_pause_at_every_boundary_then_resume_is_bitwise(launch, case):
    output = launch(case)
    reports = per_rank_json(output, case)
    full = per_rank_tensors(output, "full")
    sizes = reports[0]["window_sizes"]
    assert sizes == [3, 2, 3, 2], "10 batches, 5 per rank, accumulation 3: incomplete tail windows"
    assert_two_gloo_ranks([r["full"]["accelerator"] for r in reports])
    assert_bitwise_equal(full[0], full[1], "rank 0 vs rank 1, uninterrupted")

    for window in range(len(sizes)):
        resumed = per_rank_tensors(output, f"pause{window}")
        for rank in RANKS:
            report = reports[rank][f"pause{window}"]
            # A fresh Accelerator after resetting accelerate's state still spans both ranks.
            assert report["resumed"]["accelerator"]["num_processes"] == 2
            assert report["resumed"]["state"] == reports[rank]["full"]["state"], f"window {window}, rank {rank}"
            assert_bitwise_equal(full[rank], resumed[rank], f"paused in window {window}, resumed, rank {rank}")
            if case == "resume":  # num_workers=0: reads are recorded in this process
                consumed = report["paused"]["samples"]
                assert report["resumed"]["reads"] == reports[rank]["full"]["reads"][consumed:], (
                    f"window {window}, rank {rank}: the resumed run must read exactly the rest of the "
                    "uninterrupted order, skipping consumed batches without loading them"
                )


@pytest.mark.parametrize("case", ["resume", "resume_workers"])
def test_a_real_sigterm_on_one_rank_mid_window_pauses_both_and_resumes_bitwise(launch, case):
    output = launch(case)
    reports = per_rank_json(output, case)
    full = per_rank_tensors(output, "full")
    resumed = per_rank_tensors(output, "sigterm")
    first_window = reports[0]["window_sizes"][0]
    for rank in (0, 1):
        paused = reports[rank]["sigterm"]
        assert paused["paused"]["stop_reason"] == "SIGTERM", f"rank {rank}"
        # The signal came in the 2nd microbatch of window 2; the window was finished on both ranks.
        assert paused["microbatches"] == first_window + reports[0]["window_sizes"][1]
        assert paused["paused"]["step"] == 2
        assert_bitwise_equal(full[rank], resumed[rank], f"SIGTERM on rank 1, resumed, rank {rank}")
    assert reports[1]["sigterm"]["signal"] == "SIGTERM" and reports[0]["sigterm"]["signal"] is None


def test_random_augmentation_in_workers_on_two_ranks_resumes_bitwise_after_a_pause_and_a_sigterm_on_one_rank(launch):
    output = launch("augmented_workers")
    straight = per_rank_tensors(output, "augmented-straight")
    assert not torch.equal(straight[0]["raw/conv.weight"], torch.zeros_like(straight[0]["raw/conv.weight"]))
    assert_bitwise_equal(straight[0], straight[1], "rank 0 vs rank 1 (replicated weights)")
    stopped = per_rank_tensors(output, "augmented-sigterm-stopped")
    assert [bool(s["stopped"]) for s in stopped] == [True, True], "a SIGTERM on rank 1 stops both ranks"
    for kind in ("pause", "sigterm"):
        for rank, end in enumerate(per_rank_tensors(output, f"augmented-{kind}")):
            assert_bitwise_equal(straight[rank], end, f"{kind}, rank {rank}")


def test_ranks_streams_of_unequal_length_are_refused_and_a_stream_without_length_that_ends_stops_the_run(launch):
    for rank, messages in enumerate(per_rank_json(launch("augmented_workers"), "stream-refusals")):
        assert "training streams have [10, 9] batches per epoch" in messages["unequal"], rank
        assert f"Rank {rank}'s training stream ended after 10 batches of epoch 0" in messages["ended"], rank
        assert "give each rank's dataset a __len__" in messages["ended"], rank


@pytest.mark.parametrize("case", ["resume", "resume_workers"])
def test_stop_on_one_rank_stops_every_rank_at_the_same_boundary(launch, case):
    output = launch(case)
    reports = per_rank_json(output, case)
    sizes = reports[0]["window_sizes"]
    for window in range(len(sizes)):
        reason = f"pause-in-window-{window}"
        microbatches = sum(sizes[: window + 1])  # per rank, up to the end of the window of the request
        paused = [reports[rank][f"pause{window}"]["paused"] for rank in RANKS]
        for rank, report in enumerate(paused):
            context = f"stop requested on rank 1 in window {window}; rank {rank}"
            assert report["stop_reason_of_request"] == reason, context
            assert report["state"]["stop_reason"] == reason, context
            assert report["microbatches"] == microbatches, context
            assert report["state"]["step"] == window + 1, context
            assert report["state"]["batches"] == 2 * microbatches, context
            assert report["last"] == f"step-{window + 1:08d}-batches-{2 * microbatches:010d}.pt", context
        assert paused[0]["state"] == paused[1]["state"], f"window {window}: ranks stopped at different positions"
        for rank in RANKS:
            assert reports[rank][f"pause{window}"]["resumed"]["state"]["stop_reason"] is None

        events = read_events(output / f"pause{window}")
        requested = [event for event in events if event["event"] == "stop_requested"]
        stopped = [event for event in events if event["event"] == "stopped"]
        assert [event["reason"] for event in requested] == [reason], "rank 0 records rank 1's reason"
        assert [event["state"]["stop_reason"] for event in stopped] == [reason]
        assert [event["event"] for event in events].count("finished") == 0


def test_a_two_rank_checkpoint_refuses_one_rank_with_the_same_accumulation_naming_the_one_that_keeps_the_window(launch):
    from accelerate.state import AcceleratorState, GradientState
    from workloads import RunSpec, build

    from elfes.engine import CheckpointError

    output = launch("resume")
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    run = build(RunSpec())
    with pytest.raises(CheckpointError) as raised:
        run.trainer.train(run.config, resume_from=output / "full" / "checkpoints" / "final")
    message = str(raised.value)
    spec = RunSpec()
    window = 2 * spec.accumulation
    assert (f"world_size: the checkpoint was written on 2 ranks x accumulation {spec.accumulation} (a window of {window} "
            f"microbatches per update) and this run has 1 rank x accumulation {spec.accumulation} ({spec.accumulation})"
            ) in message
    assert f"1 rank x accumulation {window} keeps the window of {window} microbatches" in message
    assert run.trainer.state.step == 0  # nothing was loaded


def test_exports_of_a_ddp_model_are_plain_state_dicts(launch):
    output = launch("resume")
    exported = torch.load(output / "full-ema-export.pt", weights_only=True)
    full = per_rank_tensors(output, "full")[0]
    assert not any(name.startswith("module.") for name in exported)
    assert set(exported) == {name.removeprefix("raw/") for name in full if name.startswith("raw/")}
    for name, tensor in exported.items():
        expected = full.get(f"ema/{name}", full[f"raw/{name}"])  # EMA parameters, raw buffers
        assert torch.equal(tensor, expected), name


# ------------------------------------------------------------------------------------------------
# 7. Asynchronous checkpoints on two ranks


def test_asynchronous_checkpoints_on_two_ranks_equal_synchronous_ones_and_a_stop_in_flight_resumes_bitwise(launch):
    from checkpoint_files import assert_same_payload, published

    output = launch("async_checkpoints")
    reports = per_rank_json(output, "async_checkpoints")
    files = [path.name for path in published(output / "sync" / "checkpoints")]
    assert [path.name for path in published(output / "async" / "checkpoints")] == files and len(files) == 4
    for file in files:  # every tensor, raw and EMA, and both ranks' RNG and log-interval states
        expected, actual = (torch.load(output / name / "checkpoints" / file, map_location="cpu", weights_only=True)
                            for name in ("sync", "async"))
        assert len(actual["ranks"]) == 2
        for payload in (expected, actual):
            payload["run_id"] = payload["progress"]["run_id"] = None
        assert_same_payload(expected, actual, file)
    for rank in RANKS:
        sync, asynchronous = (torch.load(output / f"{name}.rank{rank}.pt", weights_only=True) for name in ("sync", "async"))
        assert_bitwise_equal(sync, asynchronous, f"rank {rank}: async vs sync")
    # Only rank 0 writes; each of its 4 background writes was still in flight at the next boundary (or the end).
    assert [report["async"]["waited_for"] for report in reports] == [4, 0]
    assert all(report[name]["writers_left"] == 0 for report in reports for name in ("sync", "async", "paused"))

    assert [report["paused"]["state"]["step"] for report in reports] == [3, 3]
    assert [report["paused"]["waited_for"] for report in reports] == [2, 0], "step 2's write was in flight at the stop"
    events = [event for event in read_events(output / "paused") if event["event"] == "checkpoint"]
    assert [(e["step"], e["reason"], e["asynchronous"]) for e in events] == [(1, "interval", True), (2, "interval", True), (3, "stop", False)]
    assert events[2]["blocked_s"] >= events[2]["waited_s"] > 0, "the stop waited for the write in flight"
    for rank in RANKS:
        full = torch.load(output / f"sync.rank{rank}.pt", weights_only=True)
        resumed = torch.load(output / f"resumed.rank{rank}.pt", weights_only=True)
        assert_bitwise_equal(full, resumed, f"rank {rank}: stopped with a write in flight, resumed")
