"""A torch-free `command:` job for the SLURM sweep tests: it "trains" by hashing, unit after unit, a chain
that starts from its member's ``config.member`` (read from RUN_DIR/job.yaml), keeping ``{"unit", "digest"}``
in RUN_DIR/chain.json (written atomically after every unit, so a stop loses nothing). On SIGUSR2, SIGTERM or
SIGINT it exits 128 + the signal's number, as a command job must; the next attempt continues from the file.
While the file named by ``config.hold`` exists, it waits after ``--hold-after`` units (a test decides when
a member finishes). :func:`expected` is the chain of a run never interrupted: a resumed member ends bitwise
equal to it or not at all. Starts in milliseconds, so a sweep of many members stays short."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import yaml

from elfes.files import write_text_atomically


def step(digest: str, unit: int) -> str:
    return hashlib.sha256(f"{digest}:{unit}".encode()).hexdigest()


def expected(member: int, units: int) -> dict[str, object]:
    """chain.json of member ``member`` after ``units`` units, never interrupted."""
    digest = hashlib.sha256(str(member).encode()).hexdigest()
    for unit in range(units):
        digest = step(digest, unit)
    return {"unit": units, "digest": digest}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--units", type=int, required=True)
    parser.add_argument("--unit-s", type=float, default=0.02)
    parser.add_argument("--hold-after", type=int, default=3)
    args = parser.parse_args(argv)
    received: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2):
        signal.signal(signum, lambda signum, frame: received.append(signum))
    config = yaml.safe_load((args.run_dir / "job.yaml").read_text())["config"]
    file = args.run_dir / "chain.json"
    state = json.loads(file.read_text()) if file.exists() else expected(int(config["member"]), 0)
    print(f"chain from unit {state['unit']} to {args.units}", flush=True)
    hold = config.get("hold") or ""
    while state["unit"] < args.units:
        while hold and state["unit"] >= args.hold_after and os.path.exists(hold) and not received:
            time.sleep(0.02)
        if received:
            print(f"stopping at unit {state['unit']} on {signal.Signals(received[0]).name}", flush=True)
            return 128 + received[0]
        time.sleep(args.unit_s)
        state = {"unit": state["unit"] + 1, "digest": step(str(state["digest"]), int(state["unit"]))}
        write_text_atomically(file, json.dumps(state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
