"""How every benchmark measures: interleaved rounds, medians of per-round figures, one result row each.

Variants compared with each other run in the same round, one after the other, their order rotating
from round to round, so that a burst of load on a shared machine hits them alike; a figure is the
median over rounds of the per-round ratio (or difference), never a ratio of two medians.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console

REPOSITORY = Path(__file__).resolve().parent.parent


@dataclass
class Row:
    """One line of the results table.

    ``value`` is the ELFES figure, ``reference`` what it is compared with (a hand-written loop, a bare
    ``torch.save``, ...), ``result`` the median over rounds of their per-round ratio or difference
    (``kind``), checked against ``target`` (``"<= 1.15"``, ``">= 0.98"``, or None for information).
    """

    benchmark: str
    case: str
    measure: str
    unit: str
    value: float
    reference: float | None
    reference_name: str | None
    kind: str  # "ratio", "difference" or "value"
    result: float
    target: str | None = None
    holds: bool | None = None
    rounds: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.target is not None and self.holds is None:
            self.holds = meets(self.result, self.target)


def meets(result: float, target: str) -> bool:
    """Whether ``result`` satisfies ``target``, written ``"<= 100"`` or ``">= 0.98"``."""
    operator, bound = target.split()
    if operator == "<=":
        return result <= float(bound)
    if operator == ">=":
        return result >= float(bound)
    if operator == "==":
        return result == float(bound)
    raise ValueError(f"target {target!r} must read '<= number', '>= number' or '== number'.")


class Progress:
    """Progress lines on stderr, one per round, so that a long run shows it is alive (and log files keep them)."""

    def __init__(self, quiet: bool = False) -> None:
        self.console = Console(stderr=True, highlight=False, soft_wrap=True, quiet=quiet)
        self.started = time.perf_counter()

    def __call__(self, message: str) -> None:
        self.console.print(f"[{self.elapsed():6.1f} s] {message}", markup=False)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


Sample = dict[str, float]
Variant = Callable[[], Sample]


def interleave(
    variants: Mapping[str, Variant], rounds: int, progress: Progress, label: str, *, warmup: bool = True, repeats: int = 1
) -> dict[str, list[Sample]]:
    """Run each variant ``repeats`` times per round, alternating them and rotating their order; returns
    each variant's per-round sums.

    A variant returns a dict of figures (e.g. ``{"wall_s": ..., "cpu_s": ...}``). Several short
    repeats per round interleave the variants finely, so that a burst of load on a shared machine
    (seconds long) hits both. An unrecorded warm-up call of each variant runs first when ``warmup``
    (first-call costs: allocator, lazy imports, page cache).
    """
    names = list(variants)
    if warmup:
        for name in names:
            variants[name]()
    samples: dict[str, list[Sample]] = {name: [] for name in names}
    turn = 0
    for round_index in range(rounds):
        sums: dict[str, Sample] = {name: {} for name in names}
        for _ in range(repeats):
            shift = turn % len(names)
            turn += 1
            for name in names[shift:] + names[:shift]:
                for key, value in variants[name]().items():
                    sums[name][key] = sums[name].get(key, 0.0) + value
        for name in names:
            samples[name].append(sums[name])
        shown = ", ".join(f"{name} {_short(samples[name][-1])}" for name in names)
        progress(f"{label}: round {round_index + 1}/{rounds}: {shown}")
    return samples


def _short(sample: Sample) -> str:
    return " ".join(f"{key.removesuffix('_s')} {value:.3f}" + (" s" if key.endswith("_s") else "") for key, value in sample.items())


def median_ratio(samples: Mapping[str, list[Sample]], numerator: str, denominator: str, key: str) -> float:
    """The median over rounds of ``numerator[key] / denominator[key]``."""
    return statistics.median(a[key] / b[key] for a, b in zip(samples[numerator], samples[denominator]))


def median_difference(samples: Mapping[str, list[Sample]], minuend: str, subtrahend: str, key: str, scale: float = 1.0) -> float:
    """The median over rounds of ``(minuend[key] - subtrahend[key]) * scale``."""
    return statistics.median((a[key] - b[key]) * scale for a, b in zip(samples[minuend], samples[subtrahend]))


def median_of(samples: Mapping[str, list[Sample]], name: str, key: str) -> float:
    return statistics.median(sample[key] for sample in samples[name])


def timed(function: Callable[[], Any]) -> Sample:
    """Wall and CPU seconds (this process, all threads) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def run_command(command: list[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> Sample:
    """Wall seconds of a child process and the CPU seconds it used; raises with its output if it fails."""
    before = os.times()
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=cwd, env=dict(env) if env is not None else None, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = os.times()
    if completed.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited with status {completed.returncode}:\n{completed.stdout[-2000:]}{completed.stderr[-2000:]}"
        )
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"wall_s": wall, "cpu_s": cpu}


def child_environment(**overrides: str) -> dict[str, str]:
    """This environment with the repository importable and one CPU thread per process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
    env.update(overrides)
    return env


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPU, cores, load, Python and package versions, commit."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for package in ("torch", "accelerate", "lightning", "numpy", "elfes"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "elfes", "launcher", "benchmarks"], cwd=REPOSITORY,
                           capture_output=True, text=True)
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average": [round(value, 2) for value in os.getloadavg()],
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": versions,
        "commit": commit.stdout.strip() or None,
        "uncommitted_changes": bool(dirty.stdout.strip()),
    }


def write_json(path: Path, machine_info: Mapping[str, Any], settings: Mapping[str, Any], rows: list[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": dict(machine_info), "settings": dict(settings), "results": [asdict(row) for row in rows]}
    path.write_text(json.dumps(payload, indent=2) + "\n")
