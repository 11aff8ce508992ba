"""FSDP2-sharded models on 2 and 4 gloo ranks, against what they replace:

- checkpoints: publishing one (every rank writes its shards of the model and AdamW state into one folder
  with DCP, then the main process its ``state.pt`` and the rename) and restoring it, against the single
  file the same model writes replicated (the main process writes the whole, every rank reads it), timed
  between barriers; and the bytes each rank writes (the most any rank writes);
- the loop: ``Trainer`` on the sharded model against a hand-written FSDP2 loop doing the same math (the
  window's global sample count all-reduced, gradients reduce-scattered once per window through
  ``set_requires_gradient_sync``, clipping over every shard, AdamW), microseconds per microbatch.

Each rank count is one ``torch.distributed.run`` job that times every variant in interleaved rounds.

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m benchmarks.sharded --rounds 3 --out r.json
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import elfes.engine  # noqa: F401  before the process group forms: it imports torch.distributed.nn early (see there)
from elfes.engine.process_group import release_process_groups

from .loop import ACCUMULATION, LEARNING_RATE, MAX_GRAD_NORM, LoopCase, make_data, make_model, step
from .measure import REPOSITORY, Progress, Row, child_environment, median_difference, median_of, median_ratio

RANKS = (2, 4)


def checkpoint_case(smoke: bool) -> LoopCase:
    """The model whose checkpoints are timed: 8 x 1024 (7.4M parameters, 89 MB with AdamW's two moments)."""
    return LoopCase("ckpt", 64, 2, 8, 64) if smoke else LoopCase("ckpt", 1024, 8, 8, 64)


def loop_case(smoke: bool, ranks: int) -> LoopCase:
    return LoopCase(f"fsdp2 mlp, {ranks} ranks", 64, 2, 8, 256) if smoke else LoopCase(f"fsdp2 mlp, {ranks} ranks", 256, 4, 16, 4096)


def run(rounds: int, progress: Progress, *, smoke: bool = False) -> list[Row]:
    rows = []
    for ranks in RANKS:
        results = _launch(ranks, rounds, progress, smoke)
        rows += _rows(results, ranks, rounds, smoke)
    return rows


def _launch(ranks: int, rounds: int, progress: Progress, smoke: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="elfes-sharded-bench-") as folder:
        out = Path(folder) / "results.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
                   "-m", "benchmarks.sharded", "--rounds", str(rounds), "--out", str(out), "--folder", folder]
        worker = subprocess.Popen(command + (["--smoke"] if smoke else []), cwd=REPOSITORY, env=child_environment(),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert worker.stdout is not None
        lines = []
        for line in worker.stdout:
            lines.append(line)
            if line.startswith("sharded "):
                progress(line.rstrip())
        if worker.wait() != 0 or not out.exists():
            raise RuntimeError(f"the {ranks}-rank benchmark failed (status {worker.returncode}):\n{''.join(lines[-40:])}")
        return json.loads(out.read_text())


def _rows(results: dict[str, Any], ranks: int, rounds: int, smoke: bool) -> list[Row]:
    saves, loads, loop = results["save"], results["load"], results["loop"]
    megabytes = results["payload_mb"]
    case = f"{megabytes:.0f} MB, {ranks} ranks"
    written = {"sharded_mb_per_rank": [b / 1e6 for b in results["sharded_bytes"]],
               "single_file_mb_per_rank": [b / 1e6 for b in results["single_bytes"]], "payload_mb": megabytes}
    largest = max(results["sharded_bytes"]) / 1e6, max(results["single_bytes"]) / 1e6
    loop_spec = loop_case(smoke, ranks)
    microbatches = -(-loop_spec.samples // loop_spec.batch_size) // ranks
    return [
        Row("sharded", case, "publish: DCP shards of every rank / one file of the main process", "s",
            median_of(saves, "sharded", "wall_s"), median_of(saves, "single", "wall_s"), "single-file save",
            "ratio", median_ratio(saves, "sharded", "single", "wall_s"), rounds=rounds, details=written),
        Row("sharded", case, "restore: every rank its shards / every rank the whole file", "s",
            median_of(loads, "sharded", "wall_s"), median_of(loads, "single", "wall_s"), "single-file restore",
            "ratio", median_ratio(loads, "sharded", "single", "wall_s"), rounds=rounds, details={"payload_mb": megabytes}),
        Row("sharded", case, "bytes written by the busiest rank: sharded / single file", "MB", largest[0], largest[1],
            "single file", "ratio", largest[0] / largest[1], rounds=1, details=written),
        Row("sharded", loop_spec.name, "loop: ELFES / hand FSDP2 loop (wall), extra per microbatch", "us",
            median_difference(loop, "elfes", "hand", "wall_s", 1e6 / microbatches), 0.0, "hand FSDP2 loop",
            "ratio", median_ratio(loop, "elfes", "hand", "wall_s"), rounds=rounds,
            details={"model": loop_spec.describe(), "ranks": ranks, "microbatches_per_rank": microbatches,
                     "max_parameter_difference_vs_hand": loop["max_parameter_difference"],
                     "noise_hand_again_over_hand": median_ratio(loop, "hand again", "hand", "wall_s")}),
    ]


# ------------------------------------------------------------------------------------------------
# Inside the torchrun job


def shard(model: nn.Module) -> nn.Module:
    """Each Linear, then the root, over a mesh of every rank (as a job shards its blocks)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def trainer_of(accelerator: Any, case: LoopCase, model: nn.Module, data: TensorDataset) -> Any:
    from elfes.engine import Trainer

    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    return Trainer(accelerator, model, optimizer, DataLoader(data, batch_size=case.batch_size), step)


def _one_update(trainer: Any, width: int) -> None:
    """An optimizer step on a zero gradient's worth of data, so that AdamW's moments exist."""
    loss = trainer.model(torch.zeros(2, width)).sum()
    loss.backward()
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)


def hand_epoch(case: LoopCase, model: nn.Module, data: TensorDataset) -> Callable[[], None]:
    """A hand FSDP2 loop over the batches accelerate gives each rank (rank r: batches r, r + world, ...)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    indices = list(range(len(data)))
    batches = [indices[i:i + case.batch_size] for i in range(0, len(indices), case.batch_size)]

    def epoch() -> None:
        loader = iter(DataLoader(data, batch_sampler=batches[rank::world]))
        while window := list(itertools.islice(loader, ACCUMULATION)):
            count = torch.tensor([float(sum(len(inputs) for inputs, _ in window))], dtype=torch.float64)
            dist.all_reduce(count)
            for index, (inputs, targets) in enumerate(window):
                model.set_requires_gradient_sync(index == len(window) - 1)  # type: ignore[operator]
                loss = (model(inputs) - targets).square().mean()
                (loss * (len(inputs) * world / count.item())).backward()  # the reduce-scatter averages over ranks
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return epoch


def _between_barriers(function: Callable[[], Any]) -> dict[str, float]:
    dist.barrier()
    started = time.perf_counter()
    function()
    dist.barrier()
    return {"wall_s": time.perf_counter() - started}


def measure_checkpoints(accelerator: Any, arguments: argparse.Namespace) -> dict[str, Any]:
    from elfes.engine.checkpoint import CheckpointDirectory, CheckpointName

    case = checkpoint_case(arguments.smoke)
    data = make_data(8 * case.batch_size, seed=1)  # batches that 2 and 4 ranks share equally
    trainers = {"sharded": trainer_of(accelerator, case, shard(make_model(case)), data),
                "single": trainer_of(accelerator, case, make_model(case), data)}
    for trainer in trainers.values():
        _one_update(trainer, 64)
    folders = {name: CheckpointDirectory(Path(arguments.folder) / name) for name in trainers}
    counter = itertools.count(1)
    written: dict[str, Path] = {}

    def save(name: str) -> None:
        number = next(counter)
        trainer, directory = trainers[name], folders[name]
        pending = trainer.checkpointer.snapshot(directory, CheckpointName(number, number, sharded=name == "sharded"),
                                                reuse=False, run_id="benchmark")
        path, _ = pending.write()
        if accelerator.is_main_process:
            directory.point("last", path)
            previous = written.get(name)
            if previous is not None and previous != path:
                shutil.rmtree(previous) if previous.is_dir() else previous.unlink()
        written[name] = path

    names = ["single", "sharded"]
    samples: dict[str, dict[str, list]] = {"save": {n: [] for n in names}, "load": {n: [] for n in names}}
    for name in names:  # warm-up
        save(name)
    for round_index in range(arguments.rounds * 3):  # a save takes a fraction of a second: more rounds steady the medians
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            samples["save"][name].append(_between_barriers(lambda name=name: save(name)))
        for name in order:
            samples["load"][name].append(_between_barriers(lambda name=name: trainers[name].checkpointer.restore(written[name])))
        if accelerator.is_main_process:
            shown = ", ".join(f"{n} save {samples['save'][n][-1]['wall_s']:.3f} s load {samples['load'][n][-1]['wall_s']:.3f} s"
                              for n in names)
            print(f"sharded checkpoint, {accelerator.num_processes} ranks: round {round_index + 1}: {shown}", flush=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    dist.barrier()
    shard_file = written["sharded"] / f"__{rank}_0.distcp"
    own = shard_file.stat().st_size + (sum(p.stat().st_size for p in written["sharded"].iterdir()
                                           if not p.name.startswith("__")) if rank == 0 else 0)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, own)
    sharded_bytes = [int(b) for b in gathered]
    single_bytes = [written["single"].stat().st_size] + [0] * (world - 1)  # the main process writes it all
    module = trainers["single"].module
    tensors = list(module.state_dict().values()) + [v for s in trainers["single"].optimizer.state.values()
                                                    for v in s.values() if isinstance(v, torch.Tensor)]
    megabytes = sum(t.numel() * t.element_size() for t in tensors) / 1e6
    return {**samples, "sharded_bytes": sharded_bytes, "single_bytes": single_bytes, "payload_mb": megabytes}


def measure_loop(accelerator: Any, arguments: argparse.Namespace) -> dict[str, Any]:
    from elfes.engine import TrainConfig

    case = loop_case(arguments.smoke, accelerator.num_processes)
    data = make_data(case.samples, seed=1)
    config = TrainConfig(epochs=1, max_grad_norm=MAX_GRAD_NORM, evaluate_every=None, checkpoint_every=None)
    finals: dict[str, nn.Module] = {}

    def timed_epoch(name: str) -> dict[str, float]:
        finals[name] = shard(make_model(case))
        if name.startswith("hand"):
            epoch = hand_epoch(case, finals[name], data)
        else:
            trainer = trainer_of(accelerator, case, finals[name], data)
            epoch = lambda: trainer.train(config)  # noqa: E731
        return _between_barriers(epoch)

    names = ["hand", "elfes", "hand again"]  # the hand loop twice: the spread of identical code here
    for name in names:  # warm-up
        timed_epoch(name)
    samples: dict[str, Any] = {name: [] for name in names}
    for round_index in range(arguments.rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(timed_epoch(name))
        if accelerator.is_main_process:
            shown = ", ".join(f"{name} wall {samples[name][-1]['wall_s']:.3f} s" for name in names)
            print(f"sharded {case.name}: round {round_index + 1}/{arguments.rounds}: {shown}", flush=True)
    differences = [(a.full_tensor() - b.full_tensor()).abs().max().item()
                   for a, b in zip(finals["elfes"].parameters(), finals["hand"].parameters())]
    samples["max_parameter_difference"] = max(differences)
    return samples


def worker(arguments: argparse.Namespace) -> None:
    from accelerate import Accelerator, DataLoaderConfiguration

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION,
                              dataloader_config=DataLoaderConfiguration(even_batches=False))
    results = measure_checkpoints(accelerator, arguments)
    results["loop"] = measure_loop(accelerator, arguments)
    if accelerator.is_main_process:
        Path(arguments.out).write_text(json.dumps(results))
    accelerator.end_training()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", required=True)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--smoke", action="store_true")
    worker(parser.parse_args())
    gc.collect()  # see benchmarks/loop_ddp.py: the destroyed group's references go before interpreter shutdown
    release_process_groups()
