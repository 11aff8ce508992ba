"""`elfes rehearse` on real local jobs: exact for the quickstart (one interruption of each kind) and for a
command job, not resumable for a job whose sampler keeps a hidden count, not reproducible for a job seeded
from the clock; bad input exits 2 and leaves nothing behind."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from launching import kill_local_run
from shared_runs import session_folder

from elfes.files import exclusive_lock
from elfes.launcher.cli.main import main as elfes
from elfes.launcher.commands.rehearsal.pipeline import KINDS, candidate_steps, plan_interruptions
from elfes.launcher.rundir.liveness import local_processes
from elfes.launcher.rundir.paths import RunPaths

REPOSITORY = Path(__file__).resolve().parents[2]
# 256 samples, batches of 16, accumulation 2: 8 updates an epoch on one rank, a train record each.
CONFIG = {"epochs": 2, "train_samples": 256, "log_every": 1, "step_delay_s": 0.08}
# Three epochs, where an interruption must land before the end: a follower on a loaded machine may see a
# step several updates late, and a signal that arrives in the last update resumes nothing.
LONGER = {**CONFIG, "epochs": 3}
LOGGED_STEPS = candidate_steps(24)  # the steps a rehearsal of a three-epoch run (24 updates) aims at


def seed_where(count: int, kinds: tuple[str, ...], wanted) -> int:
    return next(s for s in range(1000) if wanted([p.step for p in plan_interruptions(count, kinds, LOGGED_STEPS, s)]))


def write_spec(folder: Path, entrypoint: str | None = "tests.launcher.rehearsal_jobs:slow_quickstart",
               **fields: Any) -> Path:
    spec: dict[str, Any] = {
        "name": "rehearsed", "workdir": str(REPOSITORY), "run_dir": str(folder / "run"), "config": dict(CONFIG),
        "resources": {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 1,
                      "timeout_min": 10},
        "requeue": {"max_requeues": 5}, "env": {"OMP_NUM_THREADS": "1"},
    }
    if entrypoint:
        spec["entrypoint"] = entrypoint
    spec.update(fields)
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def rehearse(spec: Path, *arguments: str, capsys: pytest.CaptureFixture) -> tuple[int, dict[str, Any]]:
    code = elfes(["rehearse", str(spec), "--executor", "local", "--json", *arguments])
    return code, json.loads(capsys.readouterr().out)


def test_interruptions_are_spread_over_the_run_and_every_kind_occurs():
    logged = range(5, 80, 5)  # a run logging every 5 updates of 80: interruptions aim at steps a follower sees
    planned = plan_interruptions(3, KINDS, logged, seed=0)
    assert sorted(p.kind for p in planned) == sorted(KINDS)
    steps = [p.step for p in planned]
    assert steps == sorted(steps) and len(set(steps)) == 3 and set(steps) <= set(logged)
    assert steps[0] < 30 and 25 <= steps[1] < 55 and steps[2] >= 50  # one in each third of the run
    assert plan_interruptions(3, KINDS, logged, seed=0) == planned != plan_interruptions(3, KINDS, logged, seed=1)


def test_run_ids_and_clock_measurements_are_not_compared_but_every_tensor_and_count_is():
    import torch

    from elfes.launcher.commands.rehearsal.compare import named_leaves

    payload = {"run_id": "a1", "model": {"w": torch.ones(2)}, "ranks": [{"log_interval": {"seconds": 0.25,
               "samples": 64, "wait_s": 1.5}}], "state": {"step": 7}}
    assert sorted(dict(named_leaves(payload))) == ["/model/w", "/ranks[0]/log_interval/samples", "/state/step"]


def test_an_interruption_that_saved_the_last_update_does_not_count_as_landed():
    from elfes.launcher.commands.rehearsal.pipeline import Interruption, after_the_last_update

    mid_run = Interruption("requeue", 9, 10, "0.50 of an update after step 10", 1, saved_step=11)
    at_the_end = Interruption("stop", 14, 15, "0.39 of an update after step 15", 2, saved_step=16)
    killed = Interruption("kill", 12, 15, "after step 15", 3)  # a kill saves nothing: its relaunch replays
    assert after_the_last_update([mid_run, at_the_end, killed], final_step=16) == [at_the_end]
    assert (mid_run.landed, at_the_end.landed, killed.landed) == (True, False, True)



def test_a_relaunched_attempt_is_followed_from_where_it_resumes_not_from_where_the_killed_one_got(tmp_path):
    """Attempt 1 logged step 8 and was killed; `last` names step 4. Once attempt 2 runs, and until it logs its
    start, the follower puts the run at step 4: an interruption aimed at step 8 waits for it to get there, and
    is reported at the step the run really is at (it was sent at once, and reported at step 8)."""
    from run_fixtures import make_run

    from elfes.launcher.commands.rehearsal.runs import Follower
    from elfes.launcher.rundir import state as run_state

    paths = make_run(tmp_path, outcome=None, step=4)
    first = run_state.load_state(paths).last_attempt.started_at  # its records are logged once it began
    paths.events.write_text(paths.events.read_text().replace("2026-01-02T03:04:05.000000+00:00", first))
    with paths.events.open("a") as events:
        events.write(json.dumps({"event": "train", "time": first, "epoch": 1, "step": 8, "planned_steps": 10,
                                 "samples": 64, "metrics": {"loss": 0.2}}) + "\n")
    paths.checkpoints.mkdir()
    (paths.checkpoints / "step-00000004-batches-0000000004.pt").write_bytes(b"")
    (paths.checkpoints / "last").symlink_to("step-00000004-batches-0000000004.pt")
    follower = Follower(paths)
    assert follower.poll() == 8  # attempt 1 runs
    for change in (lambda s: run_state.mark_lost(s, cancelled=False),
                   lambda s: run_state.record_submission(s, executor="local", kind="resume", max_requeues=3,
                                                         run_dir=str(paths.run_dir)),
                   lambda s: run_state.mark_pending(s, job_id="4194998"),
                   lambda s: run_state.begin_attempt(s, token="4194998:0", job_id="4194998", launch="resume",
                                                     hosts=["node-a"], world_size=2)):
        run_state.update_state(paths, change)
    assert follower.poll() == 4
    began = run_state.load_state(paths).last_attempt.started_at
    with paths.events.open("a") as events:
        events.write(json.dumps({"event": "resumed", "time": began, "state": {"step": 4}}) + "\n")
        events.write(json.dumps({"event": "train", "time": began, "step": 5, "metrics": {"loss": 0.2}}) + "\n")
    assert follower.poll() == 5

@pytest.mark.parametrize("arguments, says", [
    (["--interruptions", "0"], "--interruptions 0"),
    (["--kinds", "requeue,explode"], "'explode'"),
    (["--kinds", ","], "empty"),
])
def test_bad_arguments_exit_2_and_create_nothing(tmp_path, capsys, arguments, says):
    spec = write_spec(tmp_path)
    assert elfes(["rehearse", str(spec), "--executor", "local", *arguments]) == 2
    assert says in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.yaml"]


def test_the_scratch_runs_mirror_to_the_specs_trackers_only_with_trackers_asked_for(tmp_path):
    from elfes.launcher.commands.rehearsal.pipeline import RehearsalOptions, prepare

    spec = write_spec(tmp_path, tracking={"mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}})
    assert prepare(spec, RehearsalOptions(executor="local")).spec.tracking.trackers == ()
    assert prepare(spec, RehearsalOptions(executor="local", with_trackers=True)).spec.tracking.trackers == ("mlflow",)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.yaml"]


def test_a_bad_spec_exits_2_and_creates_nothing(tmp_path, capsys):
    spec = write_spec(tmp_path, resources={"nodes": 1, "tasks_per_node": 0})
    assert elfes(["rehearse", str(spec), "--executor", "local"]) == 2
    assert "resources.tasks_per_node" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.yaml"]


def test_the_quickstart_with_one_interruption_of_each_kind_is_exact(tmp_path, capsys):
    seed = seed_where(3, KINDS, lambda steps: steps[-1] <= 17)  # six updates of slack before the last
    store = tmp_path / "mlflow.db"  # the spec's tracker, which a rehearsal leaves alone unless --with-trackers
    spec = write_spec(tmp_path, config=LONGER, tracking={"mlflow": {"tracking_uri": f"sqlite:///{store}"}})
    code, report = rehearse(spec, "--interruptions", "3", "--seed", str(seed), capsys=capsys)
    assert (code, report["verdict"]) == (0, "exact"), report
    assert not store.exists()  # no MLflow run of a scratch run
    assert sorted(i["kind"] for i in report["interruptions"]) == sorted(KINDS)
    assert all(i["step"] is not None and i["attempt"] and i["landed"] for i in report["interruptions"])
    assert report["runs"]["interrupted"]["attempts"] == 4
    assert report["differences"]["tensors"] == [] and report["differences"]["first_diverging_step"] is None
    import torch

    # What each run ran on is reported (a kill before its start may leave an attempt without a record).
    for name in ("straight-1", "straight-2", "interrupted"):
        recorded = report["runs"][name]["provenance"]
        assert recorded[0]["torch"] == torch.__version__ and recorded[0]["code"]["origin"] == "submit", recorded
    assert not any("threat to bitwise resume" in note for note in report["notes"])
    folder = tmp_path / "run.rehearsal"
    # Each scratch run was removed once its job was gone: no process is left to write a stray folder back.
    for name in ("straight-1", "straight-2", "interrupted"):
        assert not any(local_processes(RunPaths(folder / name)).values()), name
    assert sorted(p.name for p in folder.iterdir()) == ["report.json"]  # scratch runs removed after exact
    assert json.loads((folder / "report.json").read_text())["verdict"] == "exact"
    assert not (tmp_path / "run").exists()  # the spec's own run directory is never touched


def test_a_sampler_with_a_hidden_count_is_not_resumable(tmp_path, capsys):
    # One requeue in the second epoch: the relaunched sampler has forgotten that an epoch was begun, and so
    # reads the rest of the run in other orders (landing anywhere from step 8 to 23 shows it).
    seed = seed_where(1, ("requeue",), lambda steps: 9 <= steps[0] <= 12)
    spec = write_spec(tmp_path, "tests.launcher.rehearsal_jobs:hidden_sampler_counter", config=LONGER)
    code, report = rehearse(spec, "--interruptions", "1", "--kinds", "requeue", "--seed", str(seed), capsys=capsys)
    assert (code, report["verdict"]) == (6, "not resumable"), report
    differences = report["differences"]
    assert any(t["name"].startswith("/model/") and t["name"].endswith("weight") and t["max_abs_diff"] > 0
               for t in differences["tensors"]), differences["tensors"]
    interruption = report["interruptions"][0]
    assert interruption["landed"] and interruption["step"] < differences["first_diverging_step"] <= 24
    assert any("sampler" in cause for cause in report["likely_causes"])
    assert (tmp_path / "run.rehearsal" / "interrupted" / "checkpoints" / "final").exists()  # kept to inspect


def test_a_job_seeded_from_the_clock_is_not_reproducible(tmp_path, capsys):
    spec = write_spec(tmp_path, "tests.launcher.rehearsal_jobs:clock_seeded")
    code, report = rehearse(spec, "--interruptions", "1", "--kinds", "requeue", capsys=capsys)
    assert (code, report["verdict"]) == (7, "not reproducible"), report
    assert report["differences"]["compared"] == "straight-2 vs straight-1"
    assert report["differences"]["first_diverging_step"] is not None
    assert report["interruptions"] == [] and report["interrupted_vs_straight"] is None  # resume not judged
    assert any("use_deterministic_algorithms" in line for line in report["advice"])


def test_a_command_job_rehearses_exact(tmp_path, capsys):
    command = ["{python}", "examples/quickstart/train.py", "--run-dir", "{run_dir}", "--epochs", "30"]
    spec = write_spec(tmp_path, None, command=command, config={})
    code, report = rehearse(spec, "--interruptions", "1", "--kinds", "stop", capsys=capsys)
    assert (code, report["verdict"]) == (0, "exact"), report
    assert [i["kind"] for i in report["interruptions"]] == ["stop"]
    assert report["runs"]["interrupted"]["attempts"] == 2


def test_a_sharded_job_rehearses_exact_through_sigterm_and_sigkill(tmp_path, capsys):
    """examples/charlm with its model sharded over two ranks (FSDP2): SIGTERM then resume and SIGKILL then resume
    both land, and the three runs' final checkpoints (folders of shards, read whole) and exported models are
    equal bit for bit. (The requeue signal on a sharded job: tests/slurm.)"""
    from tests.launcher.entrypoints import TINY_CHARLM

    # Shorter than TINY_CHARLM (18 updates, not 85: what a rank computes is what this test costs), with a
    # checkpoint every 4 updates, so that the kill still aims at a write of the shards, and a sleep in every
    # step that keeps the updates long enough for each interruption to land with its slack.
    config = {**TINY_CHARLM, "train_chars": 8_000, "checkpoint_every": 4, "evaluate_every": 8, "step_delay_s": 0.1}
    spec = write_spec(tmp_path, "tests.launcher.entrypoints:sharded_charlm", config=config,
                      resources={"nodes": 1, "tasks_per_node": 2, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 2,
                                 "timeout_min": 10})
    code, report = rehearse(spec, "--interruptions", "2", "--kinds", "stop,kill", "--keep", capsys=capsys)
    assert (code, report["verdict"]) == (0, "exact"), report
    assert sorted(i["kind"] for i in report["interruptions"]) == ["kill", "stop"]
    assert all(i["landed"] for i in report["interruptions"]), report["interruptions"]
    assert report["differences"]["compared_files"] == ["checkpoints/final", "model.pt"]
    final = tmp_path / "run.rehearsal" / "interrupted" / "checkpoints" / "final"
    assert final.resolve().suffix == ".dcp"


def test_a_pause_continued_on_another_world_size_is_within_rounding_with_the_same_samples(tmp_path, capsys):
    """--resize 1 on a 2-rank job that derives its accumulation from its window (4 microbatches) and has no
    dropout: one pause, the continuation on 1 rank, a verdict that names the data identical and the largest
    relative difference of any tensor."""
    config = {"epochs": 3, "train_samples": 256, "log_every": 1, "window": 4, "dropout": 0.0, "step_delay_s": 0.04}
    spec = write_spec(tmp_path, "tests.launcher.entrypoints:budget_free_quickstart", config=config,
                      resources={"nodes": 1, "tasks_per_node": 2, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 1,
                                 "timeout_min": 10})
    code, report = rehearse(spec, "--resize", "1", "--keep", capsys=capsys)
    assert (code, report["verdict"]) in ((0, "within rounding"), (0, "exact")), report
    [pause] = report["interruptions"]
    assert pause["kind"] == "stop" and pause["landed"], pause
    resized = report["resized"]
    assert resized["ranks"] == 1 and resized["resumed_at"] == pause["saved_step"]
    assert resized["samples_identical"] and resized["losses_within_tolerance"]
    assert resized["largest_difference"] <= resized["tolerance"] and resized["unmatched"] == []
    assert not any(t["name"].startswith(("/layout", "/ranks")) for t in report["differences"]["tensors"])
    assert report["differences"]["entries_set_aside"] == ["/ranks", "/layout"]
    assert report["summary"].startswith(f"{report['verdict']} on 1 rank (the same samples in every update after "
                                        f"step {pause['saved_step']}, the losses within 0.001 (relative, at most ")
    state = json.loads((tmp_path / "run.rehearsal" / "interrupted" / "state.json").read_text())
    assert [attempt["world_size"] for attempt in state["attempts"]] == [2, 1]
    # docs/rehearse.md shows such a line: the same words around the numbers.
    shown = re.sub(r"\d+(\.\d+)?(e[-+]\d+)?", "N", (REPOSITORY / "docs" / "rehearse.md").read_text().split(
        "<!-- doc-test: rehearse/resize-line -->\n```\n", 1)[1].split("\n```", 1)[0])
    assert re.sub(r"\d+(\.\d+)?(e[-+]\d+)?", "N", report["summary"]).split(", in ")[0] == shown.split(", in ")[0]


def test_a_resize_of_a_job_with_dropout_drawn_per_rank_names_the_dropout(tmp_path, capsys):
    """--resize 1 of the same job with dropout drawn per rank (the default): every update counts the same samples,
    the losses part by more than rounding, so not resumable; the verdict gives the samples' and the losses' apart,
    the table of differences leaves out the entries that describe the ranks, and the likely cause is the dropout,
    with model_randomness="per_batch" as the way out."""
    config = {"epochs": 3, "train_samples": 256, "log_every": 1, "window": 4, "dropout": 0.3, "step_delay_s": 0.04}
    spec = write_spec(tmp_path, "tests.launcher.entrypoints:budget_free_quickstart", config=config,
                      resources={"nodes": 1, "tasks_per_node": 2, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 1,
                                 "timeout_min": 10})
    code, report = rehearse(spec, "--resize", "1", capsys=capsys)
    assert (code, report["verdict"]) == (6, "not resumable"), report
    resized = report["resized"]
    assert resized["samples_identical"] and not resized["losses_within_tolerance"], resized
    assert "the losses differ by up to" in report["summary"] and "the same samples in every update" in report["summary"]
    tensors = report["differences"]["tensors"]
    assert tensors and not any(t["name"].startswith(("/layout", "/ranks")) for t in tensors), tensors
    assert report["differences"]["entries_set_aside"] == ["/ranks", "/layout"]
    [cause] = report["likely_causes"]
    assert cause.startswith("Dropout drawn per rank") and 'model_randomness="per_batch"' in cause, cause


@pytest.mark.parametrize(("ranks", "says"), [(0, "give the number of ranks to continue on"),
                                             (1, "the job already runs on 1 rank; give another world size")])
def test_a_resize_to_no_other_world_size_exits_2_and_creates_nothing(tmp_path, capsys, ranks, says):
    spec = write_spec(tmp_path)
    assert elfes(["rehearse", str(spec), "--executor", "local", "--resize", str(ranks)]) == 2
    assert says in capsys.readouterr().err and not (tmp_path / "run.rehearsal").exists()


def test_a_resize_to_more_ranks_than_the_executor_runs_exits_2_before_any_run(tmp_path, capsys):
    """The continuation's spec is checked against the executor too, before the straight runs start."""
    from elfes.launcher.submit.executors import LOCAL_RANKS_PER_CPU, usable_cpus

    ranks = LOCAL_RANKS_PER_CPU * usable_cpus() + 1
    spec = write_spec(tmp_path)
    assert elfes(["rehearse", str(spec), "--executor", "local", "--resize", str(ranks)]) == 2
    said = capsys.readouterr().err
    assert f"--resize {ranks}: the continuation (resources.tasks_per_node={ranks}) cannot run" in said, said
    assert f"resources.tasks_per_node = {ranks}: this machine has {usable_cpus()} CPU(s)" in said, said
    assert said.rstrip().endswith("or rehearse another --resize"), said
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.yaml"]


def sharded_run(run_dir: Path, weight: Any) -> Path:
    """A run directory whose final checkpoint is a folder of DCP shards holding ``weight`` as the model's ``w``."""
    import torch
    import torch.distributed.checkpoint as dcp

    from elfes.engine.checkpoint import FORMAT, SHARDED_STATE_FILE, VERSION

    folder = run_dir / "checkpoints" / "step-00000001-batches-0000000002.dcp"
    dcp.save({"model": {"w": weight}}, storage_writer=dcp.FileSystemWriter(folder), no_dist=True)
    torch.save({"format": FORMAT, "version": VERSION, "run_id": run_dir.name}, folder / SHARDED_STATE_FILE)
    (run_dir / "checkpoints" / "final").symlink_to(folder.name)
    return run_dir


def test_sharded_checkpoints_are_compared_tensor_by_tensor_read_whole(tmp_path):
    import torch

    from elfes.launcher.commands.rehearsal.compare import compare_runs

    ours = sharded_run(tmp_path / "ours", torch.tensor([1.0, 2.0, 3.0]))
    same = sharded_run(tmp_path / "same", torch.tensor([1.0, 2.0, 3.0]))
    other = sharded_run(tmp_path / "other", torch.tensor([1.0, 2.0, 3.5]))
    assert compare_runs(ours, same).identical  # the run ids differ, and are not compared
    [difference] = compare_runs(ours, other).tensors
    assert (difference.file, difference.name, difference.max_abs_diff) == ("checkpoints/final", "/model/w", 0.5)
    (tmp_path / "same" / "checkpoints" / "final").unlink()
    torch.save({"w": torch.zeros(3)}, tmp_path / "same" / "checkpoints" / "final")
    [difference] = compare_runs(ours, same).tensors
    assert "a sharded checkpoint (a folder) in one run, a file in the other" in difference.note


# -- what is compared decides the verdict -------------------------------------------------------------------------
SWITCHABLE = "tests.launcher.rehearsal_jobs:switchable"


def test_nan_equals_nan_in_the_same_position_by_bit_pattern_and_nowhere_else():
    import torch

    from elfes.launcher.commands.rehearsal.compare import _leaf_difference

    nan = float("nan")
    assert _leaf_difference(torch.tensor([1.0, nan]), torch.tensor([1.0, nan])) is None
    assert _leaf_difference(torch.tensor([1.0, nan], dtype=torch.bfloat16), torch.tensor([1.0, nan],
                                                                                       dtype=torch.bfloat16)) is None
    assert _leaf_difference(torch.tensor([nan, 1.0]), torch.tensor([1.0, nan])) == (
        None, "NaN in one run only at 2 position(s)")
    assert _leaf_difference(torch.tensor([2.0, nan]), torch.tensor([1.5, nan])) == (0.5, "")
    assert _leaf_difference(torch.tensor([0.0]), torch.tensor([-0.0]))[0] == 0.0  # bits differ: not identical


def test_an_export_torch_cannot_read_is_compared_byte_for_byte(tmp_path):
    from elfes.launcher.commands.rehearsal.compare import _compare_file

    (tmp_path / "a.pt").write_text("weights in a format of its own")
    (tmp_path / "b.pt").write_text("weights in a format of its own")
    (tmp_path / "c.pt").write_text("weights in a format of its owN")
    assert _compare_file(tmp_path / "a.pt", tmp_path / "b.pt", "model.pt") == []
    [difference] = _compare_file(tmp_path / "a.pt", tmp_path / "c.pt", "model.pt")
    assert (difference.file, difference.note) == ("model.pt", "the bytes differ")


# -- one rehearsal that several tests judge --------------------------------------------------------------------
SWEEP = {"grid": {"config.seed_value": [0, 1]}}
# The switchable job seeding torch only, with NaN in a buffer and in a logged metric: a sweep of two seeds, each
# member rehearsed (kept) with one pause. The sweep test judges the members' folders; the generator and NaN tests
# judge a member's report, each by what its own switch makes of it.
SWEPT = {"config": {**CONFIG, "seed": "torch", "nan": True}, "sweep": SWEEP}
SWEPT_ARGUMENTS = ("--member", "seed_value=1", "--member", "seed_value=0", "--interruptions", "1", "--kinds", "stop",
                   "--keep")


@pytest.fixture(scope="session")
def swept_rehearsal(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[dict[str, Any]], Path]:
    """The exit code, the ``--json`` reports (seed_value=1, then 0) and the spec's folder of the rehearsal of
    :data:`SWEPT`: run by the first test of the session to ask, on any xdist worker (this file's tests are spread
    over them), and read by every later one (under a lock, as tests/shared_runs.py shares reference runs)."""
    folder = session_folder(tmp_path_factory, "swept-rehearsal")
    with exclusive_lock(folder / "lock"):
        if not (folder / "result.json").exists():
            spec = write_spec(folder, SWITCHABLE, **SWEPT)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                code = elfes(["rehearse", str(spec), "--executor", "local", "--json", *SWEPT_ARGUMENTS])
            (folder / "result.json").write_text(json.dumps({"code": code, "reports": json.loads(printed.getvalue())}))
        result = json.loads((folder / "result.json").read_text())
    return result["code"], result["reports"], folder


def member_report(swept_rehearsal, seed_value: int) -> tuple[int, dict[str, Any]]:
    """The rehearsal's exit code (a sweep's is its first member's that is not exact) and a member's report, from
    :func:`swept_rehearsal`."""
    code, reports, _ = swept_rehearsal
    [report] = [report for report in reports if report["rehearsal_dir"].endswith(f"seed_value={seed_value}")]
    return code, report


def test_generators_never_seeded_nor_drawn_from_are_a_note_and_the_verdict_exact(swept_rehearsal):
    # The job seeds torch only: the straight runs end with other Python and NumPy generator states, and
    # nothing else differs (its NaNs are equal bit for bit).
    code, report = member_report(swept_rehearsal, 0)
    assert (code, report["verdict"]) == (0, "exact"), report
    assert report["straight_vs_straight"]["generators_set_aside"] == ["numpy", "python"]
    assert ("NumPy's global generator is never seeded; this job does not draw from it, but any use would make it "
            "not reproducible: seed it with `accelerate.utils.set_seed`") in report["notes"]
    assert any(note.startswith("Python's `random` generator is never seeded") for note in report["notes"])


def test_a_job_with_nan_in_a_buffer_and_a_logged_metric_is_exact(swept_rehearsal):
    code, report = member_report(swept_rehearsal, 1)
    assert (code, report["verdict"]) == (0, "exact"), report
    assert report["landed"] == {"stop": 1}


def test_an_export_the_interrupted_run_lost_is_not_resumable_naming_the_file(tmp_path, capsys):
    # model.pt is written only by a run never resumed: both straight runs have it, the interrupted one not.
    spec = write_spec(tmp_path, SWITCHABLE, config={**CONFIG, "export": "first_attempt"})
    code, report = rehearse(spec, "--interruptions", "1", "--kinds", "requeue", capsys=capsys)
    assert (code, report["verdict"]) == (6, "not resumable"), report
    [lost] = report["differences"]["tensors"]
    assert lost["file"] == "model.pt" and "model.pt is missing in the interrupted run" in lost["note"]
    assert "model.pt" in report["differences"]["compared_files"]


# -- any job ----------------------------------------------------------------------------------------------------
def test_a_job_without_a_run_logger_rehearses_exact_and_says_the_metrics_were_not_compared(tmp_path, capsys):
    spec = write_spec(tmp_path, SWITCHABLE, config={**LONGER, "logger": False})
    code, report = rehearse(spec, "--interruptions", "3", capsys=capsys)
    assert (code, report["verdict"]) == (0, "exact"), report
    assert report["differences"]["metrics_compared"] is False
    assert any(note.startswith("The logged metrics were not compared") for note in report["notes"])
    assert sum(report["landed"].values()) >= 1 and set(report["landed"]) == set(KINDS)
    assert not (tmp_path / "run.rehearsal" / "straight-1").exists()


def test_a_command_job_without_records_rehearses_to_a_verdict(tmp_path, capsys):
    command = ["{python}", "-m", "tests.launcher.rehearsal_jobs", "--run-dir", "{run_dir}", "--set", "logger=false",
               "--set", "epochs=3", "--set", "train_samples=256", "--set", "log_every=1", "--set", "step_delay_s=0.08"]
    spec = write_spec(tmp_path, None, command=command, config={})
    code, report = rehearse(spec, "--interruptions", "1", "--kinds", "stop", capsys=capsys)
    assert (code, report["verdict"]) == (0, "exact"), report
    assert report["differences"]["metrics_compared"] is False
    assert report["differences"]["compared_files"] == ["checkpoints/final", "model.pt"]


# -- every requested kind lands ---------------------------------------------------------------------------------
def test_an_interruption_that_lands_after_the_last_update_is_retried_at_an_earlier_moment(tmp_path, capsys):
    # Updates after step 16 take no time and the job then waits 3 s: a requeue aimed at step 17 or 18 (late
    # in the first pass) reaches a run that has already trained its last update; the retry aims earlier.
    seed = next(s for s in range(1000) if (lambda p: p.step in (17, 18) and p.fraction >= 0.5)(
        plan_interruptions(1, ("requeue",), candidate_steps(24), s)[0]))
    config = {**LONGER, "step_delay_s": 0.15, "fast_after_step": 16, "pause_after_s": 3.0}
    spec = write_spec(tmp_path, SWITCHABLE, config=config)
    code = elfes(["rehearse", str(spec), "--executor", "local", "--json", "--interruptions", "1", "--kinds", "requeue",
                  "--seed", str(seed)])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert (code, report["verdict"]) == (0, "exact"), report
    [missed] = report["retried"]
    assert (missed["pass"], missed["kind"], missed["landed"]) == (1, "requeue", False)
    assert missed["saved_step"] == 24 or missed["step"] is None
    [landed] = report["interruptions"]
    assert landed["landed"] and landed["planned_step"] < missed["planned_step"] and landed["saved_step"] < 24
    assert report["landed"] == {"requeue": 1} and report["summary"] == "exact (requeue: 1 of 1 landed)"
    lines = captured.err.splitlines()
    assert any("running the interrupted run again with earlier moments" in line for line in lines)
    assert any(line.startswith("elfes: interruption 1/1: requeue landed") for line in lines)
    assert any(line.startswith("elfes:   straight-2: step ") and line.endswith("/24") for line in lines)  # progress


def test_the_verdict_line_names_what_landed_and_what_never_did():
    from elfes.launcher.commands.rehearsal.report import verdict_line

    assert verdict_line("exact", ["requeue", "stop", "kill"], {"requeue": 1, "stop": 1, "kill": 1}) == (
        "exact (requeue, stop, kill: 3 of 3 landed)")
    assert verdict_line("exact", ["kill", "stop", "requeue"], {"requeue": 1, "stop": 0, "kill": 1}) == (
        "exact (requeue, kill: 2 of 3 landed; stop never landed mid-run, so it is untested)")


# -- sweeps -----------------------------------------------------------------------------------------------------


def test_a_sweep_spec_without_a_member_exits_2_names_the_members_and_creates_nothing(tmp_path, capsys):
    spec = write_spec(tmp_path, SWITCHABLE, sweep=SWEEP)
    assert elfes(["rehearse", str(spec), "--executor", "local"]) == 2
    error = capsys.readouterr().err
    assert "is a sweep of 2 members (seed_value=0, seed_value=1)" in error and "--member seed_value=0" in error
    assert elfes(["rehearse", str(spec), "--executor", "local", "--member", "seed_value=0", "--member", "lr=1"]) == 2
    assert "--member lr=1: " in capsys.readouterr().err  # every member is checked before any is rehearsed
    assert elfes(["rehearse", str(write_spec(tmp_path, SWITCHABLE)), "--executor", "local", "--member", "x"]) == 2
    assert "has no sweep section" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job.yaml"]


def test_each_sweep_member_given_is_rehearsed_with_its_own_values(swept_rehearsal):
    code, reports, spec_folder = swept_rehearsal  # --member seed_value=1 --member seed_value=0, kept
    assert code == 0 and [report["verdict"] for report in reports] == ["exact", "exact"], reports
    for report, value in zip(reports, (1, 0)):
        folder = spec_folder / "run.rehearsal" / f"seed_value={value}"
        assert report["rehearsal_dir"] == str(folder) and (folder / "report.json").is_file()
        assert yaml.safe_load((folder / "straight-1" / "job.yaml").read_text())["config"]["seed_value"] == value
    assert not (spec_folder / "run").exists()  # the sweep's own folder is never touched


# -- signals ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_to_rehearse_ends_its_scratch_job_keeps_its_folder_and_leaves_no_process(tmp_path, signum):
    from elfes.launcher.rundir.liveness import local_processes, recorded_tasks
    from elfes.launcher.rundir.paths import RunPaths

    spec = write_spec(tmp_path, SWITCHABLE, config={**LONGER, "epochs": 50})
    # SIGINT as a terminal sends it, even where this test runs in the background (which ignores SIGINT).
    rehearsal = subprocess.Popen([sys.executable, "-m", "elfes", "rehearse", str(spec), "--executor", "local"],
                                 cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    paths = RunPaths(tmp_path / "run.rehearsal" / "straight-1")
    try:
        assert wait_until(lambda: paths.events.is_file() and recorded_tasks(paths), 300), "straight-1 never trained"
        rehearsal.send_signal(signum)
        out, err = rehearsal.communicate(timeout=300)
    finally:
        if rehearsal.poll() is None:
            rehearsal.kill()
    assert rehearsal.returncode == 128 + signum, (out, err)
    [line] = [line for line in err.splitlines() if "interrupted" in line]
    assert line == (f"elfes: error: interrupted by {signal.Signals(signum).name}; ended the scratch job of straight-1; the "
                    f"scratch runs are kept in {tmp_path / 'run.rehearsal'}")
    assert paths.state.is_file() and paths.events.is_file()  # kept for inspection
    assert wait_until(lambda: not any(local_processes(paths).values()), 60), local_processes(paths)


def test_a_scratch_job_still_alive_past_the_wait_is_ended_before_its_folder_is_removed(tmp_path):
    """A scratch run is removed (a retry's fresh start, the end of an exact rehearsal) once its job is gone; one
    still alive after the wait is ended first, so nothing keeps writing into a folder that is gone."""
    from elfes.launcher.commands.rehearsal.runs import remove_run_dir
    from elfes.launcher.rundir.command_group import process_stat

    spec = write_spec(tmp_path, None, command=["sleep", "600"], config={})
    paths = RunPaths(tmp_path / "run")
    assert elfes(["submit", str(spec), "--executor", "local"]) == 0
    pids: list[int] = []

    def alive() -> list[int]:
        return [pid for pid in pids if (stat := process_stat(pid)) is not None and stat.live]

    try:
        assert wait_until(lambda: local_processes(paths)["command"], 300), "the job's command never started"
        pids += [pid for found in local_processes(paths).values() for pid in found]
        remove_run_dir(paths.run_dir, timeout_s=1.0)
        assert not paths.run_dir.exists()
        assert wait_until(lambda: not alive(), 60), f"still alive: {alive()} of {pids}"
    finally:
        for pid in alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        kill_local_run(paths.run_dir)


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return bool(condition())


def test_on_a_terminal_each_run_has_a_bar_of_its_step_against_its_total():
    import io

    from elfes.launcher.cli.rehearse import LiveView

    stream = io.StringIO()
    with LiveView(stream, bars=True) as view:
        view.show("straight-2", 12, 24)
        view.say("interruption 1/3: requeue landed; the run continues from step 13")
    text = stream.getvalue()
    assert "straight-2" in text and "12/24 steps" in text and "interruption 1/3: requeue landed" in text
