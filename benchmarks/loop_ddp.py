"""Loop overhead with 2 gloo ranks: ``Trainer`` against a hand-written DDP loop doing the same math.

Both ranks run in one ``torch.distributed.run`` job and time each variant between barriers, in
interleaved rounds. The hand loop shards the batches like accelerate (rank r takes batches r, r + 2,
...), all-reduces the window's sample count before its backward passes (the exact global denominator
needs it), skips DDP's gradient all-reduce on all but the last microbatch of a window, clips and
steps: one small collective and one gradient all-reduce per window, as the Trainer does.

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m benchmarks.loop_ddp --rounds 3 --out r.json
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import elfes.engine  # noqa: F401  before the process group forms: it imports torch.distributed.nn early (see there)
from elfes.engine.process_group import release_process_groups

from .loop import ACCUMULATION, LEARNING_RATE, MAX_GRAD_NORM, LoopCase, make_data, make_model, step
from .measure import REPOSITORY, Progress, Row, child_environment, median_difference, median_of, median_ratio

WORLD = 2


def cases(smoke: bool) -> list[LoopCase]:
    if smoke:
        return [LoopCase("tiny, 2 ranks", 16, 2, 8, 256)]
    return [LoopCase("tiny, 2 ranks", 16, 2, 8, 8192), LoopCase("mlp, 2 ranks", 512, 4, 64, 8192, target_speed=0.95)]


def run(rounds: int, progress: Progress, *, smoke: bool = False) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="elfes-ddp-bench-") as folder:
        out = Path(folder) / "results.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(WORLD),
                   "-m", "benchmarks.loop_ddp", "--rounds", str(rounds), "--out", str(out)] + (["--smoke"] if smoke else [])
        worker = subprocess.Popen(command, cwd=REPOSITORY, env=child_environment(), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in worker.stdout:
            lines.append(line)
            if line.startswith("loop "):
                progress(line.rstrip())
        if worker.wait() != 0 or not out.exists():
            raise RuntimeError(f"the 2-rank benchmark failed (status {worker.returncode}):\n{''.join(lines[-40:])}")
        results = json.loads(out.read_text())
    rows = []
    for case in cases(smoke):
        samples = results[case.name]
        per_microbatch = 1e6 / (case.microbatches // WORLD)
        details = {"model": case.describe(), "ranks": WORLD, "microbatches_per_rank": case.microbatches // WORLD,
                   "over_us_wall": median_difference(samples, "elfes", "hand", "wall_s", per_microbatch),
                   "max_parameter_difference_vs_hand": samples["max_parameter_difference"]}
        rows.append(Row(
            "loop", case.name, "ELFES: samples/s, ELFES / hand DDP loop (wall)", "samples/s",
            case.samples / median_of(samples, "elfes", "wall_s"), case.samples / median_of(samples, "hand", "wall_s"),
            "hand DDP loop", "ratio", median_ratio(samples, "hand", "elfes", "wall_s"),
            target=f">= {case.target_speed:g}" if case.target_speed else None, rounds=rounds, details=details,
        ))
        rows.append(Row(
            "loop", case.name, "noise: the same hand DDP loop twice, samples/s ratio", "samples/s",
            case.samples / median_of(samples, "hand again", "wall_s"), case.samples / median_of(samples, "hand", "wall_s"),
            "hand DDP loop", "ratio", median_ratio(samples, "hand", "hand again", "wall_s"), rounds=rounds,
        ))
    return rows


# ------------------------------------------------------------------------------------------------
# Inside the torchrun job


def hand_epoch(case: LoopCase, model: nn.Module, data: TensorDataset) -> Callable[[], None]:
    """Wrap the model in DDP and build the optimizer and loader; returns the epoch to time."""
    rank = dist.get_rank()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=LEARNING_RATE)
    indices = list(range(len(data)))
    batches = [indices[i:i + case.batch_size] for i in range(0, len(indices), case.batch_size)]

    def epoch() -> None:
        loader = iter(DataLoader(data, batch_sampler=batches[rank::WORLD]))
        ddp.train()
        while window := list(itertools.islice(loader, ACCUMULATION)):
            optimizer.zero_grad(set_to_none=True)
            count = torch.tensor([float(sum(len(inputs) for inputs, _ in window))], dtype=torch.float64)
            dist.all_reduce(count)
            total = count.item()
            for index, (inputs, targets) in enumerate(window):
                with ddp.no_sync() if index < len(window) - 1 else nullcontext():
                    loss = (ddp(inputs) - targets).square().mean()
                    (loss * (len(inputs) * WORLD / total)).backward()  # DDP averages over ranks
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), MAX_GRAD_NORM)
            optimizer.step()

    return epoch


def elfes_epoch(accelerator: Any, case: LoopCase, model: nn.Module, data: TensorDataset) -> Callable[[], None]:
    """Build the trainer (its DDP wrapping and prepared loader); returns the epoch to time."""
    from elfes.engine import TrainConfig, Trainer

    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    trainer = Trainer(accelerator, model, optimizer, DataLoader(data, batch_size=case.batch_size), step)
    config = TrainConfig(epochs=1, max_grad_norm=MAX_GRAD_NORM, evaluate_every=None, checkpoint_every=None)
    return lambda: trainer.train(config)


def _timed_epoch(accelerator: Any, case: LoopCase, data: TensorDataset, finals: dict[str, nn.Module], name: str) -> dict[str, float]:
    """One epoch of variant ``name`` on a fresh model, timed between barriers (every rank waits for the
    slowest); building the DDP wrapper or the trainer is not timed, as in the single-process benchmark."""
    finals[name] = make_model(case)
    if name.startswith("hand"):
        epoch = hand_epoch(case, finals[name], data)
    else:
        epoch = elfes_epoch(accelerator, case, finals[name], data)
    dist.barrier()
    started = time.perf_counter()
    epoch()
    dist.barrier()
    return {"wall_s": time.perf_counter() - started}


def worker(arguments: argparse.Namespace) -> None:
    from accelerate import Accelerator, DataLoaderConfiguration

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION,
                              dataloader_config=DataLoaderConfiguration(even_batches=False))
    results: dict[str, Any] = {}
    for case in cases(arguments.smoke):
        data = make_data(case.samples, seed=1)
        finals: dict[str, nn.Module] = {}
        names = ["hand", "elfes", "hand again"]  # the hand loop twice: the spread of identical code here
        for name in names:  # warm-up
            _timed_epoch(accelerator, case, data, finals, name)
        samples: dict[str, Any] = {name: [] for name in names}
        for round_index in range(arguments.rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(_timed_epoch(accelerator, case, data, finals, name))
            if accelerator.is_main_process:
                shown = ", ".join(f"{name} wall {samples[name][-1]['wall_s']:.3f} s" for name in names)
                print(f"loop {case.name}: round {round_index + 1}/{arguments.rounds}: {shown}", flush=True)
        samples["max_parameter_difference"] = max(
            (a - b).abs().max().item() for a, b in zip(finals["elfes"].parameters(), finals["hand"].parameters())
        )
        results[case.name] = samples
    if accelerator.is_main_process:
        Path(arguments.out).write_text(json.dumps(results))
    accelerator.end_training()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true")
    worker(parser.parse_args())
    # The accelerator and its DDP wrappers reference the destroyed group, and the engine holds the Trainer's
    # past its wrapper; freeing them now joins gloo's threads, which at interpreter shutdown could abort
    # the rank (see launcher.runtime.release_process_group and elfes/engine/process_group.py).
    gc.collect()
    release_process_groups()
