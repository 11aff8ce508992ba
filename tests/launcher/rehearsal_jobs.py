"""Jobs that `elfes rehearse` must judge: the quickstart slowed down (exact), one whose data order hangs
on a counter the checkpoint does not hold (not resumable), one seeded from the clock (not reproducible),
and :func:`switchable` (no RunLogger, unseeded generators, NaN, a lost export; also a `command:` job).
Imported inside the jobs (the tests' specs run them from the repository root)."""

from __future__ import annotations

import time
from typing import Any

import torch
import yaml
from torch.utils.data import Sampler

from examples.quickstart import job as quickstart
from examples.quickstart.train import step
from tests.launcher.entrypoints import slow_quickstart

__all__ = ["clock_seeded", "hidden_sampler_counter", "slow_quickstart", "switchable"]


def _slow(config: dict[str, Any]):
    delay = float(config.pop("step_delay_s", 0.0))

    def slow_step(model, batch):
        time.sleep(delay)
        return step(model, batch)

    return slow_step


class CountingSampler(Sampler[int]):
    """Shuffles each epoch from a count of its own epochs: a restart forgets the count, so the epoch a run
    resumes in is read in another order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.epochs_begun = 0

    def __iter__(self):
        self.epochs_begun += 1
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.epochs_begun))
        return iter(order.tolist())

    def __len__(self) -> int:
        return self.size


def hidden_sampler_counter(job: Any) -> Any:
    """The quickstart with :class:`CountingSampler` instead of ``shuffle=True``."""
    config = dict(job.config)
    job.config = config
    slow_step = _slow(config)
    original = quickstart.DataLoader

    def loader_with_counting_sampler(dataset, batch_size, shuffle=False, **kwargs):
        sampler = CountingSampler(len(dataset)) if shuffle else None
        return original(dataset, batch_size=batch_size, sampler=sampler, **kwargs)

    quickstart.DataLoader = loader_with_counting_sampler
    try:
        return quickstart.run(job, slow_step)
    finally:
        quickstart.DataLoader = original


def clock_seeded(job: Any) -> Any:
    """The quickstart whose configured seed is replaced by the clock."""
    config = dict(job.config)
    config["seed"] = time.time_ns() % 2**31
    job.config = config
    return quickstart.run(job, _slow(config))


# -- the switchable job: what a rehearsal must judge on jobs unlike the quickstart -------------------------------
SWITCHES: dict[str, Any] = {
    "logger": True,  # False: no RunLogger, so no events.jsonl
    "seed": "all",  # "torch": torch.manual_seed only; Python's random and NumPy stay unseeded (and unused)
    "nan": False,  # True: a model buffer holds NaN, and a logged metric is NaN
    "export": "always",  # "first_attempt": model.pt only when the run was never resumed (a lost export)
    "fast_after_step": None,  # updates after this one take no time...
    "pause_after_s": 0.0,  # ...and the job waits this long after training: a signal there lands after the end
}


def switchable(job: Any) -> Any:
    """The quickstart model, data and step with :data:`SWITCHES` (and the quickstart's budget keys) from
    the config."""
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import set_seed
    from torch import nn
    from torch.utils.data import DataLoader

    from elfes.engine import MeanMetric, RunLogger, TrainConfig, Trainer
    from examples.quickstart.train import make_data

    config = {**quickstart.DEFAULTS, **SWITCHES, "step_delay_s": 0.0, "seed_value": 0, **job.config}
    accelerator = Accelerator(gradient_accumulation_steps=config["accumulation"],
                              dataloader_config=DataLoaderConfiguration(even_batches=False))
    if config["seed"] == "all":
        set_seed(config["seed_value"])
    else:
        torch.manual_seed(config["seed_value"])
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    if config["nan"]:
        model.register_buffer("untouched", torch.full((3,), float("nan")))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    loader = DataLoader(make_data(config["train_samples"], seed=1), batch_size=config["batch_size"], shuffle=True)
    trainer: Any = None

    def the_step(model, batch):
        fast = config["fast_after_step"] is not None and trainer.state.step >= config["fast_after_step"]
        time.sleep(0.0 if fast else config["step_delay_s"])
        output = step(model, batch)
        if config["nan"]:
            output.metrics["nan"] = MeanMetric(torch.tensor(float("nan")), 1)
        return output

    logger = RunLogger(job.run_dir, is_main_process=accelerator.is_main_process) if config["logger"] else None
    trainer = Trainer(accelerator, model, optimizer, loader, the_step, ema_decay=0.9, logger=logger)
    state = trainer.train(TrainConfig(epochs=config["epochs"], log_every=config["log_every"], evaluate_every=None),
                          checkpoint_dir=job.checkpoint_dir, resume_from=job.resume_from, stop=job.stop)
    if state.stop_reason is None and (config["export"] == "always" or job.resume_from is None):
        trainer.save_model(job.run_dir / "model.pt", weights="ema")
    if state.stop_reason is None:
        time.sleep(config["pause_after_s"])
    if logger is not None:
        logger.close()
    accelerator.end_training()
    return state


def main(argv: list[str] | None = None) -> int:
    """:func:`switchable` as a `command:` job: ``python -m tests.launcher.rehearsal_jobs --run-dir RUN_DIR
    --set logger=false --set epochs=3``; it catches the stop signals and exits 128 + the signal's number
    when one paused it."""
    import argparse
    import signal
    from pathlib import Path
    from types import SimpleNamespace

    from elfes.engine import StopRequest

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=YAML", dest="sets")
    args = parser.parse_args(argv)
    config = {key: yaml.safe_load(value) for key, _, value in (text.partition("=") for text in args.sets)}
    last = args.run_dir / "checkpoints" / "last"
    stop = StopRequest()
    with stop.catch_signals(signals=(signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)):
        job = SimpleNamespace(config=config, run_dir=args.run_dir, checkpoint_dir=args.run_dir / "checkpoints",
                              resume_from=last if last.exists() else None, stop=stop)
        state = switchable(job)
    return 128 + signal.Signals[state.stop_reason] if state.stop_reason in signal.Signals.__members__ else 0


if __name__ == "__main__":
    raise SystemExit(main())
