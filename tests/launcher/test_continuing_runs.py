"""Continuing a run with a changed spec, end to end on the local executor: a finished run extended
with `elfes resume RUN_DIR --set config.epochs=N` ends bitwise equal (torch.equal on every tensor) to
a straight N-epoch run; a change to what the run computes is refused by field; a run directory whose
first submission failed before any checkpoint takes the corrected spec, its history kept."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml
from launching import launch_environment
from local_runs import CONFIG, Runs, wait_ended, write_spec
from run_comparison import assert_runs_bitwise_equal

from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths

ELFES = str(Path(sys.executable).with_name("elfes"))
ENTRYPOINT = "tests.launcher.entrypoints:budget_free_quickstart"
TRAINING = {key: CONFIG[key] for key in ("train_samples", "log_every")}


def elfes(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([ELFES, *argv], env=launch_environment(), capture_output=True, text=True, timeout=120)


def test_resume_with_a_raised_epoch_budget_continues_a_finished_run_bitwise(
    runs: Runs, straight_runs: Callable[..., Path]
):
    reference = straight_runs(entrypoint=ENTRYPOINT, tasks=2, config={**TRAINING, "epochs": 4})
    run_dir = runs.submit("extended", tasks=2, entrypoint=ENTRYPOINT, config={**TRAINING, "epochs": 2})
    first = wait_ended(run_dir, "finished")
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}

    again = elfes("resume", str(run_dir))
    assert again.returncode == 3 and f"elfes resume {run_dir} --set config.epochs=4" in again.stderr, again.stderr
    changed = elfes("resume", str(run_dir), "--set", "config.epochs=4", "--set", "config.lr=0.1")
    assert changed.returncode == 2 and "may not change when a run continues from its checkpoints: config.lr" in \
        changed.stderr, changed.stderr
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before

    extended = elfes("resume", str(run_dir), "--set", "config.epochs=4", "--set", "resources.timeout_min=20")
    assert extended.returncode == 0, extended.stderr
    assert "recorded spec changed: config.epochs, resources.timeout_min" in extended.stdout
    state = wait_ended(run_dir, "finished")
    assert [(a.outcome, a.launch) for a in state.attempts] == [("finished", "submit"), ("finished", "resume")]
    assert state.attempts[1].step == 2 * first.attempts[0].step
    recorded = yaml.safe_load(RunPaths(run_dir).spec.read_text())
    assert recorded["config"]["epochs"] == 4 and recorded["resources"]["timeout_min"] == 20
    wait_ended(reference, "finished")
    assert_runs_bitwise_equal(run_dir, reference)


def test_resume_on_another_world_size_continues_the_run_within_float_rounding(
    runs: Runs, straight_runs: Callable[..., Path]
):
    """A finished 2-rank run (a window of 4 microbatches, no dropout) extended on 1 rank: the job derives its
    accumulation from the world size, the engine continues the run on the new size, each attempt records its
    own, the warning says what is no longer bitwise, and the run ends within float rounding of a run that had
    the larger budget on 2 ranks from the start (the session's, shared with test_two_hosts.py)."""
    import torch
    from run_comparison import named_tensors

    config = {**TRAINING, "window": 4, "dropout": 0.0}
    reference = straight_runs(entrypoint=ENTRYPOINT, tasks=2, config={**config, "epochs": 4})
    run_dir = runs.submit("resized", tasks=2, entrypoint=ENTRYPOINT, config={**config, "epochs": 2})
    wait_ended(run_dir, "finished")

    resized = elfes("resume", str(run_dir), "--set", "config.epochs=4", "--set", "resources.tasks_per_node=1")
    assert resized.returncode == 0, resized.stderr
    assert "recorded spec changed: config.epochs, resources.tasks_per_node" in resized.stdout
    state = wait_ended(run_dir, "finished")
    assert [(a.outcome, a.world_size) for a in state.attempts] == [("finished", 2), ("finished", 1)]
    records = [json.loads(line) for line in RunPaths(run_dir).events.read_text().splitlines()]
    starts = [(e["event"], e["world_size"], e["gradient_accumulation_steps"]) for e in records
              if e["event"] in ("started", "resumed")]
    assert starts == [("started", 2, 2), ("resumed", 1, 4)]
    status = json.loads(elfes("status", str(run_dir), "--json").stdout)
    assert any("Continuing on 1 rank x accumulation 4 a run whose checkpoint was written on 2 ranks" in note
               for note in status["notes"]), status["notes"]
    table = elfes("status", str(run_dir)).stdout  # the attempts table: the ranks each attempt trained on
    assert re.search(r"1 │ submit │ \S+ +│ \S+ +│ 2 ", table) and re.search(r"2 │ resume │ \S+ +│ \S+ +│ 1 ", table), table
    wait_ended(reference, "finished")
    expected, final = ({name: tensor for name, tensor in named_tensors(
        torch.load(folder / "checkpoints" / "final", weights_only=True)) if "/rng/" not in name}
        for folder in (reference, run_dir))
    assert final.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(final[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


def test_a_world_size_that_cannot_keep_the_window_is_refused_at_resume_and_the_engines_refusal_says_why(runs: Runs):
    """A finished 2-rank run of 2 x accumulation 2 (a window of 4 microbatches). On 3 ranks no accumulation keeps
    the window: `elfes resume` refuses it from the run's records before anything is submitted, naming the world
    sizes that do, the run directory unchanged. On 1 rank only the job's accumulation decides, and this job keeps
    2: the engine refuses at the resume, and state.json and `elfes status` carry the whole reason (the
    accumulation that keeps the window), not retried."""
    run_dir = runs.submit("fixed", tasks=2, entrypoint=ENTRYPOINT, config={**TRAINING, "epochs": 1, "dropout": 0.0})
    wait_ended(run_dir, "finished")
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}

    refused = elfes("resume", str(run_dir), "--set", "config.epochs=2", "--set", "resources.tasks_per_node=3")
    assert refused.returncode == 2, refused.stderr
    assert f"run directory {run_dir} cannot continue on 3 ranks" in refused.stderr, refused.stderr
    assert "no accumulation on 3 ranks keeps it: use a world size that divides 4 (1, 2 or 4)" in refused.stderr
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before

    resized = elfes("resume", str(run_dir), "--set", "config.epochs=2", "--set", "resources.tasks_per_node=1")
    assert resized.returncode == 0, resized.stderr
    state = wait_ended(run_dir, "failed")
    assert [(a.outcome, a.world_size) for a in state.attempts] == [("finished", 2), ("failed", 1)]  # not retried
    failure = state.attempts[-1].failure
    assert failure is not None and not failure.retried
    keeps = "1 rank x accumulation 4 keeps the window of 4 microbatches"
    assert keeps in failure.cause and keeps in (state.error or ""), (failure, state.error)
    assert keeps in json.loads(elfes("status", str(run_dir), "--json").stdout)["error"]
    assert keeps in " ".join(elfes("status", str(run_dir)).stdout.split())


def test_a_run_whose_first_submission_failed_before_a_checkpoint_takes_the_corrected_spec(runs: Runs):
    run_dir = runs.submit("typo", tasks=1, entrypoint="tests.launcher.entrypoints:failing")
    failed = wait_ended(run_dir, "failed")
    assert not RunPaths(run_dir).checkpoints.exists() or not any(RunPaths(run_dir).checkpoints.iterdir())

    corrected = write_spec(runs.folder, "typo", tasks=1, entrypoint=ENTRYPOINT, config={**TRAINING, "epochs": 1})
    submitted = elfes("submit", str(corrected), "--executor", "local")
    assert submitted.returncode == 0, submitted.stderr
    assert "continues as local job" in submitted.stdout and "recorded spec changed: entrypoint, config" in submitted.stdout
    state = wait_ended(run_dir, "finished")
    # the history is kept: the failure, its retry (requeue.max_failures), the second failure that ended it
    assert [a.outcome for a in state.attempts] == ["failed", "failed", "finished"]
    assert [s.kind for s in state.submissions] == ["submit", "submit"] and state.attempts[:2] == failed.attempts
    assert yaml.safe_load(RunPaths(run_dir).spec.read_text())["entrypoint"] == ENTRYPOINT
    assert run_state.load_state(RunPaths(run_dir)).status == "finished"
