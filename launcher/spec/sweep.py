"""A sweep's members: expanded from the spec's ``sweep`` section and ``--sweep KEY=V1,V2``, named from
their overrides, and each validated as a complete job spec before anything is created. Torch-free.

>>> plan = plan_sweep("job.yaml", sweeps=["config.lr=0.001,0.003"])  # doctest: +SKIP
>>> [member.name for member in plan.members]  # doctest: +SKIP
['lr=0.001', 'lr=0.003']
>>> plan.members[0].spec.run_dir            # SWEEP_DIR/lr=0.001, with config.lr = 0.001  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .loading import read_spec_data, validate_spec_data
from .models import JobSpec, SpecError
from .overrides import Override, apply_overrides, describe_source, parse_override, parse_overrides
from .sweep_model import Sweep

MAX_NAME_CHARS = 120
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")
RESERVED_NAMES = frozenset({"submitit", "sweep.json", "scheduler.log"})


@dataclass(frozen=True)
class Member:
    """One run of the sweep: its position, folder name, overrides and validated spec."""

    index: int
    name: str
    overrides: dict[str, Any]
    spec: JobSpec


@dataclass(frozen=True)
class SweepPlan:
    """The sweep's base spec (``sweep`` included), its members in order, and how many run at once."""

    base: JobSpec
    members: tuple[Member, ...]
    max_parallel: int
    source: str

    @property
    def sweep_dir(self) -> Path:
        return self.base.run_dir


def parse_sweep_option(text: str) -> tuple[str, list[Any]]:
    """``"config.lr=0.001,0.003"`` -> ``("config.lr", [0.001, 0.003])`` (each value a YAML scalar)."""
    key, separator, raw = text.partition("=")
    if not separator or not raw.strip():
        raise SpecError(f"--sweep {text!r}: write --sweep KEY=VALUE1,VALUE2,..., e.g. --sweep config.lr=0.001,0.003")
    values = [parse_override(f"{key}={part}").value for part in raw.split(",")]
    return key.strip(), values


def wants_sweep(spec_file: str | os.PathLike[str], sets: Sequence[str] = (), sweeps: Sequence[str] = ()) -> bool:
    """Whether submitting ``spec_file`` (with ``sets``) is a sweep: it has a ``sweep`` section or ``sweeps``."""
    if sweeps:
        return True
    data = apply_overrides(read_spec_data(Path(spec_file)), parse_overrides(sets))
    return data.get("sweep") is not None


def _product(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    combinations: list[dict[str, Any]] = [{}]
    for key, values in grid.items():
        combinations = [{**combination, key: value} for combination in combinations for value in values]
    return combinations


def expand(sweep: Sweep | None, cli_grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every member's overrides: the spec's grid with ``--sweep`` keys replacing or added to it, or the
    spec's members each crossed with the ``--sweep`` grid."""
    if sweep is not None and sweep.members is not None:
        return [{**member, **combination} for member in sweep.members for combination in _product(cli_grid)]
    return _product({**(sweep.grid if sweep is not None and sweep.grid else {}), **cli_grid})


def _value_text(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def member_names(members: Sequence[Mapping[str, Any]]) -> list[str]:
    """Folder names from the overrides (``lr=0.001,seed=0``): a key by its last part unless two keys of
    the sweep share it; filesystem-safe, at most 120 characters, unique."""
    keys = list(dict.fromkeys(key for member in members for key in member))
    last_parts = [key.rsplit(".", 1)[-1] for key in keys]
    label = {key: part if last_parts.count(part) == 1 else key for key, part in zip(keys, last_parts)}
    names: list[str] = []
    for member in members:
        text = ",".join(f"{label[key]}={_value_text(value)}" for key, value in member.items()) or "base"
        name = _UNSAFE.sub("_", text)
        if name.startswith(".") or name in RESERVED_NAMES:
            name = "_" + name
        if len(name) > MAX_NAME_CHARS:
            name = f"{name[:MAX_NAME_CHARS - 9]}~{hashlib.sha1(text.encode()).hexdigest()[:8]}"
        unique, copy = name, 2
        while unique in names:
            unique, copy = f"{name}~{copy}", copy + 1
        names.append(unique)
    return names


def _member_spec(data: Mapping[str, Any], overrides: Mapping[str, Any], run_dir: Path, *, source: str,
                 base: Path, check_files: bool) -> JobSpec:
    changes = [Override(text=f"{key}={_value_text(value)}", path=tuple(key.split(".")), value=value)
               for key, value in overrides.items()]
    member = apply_overrides({key: value for key, value in data.items() if key != "sweep"}, changes)
    member["run_dir"] = str(run_dir)
    return validate_spec_data(member, source=source, base=base, check_files=check_files)


def plan_sweep(spec_file: str | os.PathLike[str], *, sets: Sequence[str] = (), sweeps: Sequence[str] = (),
               max_parallel: int | None = None, check_files: bool = True) -> SweepPlan:
    """Expand and validate every member of the sweep in ``spec_file`` (``--set`` texts ``sets`` applied to
    the base, ``--sweep`` texts ``sweeps`` added to its grid). SpecError naming each bad member and field;
    nothing is created."""
    path = Path(spec_file)
    overrides = parse_overrides(sets)
    described = describe_source(path, overrides)
    data = apply_overrides(read_spec_data(path), overrides)
    base_folder = path.absolute().parent
    base = validate_spec_data(data, source=described, base=base_folder, check_files=False)
    cli_grid: dict[str, list[Any]] = {}
    for text in sweeps:
        key, values = parse_sweep_option(text)
        if key in cli_grid:
            raise SpecError(f"--sweep {key} is given twice; give its values once: --sweep {key}=V1,V2")
        cli_grid[key] = values
    if cli_grid:  # the same rules as the spec's own sweep section (no run_dir, no sweep keys)
        validate_spec_data({**data, "sweep": {"grid": cli_grid}}, source=f"{described} (--sweep)", base=base_folder,
                           check_files=False)
    if base.sweep is None and not cli_grid:
        raise SpecError(f"{described}: no sweep to run: add a sweep section (sweep: {{grid: {{config.lr: [0.001, "
                        "0.003]}}}}) or --sweep KEY=V1,V2, or leave out --max-parallel")
    overrides_list = expand(base.sweep, cli_grid)
    names = member_names(overrides_list)
    members, problems = [], []
    # Compared as typed values: 1, true and 1.0 are three members (Python's == calls them one).
    typed = [json.dumps(member_overrides, sort_keys=True) for member_overrides in overrides_list]
    for index, (name, member_overrides) in enumerate(zip(names, overrides_list)):
        earlier = next((j for j in range(index) if typed[j] == typed[index]), None)
        if earlier is not None:
            problems.append(f"sweep member {index} ({name}) repeats member {earlier} ({names[earlier]}); "
                            "give each combination once")
            continue
        try:
            spec = _member_spec(data, member_overrides, base.run_dir / name, source=f"{described}, sweep member "
                                f"{index} ({name})", base=base_folder, check_files=check_files)
        except SpecError as error:
            problems.append(str(error) if f"sweep member {index}" in str(error)
                            else f"sweep member {index} ({name}): {error}")
            continue
        members.append(Member(index, name, dict(member_overrides), spec))
    if problems:
        raise SpecError("\n".join(problems))
    chosen = max_parallel if max_parallel is not None else (base.sweep.max_parallel if base.sweep else None)
    if chosen is not None and chosen < 1:
        raise SpecError(f"--max-parallel {chosen}: must be an integer >= 1")
    return SweepPlan(base, tuple(members), chosen or len(members), described)
