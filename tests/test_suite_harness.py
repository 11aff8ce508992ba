"""How the suite shares its work: reference runs started once per session whoever asks (shared_runs.py), and the
units the xdist workers take, longest first (scheduling.py)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

from scheduling import EXPECTED_S, SPREAD_FILES, file_of, queue_order, work_unit
from shared_runs import SharedRuns

REPOSITORY = Path(__file__).resolve().parents[1]


def _ask(folder: str, inputs: dict[str, Any], barrier: Any, answers: Any) -> None:
    def start(shared_folder: Path, name: str, given: dict[str, Any]) -> Path:
        with (shared_folder / "starts.jsonl").open("a") as starts:
            starts.write(json.dumps({"name": name, "inputs": given}) + "\n")
        return shared_folder / name

    shared = SharedRuns(Path(folder), start)
    barrier.wait()  # every process asks at the same moment
    answers.put(str(shared.get(inputs)))


def test_a_run_asked_for_by_several_processes_at_once_is_started_once_per_inputs(tmp_path):
    context = multiprocessing.get_context("spawn")
    barrier, answers = context.Barrier(4), context.Queue()
    asked = [{"tasks": 1}, {"tasks": 1}, {"tasks": 1}, {"tasks": 2}]
    processes = [context.Process(target=_ask, args=(str(tmp_path), inputs, barrier, answers)) for inputs in asked]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    got = sorted(answers.get(timeout=10) for _ in asked)
    starts = [json.loads(line) for line in (tmp_path / "starts.jsonl").read_text().splitlines()]
    assert sorted(start["inputs"]["tasks"] for start in starts) == [1, 2]  # one start per inputs
    one, two = (str(tmp_path / start["name"]) for start in sorted(starts, key=lambda start: start["inputs"]["tasks"]))
    assert got == sorted([one, one, one, two]) and one != two


def test_a_file_is_one_unit_of_work_and_each_test_of_a_spread_file_is_its_own():
    spread = sorted(SPREAD_FILES)[0]
    assert work_unit("tests/engine/test_kill.py::test_a[1]") == work_unit("tests/engine/test_kill.py::test_b")
    assert work_unit(f"{spread}::test_a") != work_unit(f"{spread}::test_b")
    assert work_unit(f"{spread}::test_a") == f"{spread}::test_a"


def test_the_units_are_queued_longest_first_a_file_kept_whole_in_its_order():
    spread = sorted(SPREAD_FILES)[0]
    known = next(unit for unit in EXPECTED_S if unit.startswith("tests/launcher/test_rehearse.py::"))
    collected = [("tests/a.py::one", False), ("tests/b.py::one", False), ("tests/b.py::two", False),
                 (f"{spread}::unknown", False), ("tests/slurm/c.py::one", True), ("tests/slurm/c.py::two", True),
                 (known, False)]
    queued = [collected[index][0] for index in queue_order(collected)]
    assert queued == [known, "tests/slurm/c.py::one", "tests/slurm/c.py::two", f"{spread}::unknown",
                      "tests/b.py::one", "tests/b.py::two", "tests/a.py::one"]


def test_every_unit_of_the_expected_durations_names_a_file_and_a_test_that_exist():
    """A renamed file or test would silently lose its place at the head of the queue."""
    missing = []
    for unit in EXPECTED_S:
        file = REPOSITORY / file_of(unit)
        if not file.is_file():
            missing.append(f"{unit}: no file {file_of(unit)}")
        elif "::" in unit:
            name = unit.split("::", 1)[1].split("[", 1)[0]  # a parametrized id's function
            if f"def {name}(" not in file.read_text(encoding="utf-8"):
                missing.append(f"{unit}: no `def {name}(` in {file_of(unit)}")
    assert not missing, "tests/scheduling.py EXPECTED_S names what is not there:\n" + "\n".join(missing)
