"""The likely causes ``elfes rehearse`` names for a job that is not resumable, and its advice for a
job that is not reproducible, in that job's terms: what differed, where, after which interruption,
and what the spec shows. Pure and torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from elfes.contract import START_EVENTS, EventKind, WarningKind

from ...spec import JobSpec
from .compare import RESIZE_TOLERANCE, Comparison, Resized

# Top-level checkpoint entries, as the engine names them, and what each holds.
_PARTS = {
    "model": "the raw weights",
    "ema": "the EMA weights",
    "optimizer": "the optimizer state",
    "scheduler": "the learning-rate schedule",
    "scaler": "the grad-scaler state",
    "state": "the training state (step, epoch, best metric)",
    "progress": "the data position",
    "ranks": "each rank's random generators and log interval",
}


def differing_parts(comparison: Comparison) -> list[str]:
    """The checkpoint parts (``model``, ``optimizer``, ...) with a differing tensor, in the order of _PARTS."""
    found = {difference.name.lstrip("/").split("/")[0].split("[")[0] for difference in comparison.tensors}
    return [part for part in _PARTS if part in found] + sorted(found - set(_PARTS))


def _job(spec: JobSpec) -> str:
    return f"entrypoint {spec.entrypoint}" if spec.entrypoint else f"command {spec.command!r}"


def _workers(spec: JobSpec) -> int | None:
    for key, value in (spec.config or {}).items():
        if "worker" in str(key).lower() and isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def likely_causes(spec: JobSpec, comparison: Comparison, interruptions: Sequence[Any],
                  events: list[dict[str, Any]]) -> list[str]:
    """Sentences naming what most probably loses or replays state across a restart, best evidence first."""
    causes: list[str] = []
    divergence = comparison.divergence
    before = None
    if divergence is not None:
        earlier = [i for i in interruptions if (i.saved_step if i.saved_step is not None else i.step or 0) < divergence.step]
        before = earlier[-1] if earlier else None
        where = (f"the first logged step after interruption {list(interruptions).index(before) + 1} ({before.kind} at "
                 f"step {before.step}, attempt {before.attempt})" if before is not None else "before any interruption")
        causes.append(f"The interrupted run follows the straight run until step {divergence.step}, {where}: there "
                      f"{divergence.event} metric {divergence.metric} is {divergence.ours!r} instead of "
                      f"{divergence.theirs!r}. What the job did after that restart is not what it would have done.")
    parts = differing_parts(comparison)
    if parts:
        causes.append("Differing at the end: " + "; ".join(f"{part} ({_PARTS.get(part, 'saved by the job')})"
                                                         for part in parts) + ".")
    loss_first = divergence is not None and divergence.event == EventKind.TRAIN
    workers = _workers(spec)
    data = (f"A stateful object without state_dict: {_job(spec)} reads its batches through a sampler, dataset or "
            "stream with state of its own (a counter, an iterator position, a buffer) but no state_dict() and "
            "load_state_dict(), so no checkpoint holds it and a restart begins it again. Give it both methods (the "
            "trainer saves them for every rank and loads them on a mid-epoch resume), or derive the state from "
            "set_epoch(epoch).")
    worker_randomness = (
        "A generator drawn from outside the engine's derivation" + (f" (config sets {workers} workers)" if workers else "")
        + ": a transform, collate_fn or worker_init_fn that draws from a generator of its own "
        "(numpy.random.default_rng(), random.Random, a torch.Generator, or one seeded from the clock or the pid) "
        "draws other numbers after a restart. Draw from the global torch, NumPy or Python generators, which the "
        "trainer seeds for every batch a worker fetches and restores in this process, or keep the generator in a "
        "dataset with state_dict().")
    seeding = ("Seeding after the checkpoint is restored: set_seed or torch.manual_seed called inside the step, or "
               "after trainer.train(...) began, overwrites the generators the checkpoint restored. Seed once, "
               "before building the model and the data.")
    outside = ("State outside the model, optimizer and scheduler: a module-level global, a curriculum, a "
               "temperature or a step counter kept in Python restarts from its initial value"
               + (", and a command job's own process keeps anything it does not checkpoint" if spec.command else "")
               + ". Keep it in an object the trainer checkpoints, or recompute it from the TrainState.")
    streaming = ("Data changed on disk: files appended, rewritten or re-shuffled between the interrupted attempt "
                 "and its resume make the same position read other samples (a stream without state is read again "
                 "from its epoch's start). Keep the training files unchanged while a run uses them: write new "
                 "files instead of changing old ones.")
    warned = any(event.get("event") == EventKind.WARNING and event.get("kind") == WarningKind.INEXACT_STREAM for event in events)
    shuffle_buffer = (
        "A stream shuffled in a buffer: " + ("the interrupted run warned that its training stream is shuffled with "
                                             "shuffle(buffer_size=...)" if warned else "a Hugging Face stream shuffled "
                                             "with shuffle(buffer_size=...) (or a stream's own buffer)")
        + ", a buffer its state_dict() leaves out, so a resume in the middle of an epoch refills it from the saved "
        "position with other examples in another order. Shuffle the shards instead (the data files in a seeded order, "
        "no buffer), or load the data map-style (load_dataset without streaming) and shuffle in the sampler "
        "(DataLoader(shuffle=True)).")
    replay = ("A kill replays the updates since the last complete checkpoint: anything advanced during the lost "
              "updates and not restored from the checkpoint (a counter, a generator outside the engine) differs.")
    ordered = [data, worker_randomness, seeding, streaming, outside] if loss_first else [seeding, outside, data,
                                                                                          worker_randomness, streaming]
    if not warned:
        ordered.insert(ordered.index(streaming) + 1, shuffle_buffer)
    if before is not None and before.kind == "kill":
        ordered.insert(0, replay)
    if parts == ["scheduler"] or (parts and parts[0] == "scheduler"):
        ordered.insert(0, "The learning-rate schedule: a scheduler built with a budget that differs between attempts, "
                          "or stepped outside the trainer, is not restored to the same point.")
    if warned:  # the run's own words: the best evidence
        ordered.insert(0, shuffle_buffer)
    return causes + ordered


def model_randomness(events: list[dict[str, Any]]) -> str | None:
    """``TrainConfig.model_randomness`` of the run's latest start, as its records say (None without records)."""
    starts = [event for event in events if event.get("event") in START_EVENTS]
    found = (starts[-1].get("config") or {}).get("model_randomness") if starts else None
    return found if isinstance(found, str) else None


def resize_causes(resized: Resized, events: list[dict[str, Any]]) -> list[str]:
    """What most probably made a continuation on another world size (``resized``) differ by more than rounding;
    ``events``: the continued run's records."""
    after = f"after step {resized.resumed_at}" if resized.resumed_at is not None else "after the pause"
    causes = []
    if not resized.samples_identical:
        causes.append(
            f"Another window: from step {resized.samples_differ_at} an update counted other samples than the straight "
            "run's, so the job's window of microbatches per update changed with the world size. Derive the "
            "accumulation from it (Accelerator(gradient_accumulation_steps=window // world_size)), as the guide's "
            "'Continuing on another world size' shows.")
    elif not (resized.losses_within_tolerance and resized.largest_difference <= RESIZE_TOLERANCE):
        randomness = model_randomness(events)
        if randomness != "per_batch":
            causes.append(
                f"Dropout drawn per rank: every update {after} counted the same samples, but the job's "
                f"TrainConfig.model_randomness is {randomness or 'per_rank'!r}, so each rank of the new world size "
                "draws its dropout (and every other torch draw of the model) from a new stream, and the run took "
                f"another random path (its losses differ by up to {resized.largest_loss_difference:.1e}). Set "
                "TrainConfig(model_randomness=\"per_batch\"): each microbatch's draws then follow its batch, on any "
                "world size. A model without dropout or other draws continues within rounding as it is.")
        else:
            causes.append(
                f"Draws outside torch: every update {after} counted the same samples and torch's draws follow each "
                "batch (model_randomness='per_batch'), but NumPy's and Python's generators in the training process "
                "start new streams on the new world size. Draw the model's randomness from torch, or seed those "
                "generators from the batch.")
    if resized.unmatched:
        first = resized.unmatched[0]
        causes.append(f"{len(resized.unmatched)} entries differ in a way no rounding explains, e.g. {first.file} "
                      f"{first.name}: {first.note}.")
    return causes


def reproducibility_advice(spec: JobSpec, comparison: Comparison) -> list[str]:
    """Why resume cannot be judged yet, and how to make the job deterministic."""
    divergence = comparison.divergence
    first = (f"they first differ at step {divergence.step} ({divergence.event} metric {divergence.metric}: "
             f"{divergence.ours!r} vs {divergence.theirs!r})" if divergence is not None else
             "their logged metrics agree but their final tensors do not")
    threads = (spec.env or {}).get("OMP_NUM_THREADS")
    return [
        f"The two uninterrupted runs of {_job(spec)} differ: {first}. Resume cannot be judged until the job is "
        "deterministic: fix that first, then rehearse again.",
        "Seed every generator from the spec's config, never from the clock, os.urandom or the pid: "
        "set_seed(config['seed']) before building the model and the data.",
        "Make torch deterministic: torch.use_deterministic_algorithms(True) and "
        "torch.backends.cudnn.benchmark = False; on CUDA also CUBLAS_WORKSPACE_CONFIG=:4096:8 in the spec's env.",
        "Fix the thread count: " + (f"env sets OMP_NUM_THREADS={threads}; keep it" if threads else
                                    "set OMP_NUM_THREADS in the spec's env (or torch.set_num_threads)")
        + ", since CPU kernels round differently with another count.",
        "Draw random augmentation from the global torch, NumPy or Python generators (the trainer seeds them for "
        "every batch a DataLoader worker fetches), not from a generator of your own seeded from the clock, and set "
        "PYTHONHASHSEED in env if the job iterates over sets of strings.",
    ]
