"""Training processes that receive real signals; run as scripts by test_resume.py.

    python signal_cases.py group-sigterm OUTPUT_DIR
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from workloads import RunSpec, build, mse_step

from elfes.engine import StopRequest


def group_sigterm(directory: Path) -> None:
    """SIGTERM to the whole process group (as SLURM does) while two DataLoader workers are alive."""
    run = build(RunSpec(num_workers=2))
    stop = StopRequest()
    calls = 0

    def step(model, batch):
        nonlocal calls
        calls += 1
        if calls == 5:  # the 2nd microbatch of the 2nd window; the workers are running
            os.killpg(os.getpgid(0), signal.SIGTERM)
        return mse_step(model, batch)

    run.trainer.step = step
    with stop.catch_signals():
        state = run.trainer.train(run.config, checkpoint_dir=directory, stop=stop)
    print(f"stopped {state.stop_reason} at step {state.step}", flush=True)


def group_sigterm_during_evaluation(directory: Path) -> None:
    """The same signal while the evaluation loader's two workers are alive."""
    from torch.utils.data import DataLoader
    from workloads import RegressionData

    from elfes.engine import Evaluator

    run = build(RunSpec(num_workers=2))
    stop = StopRequest()
    sent = False

    def evaluation_step(model, batch):
        nonlocal sent
        if not sent:
            sent = True
            os.killpg(os.getpgid(0), signal.SIGTERM)
        return mse_step(model, batch)

    validation = DataLoader(RegressionData(13, seed=2), batch_size=4, num_workers=2)
    run.trainer.evaluator = Evaluator(run.accelerator, {"validation": validation}, evaluation_step)
    with stop.catch_signals():
        state = run.trainer.train(run.config, checkpoint_dir=directory, stop=stop)
    print(f"stopped {state.stop_reason} at step {state.step}", flush=True)


def group_sigusr2(directory: Path) -> None:
    """The requeue signal to the whole process group while two workers are alive, caught by the request."""
    run = build(RunSpec(num_workers=2))
    stop = StopRequest()
    calls = 0

    def step(model, batch):
        nonlocal calls
        calls += 1
        if calls == 5:
            os.killpg(os.getpgid(0), signal.SIGUSR2)
        return mse_step(model, batch)

    run.trainer.step = step
    with stop.catch_signals(signals=(signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)):
        state = run.trainer.train(run.config, checkpoint_dir=directory, stop=stop)
    print(f"stopped {state.stop_reason} at step {state.step}", flush=True)


if __name__ == "__main__":
    case, output = sys.argv[1], Path(sys.argv[2])
    cases = {"group-sigterm": group_sigterm, "group-sigterm-evaluation": group_sigterm_during_evaluation, "group-sigusr2": group_sigusr2}
    cases[case](output)
