"""Continuing a run on another world size: what its layout must keep (torch-free: the launcher refuses with the
same words at ``elfes resume``, before anything is submitted; the engine refuses at the resume itself).

An update sums over a window of world size x ``gradient_accumulation_steps`` microbatches, and rank r reads the
epoch's batches r, r + world, r + 2 world, ...: a run continues on another world size when the window, and the
epoch's batches over all ranks, stay (elfes/engine/resize.py remaps each rank's state). A layout is the mapping a
checkpoint records (``world_size``, ``gradient_accumulation_steps``, ``batches_per_epoch`` per rank, ``sharding``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Layout entries that differ per rank count, checked as one window by :func:`resize_problems` instead.
PER_WORLD_LAYOUT = ("world_size", "sharding", "gradient_accumulation_steps", "batches_per_epoch")


def window(layout: Mapping[str, Any]) -> int:
    """Microbatches per update over all ranks."""
    return int(layout["world_size"]) * int(layout["gradient_accumulation_steps"])


def describe(layout: Mapping[str, Any]) -> str:
    """``2 ranks x accumulation 2`` of a layout."""
    return f"{_ranks(int(layout['world_size']))} x accumulation {layout['gradient_accumulation_steps']}"


def _ranks(count: int) -> str:
    return f"{count} rank{'s' if count != 1 else ''}"


def _divisors(number: int, shown: int = 8) -> str:
    """``1, 2, 4 or 8``: the world sizes that divide ``number``, the smallest ``shown`` of them."""
    small = [d for d in range(1, int(number**0.5) + 1) if number % d == 0]
    found = sorted({*small, *(number // d for d in small)})
    if len(found) > shown:
        return f"{', '.join(map(str, found[:shown]))}, ..."
    return str(found[0]) if len(found) == 1 else f"{', '.join(map(str, found[:-1]))} or {found[-1]}"


def keeping_the_window(found: Mapping[str, Any], world: int) -> str:
    """How a run on ``world`` ranks keeps the window of checkpoint layout ``found``: the accumulation that does, or
    the world sizes that can."""
    old = window(found)
    if old % world:
        return f"no accumulation on {_ranks(world)} keeps it: use a world size that divides {old} ({_divisors(old)})"
    return (f"{_ranks(world)} x accumulation {old // world} keeps the window of {old} microbatches: set "
            f"Accelerator(gradient_accumulation_steps={old // world}), as a job does that derives it from the world "
            "size (window // world_size; the guide's 'Continuing on another world size')")


def window_problem(found: Mapping[str, Any], world: int, asked: str) -> str:
    """Why ``world`` ranks cannot continue a checkpoint of layout ``found``: they change its window (``asked``: what
    the run has, or the spec asks for). The engine's refusal and the launcher's say it in these words alike."""
    return (f"world_size: the checkpoint was written on {describe(found)} (a window of {window(found)} microbatches "
            f"per update) and {asked}; continuing needs the same window, so that every update trains on the same "
            f"samples: {keeping_the_window(found, world)}")


def epoch_batches(layout: Mapping[str, Any]) -> int:
    """The batches of an epoch over all ranks (``batches_per_epoch`` is one rank's)."""
    return int(layout["batches_per_epoch"]) * int(layout["world_size"])


def per_rank_data_problem(per_rank_data: str) -> str:
    """Why a loader whose position each rank keeps (``per_rank_data`` names it) cannot continue on another size."""
    return (f"data: {per_rank_data}, whose position each rank keeps for itself and no other world size can take "
            "over; continue on the same world size, or read a map-style dataset through the engine's sampler "
            "(DataLoader(dataset, shuffle=True), with or without workers), whose position is the run's")


def resize_problems(found: Mapping[str, Any], expected: Mapping[str, Any], *, per_rank_data: str | None) -> list[str]:
    """Why a checkpoint of layout ``found`` cannot continue on this run's ``expected`` world size (empty when it
    can); ``per_rank_data`` names the training loader's per-rank position, if it keeps one."""
    old, new = window(found), window(expected)
    world = int(expected["world_size"])
    problems = []
    if old != new:
        problems.append(window_problem(found, world, f"this run has {describe(expected)} ({new})"))
    elif found.get("batches_per_epoch") is not None and expected.get("batches_per_epoch") is not None:
        before, after = epoch_batches(found), epoch_batches(expected)
        if before != after:
            problems.append(f"batches_per_epoch: the checkpoint's epoch has {before} batches over all ranks, this "
                            f"run's has {after}; continue with the same data and batch size")
    if (found.get("sharding") is None) != (expected.get("sharding") is None):
        sharded = "sharded" if found.get("sharding") is not None else "not sharded"
        problems.append(f"sharding: the checkpoint's model is {sharded}, this run's is "
                        f"{'not ' if expected.get('sharding') is None else ''}sharded")
    if per_rank_data is not None and old == new:
        problems.append(per_rank_data_problem(per_rank_data))
    return problems


def world_size_problems(found: Mapping[str, Any], world: int, *, per_rank_data: str | None) -> list[str]:
    """Why no run on ``world`` ranks, whatever its accumulation, can continue a checkpoint of layout ``found``
    (``per_rank_data``: its loader's per-rank position, where it kept one): what the launcher can tell from the
    spec alone. Empty on the same world size, and where only the job's own accumulation decides."""
    if world == int(found["world_size"]):
        return []
    old = window(found)
    problems = []
    if old % world:
        problems.append(window_problem(found, world, f"the spec asks for {_ranks(world)}"))
    elif found.get("batches_per_epoch") is not None:
        epoch = epoch_batches(found)
        if epoch % world:
            problems.append(f"batches_per_epoch: the checkpoint's epoch has {epoch} batches over all ranks, which "
                            f"{_ranks(world)} cannot share equally; use a world size that divides {epoch} "
                            f"({_divisors(epoch)})")
    if per_rank_data is not None and not problems:
        problems.append(per_rank_data_problem(per_rank_data))
    return problems
