"""RunPaths names what the engine writes into a run directory by the engine's own names, and those names have one
home (elfes/contract.py): no other module of elfes/ or launcher/ spells one."""

from __future__ import annotations

import ast
from pathlib import Path

from elfes import contract
from elfes.launcher.rundir.paths import RunPaths
from elfes.records import EVENTS_FILE_NAME
from elfes.records.tensorboard import TENSORBOARD_DIR_NAME, tensorboard_dir
from elfes.records.timings import timings_path
from elfes.records.tracking import tracker_state_path, tracking_dir, wandb_dir

REPOSITORY = Path(__file__).resolve().parents[2]
# What the engine writes in a run directory, by the contract's names.
CONTRACT_NAMES = (contract.EVENTS_FILE_NAME, contract.TIMINGS_FILE_NAME, contract.TRACKING_DIR_NAME,
                  contract.LIFECYCLE_FILE_NAME, contract.TENSORBOARD_DIR_NAME)


def test_run_paths_agree_with_the_engines_file_names(tmp_path):
    paths = RunPaths(tmp_path / "run")
    assert paths.events.name == EVENTS_FILE_NAME
    assert paths.tensorboard == tensorboard_dir(tmp_path / "run")
    assert paths.tensorboard.name == TENSORBOARD_DIR_NAME
    assert paths.tracking == tracking_dir(tmp_path / "run") and paths.tracking / "wandb" == wandb_dir(tmp_path / "run")
    assert paths.tracker_state("mlflow") == tracker_state_path(tmp_path / "run", "mlflow")
    assert (paths.checkpoints, paths.last) == (tmp_path / "run" / "checkpoints", tmp_path / "run" / "checkpoints" / "last")
    assert paths.plot == tmp_path / "run" / "plot.png"
    assert paths.timings == timings_path(tmp_path / "run")


def names_spelled_by_hand(tree: ast.Module, names: tuple[str, ...] = CONTRACT_NAMES) -> list[tuple[int, str]]:
    """(line, name) for each of ``names`` that the module's code (not its documentation) spells: a string equal to
    a file name, a path joined with one (``run_dir / "tracking"``), or a string that ends with ``/<name>``."""
    documentation = {id(node.value) for node in ast.walk(tree)
                     if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found += [(node.lineno, side.value) for side in (node.left, node.right)
                      if isinstance(side, ast.Constant) and side.value in names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in documentation:
            found += [(node.lineno, name) for name in names
                      if ("." in name and node.value == name) or node.value.endswith(f"/{name}")]
    return sorted(set(found))


def test_no_module_spells_a_run_directory_name_the_contract_owns():
    """A copy of ``"events.jsonl"`` or ``run_dir / "tracking"`` outside elfes/contract.py fails here: the engine and
    RunPaths build those paths from the contract's names."""
    files = [file for package in ("elfes", "launcher") for file in sorted((REPOSITORY / package).rglob("*.py"))
             if file != REPOSITORY / "elfes" / "contract.py"]
    spelled = [f"{file.relative_to(REPOSITORY)}:{line}: {name!r}" for file in files
               for line, name in names_spelled_by_hand(ast.parse(file.read_text(encoding="utf-8")))]
    assert spelled == [], "use elfes.contract's name instead:\n" + "\n".join(spelled)


def test_the_scan_finds_each_way_of_spelling_a_name_and_leaves_prose_alone():
    source = '''
"""A run writes events.jsonl."""
EVENTS = "events.jsonl"
def where(run_dir, settings):
    """Its tracking/ folder."""
    message = f"no events.jsonl in {run_dir}: wait for the run"
    settings.get("tracking")
    return run_dir / "tracking", f"{run_dir}/timings.json", message
'''
    assert names_spelled_by_hand(ast.parse(source)) == [(3, "events.jsonl"), (8, "timings.json"), (8, "tracking")]
