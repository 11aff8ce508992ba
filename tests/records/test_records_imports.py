"""The records package stays light: login-node tools import it without torch, rich or numpy."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import elfes.records

REPOSITORY = Path(__file__).resolve().parents[2]
PACKAGE = Path(elfes.records.__file__).parent
HEAVY = ("torch", "rich", "numpy")


@pytest.mark.parametrize(
    "statement",
    [
        "import elfes.records",
        "from elfes.records import read_events, summarize, format_summary, RunSummary, event_reference, RunLogger",
        # A logger on a non-main rank shows nothing, so it needs no console either.
        "from elfes.records import RunLogger; RunLogger('unused', is_main_process=False).close()",
    ],
)
def test_reading_and_summarising_import_neither_torch_nor_rich_nor_numpy(statement):
    code = f"import sys\n{statement}\nprint(' '.join(name for name in {HEAVY!r} if name in sys.modules))"
    completed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPOSITORY,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "", f"{statement!r} imported {completed.stdout.strip()}"


def imported_top_level_names(path: Path) -> set[str]:
    """Top-level packages a module imports when it runs (``if TYPE_CHECKING:`` blocks do not run)."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return names


def test_the_console_is_the_only_room_that_imports_rich():
    importers = sorted(path.name for path in PACKAGE.glob("*.py") if "rich" in imported_top_level_names(path))
    assert importers == ["console.py"]
    # Only the TensorBoard mirror reaches torch (torch.utils.tensorboard, inside the function that opens a writer);
    # RunLogger imports it only when a mirror is asked for.
    assert sorted(path.name for path in PACKAGE.glob("*.py") if "torch" in imported_top_level_names(path)) == [
        "tensorboard.py"]


def test_no_module_of_the_package_is_over_400_lines():
    lengths = {path.name: len(path.read_text().splitlines()) for path in PACKAGE.glob("*.py")}
    assert {"schema.py", "writer.py", "reader.py", "summary.py", "plain.py", "console.py"} <= set(lengths)
    assert max(lengths.values()) <= 400, lengths
