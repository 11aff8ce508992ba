"""A `command:` job of the launcher tests: the quickstart model trained by a script that owns its
StopRequest, as a command job must, and exits 128 + the signal's number when it paused.

    python -m tests.launcher.command_train --run-dir RUN_DIR --epochs 2 --train-samples 256 --step-delay-s 0.1
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from elfes.engine import StopRequest
from examples.quickstart import job as quickstart


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--train-samples", type=int, required=True)
    parser.add_argument("--log-every", type=int, default=1)
    parser.add_argument("--step-delay-s", type=float, default=0.0)
    parser.add_argument("--default-signals", action="store_true",
                        help="StopRequest().catch_signals() as the engine's docs write it: SIGINT and SIGTERM only")
    args = parser.parse_args(argv)

    def slow_step(model, batch):
        time.sleep(args.step_delay_s)
        return quickstart.step(model, batch)

    last = args.run_dir / "checkpoints" / "last"
    stop = StopRequest()
    signals = (signal.SIGINT, signal.SIGTERM) if args.default_signals else (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)
    with stop.catch_signals(signals=signals):
        job = SimpleNamespace(
            config={"epochs": args.epochs, "train_samples": args.train_samples, "log_every": args.log_every},
            run_dir=args.run_dir, checkpoint_dir=args.run_dir / "checkpoints",
            resume_from=last if last.exists() else None, stop=stop,
        )
        state = quickstart.run(job, slow_step)
    if state.stop_reason in signal.Signals.__members__:
        return 128 + signal.Signals[state.stop_reason]  # paused after saving `last`
    return 0


if __name__ == "__main__":
    sys.exit(main())
