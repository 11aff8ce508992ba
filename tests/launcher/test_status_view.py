"""`elfes status` for people: a table where it fits the terminal, else a block per run that wraps and
cuts nothing; `-` where the run records name no step yet; a spec given instead of its run directory."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from run_fixtures import make_run, write_project

from elfes.launcher.cli.main import main
from elfes.launcher.cli.status import print_status
from elfes.launcher.commands import status as status_report

ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def terminal(monkeypatch, columns: int) -> None:
    """Make `elfes status` see a terminal `columns` wide (rich reads both variables)."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("COLUMNS", str(columns))


def shown(capsys) -> str:
    return ESCAPES.sub("", capsys.readouterr().out)


@pytest.fixture
def deep(tmp_path: Path) -> Path:
    """A folder whose paths alone are wider than 80 columns."""
    return tmp_path / "a folder with spaces" / ("experiments-of-a-long-project-name-" * 2)


def test_at_80_columns_status_shows_status_and_step_whole(deep: Path, monkeypatch, capsys):
    paths = make_run(deep, name="quickstart", outcome="finished", step=10)
    terminal(monkeypatch, 80)
    assert main(["status", str(paths.run_dir)]) == 0
    output = shown(capsys)
    assert "…" not in output, output
    assert "quickstart: finished, step 10/10" in output
    assert all(len(line) <= 80 for line in output.splitlines())
    folded = output.split("run directory", 1)[1].split("\n  job", 1)[0]
    assert re.sub(r"\s", "", folded) == re.sub(r"\s", "", str(paths.run_dir)), "the run directory whole, wrapped"
    assert re.search(r"attempt 1\s+finished \(SIGTERM\)|attempt 1\s+finished at step 10", output), output


def test_at_80_columns_several_runs_get_a_block_each(deep: Path, monkeypatch, capsys):
    first = make_run(deep / "a", name="first", outcome="stopped", step=1500)
    second = make_run(deep / "b", name="second", outcome="failed", step=3)
    terminal(monkeypatch, 80)
    assert main(["status", str(first.run_dir), str(second.run_dir)]) == 0
    output = shown(capsys)
    assert "…" not in output
    assert "first: stopped, step 1500/10" in output and "second: failed, step 3/10" in output
    assert "second: error: RuntimeError: boom" in output


def test_a_wide_terminal_gets_the_table(tmp_path: Path, monkeypatch, capsys):
    paths = make_run(tmp_path, outcome="stopped", step=4)
    terminal(monkeypatch, 400)
    assert main(["status", str(paths.run_dir)]) == 0
    output = shown(capsys)
    (row,) = [line for line in output.splitlines() if line.startswith(" demo (")]
    assert re.search(r"│ stopped\s+│ local \d+\s+│ 1\s+│ 0 used, 3 left\s+│ 4/10\s+│ validation/loss 0.5 @ 4", row), row
    assert "…" not in output and "attempts (UTC)" in output


def test_piped_status_follows_columns_where_it_is_set(deep: Path, monkeypatch, capsys):
    paths = make_run(deep, name="quickstart", outcome="finished", step=10)
    assert main(["status", str(paths.run_dir)]) == 0  # a pipe, no COLUMNS: the table, however wide
    (row,) = [line for line in shown(capsys).splitlines() if line.startswith(" quickstart (")]
    assert len(row) > 80 and "│ finished" in row
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["status", str(paths.run_dir)]) == 0
    output = shown(capsys)
    assert "quickstart: finished, step 10/10" in output
    assert all(len(line) <= 80 for line in output.splitlines()), output


@pytest.mark.parametrize("width", [40, 80, 120])
def test_no_cell_is_cut_at_any_width(tmp_path: Path, width: int):
    results = status_report.status([make_run(tmp_path / ("long-name-" * 3), outcome="cancelled", step=1234).run_dir])
    console = Console(file=io.StringIO(), force_terminal=True, width=width)
    print_status(console, results)
    output = ESCAPES.sub("", console.file.getvalue())
    assert "…" not in output and "cancelled" in output and "1234/10" in output


def test_before_the_first_step_the_step_is_a_dash(tmp_path: Path, monkeypatch, capsys):
    paths = make_run(tmp_path, outcome=None, step=0)
    paths.events.unlink()  # the job has not logged anything yet
    terminal(monkeypatch, 400)
    assert main(["status", str(paths.run_dir)]) == 0
    output = shown(capsys)
    assert "n/a" not in output
    (row,) = [line for line in output.splitlines() if line.startswith(" demo (")]
    assert re.search(r"│ 0 used, 3 left\s+│ -\s+│ -", row), row
    assert main(["status", str(paths.run_dir), "--json"]) == 0
    assert '"step": null' in capsys.readouterr().out


def test_status_of_a_spec_names_its_run_directory(tmp_path: Path, capsys):
    spec = write_project(tmp_path)
    assert main(["status", str(spec)]) == 2
    error = capsys.readouterr().err
    assert f"{spec} is a job spec, not a run directory" in error
    assert f"elfes status {tmp_path / 'runs' / 'demo'}" in error and "elfes submit" in error
    assert main(["logs", str(spec)]) == 2
    assert "is a job spec, not a run directory" in capsys.readouterr().err


def test_a_data_warning_of_the_latest_start_shows_in_status_however_long_the_attempt_ran(tmp_path, capsys):
    import json

    from run_fixtures import events

    paths = make_run(tmp_path, name="streamed", outcome=None, step=4)
    recorded = events(4, 10)
    message = "The training stream is shuffled with shuffle(buffer_size=8), whose buffer no checkpoint holds"
    warning = {"event": "warning", "time": recorded[0]["time"], "kind": "inexact_stream", "message": message}
    train = recorded[1]
    # the warning right after the start, then more train events than status reads of the file's tail
    lines = [recorded[0], warning] + [train] * (2 * 256 * 1024 // len(json.dumps(train)))
    paths.events.write_text("".join(json.dumps(event) + "\n" for event in lines))
    assert main(["status", str(paths.run_dir)]) == 0
    assert f"streamed: {message}" in " ".join(shown(capsys).split())
    assert message in status_report.run_status(paths.run_dir).notes

    resumed = {**recorded[0], "event": "resumed", "resumed_from": "last"}  # a later start without the warning
    with open(paths.events, "a") as handle:
        handle.write(json.dumps(resumed) + "\n")
    assert message not in status_report.run_status(paths.run_dir).notes
