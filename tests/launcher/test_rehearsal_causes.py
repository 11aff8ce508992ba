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
