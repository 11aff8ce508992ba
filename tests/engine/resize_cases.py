"""Runs continued on another world size, for ``test_resize.py``; one phase per torchrun launch.

    python -m torch.distributed.run --standalone --nproc_per_node N resize_cases.py PHASE OUTPUT_DIR

Every run reads 16 batches of 4 augmented samples an epoch (noise drawn in the dataset: in this process, or
in 2 DataLoader workers), shuffled, in float64, without dropout, with a window of 4 microbatches per update:
2 ranks x accumulation 2, 4 x 1 or 1 x 4. Each rank records the inputs of every microbatch with the update
they went into (``<run>.rank<r>.pt``) and a snapshot of the final state (gathered whole; ``<run>.final.pt``).

- ``two``: on 2 ranks, straight and paused after the second update (mid-epoch), replicated (main-process
  augmentation, and in workers) and sharded with FSDP2;
- ``four``: on 4 ranks, the 2-rank pauses continued, the same straight and paused (replicated and sharded),
  and a continuation whose window would change (accumulation 2), whose refusal is recorded;
- ``one``: on 1 rank, the 2-rank replicated and sharded pauses continued;
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

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
WINDOW = 4  # microbatches per update, over all ranks
BASE = RunSpec(samples=64, batch_size=4, accumulation=2, epochs=2, dropout=0.0, dtype="float64", augment=True,
               validation_samples=16)
# What each run varies: DataLoader workers, and whether the model is sharded.
KINDS = {"main": {}, "workers": {"num_workers": 2}, "sharded": {"shard": True}}
PAUSE_AT = 3  # the last rank's microbatch during which the pause is requested: it lands after update 2 of 8


def spec(kind: str, world: int, accumulation: int | None = None) -> RunSpec:
    settings: dict[str, Any] = dict(KINDS[kind])
    if settings.pop("shard", False):
        settings["shard"] = (world,)
    return BASE.with_(accumulation=accumulation or WINDOW // world, **settings)


def recording(trainer: Any, inputs: list[tuple[int, torch.Tensor]], stop: StopRequest | None = None) -> Any:
    """The step, recording each microbatch's inputs with the update they go into (and pausing, with ``stop``)."""
    calls = {"count": 0}

    def step(model: nn.Module, batch: Any) -> StepOutput:
        calls["count"] += 1
        if stop is not None and RANK == WORLD - 1 and calls["count"] == PAUSE_AT:
            stop.request("pause")
        inputs.append((trainer.state.step + 1, batch[0].detach().clone()))
        return mse_step(model, batch)

    return step


def train(out: Path, name: str, run_spec: RunSpec, *, pause: bool = False, resume_from: Path | None = None) -> None:
    """One run into ``out/name`` (its checkpoints there), recorded as the module docstring says."""
    reset_accelerate()
    run = build(run_spec)
    inputs: list[tuple[int, torch.Tensor]] = []
    stop = StopRequest() if pause else None
    run.trainer.step = recording(run.trainer, inputs, stop)
    with quiet_logger(out / name) as logger:
        run.trainer.logger = logger
        state = run.trainer.train(run.config, checkpoint_dir=out / name / "checkpoints", resume_from=resume_from,
                                  stop=stop)
    torch.save(inputs, out / f"{name}.rank{RANK}.pt")
    final = snapshot(run.trainer)  # every rank gathers a sharded model's tensors
    if RANK == 0:
        torch.save(final, out / f"{name}.final.pt")
        write_json(out / f"{name}.state.json", state.state_dict())


def refused(out: Path, name: str, run_spec: RunSpec, resume_from: Path) -> None:
    reset_accelerate()
    run = build(run_spec)
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
        for kind in KINDS:
            train(out, f"{kind}-straight-{WORLD}", spec(kind, WORLD))
            train(out, f"{kind}-paused-{WORLD}", spec(kind, WORLD), pause=True)
    if name == "four":
        refused(out, "window-changed", spec("main", WORLD, accumulation=2), paused_checkpoint(out, "main", 2))
    origin = {"four": 2, "one": 2, "two-again": 4}.get(name)
    if origin is not None:
        for kind in KINDS if WORLD > 1 else ("main", "sharded"):  # one rank: workers change nothing more
            train(out, f"{kind}-{origin}-to-{WORLD}", spec(kind, WORLD), resume_from=paused_checkpoint(out, kind, origin))


if __name__ == "__main__":
    phase_name, output = sys.argv[1], Path(sys.argv[2])
    output.mkdir(parents=True, exist_ok=True)
    fresh_accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=60))])
    if not torch.distributed.is_initialized():  # one rank: accelerate forms no group; the sharded model needs one
        torch.distributed.init_process_group("gloo", timeout=timedelta(seconds=60))
    phase(output, phase_name)
    leave()  # a sharded model's device mesh keeps its group past destroy_process_group (see there)
