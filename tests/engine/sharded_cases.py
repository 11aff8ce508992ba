"""Cases of a model sharded with FSDP2 (``fully_shard``) for ``test_sharded.py``; one case per torchrun launch.

    python -m torch.distributed.run --standalone --nproc_per_node N sharded_cases.py CASE OUTPUT_DIR

Every rank writes what it observed into OUTPUT_DIR (snapshots gathered whole, so every rank's are the
whole model's); the assertions run in pytest. ``kill`` is one launch of a job that resumes from ``last``
and SIGKILLs itself at a chosen moment (see :func:`install_kill`).
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed.nn  # noqa: F401  before any process group exists: see distributed_cases.release_process_group
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from distributed_cases import describe, fresh_accelerator, quiet_logger, reset_accelerate, window_sizes, write_json
from torch import nn
from torch.distributed.tensor import DTensor
from workloads import DropoutMLP, RunSpec, build, mse_step, shard, snapshot

from elfes.engine import Evaluator, Interval, StepOutput, StopRequest, TrainConfig, Trainer
from elfes.engine.checkpoint import CheckpointDirectory

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))

# Accumulation with a tail window (5 batches per rank: windows of 3 and 2), EMA, clipping, dropout, random
# noise drawn in the dataset, a warmup schedule, evaluation every 2 updates on 17 samples (5 batches: the
# ranks hold 3 and 2, so the sharded forwards run in lockstep) and a monitor.
SPEC2 = RunSpec(shard=(2,), augment=True, validation_samples=17)
# 12 batches on 4 ranks: windows of 2 and 1 batches per rank and epoch.
SPEC4 = RunSpec(samples=48, accumulation=2, augment=True, validation_samples=17)
MESHES4 = {"flat": (4,), "hybrid": (2, 2)}
# Two ranks, float64, no dropout: the same global windows as one rank with accumulation 4 (test_distributed.py).
EQUIVALENCE = RunSpec(samples=37, dtype="float64", dropout=0.0, accumulation=2, shard=(2,))
KILL_SPEC = SPEC2.with_(epochs=3, checkpoint_every=Interval(1, "step"), keep_checkpoints=2)


def paused_and_resumed(out: Path, name: str, spec: RunSpec, at_microbatch: int, *, signal_it: bool = False) -> dict[str, Any]:
    """Stop on the last rank during its ``at_microbatch``-th microbatch (by request or a real SIGTERM), resume
    from ``last`` in a new trainer; the resumed run's snapshot goes to ``<name>.rank<r>.pt``."""
    checkpoints = out / name / "checkpoints"
    stop, calls = StopRequest(), {"count": 0}
    reset_accelerate()
    paused = build(spec)
    if at_microbatch == 0:  # before training: a checkpoint without optimizer state
        stop.request(f"pause-{name}")

    def step(model: nn.Module, batch: Any) -> StepOutput:
        calls["count"] += 1
        if RANK == WORLD - 1 and calls["count"] == at_microbatch:
            if signal_it:
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                stop.request(f"pause-{name}")
        return mse_step(model, batch)

    paused.trainer.step = step
    with quiet_logger(out / name) as logger, stop.catch_signals():
        paused.trainer.logger = logger
        state = paused.trainer.train(paused.config, checkpoint_dir=checkpoints, stop=stop)
    last = checkpoints / "last"
    report = {"paused": state.state_dict(), "signal": stop.signal, "last": os.readlink(last),
              "entries": sorted(entry.name for entry in (last.resolve()).iterdir())}
    reset_accelerate()
    resumed = build(spec)
    resumed.trainer.train(resumed.config, checkpoint_dir=checkpoints, resume_from=last)
    torch.save(snapshot(resumed.trainer), out / f"{name}.rank{RANK}.pt")
    return report


def straight(out: Path, name: str, spec: RunSpec) -> dict[str, Any]:
    """The uninterrupted run; what it did besides its tensors: gradient sync per microbatch, EMA placement, and an
    evaluation of its raw weights at the end."""
    reset_accelerate()
    run = build(spec)
    syncs: list[bool] = []
    model, set_sync = run.trainer.model, run.trainer.model.set_requires_gradient_sync
    model.set_requires_gradient_sync = lambda flag, **options: (syncs.append(flag), set_sync(flag, **options))[1]
    state = run.trainer.train(run.config, checkpoint_dir=out / name / "checkpoints")
    torch.save(snapshot(run.trainer), out / f"{name}.rank{RANK}.pt")
    run.trainer.save_model(out / f"{name}-ema-export.pt", weights="ema")
    return {"state": state.state_dict(), "accelerator": describe(run.accelerator), "sizes": window_sizes(run.trainer, spec.epochs),
            "sharded": run.trainer.sharded, "model": type(run.trainer.model).__name__, "gradient_sync": syncs,
            "ema_sharded": all(isinstance(average, DTensor) for average in run.trainer.ema.average.values()),
            "evaluation": run.trainer.evaluate(weights="raw"), "evaluation_one_batch": one_batch_evaluation(run)}


def one_batch_evaluation(run: Any) -> dict[str, Any]:
    """An evaluation loader of one batch: the other ranks hold none, and run the forward on its first batch."""
    from workloads import RegressionData

    loader = torch.utils.data.DataLoader(RegressionData(3, seed=2), batch_size=4)
    return Evaluator(run.accelerator, {"one": loader}, mse_step).evaluate(run.trainer.model)


def guide_block(out: Path) -> dict[str, Any]:
    """The engine guide's sharding block, run as written with the names it assumes, then one epoch of training."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))
    from blocks import block
    from workloads import RegressionData

    reset_accelerate()
    names = {"model": DropoutMLP(), "loader": torch.utils.data.DataLoader(RegressionData(16), batch_size=4), "step": mse_step}
    exec(block("engine/sharded.py").text, names)  # noqa: S102 - the guide's own code
    trainer = names["trainer"]
    state = trainer.train(TrainConfig(epochs=1), checkpoint_dir=out / "guide" / "checkpoints")
    return {"sharded": trainer.sharded, "ddp": isinstance(trainer.model, torch.nn.parallel.DistributedDataParallel),
            "step": state.step, "last": os.readlink(out / "guide" / "checkpoints" / "last")}


def two_ranks(out: Path) -> None:
    report: dict[str, Any] = {"full": straight(out, "full", SPEC2)}
    sizes = report["full"]["sizes"]  # per-rank microbatches of each window: [3, 2, 3, 2]
    # Before training (no optimizer state yet), in the first window, in the tail window, in the second epoch.
    report["before"] = paused_and_resumed(out, "before", SPEC2, 0)
    for window in (0, 1, 2):
        report[f"pause{window}"] = paused_and_resumed(out, f"pause{window}", SPEC2, sum(sizes[:window]) + 1)
    report["sigterm"] = paused_and_resumed(out, "sigterm", SPEC2, sizes[0] + 2, signal_it=True)
    asynchronous = SPEC2.with_(async_checkpoints=True, checkpoint_every=Interval(1, "step"))
    report["async"] = paused_and_resumed(out, "async", asynchronous, sum(sizes[:3]) + 1)
    reset_accelerate()
    equivalence = build(EQUIVALENCE)
    equivalence.trainer.train(equivalence.config)
    torch.save(snapshot(equivalence.trainer), out / f"equivalence.rank{RANK}.pt")
    report["refusal"] = mixed_precision_refusal()
    report["guide"] = guide_block(out)
    write_json(out / f"two_ranks.rank{RANK}.json", report)


def mixed_precision_refusal() -> str | None:
    reset_accelerate()
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = DropoutMLP()
    shard(model, (WORLD,))
    try:
        Trainer(accelerator, model, torch.optim.SGD(model.parameters(), lr=0.1), torch.utils.data.DataLoader(range(4)), mse_step)
    except ValueError as refusal:
        return str(refusal)
    return None


def four_ranks(out: Path) -> None:
    report = {}
    for name, mesh in MESHES4.items():
        spec = SPEC4.with_(shard=mesh)
        report[name] = straight(out, f"{name}-full", spec)
        report[name]["pause"] = paused_and_resumed(out, f"{name}-pause", spec, sum(report[name]["sizes"][:2]) + 1)
    write_json(out / f"four_ranks.rank{RANK}.json", report)


# ------------------------------------------------------------------------------------------------
# One launch of a job that SIGKILLs itself: argv = kill OUTPUT_DIR CHECKPOINT_DIR ASYNC KIND NUMBER [RANK]


def install_kill(trainer: Trainer, kind: str, number: int, rank: int) -> None:
    """On rank ``rank``, SIGKILL at the ``number``-th: training microbatch ("call"), shard file written ("shards",
    the folder half complete), DCP metadata about to be written ("metadata"), rename before or after it happens
    ("replace-before"/"replace-after": state files, checkpoint folders and pointers)."""
    if rank != RANK or kind == "none":
        return
    import torch.distributed.checkpoint.filesystem as filesystem

    count = {"n": 0}

    def counted() -> bool:
        count["n"] += 1
        return count["n"] == number

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if kind == "call":
        original_step = trainer.step

        def step(model, batch):
            if counted():
                die()
            return original_step(model, batch)

        trainer.step = step
    elif kind == "shards":
        original_write = filesystem._FileSystemWriter.write_data

        def write_data(self, plan, planner):
            future = original_write(self, plan, planner)
            future.wait()
            if counted():
                die()
            return future

        filesystem._FileSystemWriter.write_data = write_data
    elif kind == "metadata":
        original_finish = filesystem._FileSystemWriter.finish

        def finish(self, metadata, results):
            if counted():
                die()
            return original_finish(self, metadata, results)

        filesystem._FileSystemWriter.finish = finish
    elif kind.startswith("replace"):
        original_replace = os.replace

        def replace(source, destination, *args, **kwargs):
            hit = counted()
            if hit and kind == "replace-before":
                die()
            result = original_replace(source, destination, *args, **kwargs)
            if hit and kind == "replace-after":
                die()
            return result

        os.replace = replace
    else:
        raise ValueError(kind)


def kill_launch(out: Path, checkpoints: str, asynchronous: str, kind: str, number: str, rank: str = "0") -> None:
    directory = Path(checkpoints)
    reset_accelerate()
    run = build(KILL_SPEC.with_(async_checkpoints=asynchronous == "async"))
    install_kill(run.trainer, kind, int(number), int(rank))
    last = directory / "last"
    published = last.is_symlink() or bool(CheckpointDirectory(directory).checkpoints())
    run.trainer.train(run.config, checkpoint_dir=directory, resume_from=last if published else None)
    torch.save(snapshot(run.trainer), out / f"kill.rank{RANK}.pt")


def leave() -> None:
    """Leave together and exit without interpreter shutdown. A device mesh (init_device_mesh) keeps a reference to
    its gloo group that destroy_process_group() does not drop (torch 2.13), so the group's workers outlive it; one
    still releasing a finished collective at interpreter shutdown would abort the rank (see
    distributed_cases.release_process_group). Nothing is left to run at exit: outputs are written and closed."""
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


CASES = {"two_ranks": two_ranks, "four_ranks": four_ranks}

if __name__ == "__main__":
    case_name, output = sys.argv[1], Path(sys.argv[2])
    output.mkdir(parents=True, exist_ok=True)
    fresh_accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=60))])
    if case_name == "kill":
        kill_launch(output, *sys.argv[3:])
    else:
        CASES[case_name](output)
    leave()
