"""The chaos soak: ``elfes rehearse JOB --interruptions 100`` on a two-rank job, every kind at seeded
random moments, with asynchronous checkpoints on in odd attempts and off in even ones, so that every
interruption meets the other writer than the one before. The target: every interruption landed
mid-run and the verdict exact.

Not in the default set (about 25 minutes on 2 cores): ``python -m benchmarks --only soak``;
``--smoke`` rehearses with 6 interruptions.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from .measure import REPOSITORY, Progress, Row, child_environment

INTERRUPTIONS = 100
SMOKE_INTERRUPTIONS = 6


def run(rounds: int, progress: Progress, *, smoke: bool = False) -> list[Row]:
    """One soak whatever ``rounds`` says: it is a count of events, not a timing to take a median of."""
    count = SMOKE_INTERRUPTIONS if smoke else INTERRUPTIONS
    folder = Path(tempfile.mkdtemp(prefix="elfes-soak-"))
    spec = write_spec(folder, updates=max(24, 2 * count))
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "elfes", "rehearse", str(spec), "--executor", "local",
                                "--interruptions", str(count), "--json"], cwd=REPOSITORY,
                               env=child_environment(), capture_output=True, text=True)
    wall = time.perf_counter() - started
    (folder / "rehearse.err").write_text(completed.stderr)
    if not completed.stdout.strip():
        raise RuntimeError(f"the soak's rehearsal gave no report (exit {completed.returncode}); its output and "
                           f"scratch runs are kept in {folder}:\n{completed.stderr[-3000:]}")
    shutil.rmtree(folder)
    report = json.loads(completed.stdout)
    landed = sum(report["landed"].values())
    progress(f"soak: {report['summary']} in {wall:.0f} s")
    case = f"{count} interruptions, 2 ranks, async checkpoints alternating"
    details = {"summary": report["summary"], "landed": report["landed"], "requested": report["requested"],
               "retried": len(report["retried"]), "attempts": report["runs"]["interrupted"]["attempts"]}
    return [
        Row("soak", case, "interruptions landed mid-run", "interruptions", float(landed), None, None, "value",
            float(landed), target=f">= {count}", rounds=1, details=details),
        Row("soak", case, "verdict exact (1) or not (0)", "verdict", float(report["verdict"] == "exact"), None, None,
            "value", float(report["verdict"] == "exact"), target=">= 1", rounds=1, details={"verdict": report["verdict"]}),
        Row("soak", case, "wall time of the rehearsal", "s", wall, None, None, "value", wall, rounds=1),
    ]


def write_spec(folder: Path, *, updates: int) -> Path:
    spec: dict[str, Any] = {
        "name": "soak", "entrypoint": "benchmarks.soak:job", "workdir": str(REPOSITORY), "run_dir": str(folder / "run"),
        "config": {"updates": updates},
        "resources": {"nodes": 1, "tasks_per_node": 2, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 2,
                      "timeout_min": 60},
        "requeue": {"max_requeues": 1000}, "env": {"OMP_NUM_THREADS": "1"},
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def job(job: Any) -> Any:
    """The soak's job: a small model on two ranks for ``config.updates`` updates, a checkpoint every 4, and
    asynchronous checkpoints in odd attempts only."""
    import torch
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import set_seed
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from elfes.engine import Interval, RunLogger, StepOutput, TrainConfig, Trainer

    accelerator = Accelerator(gradient_accumulation_steps=2,
                              dataloader_config=DataLoaderConfiguration(even_batches=False))
    set_seed(0)
    generator = torch.Generator().manual_seed(1)
    batches = 2 * 2 * 16  # a batch of 8 per rank, two per update, 16 updates an epoch
    data = TensorDataset(torch.randn(batches * 8, 8, generator=generator), torch.randn(batches * 8, 1, generator=generator))
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(model: nn.Module, batch: Any) -> StepOutput:
        time.sleep(0.05)
        inputs, targets = batch
        return StepOutput(loss=(model(inputs) - targets).square().mean(), num_samples=len(inputs))

    updates = int(job.config["updates"])
    with RunLogger(job.run_dir, is_main_process=accelerator.is_main_process) as logger:
        trainer = Trainer(accelerator, model, optimizer, DataLoader(data, batch_size=8, shuffle=True), step,
                          ema_decay=0.9, logger=logger)
        config = TrainConfig(epochs=10**6, max_steps=updates, log_every=1, evaluate_every=None,
                             checkpoint_every=Interval(4, "step"), keep_checkpoints=3,
                             async_checkpoints=job.attempt % 2 == 1)
        state = trainer.train(config, checkpoint_dir=job.checkpoint_dir, resume_from=job.resume_from, stop=job.stop)
        if state.stop_reason is None:
            trainer.save_model(job.run_dir / "model.pt", weights="ema")
    accelerator.end_training()
    return state
