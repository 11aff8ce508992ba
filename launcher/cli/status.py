"""``elfes status``'s human view: a table where it fits the console, else a block of lines per run that
wrap instead of cutting a cell. Printing only; the data is launcher/commands/status.py's. Part of the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text


def _cell(value: Any) -> str:
    from elfes.records.plain import format_number

    return "-" if value is None else format_number(value)


def progress(result: Any) -> str:
    """``40/1500``; ``-`` before the run records name a step."""
    if result.step is None:
        return "-"
    return _cell(result.step) if result.planned_steps is None else f"{_cell(result.step)}/{_cell(result.planned_steps)}"


def _best(result: Any) -> str:
    if result.best_metric is None:
        return "-"
    return f"{result.monitor or 'metric'} {_cell(result.best_metric)} @ {_cell(result.best_step)}"


def _short_checkpoint(result: Any) -> str:
    """``checkpoints/step-...pt`` (relative to the run directory); the JSON has the full path."""
    checkpoint: str | None = result.last_checkpoint
    if not checkpoint:
        return "-"
    return checkpoint.removeprefix(result.run_dir.rstrip("/") + "/")


def _retrying(result: Any) -> bool:
    """Whether the run is requeued because its latest attempt failed and is retried."""
    failure = result.attempts[-1].get("failure") if result.attempts else None
    from ..rundir.state import RunStatus

    return result.status == RunStatus.REQUEUED and bool(failure and failure.get("retried"))


def _status(result: Any) -> str:
    """The run's status with SLURM's queue state and reason: ``pending [PENDING (BeginTime)]``; a run
    requeued after a failure is ``failed (retrying)``."""
    status = "failed (retrying)" if _retrying(result) else result.status
    if not result.queue_state:
        return status
    queue = f"{result.queue_state} ({result.queue_reason})" if result.queue_reason else result.queue_state
    return f"{status} [{queue}]"


def _job(result: Any) -> str:
    return (f"{result.executor or '-'} {result.job_id or ''}".strip()
            + (f" (restarts {result.restart_count})" if result.restart_count else ""))


def _requeues(result: Any) -> str:
    failures = getattr(result, "failures_used", 0)
    from ..rundir.state import Launch

    since = getattr(result, "failures_counted_since", Launch.SUBMIT)
    earlier = sum(1 for a in result.attempts if (a.get("failure") or {}).get("retried")) - failures
    return (f"{result.requeues_used} used, {_cell(result.requeues_left)} left"
            + (f"; {failures} failure{'s' if failures != 1 else ''} retried since the {since}" if failures or earlier
               else "") + (f" ({earlier} before it)" if earlier > 0 else ""))


def _outcome(attempt: dict[str, Any]) -> str:
    """``failed (retried)``, ``failed (not retried)`` for a failure the runtime decided on; else the outcome."""
    failure = attempt.get("failure")
    if failure is None:
        return attempt["outcome"] or "-"
    return f"{attempt['outcome']} ({'retried' if failure['retried'] else 'not retried'})"


def _time(text: str | None) -> str:
    """``2026-01-02 03:04:05`` from state.json's ISO time in UTC (milliseconds and offset dropped)."""
    return "-" if not text else text.replace("T", " ")[:19]


def _attempt_cells(attempt: dict[str, Any]) -> list[str]:
    return [str(attempt["number"]), attempt["launch"], attempt["job_id"], ",".join(attempt["hosts"]) or "-",
            str(attempt["world_size"]), _time(attempt["started_at"]), _time(attempt["ended_at"]), _outcome(attempt),
            attempt["signal"] or "-", _cell(attempt["step"])]


def _runs_table(results: Sequence[Any]) -> Table:
    table = Table(show_edge=False)
    for column in ("run", "status", "job", "attempts", "requeues", "step", "best", "last checkpoint"):
        table.add_column(column, no_wrap=True)
    for result in results:
        table.add_row(f"{result.name or '?'} ({result.run_dir})", _status(result), _job(result),
                      str(len(result.attempts)), _requeues(result), progress(result), _best(result),
                      _short_checkpoint(result))
    return table


def _attempts_table(result: Any) -> Table:
    table = Table(title="attempts (UTC)", show_edge=False)
    for column in ("#", "launch", "job", "hosts", "ranks", "started", "ended", "outcome", "signal", "step"):
        table.add_column(column, no_wrap=True)
    for attempt in result.attempts:
        table.add_row(*_attempt_cells(attempt))
    return table


def _run_block(result: Any, *, with_attempts: bool) -> RenderableType:
    """One run as lines: what matters first, every value whole (long ones wrap)."""
    head = Text(f"{result.name or '?'}: {_status(result)}, step {progress(result)}", style="bold")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    rows = [("run directory", result.run_dir), ("job", _job(result)),
            ("attempts", f"{len(result.attempts)}; requeues {_requeues(result)}"), ("best", _best(result)),
            ("last checkpoint", _short_checkpoint(result))]
    if with_attempts:
        for attempt in result.attempts:
            number, launch, job, hosts, ranks, started, ended, outcome, signal, step = _attempt_cells(attempt)
            rows.append((f"attempt {number}", f"{outcome}" + ("" if signal == "-" else f" ({signal})")
                         + f" at step {step}; {launch}, job {job} on {hosts}, {ranks} rank{'' if ranks == '1' else 's'}; "
                         f"{started} to {ended} UTC"))
    for key, value in rows:
        grid.add_row(key, value)
    return Group(head, Padding(grid, (0, 0, 0, 2)))


def goodput_line(data: dict[str, Any]) -> str:
    """``goodput 81.2% of 1h02m: useful training 50m, ...`` from a status's JSON goodput."""
    from elfes.records.goodput import Goodput, TimeParts, format_goodput

    return format_goodput(Goodput(wall_s=data["wall_s"], parts=TimeParts(**data["parts"]),
                                  redone_steps=data["redone_steps"]))


def _fits(console: Console, renderable: RenderableType) -> bool:
    unbounded = console.options.update_width(1_000_000)  # a table measures itself within the width it is given
    return Measurement.get(console, unbounded, renderable).maximum <= console.width


def print_status(console: Console, results: Sequence[Any]) -> None:
    """The status of ``results`` (launcher.commands.status.Status), its notes and errors below it."""
    single = len(results) == 1 and bool(results[0].attempts)
    tables: list[Table] = [_runs_table(results)] + ([_attempts_table(results[0])] if single else [])
    if all(_fits(console, table) for table in tables):
        for table in tables:
            console.print(table)
    else:
        for result in results:
            console.print(_run_block(result, with_attempts=single))
    for result in results:
        for attempt in result.attempts[:-1]:  # earlier failures: their causes, and whether each was retried
            if attempt.get("failure") is not None and attempt.get("error"):
                console.print(f"{result.name or result.run_dir}: attempt {attempt['number']} failed: {attempt['error']}",
                              markup=False)
        for node in getattr(result, "excluded_nodes", []):
            console.print(f"{result.name or result.run_dir}: node {node['host']} excluded after attempt "
                          f"{node['attempt']} failed there ({node['cause']}); `elfes resume --include-nodes` allows it "
                          "again", markup=False)
        if single and getattr(result, "goodput", None) is not None:
            console.print(f"{result.name or result.run_dir}: {goodput_line(result.goodput)}", markup=False)
        if single and result.ran_on:
            console.print(f"{result.name or result.run_dir}: latest attempt ran on {result.ran_on}", markup=False)
        if result.error:
            console.print(f"{result.name or result.run_dir}: error: {result.error}", markup=False)
        for note in result.notes:
            console.print(f"{result.name or result.run_dir}: {note}", markup=False)

