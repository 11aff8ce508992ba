"""One module runs SLURM: launcher/slurm (the adapter) is the only place in `elfes/` and `launcher/` that names
a SLURM client command as a program to run, so every call, its timeout and its parsing have one home. Read with
`ast`: a string that is exactly a tool's name (`"squeue"`, the first word of an argv or of shutil.which) outside
the adapter fails; words inside messages ("`scancel 77` failed") do not count. The adapter itself is checked
against a real cluster by tests/slurm."""

from __future__ import annotations

import ast
from pathlib import Path

from elfes.launcher.slurm import Answer, QueuedJob, QueueEntry, Tool, run
from elfes.launcher.slurm.queue import ALIVE_STATES

REPOSITORY = Path(__file__).resolve().parents[1]
ADAPTER = REPOSITORY / "launcher" / "slurm"
# SLURM's client commands: those ELFES runs (Tool) and the rest, which it must not start elsewhere either.
SLURM_COMMANDS = {tool.value for tool in Tool} | {"srun", "salloc", "sstat", "sprio", "sshare", "sreport", "strigger",
                                                  "sattach", "sbcast", "sdiag", "scrontab"}


def named_commands(file: Path, root: Path = REPOSITORY) -> list[str]:
    """``path:line: 'name'`` for every string constant of ``file`` that is exactly a SLURM command's name."""
    found = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip() in SLURM_COMMANDS:
            found.append(f"{file.relative_to(root)}:{node.lineno}: {node.value!r}")
    return found


def test_only_the_adapter_names_a_slurm_command_to_run():
    outside = [hit for root in ("elfes", "launcher") for file in sorted((REPOSITORY / root).rglob("*.py"))
               if ADAPTER not in file.parents for hit in named_commands(file)]
    assert outside == [], ("SLURM commands are run from launcher/slurm only (add a function there and call it): "
                           f"{outside}")


def test_the_check_sees_a_command_named_outside_the_adapter(tmp_path: Path):
    # The scan above must be able to fail: an argv, a which() and an f-string message, as call sites wrote them.
    caller = tmp_path / "caller.py"
    caller.write_text('import shutil, subprocess\nsubprocess.run(["squeue", "-h"])\nshutil.which("scancel")\n'
                      'job = 7\nmessage = f"`scancel {job}` failed"\n', encoding="utf-8")
    assert sorted(named_commands(caller, tmp_path)) == ["caller.py:2: 'squeue'", "caller.py:3: 'scancel'"]
    assert len(named_commands(ADAPTER / "tools.py")) == len(Tool), "the adapter names every command it runs once"


def test_a_command_that_is_not_installed_answers_without_a_code(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no SLURM here
    answer = run(Tool.SQUEUE, "-h")
    assert isinstance(answer, Answer) and not answer.started and not answer.ok and answer.code is None
    assert "squeue" in (answer.error or "") and answer.command == "squeue -h"


def test_a_command_that_does_not_answer_in_time_is_killed_and_answers_124(monkeypatch, tmp_path: Path):
    (tmp_path / "sinfo").write_text("#!/bin/sh\nexec sleep 60\n")
    (tmp_path / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    answer = run(Tool.SINFO, timeout_s=0.2)
    assert answer.timed_out and answer.code == 124 and answer.started
    assert answer.stderr == "sinfo did not answer within 0.2 s" and "timed out" in (answer.error or "")


def test_queue_lines_are_typed():
    task = QueuedJob("3", "1", "1", QueueEntry("PENDING", "BeginTime", 1))
    plain = QueuedJob("4", None, None, QueueEntry("COMPLETED"))
    assert (task.name, task.base_id, task.entry.alive) == ("1_1", "1", True)
    assert task.entry.describe() == "PENDING (BeginTime)"
    assert (plain.name, plain.base_id, plain.entry.alive, plain.entry.describe()) == ("4", "4", False, "COMPLETED")
    assert "RUNNING" in ALIVE_STATES and "GONE" not in ALIVE_STATES
