"""Runs continued on another world size, for ``test_resize.py``; one phase per torchrun launch.

    python -m torch.distributed.run --standalone --nproc_per_node N resize_cases.py PHASE OUTPUT_DIR

Every run reads 16 batches of 4 augmented samples an epoch (noise drawn in the dataset: in this process, or
in 2 DataLoader workers), shuffled, in float64, without dropout (but one kind, whose dropout is keyed by the
batch: ``TrainConfig(model_randomness="per_batch")``), with a window of 4 microbatches per update: 2 ranks x
accumulation 2, 4 x 1 or 1 x 4. Each rank records the inputs of every microbatch with the update they went into
(``<run>.rank<r>.pt``; with dropout, each row's mask too) and a snapshot of the final state (gathered whole;
``<run>.final.pt``). Every run adds a component to its checkpoint (:class:`MicrobatchCount`, the microbatches each
rank trained), whose final counts each rank writes (``<run>.microbatches.rank<r>.json``).

- ``two``: on 2 ranks, straight and paused after the second update (mid-epoch), replicated (main-process
  augmentation, and in workers), sharded with FSDP2, and with dropout keyed by the batch;
- ``four``: on 4 ranks, the 2-rank pauses continued, the same straight and paused (replicated and sharded),
  and a continuation whose window would change (accumulation 2), whose refusal is recorded;
- ``one``: on 1 rank, the 2-rank replicated, sharded and dropout pauses continued, and the replicated one continued with
  its added component as one that does not say how another world size takes it over (refused);
- ``two-again``: on 2 ranks, the 4-rank pauses continued.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed.nn  # noqa: F401  before any process group exists: see distributed_cases.release_process_group
from accelerate.utils import InitProcessGroupKwargs
from distributed_cases import fresh_accelerator, quiet_logger, reset_accelerate, write_json
from sharded_cases import leave
from torch import nn
from workloads import RunSpec, build, mse_step, snapshot

from elfes.engine import CheckpointError, StepOutput, StopRequest
from elfes.engine.components import PerRankComponent, Resize

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
WINDOW = 4  # microbatches per update, over all ranks
BASE = RunSpec(samples=64, batch_size=4, accumulation=2, epochs=2, dropout=0.0, dtype="float64", augment=True,
               validation_samples=16)
# What each run varies: DataLoader workers, and whether the model is sharded.
KINDS = {"main": {}, "workers": {"num_workers": 2}, "sharded": {"shard": True},
         "dropout": {"dropout": 0.5, "model_randomness": "per_batch"}}
FROM_FOUR = ("main", "workers", "sharded")  # the kinds also paused on 4 ranks and continued on 2
PAUSE_AT = 3  # the last rank's microbatch during which the pause is requested: it lands after update 2 of 8


class Microbatches:
    """A part a maintainer adds to the checkpoint in every run here: the microbatches this rank trained."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.count = state["count"]


class MicrobatchCount(PerRankComponent):
    """Its component: on another world size new rank 0 takes every old rank's count, the others none (the sum over
    ranks stays)."""

    def load_resized(self, states: list[Any], resize: Resize) -> None:
        self.part.count = sum(state["count"] for state in states) if resize.rank == 0 else 0


def add_component(trainer: Any, component: PerRankComponent) -> None:
    """Add ``component`` to the trainer's checkpoint, as one more entry of Trainer.checkpoint_components would."""
    listed = trainer.checkpoint_components
    trainer.checkpoint_components = lambda: (*listed(), component)


def spec(kind: str, world: int, accumulation: int | None = None) -> RunSpec:
    settings: dict[str, Any] = dict(KINDS[kind])
    if settings.pop("shard", False):
        settings["shard"] = (world,)
    return BASE.with_(accumulation=accumulation or WINDOW // world, **settings)


def recording(trainer: Any, inputs: list[tuple[Any, ...]], counter: Microbatches, stop: StopRequest | None = None) -> Any:
    """The step, recording each microbatch's inputs with the update they go into, counting it in ``counter`` (and
    pausing, with ``stop``); with dropout, each row's mask (the hidden units dropped) after its inputs."""
    calls = {"count": 0}
    masks: list[torch.Tensor] = []
    dropout = next(module for module in trainer.model.modules() if isinstance(module, nn.Dropout))
    if dropout.p > 0:
        dropout.register_forward_hook(lambda module, _, output: masks.append(output == 0) if module.training else None)

    def step(model: nn.Module, batch: Any) -> StepOutput:
        calls["count"] += 1
        counter.count += 1
        if stop is not None and RANK == WORLD - 1 and calls["count"] == PAUSE_AT:
            stop.request("pause")
        output = mse_step(model, batch)
        inputs.append((trainer.state.step + 1, batch[0].detach().clone(), *masks[-1:]))
        return output

    return step


def train(out: Path, name: str, run_spec: RunSpec, *, pause: bool = False, resume_from: Path | None = None) -> None:
    """One run into ``out/name`` (its checkpoints there), recorded as the module docstring says."""
    reset_accelerate()
    run = build(run_spec)
    inputs: list[tuple[Any, ...]] = []
    stop = StopRequest() if pause else None
    counter = Microbatches()
    add_component(run.trainer, MicrobatchCount("microbatches", counter))
    run.trainer.step = recording(run.trainer, inputs, counter, stop)
    with quiet_logger(out / name) as logger:
        run.trainer.logger = logger
        state = run.trainer.train(run.config, checkpoint_dir=out / name / "checkpoints", resume_from=resume_from,
                                  stop=stop)
    torch.save(inputs, out / f"{name}.rank{RANK}.pt")
    write_json(out / f"{name}.microbatches.rank{RANK}.json", counter.count)
    final = snapshot(run.trainer)  # every rank gathers a sharded model's tensors
    if RANK == 0:
        torch.save(final, out / f"{name}.final.pt")
        write_json(out / f"{name}.state.json", state.state_dict())


def refused(out: Path, name: str, run_spec: RunSpec, resume_from: Path, added: PerRankComponent | None = None) -> None:
    reset_accelerate()
    run = build(run_spec)
    if added is not None:
        add_component(run.trainer, added)
    try:
        run.trainer.train(run.config, checkpoint_dir=out / name / "checkpoints", resume_from=resume_from)
        message = None
    except CheckpointError as error:
        message = str(error)
    if RANK == 0:
        write_json(out / f"{name}.refusal.json", {"message": message, "step": run.trainer.state.step})


def paused_checkpoint(out: Path, kind: str, world: int) -> Path:
    return out / f"{kind}-paused-{world}" / "checkpoints" / "last"


def phase(out: Path, name: str) -> None:
    if name in ("two", "four"):
        for kind in KINDS if name == "two" else FROM_FOUR:
            train(out, f"{kind}-straight-{WORLD}", spec(kind, WORLD))
            train(out, f"{kind}-paused-{WORLD}", spec(kind, WORLD), pause=True)
    if name == "four":
        refused(out, "window-changed", spec("main", WORLD, accumulation=2), paused_checkpoint(out, "main", 2))
    if name == "one":  # the component the paused runs added, as one that does not say how another world size takes it
        refused(out, "not-taken-over", spec("main", WORLD), paused_checkpoint(out, "main", 2),
                PerRankComponent("microbatches", Microbatches()))
    origin = {"four": 2, "one": 2, "two-again": 4}.get(name)
    if origin is not None:
        kinds = KINDS if origin == 2 else FROM_FOUR
        for kind in (kind for kind in kinds if WORLD > 1 or kind != "workers"):  # one rank: workers change nothing more
            train(out, f"{kind}-{origin}-to-{WORLD}", spec(kind, WORLD), resume_from=paused_checkpoint(out, kind, origin))


if __name__ == "__main__":
    phase_name, output = sys.argv[1], Path(sys.argv[2])
    output.mkdir(parents=True, exist_ok=True)
    fresh_accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=60))])
    if not torch.distributed.is_initialized():  # one rank: accelerate forms no group; the sharded model needs one
        torch.distributed.init_process_group("gloo", timeout=timedelta(seconds=60))
    phase(output, phase_name)
    leave()  # a sharded model's device mesh keeps its group past destroy_process_group (see there)
