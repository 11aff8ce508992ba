"""A torch-free `command:` job of the launcher tests: counts to --units, one unit every --unit-s,
keeping the count in RUN_DIR/count.txt; on SIGINT, SIGTERM or SIGUSR2 it saves and exits 128 + the
signal's number, as a command job must. Starts in milliseconds, so requeue loops stay fast."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from elfes.files import write_text_atomically


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--units", type=int, required=True)
    parser.add_argument("--unit-s", type=float, default=0.05)
    args = parser.parse_args(argv)
    received: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2):
        signal.signal(signum, lambda signum, frame: received.append(signum))
    file = args.run_dir / "count.txt"
    count = int(file.read_text()) if file.exists() else 0
    print(f"counting from {count} to {args.units}", flush=True)
    while count < args.units:
        if received:
            print(f"stopping at {count} on {signal.Signals(received[0]).name}", flush=True)
            return 128 + received[0]
        time.sleep(args.unit_s)
        count += 1
        write_text_atomically(file, str(count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
