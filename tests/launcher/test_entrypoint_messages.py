"""A bad entrypoint is refused for what is wrong with it; "give exactly one of entrypoint and command" is
said only when a spec gives both or neither."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_fixtures import write_project

from elfes.launcher.cli.main import main


@pytest.mark.parametrize("entrypoint", ["not valid", "train", "train:", "1train:main"])
def test_a_malformed_entrypoint_is_refused_without_the_exactly_one_rule(tmp_path: Path, capsys, entrypoint: str):
    spec = write_project(tmp_path)
    spec.write_text(spec.read_text().replace("entrypoint: train:main", f"entrypoint: {entrypoint!r}"))
    assert main(["validate", str(spec), "--executor", "local"]) == 2
    error = capsys.readouterr().err
    assert f"entrypoint = {entrypoint!r}".replace("'", '"') in error and "must be 'module:function'" in error
    assert "exactly one" not in error.lower(), error


@pytest.mark.parametrize(("lines", "given"), [("command: [python, train.py]\n", "both"), (None, "neither")])
def test_both_or_neither_say_give_exactly_one(tmp_path: Path, capsys, lines: str | None, given: str):
    spec = write_project(tmp_path)
    text = spec.read_text()
    spec.write_text(text + lines if lines else text.replace("entrypoint: train:main\n", ""))
    assert main(["validate", str(spec), "--executor", "local"]) == 2
    error = capsys.readouterr().err
    assert given in error and "give exactly one of entrypoint ('module:function') and command (a list)" in error
