"""Resume: process start to the first completed update, resuming mid-epoch against starting fresh.

The dataset is a large map-style one (2^20 samples, batches of 64, shuffled) whose reads are counted.
A preparation run trains half an epoch and publishes a checkpoint there. Each round then starts two
processes (``python -m benchmarks.resume --child fresh|resume DIR``), in alternating order: one trains
its first update from scratch, the other resumes from the checkpoint and trains the next update. A
child reports the wall-clock time of its first optimizer step and how many samples it had read; the
resumed child reads exactly as many as the fresh one (skipped batches are skipped in the sampler,
never read), so the difference is the number of skipped-batch reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .measure import REPOSITORY, Progress, Row, child_environment

BATCH_SIZE = 64
ACCUMULATION = 2


def sizes(smoke: bool) -> tuple[int, int]:
    """(samples, updates before the checkpoint): the checkpoint lands half-way through the first epoch."""
    samples = 4096 if smoke else 2**20
    return samples, samples // BATCH_SIZE // ACCUMULATION // 2


def run(rounds: int, progress: Progress, *, smoke: bool = False) -> list[Row]:
    samples, prepared_steps = sizes(smoke)
    with tempfile.TemporaryDirectory(prefix="elfes-resume-bench-") as folder:
        base = Path(folder)
        started = time.perf_counter()
        launch("prepare", base / "prepare", smoke)
        progress(f"resume: prepared a checkpoint at update {prepared_steps} of {samples:,} samples (half an epoch) "
                 f"in {time.perf_counter() - started:.1f} s")
        results: dict[str, list[dict[str, float]]] = {"fresh": [], "resume": []}
        for round_index in range(rounds):
            for mode in ("fresh", "resume") if round_index % 2 == 0 else ("resume", "fresh"):
                results[mode].append(launch(mode, base / f"{mode}-{round_index}", smoke, checkpoint=base / "prepare" / "checkpoints" / "last"))
            progress(f"resume: round {round_index + 1}/{rounds}: first update after {results['fresh'][-1]['seconds']:.2f} s "
                     f"fresh, {results['resume'][-1]['seconds']:.2f} s resumed; samples read before it "
                     f"{results['fresh'][-1]['reads']} and {results['resume'][-1]['reads']}; CPU "
                     f"{results['fresh'][-1]['cpu_s']:.2f} s and {results['resume'][-1]['cpu_s']:.2f} s")
    fresh = [result["seconds"] for result in results["fresh"]]
    resumed = [result["seconds"] for result in results["resume"]]
    skipped_reads = max(r["reads"] - f["reads"] for r, f in zip(results["resume"], results["fresh"]))
    reads_details = {"fresh_reads": results["fresh"][-1]["reads"], "resume_reads": results["resume"][-1]["reads"],
                     "skipped_batches": prepared_steps * ACCUMULATION}
    return [
        Row("resume", f"{samples:,} samples, mid-epoch", "process start to first update, resumed / fresh", "s",
            statistics.median(resumed), statistics.median(fresh), "fresh start", "ratio",
            statistics.median(r / f for r, f in zip(resumed, fresh)), target="<= 1.2", rounds=rounds,
            details={"samples": samples, "batch_size": BATCH_SIZE, "resumed_at_update": prepared_steps,
                     "cpu_ratio": statistics.median(r["cpu_s"] / f["cpu_s"] for r, f in zip(results["resume"], results["fresh"])),
                     "fresh_cpu_s": statistics.median(f["cpu_s"] for f in results["fresh"]),
                     "resume_cpu_s": statistics.median(r["cpu_s"] for r in results["resume"])}),
        Row("resume", f"{samples:,} samples, mid-epoch", "samples of skipped batches read before the first update", "reads",
            float(skipped_reads), None, None, "value", float(skipped_reads), target="== 0", rounds=rounds, details=reads_details),
    ]


def launch(mode: str, run_dir: Path, smoke: bool, checkpoint: Path | None = None) -> dict[str, float]:
    run_dir.mkdir(parents=True)
    command = [sys.executable, "-m", "benchmarks.resume", mode, str(run_dir)] + (["--smoke"] if smoke else [])
    if checkpoint is not None:
        command += ["--checkpoint", str(checkpoint)]
    started = time.time()  # the child reports time.time() too: one clock
    completed = subprocess.run(command, cwd=REPOSITORY, env=child_environment(), capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"the resume benchmark's {mode} process failed:\n{completed.stdout[-2000:]}{completed.stderr[-3000:]}")
    if mode == "prepare":
        return {}
    report = json.loads((run_dir / "first_update.json").read_text())
    return {"seconds": report["time"] - started, "cpu_s": report["cpu_s"], "reads": report["reads"]}


# ------------------------------------------------------------------------------------------------
# The training process


def child(mode: str, run_dir: Path, smoke: bool, checkpoint: Path | None) -> None:
    import torch
    from accelerate import Accelerator
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    from elfes.engine import StepOutput, TrainConfig, Trainer

    class CountingData(Dataset):
        """A large map-style dataset whose samples are built from their index; it counts its reads."""

        def __init__(self, samples: int) -> None:
            self.samples = samples
            self.reads = 0

        def __len__(self) -> int:
            return self.samples

        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            self.reads += 1
            return torch.full((16,), (index % 97) / 97.0), torch.full((1,), (index % 89) / 89.0)

    def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> StepOutput:
        inputs, targets = batch
        return StepOutput(loss=(model(inputs) - targets).square().mean(), num_samples=len(inputs))

    torch.set_num_threads(1)
    samples, prepared_steps = sizes(smoke)
    data = CountingData(samples)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def first_update(*_: object) -> None:
        if mode != "prepare" and not (run_dir / "first_update.json").exists():
            (run_dir / "first_update.json").write_text(json.dumps({"time": time.time(), "cpu_s": time.process_time(), "reads": data.reads}))

    optimizer.register_step_post_hook(first_update)
    trainer = Trainer(accelerator, model, optimizer, DataLoader(data, batch_size=BATCH_SIZE, shuffle=True), step)
    if mode == "prepare":
        config = TrainConfig(epochs=1, max_steps=prepared_steps, evaluate_every=None, checkpoint_every=None)
        trainer.train(config, checkpoint_dir=run_dir / "checkpoints")
    elif mode == "fresh":
        trainer.train(TrainConfig(epochs=1, max_steps=1, evaluate_every=None, checkpoint_every=None))
    else:
        config = TrainConfig(epochs=1, max_steps=prepared_steps + 1, evaluate_every=None, checkpoint_every=None)
        trainer.train(config, resume_from=checkpoint)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("prepare", "fresh", "resume"))
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--smoke", action="store_true")
    arguments = parser.parse_args()
    child(arguments.mode, arguments.run_dir, arguments.smoke, arguments.checkpoint)
