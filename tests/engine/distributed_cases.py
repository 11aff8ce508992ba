"""Two-rank cases for ``test_distributed.py``; run one per torchrun launch.

    python -m torch.distributed.run --standalone --nproc_per_node 2 distributed_cases.py CASE OUTPUT_DIR

Every rank builds ``Accelerator(cpu=True, ...)`` (gloo) and writes what it observed to
``OUTPUT_DIR/<name>.rank<r>.json`` (or ``.pt`` for tensors); the assertions run in pytest. The
script itself asserts nothing about the engine, so that a wrong engine shows up as a readable
pytest failure rather than a crashed launch.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import random
import signal
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.nn  # noqa: F401  before any process group exists: see release_process_group()
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import InitProcessGroupKwargs
from rich.console import Console
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from workloads import RunSpec, build, gloo_threads_left, held_background_writes, mse_step, snapshot, writer_threads

from elfes.engine import (
    Evaluator,
    Interval,
    MaxMetric,
    MeanMetric,
    RunLogger,
    StepOutput,
    StopRequest,
    SumMetric,
    TrainConfig,
    Trainer,
)
from elfes.engine.process_group import release_process_groups

RANK = int(os.environ.get("RANK", "0"))  # set by torchrun; pytest imports the specs only
CASES: dict[str, Callable[[Path], None]] = {}


def case(function: Callable[[Path], None]) -> Callable[[Path], None]:
    CASES[function.__name__] = function
    return function


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1, sort_keys=True))


def reset_accelerate() -> None:
    """Forget accelerate's process-wide singletons; the gloo process group itself stays up."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def fresh_accelerator(**kwargs: Any) -> Accelerator:
    reset_accelerate()
    return Accelerator(cpu=True, **kwargs)


def quiet_logger(run_dir: Path) -> RunLogger:
    return RunLogger(run_dir, is_main_process=RANK == 0, console=Console(file=io.StringIO()))


def describe(accelerator: Accelerator) -> dict[str, Any]:
    return {
        "num_processes": accelerator.num_processes,
        "process_index": accelerator.process_index,
        "distributed_type": str(accelerator.distributed_type),
    }


# ------------------------------------------------------------------------------------------------
# 1. The hand example: batches of 3 samples (mean loss 2) and 1 sample (mean loss 6) in one window


class HandData(Dataset):
    """Per-sample loss v_i + w * g_i: v = [2, 2, 2, 6], g = [1, 1, 1, 5]."""

    values = torch.tensor([2.0, 2.0, 2.0, 6.0], dtype=torch.float64)
    slopes = torch.tensor([1.0, 1.0, 1.0, 5.0], dtype=torch.float64)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.values[index], self.slopes[index]


class ScalarModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def forward(self, slopes: torch.Tensor) -> torch.Tensor:
        return self.w * slopes


@case
def hand(out: Path) -> None:
    accelerator = fresh_accelerator(
        gradient_accumulation_steps=1, dataloader_config=DataLoaderConfiguration(even_batches=False)
    )
    model = ScalarModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    # accelerate shards global batch 0 to rank 0 and batch 1 to rank 1
    loader = DataLoader(HandData(), batch_sampler=[[0, 1, 2], [3]])
    seen: list[list[float]] = []

    def step(model: nn.Module, batch: Any) -> StepOutput:
        values, slopes = batch
        seen.append(values.tolist())
        return StepOutput(loss=(values + model(slopes)).mean(), num_samples=len(values))

    with RunLogger(out / "hand_run", is_main_process=accelerator.is_main_process, console=Console(file=io.StringIO())) as logger:
        trainer = Trainer(accelerator, model, optimizer, loader, step, logger=logger)
        state = trainer.train(TrainConfig(epochs=1, log_every=1, evaluate_every=None, checkpoint_every=None))
    write_json(
        out / f"hand.rank{RANK}.json",
        {"w": trainer.module.w.item(), "seen": seen, "state": state.state_dict(), "accelerator": describe(accelerator)},
    )


# ------------------------------------------------------------------------------------------------
# 2. Two ranks with accumulation k == one rank with accumulation 2k (the 1-rank side runs in pytest)

EQUIVALENCE_SPECS = {
    f"shuffle{int(shuffle)}": RunSpec(samples=37, dtype="float64", dropout=0.0, accumulation=2, shuffle=shuffle)
    for shuffle in (False, True)
}
# The Objective path: a sparse auxiliary term, normalised by its count over the whole global window.
EQUIVALENCE_SPECS["objective"] = EQUIVALENCE_SPECS["shuffle1"].with_(objective=True)


@case
def equivalence(out: Path) -> None:
    for name, spec in EQUIVALENCE_SPECS.items():
        reset_accelerate()
        run = build(spec)
        state = run.trainer.train(run.config)
        torch.save(snapshot(run.trainer), out / f"equivalence-{name}.rank{RANK}.pt")
        write_json(
            out / f"equivalence-{name}.rank{RANK}.json",
            {
                "state": state.state_dict(),
                "data_seed": run.trainer.progress.data_seed,
                "reads": run.train_data.reads,
                "accelerator": describe(run.accelerator),
            },
        )


# ------------------------------------------------------------------------------------------------
# 3. Settings that cannot shard training batches exactly are refused on every rank


class Numbers(Dataset):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([float(index)]), torch.tensor([1.0])


@case
def refusals(out: Path) -> None:
    attempts = {
        # name: (dataloader configuration, number of samples with batch_size=2)
        "even_batches": (DataLoaderConfiguration(), 8),
        "split_batches": (DataLoaderConfiguration(split_batches=True, even_batches=False), 8),
        "indivisible": (DataLoaderConfiguration(even_batches=False), 10),  # 5 batches on 2 ranks
        "accepted": (DataLoaderConfiguration(even_batches=False), 8),  # the control: 4 batches
    }
    messages: dict[str, str | None] = {}
    for name, (dataloader_config, samples) in attempts.items():
        accelerator = fresh_accelerator(dataloader_config=dataloader_config)
        model = nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(Numbers(samples), batch_size=2)
        try:
            Trainer(accelerator, model, optimizer, loader, mse_step)
        except ValueError as error:
            messages[name] = f"{type(error).__name__}: {error}"
        else:
            messages[name] = None
    write_json(out / f"refusals.rank{RANK}.json", messages)


# ------------------------------------------------------------------------------------------------
# 4. Evaluation over uneven and empty shards

# Dyadic values: every partial sum is exact in float64, so the reduced mean is exactly sum / n.
EVALUATION_VALUES = {
    "three": [1.5, -2.25, 3.0, 4.125, -0.5, 7.75, 2.0],  # batch_size 3: batches [0,1,2] [3,4,5] [6]
    "one": [0.25, -3.5],  # batch_size 4: a single batch, rank 1 gets nothing
}
EVALUATION_BATCH_SIZES = {"three": 3, "one": 4}


class Identified(Dataset):
    def __init__(self, values: list[float]) -> None:
        self.values = torch.tensor(values, dtype=torch.float64)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(index), self.values[index]


def identity_with_dropout() -> nn.Module:
    """Returns its input exactly in eval mode; dropout changes it in train mode."""
    model = nn.Sequential(nn.Linear(1, 1), nn.Dropout(0.5)).double()
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        model[0].bias.zero_()
    return model


def rng_states() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def same_rng(before: dict[str, Any], after: dict[str, Any]) -> dict[str, bool]:
    return {
        "torch": torch.equal(before["torch"], after["torch"]),
        "python": before["python"] == after["python"],
        "numpy": all(
            np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
            for a, b in zip(before["numpy"], after["numpy"])
        ),
    }


@case
def evaluator(out: Path) -> None:
    # The accelerator keeps the default even_batches=True: the Evaluator must still not pad.
    accelerator = fresh_accelerator()
    loaders = {
        name: DataLoader(Identified(values), batch_size=EVALUATION_BATCH_SIZES[name])
        for name, values in EVALUATION_VALUES.items()
    }
    seen: list[dict[str, Any]] = []

    def step(model: nn.Module, batch: Any) -> StepOutput:
        ids, values = batch
        seen.append({"ids": ids.tolist(), "training": model.training, "ddp": isinstance(model, DistributedDataParallel)})
        # Draw from every generator the evaluator promises to restore.
        torch.rand(3)
        random.random()
        np.random.rand(2)
        prediction = model(values.unsqueeze(1)).squeeze(1)
        metrics = {
            "count": SumMetric(len(ids)),
            "id_bits": SumMetric((2.0 ** ids.double()).sum()),  # a missing or repeated sample changes it
            "value": MeanMetric(values.sum(), len(ids)),
            "prediction": MeanMetric(prediction.sum(), len(ids)),
            "largest": MaxMetric(values.max()),
        }
        if (ids == 3).any():  # batch [3, 4, 5] of "three": only rank 1 reports this name
            metrics["only_rank1"] = SumMetric(1.0)
        if (ids == 6).any():  # batch [6] of "three": only rank 0 reports this name
            metrics["only_rank0"] = MeanMetric(values[ids == 6].sum(), 1)
        return StepOutput(loss=values.mean(), num_samples=len(ids), metrics=metrics)

    evaluator = Evaluator(accelerator, loaders, step)
    model = accelerator.prepare_model(identity_with_dropout())
    report: dict[str, Any] = {"accelerator": describe(accelerator), "runs": {}}
    for mode in ("train", "eval"):
        seen.clear()
        model.train(mode == "train")
        torch.manual_seed(100 + RANK)  # ranks in different generator states
        random.seed(200 + RANK)
        np.random.seed(300 + RANK)
        before = rng_states()
        results = evaluator.evaluate(model)
        after = rng_states()
        report["runs"][mode] = {
            "results": results,
            "rng_restored": same_rng(before, after),
            "training_after": model.training,
            "submodules_training_after": [module.training for module in model.modules()],
            "seen": list(seen),
        }
    write_json(out / f"evaluator.rank{RANK}.json", report)


# ------------------------------------------------------------------------------------------------
# 5./6. Bitwise pause/resume at every window boundary, the stop requested on rank 1 only

# Workers start from a forkserver: forked from a rank, whose gloo threads run Python code (freeing
# tensors), a worker can freeze in its first instant on this machine's Python 3.11.7 (CPython
# gh-112275, a runtime lock held by another thread at fork). The forkserver has no such threads.
RESUME_SPECS = {"resume": RunSpec(), "resume_workers": RunSpec(num_workers=2, worker_start="forkserver")}


def window_sizes(trainer: Trainer, epochs: int) -> list[int]:
    """Per-rank microbatches of every window of the run."""
    sizes = []
    for _ in range(epochs):
        start = 0
        while start < trainer.batches_per_epoch:
            sizes.append(min(trainer.accumulation_steps, trainer.batches_per_epoch - start))
            start += sizes[-1]
    return sizes


def resume_case(out: Path, name: str) -> None:
    spec = RESUME_SPECS[name]
    report: dict[str, Any] = {}

    reset_accelerate()
    full = build(spec)
    sizes = window_sizes(full.trainer, spec.epochs)
    state = full.trainer.train(full.config, checkpoint_dir=out / "full" / "checkpoints")
    torch.save(snapshot(full.trainer), out / f"full.rank{RANK}.pt")
    full.trainer.save_model(out / "full-ema-export.pt", weights="ema")  # DDP-wrapped: the main process writes
    report["full"] = {"state": state.state_dict(), "reads": full.train_data.reads, "accelerator": describe(full.accelerator)}
    report["window_sizes"] = sizes

    for window in range(len(sizes)):
        checkpoints = out / f"pause{window}" / "checkpoints"
        reason = f"pause-in-window-{window}"
        first_microbatch = sum(sizes[:window])
        stop = StopRequest()
        calls = {"count": 0, "samples": 0}

        reset_accelerate()
        paused = build(spec)

        def step(
            model: nn.Module,
            batch: Any,
            calls: dict[str, int] = calls,
            first: int = first_microbatch,
            stop: StopRequest = stop,
            reason: str = reason,
        ) -> StepOutput:
            if RANK == 1 and calls["count"] == first:
                stop.request(reason)
            calls["count"] += 1
            calls["samples"] += len(batch[0])
            return mse_step(model, batch)

        paused.trainer.step = step
        with quiet_logger(out / f"pause{window}") as logger:
            paused.trainer.logger = logger
            paused_state = paused.trainer.train(paused.config, checkpoint_dir=checkpoints, stop=stop)
        last = checkpoints / "last"
        paused_report = {
            "state": paused_state.state_dict(),
            "stop_reason_of_request": stop.reason,
            "microbatches": calls["count"],
            "samples": calls["samples"],
            "reads": paused.train_data.reads,
            "last": os.readlink(last) if last.is_symlink() else None,
        }

        reset_accelerate()
        resumed = build(spec)
        resumed_state = resumed.trainer.train(resumed.config, checkpoint_dir=checkpoints, resume_from=last)
        torch.save(snapshot(resumed.trainer), out / f"pause{window}.rank{RANK}.pt")
        report[f"pause{window}"] = {
            "paused": paused_report,
            "resumed": {
                "state": resumed_state.state_dict(),
                "reads": resumed.train_data.reads,
                "accelerator": describe(resumed.accelerator),
            },
        }
    report["sigterm"] = sigterm_pause(out, spec, first_microbatch=sizes[0] + 1)
    write_json(out / f"{name}.rank{RANK}.json", report)


def sigterm_pause(out: Path, spec: RunSpec, first_microbatch: int) -> dict[str, Any]:
    """A real SIGTERM delivered to rank 1 only, mid-window, through StopRequest.catch_signals()."""
    checkpoints = out / "sigterm" / "checkpoints"
    stop = StopRequest()
    calls = {"count": 0}
    reset_accelerate()
    paused = build(spec)

    def step(model: nn.Module, batch: Any) -> StepOutput:
        if RANK == 1 and calls["count"] == first_microbatch:
            os.kill(os.getpid(), signal.SIGTERM)
        calls["count"] += 1
        return mse_step(model, batch)

    paused.trainer.step = step
    with stop.catch_signals():
        paused_state = paused.trainer.train(paused.config, checkpoint_dir=checkpoints, stop=stop)
    reset_accelerate()
    resumed = build(spec)
    resumed.trainer.train(resumed.config, checkpoint_dir=checkpoints, resume_from=checkpoints / "last")
    torch.save(snapshot(resumed.trainer), out / f"sigterm.rank{RANK}.pt")
    return {"paused": paused_state.state_dict(), "signal": stop.signal, "microbatches": calls["count"]}


@case
def resume(out: Path) -> None:
    resume_case(out, "resume")


@case
def resume_workers(out: Path) -> None:
    resume_case(out, "resume_workers")


# ------------------------------------------------------------------------------------------------
# 6b. Random augmentation in DataLoader workers on two ranks: a pause and a SIGTERM on rank 1


@case
def augmented_workers(out: Path) -> None:
    from data_jobs import DataCase, train

    data = DataCase(source="torch", num_workers=2)
    # 5 batches per rank and epoch, windows of 2: microbatch 7 is batch 1 of epoch 1.
    torch.save(train(data, out / "straight"), out / f"augmented-straight.rank{RANK}.pt")
    train(data, out / "pause", interrupt=("pause", 7))
    torch.save(train(data, out / "pause", resume=True), out / f"augmented-pause.rank{RANK}.pt")
    stopped = train(data, out / "sigterm", interrupt=("sigterm", 7) if RANK == 1 else None)
    torch.save(stopped, out / f"augmented-sigterm-stopped.rank{RANK}.pt")
    torch.save(train(data, out / "sigterm", resume=True), out / f"augmented-sigterm.rank{RANK}.pt")
    write_json(out / f"stream-refusals.rank{RANK}.json", stream_refusals(out))


def stream_refusals(out: Path) -> dict[str, str]:
    """What two ranks say of streams of unequal lengths, and of a stream without length that ends."""
    from data_jobs import DataCase, ImageStream, train

    class UnequalStream(ImageStream):
        def __len__(self) -> int:
            return 40 if RANK == 0 else 36

    messages = {}
    reset_accelerate()
    model = nn.Linear(2, 1)
    try:
        Trainer(Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=False)), model,
                torch.optim.SGD(model.parameters(), lr=0.1),
                DataLoader(UnequalStream("torch", stateful=False), batch_size=4), mse_step)
    except ValueError as refusal:
        messages["unequal"] = str(refusal)
    try:
        train(DataCase(reader="stream", stream_length=False, epochs=100, max_steps=20), out / "ended")
    except RuntimeError as failure:
        messages["ended"] = str(failure)
    return messages


# ------------------------------------------------------------------------------------------------
# 7. Asynchronous checkpoints on two ranks: the same files as synchronous ones, and a stop in flight

ASYNC_SPEC = RunSpec(checkpoint_every=Interval(1, "step"), evaluate_every=Interval(2, "step"))


@case
def async_checkpoints(out: Path) -> None:
    report: dict[str, Any] = {}
    for name, asynchronous in (("sync", False), ("async", True)):
        reset_accelerate()
        run = build(ASYNC_SPEC.with_(async_checkpoints=asynchronous))
        with quiet_logger(out / name) as logger, held_background_writes(run.trainer, until="wait") as held:
            run.trainer.logger = logger
            run.trainer.train(run.config, checkpoint_dir=out / name / "checkpoints")
        torch.save(snapshot(run.trainer), out / f"{name}.rank{RANK}.pt")
        report[name] = {"waited_for": held.waited_for, "writers_left": len(writer_threads())}

    # Rank 1 asks to stop in window 3 (the first of epoch 2), while rank 0's write of step 2 is held in flight.
    stop, calls = StopRequest(), {"count": 0}
    reset_accelerate()
    paused = build(ASYNC_SPEC.with_(async_checkpoints=True))

    def step(model: nn.Module, batch: Any) -> StepOutput:
        calls["count"] += 1
        if RANK == 1 and calls["count"] == 7:
            stop.request("pause")
        return mse_step(model, batch)

    paused.trainer.step = step
    checkpoints = out / "paused" / "checkpoints"
    with quiet_logger(out / "paused") as logger, held_background_writes(paused.trainer, until="wait") as held:
        paused.trainer.logger = logger
        state = paused.trainer.train(paused.config, checkpoint_dir=checkpoints, stop=stop)
    report["paused"] = {"state": state.state_dict(), "waited_for": held.waited_for, "writers_left": len(writer_threads())}
    reset_accelerate()
    resumed = build(ASYNC_SPEC.with_(async_checkpoints=True))
    resumed.trainer.train(resumed.config, checkpoint_dir=checkpoints, resume_from=checkpoints / "last")
    torch.save(snapshot(resumed.trainer), out / f"resumed.rank{RANK}.pt")
    write_json(out / f"async_checkpoints.rank{RANK}.json", report)


def release_process_group() -> None:
    """Leave together, then destroy the gloo group for real: its worker threads must be joined here.

    A gloo worker thread can still hold a finished collective (a barrier keeps the collectives before
    it) when the main thread moves on. Releasing it frees tensors whose Python objects need the GIL;
    if that happens during interpreter shutdown, CPython ends the thread with pthread_exit, whose
    unwinding through a C++ destructor aborts the rank ("terminate called without an active
    exception", SIGABRT). destroy_process_group() joins the workers (with the GIL released) only if
    it drops the last reference to the group; torch.distributed.nn keeps group.WORLD as the default
    argument of its functions when it is first imported after the group formed (DDP imports it through
    torch._dynamo), hence its import at the top of this file. The check turns any other reference that
    keeps the group alive into a failed launch every time, not an abort now and then. The engine holds
    the group of each trainer's DDP wrapper past the wrapper (elfes/engine/process_group.py), and lets
    go of it here.
    """
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    release_process_groups()
    left = gloo_threads_left() if Path("/proc/self/task").is_dir() else []  # Linux lists threads there
    if left:
        raise SystemExit(
            f"rank {RANK}: gloo threads {left} still run after destroy_process_group(): something still "
            "references the process group, so its workers would stop only at interpreter shutdown, where "
            "releasing a collective's tensors aborts the process."
        )


if __name__ == "__main__":
    case_name, output = sys.argv[1], Path(sys.argv[2])
    # The forkserver imports these once; each DataLoader worker forked from it would otherwise import them
    # anew while re-running this script as its __mp_main__ (seconds of CPU per worker, per epoch).
    multiprocessing.set_forkserver_preload(["torch", "accelerate", "workloads", "data_jobs", "elfes.engine"])
    output.mkdir(parents=True, exist_ok=True)
    # The first Accelerator forms the gloo group; later ones (after reset_accelerate) reuse it. A short
    # collective timeout turns a rank waiting for a peer that already left (ranks disagreeing on a stop)
    # into an error within a minute instead of a hang until the launch times out.
    fresh_accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=60))])
    CASES[case_name](output)
    release_process_group()
