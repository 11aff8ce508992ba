"""RunLogger's TensorBoard mirror, read back with TensorBoard's own event reader: one value per step after
resumes, a killed attempt's steps replaced by their redo, the switch by argument or environment, and a
clear message where the tensorboard package is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_events import checkpoint, evaluation, plain_console, run_end, started, train

from elfes.records import RunLogger

pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install -e '.[test]' installs it")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def patient_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mirror writes from its thread: a close waits for it as long as a loaded test machine needs (its first
    import of torch.utils.tensorboard), also at a stop, whose wait is otherwise the flush's 20 s."""
    monkeypatch.setenv("ELFES_TRACKER_FLUSH_TIMEOUT_S", "300")


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    accumulator = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def log_attempt(run_dir: Path, events: list[dict], **options) -> None:
    with RunLogger(run_dir, is_main_process=True, console=plain_console(), **options) as logger:
        for event in events:
            logger.log(event)


def test_a_killed_attempts_steps_are_replaced_by_their_redo_and_no_step_is_written_twice(tmp_path):
    log_attempt(tmp_path, [started(), train(1, loss=1.0), train(2, loss=0.9), checkpoint(2),
                           run_end(2, reason="SIGTERM")], trackers={"tensorboard": {}})
    # The second attempt resumes at 2 and is killed after step 4: nothing ends it, nothing saves past 2.
    log_attempt(tmp_path, [started(2, resumed_from="last"), train(3, loss=0.7), train(4, loss=0.6)],
                trackers={"tensorboard": {}})
    log_attempt(tmp_path, [started(2, resumed_from="last"), train(3, loss=0.8), train(4, loss=0.75),
                           evaluation(4, 0.5, improved=True, best=0.5, best_step=4), train(5, loss=0.5)],
                trackers={"tensorboard": {}})

    loss = scalars(tmp_path, "train/loss")
    assert [step for step, _ in loss] == [1, 2, 3, 4, 5]
    assert [value for _, value in loss] == pytest.approx([1.0, 0.9, 0.8, 0.75, 0.5])  # float32 in the files
    assert scalars(tmp_path, "eval/val/accuracy") == [(4, 0.5)]
    assert [step for step, _ in scalars(tmp_path, "train/grad_norm")] == [1, 2, 3, 4, 5]
    files = sorted((tmp_path / "tensorboard").iterdir())
    assert len(files) == 3  # one event file per attempt, in the order TensorBoard reads them


def test_the_environment_turns_the_mirror_on_for_code_that_does_not_ask(tmp_path, monkeypatch):
    monkeypatch.setenv("ELFES_TENSORBOARD", "1")
    log_attempt(tmp_path / "on", [started(), train(1, loss=1.0)])
    assert scalars(tmp_path / "on", "train/loss") == [(1, 1.0)]
    log_attempt(tmp_path / "off", [started(), train(1, loss=1.0)], trackers={})  # the argument wins
    assert not (tmp_path / "off" / "tensorboard").exists()
    monkeypatch.setenv("ELFES_TENSORBOARD", "0")
    log_attempt(tmp_path / "zero", [started(), train(1, loss=1.0)])
    assert not (tmp_path / "zero" / "tensorboard").exists()


def test_an_unknown_environment_value_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ELFES_TENSORBOARD", "yes please")
    with pytest.raises(ValueError, match="ELFES_TENSORBOARD='yes please' is not understood; set it to 1"):
        RunLogger(tmp_path, is_main_process=True)


def test_only_the_main_process_writes_the_mirror(tmp_path):
    with RunLogger(tmp_path / "rank1", is_main_process=False, trackers={"tensorboard": {}}) as logger:
        logger.log(started())
        logger.log(train(1))
    assert not (tmp_path / "rank1").exists()


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPOSITORY)})


def test_without_the_tensorboard_package_every_process_is_told_the_pip_command(tmp_path):
    code = (
        "import sys; sys.modules['tensorboard'] = None\n"  # as if it were not installed
        "from elfes.records import RunLogger\n"
        "for main in (True, False):\n"
        "    try:\n"
        f"        RunLogger({str(tmp_path)!r}, is_main_process=main, trackers={{'tensorboard': {{}}}})\n"
        "    except ImportError as error:\n"
        "        print(error)\n"
    )
    completed = run_python(code)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert len(lines) == 2 and all("pip install 'elfes[tensorboard]'" in line for line in lines), lines


def test_a_logger_without_the_mirror_imports_no_torch_even_when_it_writes(tmp_path):
    code = (
        "import sys\n"
        "sys.path.insert(0, 'tests/records')\n"
        "from synthetic_events import every_event_kind, plain_console\n"
        "from elfes.records import RunLogger\n"
        f"with RunLogger({str(tmp_path)!r}, is_main_process=True, console=plain_console()) as logger:\n"
        "    for event in every_event_kind():\n"
        "        logger.log(event)\n"
        "print('torch' in sys.modules)\n"
    )
    completed = run_python(code)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "False"
