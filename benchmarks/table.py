"""The results table: on the terminal (rich) and as Markdown for benchmarks/results/ and the README."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from .measure import Row

COLUMNS = ("benchmark", "case", "measure", "ELFES", "reference", "result", "target", "holds")


def number(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("µs", "samples/s", "reads", "MB/s"):
        return f"{value:,.0f} {unit}"
    if unit == "s":
        return f"{value:.3f} s"
    return f"{value:.3g} {unit}".strip()


def result_text(row: Row) -> str:
    if row.kind == "ratio":
        return f"{row.result:.3f}x"
    if row.kind == "difference":
        return f"{row.result:+,.{0 if row.unit in ('µs', 'reads') else 3}f} {row.unit}"
    return number(row.result, row.unit)


def cells(row: Row) -> list[str]:
    reference = number(row.reference, row.unit)
    if row.reference_name and row.reference is not None:
        reference = f"{reference} ({row.reference_name})"
    holds = "-" if row.holds is None else ("yes" if row.holds else "NO")
    target = row.target or "-"
    if row.target and row.kind == "ratio":
        target = f"{row.target}x"
    elif row.target:
        target = f"{row.target} {row.unit}"
    return [row.benchmark, row.case, row.measure, number(row.value, row.unit), reference, result_text(row), target, holds]


def caption(info: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in info["versions"].items() if version and name != "elfes")
    return (
        f"{info['date']}, commit {info['commit']}{' (with uncommitted changes)' if info['uncommitted_changes'] else ''}; "
        f"{info['cpu']}, {info['cores']} cores, load average {info['load_average'][0]} at the start; Python {info['python']}, "
        f"{versions}; median of {settings['rounds']} interleaved round(s); the whole run took {settings['wall_s']:.0f} s"
        + ("; SMOKE SIZES: a check that every benchmark runs, not a measurement" if settings["smoke"] else "")
    )


def print_table(rows: list[Row], info: Mapping[str, Any], settings: Mapping[str, Any]) -> None:
    table = Table(title="ELFES benchmarks", caption=caption(info, settings))
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("benchmark", "case", "measure") else "right")
    for row in rows:
        table.add_row(*cells(row))
    Console(width=max(Console().width, 160)).print(table)


def markdown_table(rows: list[Row], info: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in cells(row)) + " |" for row in rows]
    return "\n".join(lines) + f"\n\n{caption(info, settings)}.\n"
