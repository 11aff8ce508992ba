"""The likely causes a rehearsal names for a job that is not resumable, including those of the data path."""

from __future__ import annotations

from types import SimpleNamespace

from elfes.launcher.commands.rehearsal.causes import likely_causes, reproducibility_advice
from elfes.launcher.commands.rehearsal.compare import Comparison, MetricDivergence, TensorDifference
from elfes.launcher.spec.models import JobSpec

SPEC = JobSpec.model_validate({
    "name": "augmented", "entrypoint": "job:main", "run_dir": "runs/augmented", "config": {"num_workers": 4},
    "resources": {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0},
})
LOSS_DIVERGES = Comparison(
    tensors=(TensorDifference("checkpoints/final", "/model/conv.weight", 0.01),),
    divergence=MetricDivergence(step=9, event="train", metric="loss", ours=0.5, theirs=0.6),
    compared_files=("checkpoints/final",),
)


def test_a_job_whose_loss_diverges_after_a_requeue_is_told_the_data_path_causes_first():
    requeue = SimpleNamespace(kind="requeue", step=6, saved_step=6, attempt=1)
    causes = likely_causes(SPEC, LOSS_DIVERGES, [requeue], [])
    assert causes[0].startswith("The interrupted run follows the straight run until step 9")
    data_causes = causes[2:5]
    assert data_causes[0].startswith("A stateful object without state_dict: entrypoint job:main reads its batches")
    assert data_causes[1].startswith("A generator drawn from outside the engine's derivation (config sets 4 workers)")
    assert "numpy.random.default_rng()" in data_causes[1]
    assert any(cause.startswith("Data changed on disk") for cause in causes)


def test_the_reproducibility_advice_says_to_draw_augmentation_from_the_global_generators():
    advice = reproducibility_advice(SPEC, LOSS_DIVERGES)
    assert any("Draw random augmentation from the global torch, NumPy or Python generators" in line for line in advice)


def test_a_stream_shuffled_in_a_buffer_is_named_first_when_the_interrupted_run_warned_of_it():
    requeue = SimpleNamespace(kind="requeue", step=6, saved_step=6, attempt=1)
    warned = [{"event": "warning", "kind": "inexact_stream", "message": "shuffle(buffer_size=8) ..."}]
    causes = likely_causes(SPEC, LOSS_DIVERGES, [requeue], warned)
    assert causes[2].startswith("A stream shuffled in a buffer: the interrupted run warned")
    assert "shuffle(buffer_size=...)" in causes[2] and "shards" in causes[2]
    unwarned = likely_causes(SPEC, LOSS_DIVERGES, [requeue], [])
    assert any(cause.startswith("A stream shuffled in a buffer:") for cause in unwarned[3:])


def train_records(losses: dict[int, float], *, samples: int = 16, randomness: str | None = None) -> list[dict]:
    start = {"event": "started", "config": {"model_randomness": randomness} if randomness else {}}
    return [start, *({"event": "train", "step": step, "metrics": {"loss": loss, "last_update_samples": samples}}
                     for step, loss in losses.items())]


RESIZED = Comparison(
    tensors=(TensorDifference("checkpoints/final", "/layout/world_size", None, "2 vs 1"),
             TensorDifference("checkpoints/final", "/ranks[1]", None, "missing in the interrupted run"),
             TensorDifference("checkpoints/final", "/model/0.weight", 0.02, max_relative_diff=0.04)),
    divergence=MetricDivergence(step=5, event="train", metric="loss", ours=0.52, theirs=0.5),
    compared_files=("checkpoints/final",),
)


def test_a_resize_with_dropout_drawn_per_rank_names_the_dropout_and_judges_samples_and_losses_apart():
    """The samples of every update after the pause are the same (exact), the losses differ beyond rounding: the
    verdict says both apart, the layout and ranks entries are set aside, and the one likely cause is the dropout
    drawn per rank, with model_randomness="per_batch" as the remedy."""
    from elfes.launcher.commands.rehearsal.causes import resize_causes
    from elfes.launcher.commands.rehearsal.compare import judge_resized
    from elfes.launcher.commands.rehearsal.report import resized_line

    kept = RESIZED.without_per_rank_entries()
    assert [t.name for t in kept.tensors] == ["/model/0.weight"]
    ours = train_records({4: 0.6, 5: 0.52, 6: 0.45}, randomness="per_rank")
    resized = judge_resized(kept, ours, train_records({4: 0.6, 5: 0.5, 6: 0.44}), ranks=1, resumed_at=4)
    assert resized.samples_identical and not resized.losses_within_tolerance and not resized.within_rounding
    report = resized.to_json()
    assert (report["samples_identical"], report["losses_within_tolerance"]) == (True, False)
    assert "data_identical" not in report
    assert resized_line("not resumable", resized) == (
        "not resumable on 1 rank (the same samples in every update after step 4, the losses differ by up to 4.0e-02 "
        "(relative), more than rounding; the largest relative difference of any tensor 4.0e-02, in checkpoints/final "
        "/model/0.weight)")
    [cause] = resize_causes(resized, ours)
    assert cause.startswith("Dropout drawn per rank: every update after step 4 counted the same samples, but the "
                            "job's TrainConfig.model_randomness is 'per_rank'")
    assert 'TrainConfig(model_randomness="per_batch")' in cause

    other_samples = judge_resized(kept, train_records({4: 0.6, 5: 0.5}, samples=8), train_records({4: 0.6, 5: 0.5}),
                                  ranks=1, resumed_at=4)
    assert not other_samples.samples_identical and other_samples.losses_within_tolerance
    assert resize_causes(other_samples, [])[0].startswith("Another window: from step 5 an update counted other "
                                                          "samples")
    per_batch = judge_resized(kept, train_records({5: 0.52}, randomness="per_batch"), train_records({5: 0.5}),
                              ranks=1, resumed_at=4)
    assert resize_causes(per_batch, train_records({}, randomness="per_batch"))[0].startswith("Draws outside torch")


def test_a_resize_leaves_out_the_per_rank_entries_saying_so_and_is_never_judged_exact():
    """The report's differences name the entries a resize leaves out, and its verdict is within rounding or not
    resumable from the resize's own measures, even where every compared bit agrees (docs/rehearse.md)."""
    from elfes.launcher.commands.rehearsal.compare import judge_resized
    from elfes.launcher.commands.rehearsal.report import decide_verdict

    kept = RESIZED.without_per_rank_entries()
    assert kept.entries_set_aside == ("/ranks", "/layout") and kept.set_aside == ()
    assert kept.to_json()["entries_set_aside"] == ["/ranks", "/layout"]
    assert RESIZED.to_json()["entries_set_aside"] == []
    assert kept.without_per_rank_entries().entries_set_aside == ("/ranks", "/layout")

    agreeing = Comparison(tensors=(), divergence=None, compared_files=("checkpoints/final",)).without_per_rank_entries()
    losses = {4: 0.6, 5: 0.5}
    within = judge_resized(agreeing, train_records(losses), train_records(losses), ranks=1, resumed_at=4)
    assert agreeing.identical and within.within_rounding
    assert decide_verdict(agreeing, agreeing, within) == "within rounding"
    apart = judge_resized(agreeing, train_records({4: 0.6, 5: 0.52}), train_records(losses), ranks=1, resumed_at=4)
    assert decide_verdict(agreeing, agreeing, apart) == "not resumable"
    # Without a resize: exact where the interrupted run equals straight-1; the straight runs' difference first.
    assert decide_verdict(agreeing, agreeing, None) == "exact"
    assert decide_verdict(agreeing, LOSS_DIVERGES, None) == "not resumable"
    assert decide_verdict(LOSS_DIVERGES, None, None) == "not reproducible"
