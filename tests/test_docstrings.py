"""Docstrings stay true to the code: every module or object they name exists, and every ``>>>`` example runs
(or is marked ``# doctest: +SKIP`` because it needs a run, a cluster or a file that a docstring cannot make)."""

from __future__ import annotations

import ast
import doctest
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGES = ("elfes", "launcher")
# `elfes.engine.Trainer`, `launcher.rundir.state`: a dotted name that starts at one of the packages.
DOTTED_NAME = re.compile(r"(?<![\w./])((?:elfes|launcher)(?:\.[A-Za-z_]\w*)+)")
# launcher/rundir/state.py, docs/engine.md, tests/slurm: a path from the repository's root.
REPOSITORY_PATH = re.compile(r"(?<![\w/.-])((?:elfes|launcher|tests|benchmarks|examples|docs|templates)/[\w/.-]*\w)")


def source_files() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (REPOSITORY / package).rglob("*.py"))


def module_name(path: Path) -> str:
    """The importable name: the top-level launcher/ folder is installed as elfes.launcher (pyproject.toml)."""
    parts = list(path.relative_to(REPOSITORY).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["elfes", *parts] if parts[0] == "launcher" else parts)


def docstrings(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield getattr(node, "lineno", 1), text


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute reached from the longest importable module prefix."""
    parts = dotted.split(".")
    if parts[0] == "launcher":
        parts.insert(0, "elfes")
    for length in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:length]))
        except ImportError:
            continue
        for attribute in parts[length:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_module_or_path_a_docstring_names_exists():
    broken = []
    for path in source_files():
        for line, text in docstrings(path):
            where = f"{path.relative_to(REPOSITORY)}:{line}"
            broken += [f"{where}: {name}" for name in DOTTED_NAME.findall(text) if not resolves(name.rstrip("."))]
            broken += [f"{where}: {name}" for name in REPOSITORY_PATH.findall(text)
                       if not (REPOSITORY / name).exists()]
    assert not broken, "docstrings name what does not exist; name the module where it lives now:\n" + "\n".join(broken)


def test_the_reference_check_finds_a_name_or_path_that_is_gone():
    assert resolves("elfes.engine.Trainer") and resolves("launcher.rundir.paths.RunPaths")
    assert not resolves("launcher.liveness.liveness") and not resolves("elfes.engine.NoSuchThing")
    assert REPOSITORY_PATH.findall("see launcher/cli.py, then docs/engine.md.") == ["launcher/cli.py", "docs/engine.md"]


def modules_with_examples() -> list[str]:
    return [module_name(path) for path in source_files() if ">>>" in path.read_text()]


@pytest.mark.parametrize("name", modules_with_examples())
def test_every_docstring_example_runs_or_is_marked(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=False)
    assert result.failed == 0, (f"{name}: {result.failed} of {result.attempted} docstring examples fail (python -m "
                                f"doctest -v on the module shows which); fix them, or mark one that needs a run or a "
                                f"cluster with '# doctest: +SKIP'")
