"""Stop latency: from SIGTERM to a published ``last``, against one accumulation window plus one save.

Each round starts a training process (``python -m benchmarks.stop --child DIR``) that catches SIGTERM
with a ``StopRequest``, waits until it has made a few updates, sends SIGTERM at a different point of
a window each round, and polls for ``DIR/checkpoints/last``. The child reports its window durations
(between optimizer steps) and the run records give the duration of its stop checkpoint, so each round
compares its latency with that round's own window + save.
"""

from __future__ import annotations

import argparse
import io
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .measure import REPOSITORY, Progress, Row, child_environment

READY_AFTER_UPDATES = 3


def run(rounds: int, progress: Progress, *, smoke: bool = False) -> list[Row]:
    latencies, windows, saves, budgets = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="elfes-stop-bench-") as folder:
        for round_index in range(rounds):
            run_dir = Path(folder) / f"round-{round_index}"
            fraction = (round_index + 0.5) / rounds  # where in a window the signal lands, spread over rounds
            latency, window, save = one_round(run_dir, fraction, smoke)
            latencies.append(latency)
            windows.append(window)
            saves.append(save)
            budgets.append(window + save)
            progress(f"stop: round {round_index + 1}/{rounds}: SIGTERM at {fraction:.0%} of a window, last published after "
                     f"{latency:.3f} s; window {window:.3f} s + save {save:.3f} s")
    over = statistics.median(latency - budget for latency, budget in zip(latencies, budgets))
    details = {"window_s": statistics.median(windows), "save_s": statistics.median(saves), "latency_max_s": max(latencies),
               "worst_over_s": max(latency - budget for latency, budget in zip(latencies, budgets))}
    return [Row("stop", "SIGTERM mid-window", "SIGTERM to last published, over window + save", "s",
                statistics.median(latencies), statistics.median(budgets), "one window + one save", "difference", over,
                target="<= 0.2", rounds=rounds, details=details)]


def one_round(run_dir: Path, fraction: float, smoke: bool) -> tuple[float, float, float]:
    run_dir.mkdir(parents=True)
    command = [sys.executable, "-m", "benchmarks.stop", "--child", str(run_dir)] + (["--smoke"] if smoke else [])
    child = subprocess.Popen(command, cwd=REPOSITORY, env=child_environment(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        ready = run_dir / "ready"
        deadline = time.monotonic() + 300
        while not ready.exists():
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the stop benchmark's training process ended early:\n{child.stdout.read()[-3000:]}")
            time.sleep(0.002)
        time.sleep(fraction * json.loads(ready.read_text())["window_s"])
        last = run_dir / "checkpoints" / "last"
        signalled = time.perf_counter()
        child.send_signal(signal.SIGTERM)
        while not last.exists():
            if child.poll() is not None and not last.exists():
                raise RuntimeError(f"the training process ended without publishing last:\n{child.stdout.read()[-3000:]}")
            time.sleep(0.001)
        latency = time.perf_counter() - signalled
        output, _ = child.communicate(timeout=120)
    finally:
        child.kill()
    if child.returncode != 0:
        raise RuntimeError(f"the stop benchmark's training process failed:\n{output[-3000:]}")
    report = json.loads((run_dir / "report.json").read_text())
    return latency, report["window_s"], report["save_s"]


# ------------------------------------------------------------------------------------------------
# The training process


def child(run_dir: Path, smoke: bool) -> None:
    import torch
    from accelerate import Accelerator
    from rich.console import Console
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from elfes.engine import RunLogger, StepOutput, StopRequest, TrainConfig, Trainer
    from elfes.files import write_text_atomically
    from elfes.records import read_events

    torch.set_num_threads(1)
    width, batch_size, accumulation = (64, 32, 2) if smoke else (1024, 128, 4)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                          nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))
    data = TensorDataset(torch.randn(batch_size * accumulation * 64, 64), torch.randn(batch_size * accumulation * 64, 1))

    def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> StepOutput:
        inputs, targets = batch
        return StepOutput(loss=(model(inputs) - targets).square().mean(), num_samples=len(inputs))

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    updates: list[float] = []

    def after_update(*_: object) -> None:
        updates.append(time.perf_counter())
        if len(updates) == READY_AFTER_UPDATES + 1:
            # Atomically: the parent polls for this file and reads it as soon as it exists.
            write_text_atomically(run_dir / "ready", json.dumps({"window_s": statistics.median(_differences(updates))}))

    optimizer.register_step_post_hook(after_update)
    stop = StopRequest()
    with RunLogger(run_dir, is_main_process=True, console=Console(file=io.StringIO())) as logger:
        trainer = Trainer(accelerator, model, optimizer, DataLoader(data, batch_size=batch_size, shuffle=True), step, logger=logger)
        config = TrainConfig(epochs=1000, evaluate_every=None, checkpoint_every=None, log_every=10**6)
        with stop.catch_signals():
            state = trainer.train(config, checkpoint_dir=run_dir / "checkpoints", stop=stop)
    if state.stop_reason != "SIGTERM":
        raise RuntimeError(f"training ended with stop_reason {state.stop_reason!r}, not SIGTERM")
    saves = [event["duration_s"] for event in read_events(run_dir) if event["event"] == "checkpoint" and event["reason"] == "stop"]
    report = {"window_s": statistics.median(_differences(updates)), "save_s": saves[-1]}
    (run_dir / "report.json").write_text(json.dumps(report))


def _differences(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in zip(times, times[1:])]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true")
    arguments = parser.parse_args()
    child(arguments.child, arguments.smoke)
