"""Run every ELFES benchmark, then print the table of ratios and write it as JSON.

    python -m benchmarks                     # every CPU benchmark, 7 rounds (about 10 minutes on 2 cores)
    python -m benchmarks --only loop,stop    # some of them
    python -m benchmarks --only loop-cuda    # the loop benchmark on one GPU, bf16 (not in the default set)
    python -m benchmarks --only slurm-array  # 100 sweep members as one job array on a private SLURM cluster
                                             # (root and the SLURM packages; not in the default set)
    python -m benchmarks --only soak         # elfes rehearse with 100 interruptions (not in the default set)
    python -m benchmarks --smoke             # tiny sizes, 1 round: checks that the command works (~1 minute)
    python -m benchmarks --record            # also write benchmarks/results/<date>.md and .json
                                             # (<date>-<names>.md for a subset given with --only)

Progress goes to stderr, one line per round; the table goes to stdout at the end.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from .measure import REPOSITORY, Progress, Row, machine, write_json
from .table import markdown_table, print_table

# name -> its modules; each module has run(rounds, progress, *, smoke) -> list[Row]
BENCHMARKS = {
    "loop": ("benchmarks.loop",),
    "loop-cuda": ("benchmarks.loop_cuda",),
    "ddp": ("benchmarks.loop_ddp",),
    "sharded": ("benchmarks.sharded",),
    "checkpoint": ("benchmarks.checkpoint", "benchmarks.checkpoint_blocking"),
    "stop": ("benchmarks.stop",),
    "resume": ("benchmarks.resume",),
    "login": ("benchmarks.login",),
    "sweep_status": ("benchmarks.sweep_status",),
    "slurm-array": ("benchmarks.slurm_array",),
    "soak": ("benchmarks.soak",),
}
# What runs without --only: all but those that need a GPU (loop-cuda: one GPU, bf16; nothing measured without
# CUDA), root and SLURM (slurm-array: a private cluster, about 5 minutes), or long (soak: 100 interruptions).
DEFAULT = [name for name in BENCHMARKS if name not in ("loop-cuda", "slurm-array", "soak")]


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per benchmark (default 7; 1 with --smoke)")
    parser.add_argument("--only", default=",".join(DEFAULT),
                        help=f"comma-separated subset of {','.join(BENCHMARKS)} (default: all but loop-cuda)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and one round: a check that every benchmark runs")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results as JSON (default: a temporary file)")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/<UTC date>.md and .json")
    arguments = parser.parse_args(argv)
    chosen = [name.strip() for name in arguments.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown or not chosen:
        parser.error(f"--only names {unknown or 'nothing'}; choose from {', '.join(BENCHMARKS)}.")
    arguments.only = chosen
    if arguments.rounds is None:
        arguments.rounds = 1 if arguments.smoke else 7
    if arguments.rounds < 1:
        parser.error(f"--rounds is {arguments.rounds}; use 1 or more.")
    return arguments


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    # The commands measured run as a user's do, with Python's bytecode cache: where the environment turns
    # it off (PYTHONDONTWRITEBYTECODE), every `elfes` command would also compile the project's modules.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    progress = Progress()
    info = machine()
    progress(
        f"{len(arguments.only)} benchmark(s) x {arguments.rounds} round(s){' (smoke sizes)' if arguments.smoke else ''} on "
        f"{info['cores']} cores ({info['cpu']}), load average {info['load_average'][0]}; a line per round:"
    )
    rows: list[Row] = []
    for name in arguments.only:
        for module_name in BENCHMARKS[name]:
            rows += importlib.import_module(module_name).run(arguments.rounds, progress, smoke=arguments.smoke)
    settings = {"rounds": arguments.rounds, "smoke": arguments.smoke, "benchmarks": arguments.only,
                "wall_s": round(progress.elapsed(), 1)}
    print_table(rows, info, settings)
    path = arguments.json or Path(tempfile.mkdtemp(prefix="elfes-benchmarks-")) / "results.json"
    write_json(path, info, settings, rows)
    progress(f"results written to {path}")
    if arguments.record:
        # The default set is the day's record; a chosen subset is recorded beside it, named after it.
        day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
        subset = "" if set(arguments.only) == set(DEFAULT) else "-" + "-".join(arguments.only)
        stem = REPOSITORY / "benchmarks" / "results" / f"{day}{subset}"
        write_json(stem.with_suffix(".json"), info, settings, rows)
        stem.with_suffix(".md").write_text(markdown_table(rows, info, settings))
        progress(f"recorded as {stem.with_suffix('.md').relative_to(REPOSITORY)} and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
