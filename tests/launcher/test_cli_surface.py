"""Snapshots of the public surface: the job spec's JSON Schema and `elfes --help` (every verb), so that
they change only on purpose. Regenerate with ELFES_UPDATE_GOLDEN=1 and review the diff."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

from elfes.launcher.cli.exit_codes import EXIT_CODES
from elfes.launcher.cli.main import main
from elfes.launcher.cli.parser import build_parser

GOLDEN = Path(__file__).parent / "golden"
# argparse's layout differs between Python versions: the exact help text is compared on this one.
HELP_PYTHON = (3, 11)


def check(name: str, text: str) -> None:
    golden = GOLDEN / name
    if os.environ.get("ELFES_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"{name} changed; if on purpose, regenerate with ELFES_UPDATE_GOLDEN=1"


def verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_json_schema_matches_its_snapshot(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    check("schema.json", json.dumps(schema, indent=2, sort_keys=True) + "\n")
    assert schema["additionalProperties"] is False and set(schema["required"]) == {"name", "run_dir"}
    assert schema["$defs"]["Resources"]["properties"]["timeout_min"]["default"] == 60


def test_the_verbs_and_their_options_match_their_snapshot():
    surface = {
        name: sorted(option for action in sub._actions for option in (action.option_strings or [action.dest]))
        for name, sub in verbs(build_parser()).items()
    }
    check("cli-options.json", json.dumps(surface, indent=2, sort_keys=True) + "\n")


def test_the_help_texts_match_their_snapshot(monkeypatch, capsys):
    if sys.version_info[:2] != HELP_PYTHON:
        pytest.skip(f"the help snapshot is argparse's layout on Python {HELP_PYTHON[0]}.{HELP_PYTHON[1]}")
    monkeypatch.setenv("COLUMNS", "100")
    texts = []
    for argv in [[], *([name] for name in verbs(build_parser()))]:
        with pytest.raises(SystemExit) as exit:
            main([*argv, "--help"])
        assert exit.value.code == 0
        texts.append(f"$ elfes {' '.join([*argv, '--help'])}\n{capsys.readouterr().out}")
    check("help.txt", "\n".join(texts))
    assert EXIT_CODES in texts[0]


@pytest.mark.parametrize("columns", [60, 80])
def test_every_help_text_fits_the_terminal_and_keeps_its_tables(monkeypatch, capsys, columns: int):
    monkeypatch.setenv("COLUMNS", str(columns))
    for argv in [[], *([name] for name in verbs(build_parser()))]:
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        text = capsys.readouterr().out
        wide = [line for line in text.splitlines() if len(line) > columns]
        assert wide == [], f"elfes {' '.join(argv)} --help at {columns} columns"
        assert "\n  130  interrupted (Ctrl-C); a submission" in text, "an exit-code row keeps its columns"
        assert "\n       " in text.split("exit codes:", 1)[1], "a wrapped row continues under its second column"
    with pytest.raises(SystemExit):
        main(["--help"])
    words = " ".join(capsys.readouterr().out.split())  # the description, wrapped, says all it said
    assert "ELFES: training jobs that survive preemption bitwise-exactly. One YAML file describes a job;" in words


def test_bad_arguments_exit_2_with_the_usage_and_no_traceback(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["submit"])
    captured = capsys.readouterr()
    assert exit.value.code == 2 and "the following arguments are required: JOB.yaml" in captured.err
    assert "Traceback" not in captured.err
