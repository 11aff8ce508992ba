"""A torch-free `command:` job of the command-job tests whose signal handling is chosen on its command
line: which stop signals it catches (or ignores), and what it does on one. Counts to --units, one unit
every --unit-s, keeping the count in RUN_DIR/count.txt and its pid in RUN_DIR/trainer.pid; with
--records it writes the run records a RunLogger would (`stopped`/`finished` in events.jsonl).

    python -m tests.launcher.protocol_command --run-dir RUN_DIR --units 400 --catch SIGINT,SIGTERM --on-stop save

--finish-when FILE: count to the end at once and finish as soon as FILE exists (a command that ends by
itself when the test says so, not after a time that a loaded machine stretches).

--on-stop: save (exit 128 + the signal's number: the protocol), exit-zero (exit 0 without finishing),
finish (count to the end at once, record `finished`, exit 0), carry-on (keep counting: a stop never ends it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from elfes.files import write_text_atomically


def _signals(text: str) -> list[signal.Signals]:
    return [signal.Signals[name] for name in text.split(",") if name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--units", type=int, required=True)
    parser.add_argument("--unit-s", type=float, default=0.05)
    parser.add_argument("--catch", type=_signals, default=_signals("SIGINT,SIGTERM,SIGUSR2"))
    parser.add_argument("--ignore", type=_signals, default=[])
    parser.add_argument("--on-stop", choices=("save", "exit-zero", "finish", "carry-on"), default="save")
    parser.add_argument("--records", action="store_true")
    parser.add_argument("--finish-when", type=Path)
    args = parser.parse_args(argv)
    received: list[int] = []
    for signum in args.catch:
        signal.signal(signum, lambda signum, frame: received.append(signum))
    for signum in args.ignore:
        signal.signal(signum, signal.SIG_IGN)
    write_text_atomically(args.run_dir / "trainer.pid", str(os.getpid()))
    file = args.run_dir / "count.txt"
    count = int(file.read_text()) if file.exists() else 0
    print(f"counting from {count} to {args.units}", flush=True)
    while count < args.units:
        if args.finish_when is not None and args.finish_when.exists():
            count = args.units
            break
        if received and args.on_stop != "carry-on":
            name = signal.Signals(received[0]).name
            print(f"stopping at {count} on {name} ({args.on_stop})", flush=True)
            if args.on_stop == "finish":
                count = args.units
                break
            _record(args, "stopped", count)
            return 128 + received[0] if args.on_stop == "save" else 0
        time.sleep(args.unit_s)
        count += 1
        write_text_atomically(file, str(count))
    write_text_atomically(file, str(count))
    _record(args, "finished", count)
    return 0


def _record(args: argparse.Namespace, event: str, step: int) -> None:
    if args.records:
        line = {"event": event, "time": datetime.now(timezone.utc).isoformat(), "state": {"step": step}}
        with open(args.run_dir / "events.jsonl", "a", encoding="utf-8") as events:
            events.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    sys.exit(main())
