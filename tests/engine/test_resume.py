"""Pause anywhere, resume, and end with exactly the bits of the run that was never interrupted."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import pytest
import torch
from launching import launch_environment
from workloads import (
    RunSpec,
    StopInWindow,
    assert_bitwise_equal,
    build,
    first_call_of_window,
    fresh_accelerate,
    pause_and_resume,
    snapshot,
    windows_per_epoch,
)

from elfes.engine import Interval, StopRequest

HERE = Path(__file__).resolve().parent


@cache
def uninterrupted(spec: RunSpec) -> tuple[dict[str, torch.Tensor], tuple[int, ...], list[int]]:
    """Final tensors, final position and dataset reads of a run that was never paused: one run per spec, shared by
    the tests that compare with it (its checkpoints are not kept)."""
    fresh_accelerate()
    run = build(spec)
    with tempfile.TemporaryDirectory() as directory:
        state = run.trainer.train(run.config, checkpoint_dir=Path(directory))
    assert state.stop_reason is None
    return snapshot(run.trainer), (state.epoch, state.step, state.batches, state.samples), list(run.train_data.reads)


SPECS = {
    "shuffle-dropout-ema-adamw-warmup-tail-monitor": RunSpec(),
    "two-loader-workers": RunSpec(num_workers=2),
    "sgd-momentum-no-ema-step-eval": RunSpec(optimizer="sgd", ema_decay=None, warmup=False, max_grad_norm=None),
    "dropout-keyed-by-batch": RunSpec(model_randomness="per_batch"),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_pause_at_every_window_boundary_resumes_bitwise(name, tmp_path):
    spec = SPECS[name]
    expected, position, _ = uninterrupted(spec)
    total_windows = windows_per_epoch(spec) * spec.epochs
    for window in range(total_windows):
        directory = tmp_path / f"pause-{window}"
        run, state = pause_and_resume(spec, directory, [first_call_of_window(spec, window)])
        assert (state.epoch, state.step, state.batches, state.samples) == position
        assert_bitwise_equal(expected, snapshot(run.trainer), f"{name}: paused in window {window}")


def test_repeated_pauses_do_not_change_the_run(tmp_path):
    """Pausing three times, once right in the first window after a resume, changes nothing."""
    spec = SPECS["shuffle-dropout-ema-adamw-warmup-tail-monitor"]
    expected, position, _ = uninterrupted(spec)
    # Calls are counted per launch: pause in the 2nd window, then in the first window after resuming,
    # then in the 2nd window after that.
    run, state = pause_and_resume(spec, tmp_path, [4, 1, 4])
    assert (state.epoch, state.step, state.batches, state.samples) == position
    assert_bitwise_equal(expected, snapshot(run.trainer), "three pauses")


def test_a_real_sigterm_mid_window_stops_at_the_boundary_and_resumes_bitwise(tmp_path):
    spec = SPECS["shuffle-dropout-ema-adamw-warmup-tail-monitor"]
    expected, position, _ = uninterrupted(spec)
    fresh_accelerate()
    run = build(spec)
    stop = StopRequest()
    # The signal arrives during the 2nd microbatch of the 2nd window, through the real handler.
    run.trainer.step = StopInWindow(stop, 5, lambda: os.kill(os.getpid(), signal.SIGTERM))
    previous = signal.getsignal(signal.SIGTERM)
    with stop.catch_signals():
        state = run.trainer.train(run.config, checkpoint_dir=tmp_path, stop=stop)
    assert signal.getsignal(signal.SIGTERM) is previous
    assert state.stop_reason == "SIGTERM" and stop.signal == "SIGTERM"
    assert state.next_batch == 2 * spec.accumulation  # the window was finished, not cut
    assert state.step == 2
    fresh_accelerate()
    resumed = build(spec)
    final = resumed.trainer.train(resumed.config, checkpoint_dir=tmp_path, resume_from=tmp_path / "last")
    assert (final.epoch, final.step, final.batches, final.samples) == position
    assert_bitwise_equal(expected, snapshot(resumed.trainer), "SIGTERM mid-window")


def test_sigterm_to_the_process_group_spares_dataloader_workers(tmp_path):
    """SLURM signals every process of the job: workers must ignore it while the trainer stops cleanly."""
    spec = SPECS["two-loader-workers"]
    expected, position, _ = uninterrupted(spec)
    completed = subprocess.run(
        [sys.executable, str(HERE / "signal_cases.py"), "group-sigterm", str(tmp_path)],
        # The same intra-op thread count as this process: it changes float results bitwise.
        env=launch_environment(OMP_NUM_THREADS=str(torch.get_num_threads())),
        capture_output=True, text=True, timeout=120, start_new_session=True,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "stopped SIGTERM" in completed.stdout, completed.stdout
    fresh_accelerate()
    resumed = build(spec)
    final = resumed.trainer.train(resumed.config, checkpoint_dir=tmp_path, resume_from=tmp_path / "last")
    assert (final.epoch, final.step, final.batches, final.samples) == position
    assert_bitwise_equal(expected, snapshot(resumed.trainer), "process-group SIGTERM")


def test_mid_epoch_resume_reads_no_skipped_batch(tmp_path):
    spec = RunSpec(num_workers=0)
    _, _, reference_reads = uninterrupted(spec)
    directory = tmp_path / "run"
    fresh_accelerate()
    paused = build(spec)
    stop = StopRequest()
    paused.trainer.step = StopInWindow(stop, first_call_of_window(spec, 1))
    state = paused.trainer.train(paused.config, checkpoint_dir=directory, stop=stop)
    assert state.epoch == 0 and state.next_batch == 2 * spec.accumulation
    consumed = state.samples
    fresh_accelerate()
    resumed = build(spec)
    resumed.trainer.train(resumed.config, checkpoint_dir=directory, resume_from=directory / "last")
    # Not one read of the skipped samples: the resumed run reads exactly the rest, in the same order.
    assert resumed.train_data.reads == reference_reads[consumed:]


def test_raising_the_epoch_budget_of_a_finished_run_continues_it(tmp_path):
    spec = RunSpec(warmup=False, evaluate_every=Interval(1, "epoch"))
    expected, position, _ = uninterrupted(spec)
    fresh_accelerate()
    short = build(spec.with_(epochs=1))
    first = short.trainer.train(short.config, checkpoint_dir=tmp_path)
    assert first.epoch == 1 and os.readlink(tmp_path / "final") == os.readlink(tmp_path / "last")
    fresh_accelerate()
    longer = build(spec)
    final = longer.trainer.train(longer.config, checkpoint_dir=tmp_path, resume_from=tmp_path / "final")
    assert (final.epoch, final.step, final.batches, final.samples) == position
    assert_bitwise_equal(expected, snapshot(longer.trainer), "continued after raising epochs")


def test_resuming_a_finished_run_with_the_same_budget_changes_nothing(tmp_path):
    spec = RunSpec(epochs=1)
    fresh_accelerate()
    run = build(spec)
    run.trainer.train(run.config, checkpoint_dir=tmp_path)
    before = snapshot(run.trainer)
    checkpoints = sorted((p.name, os.lstat(p).st_ino, os.lstat(p).st_mtime_ns) for p in tmp_path.iterdir())
    fresh_accelerate()
    again = build(spec)
    state = again.trainer.train(again.config, checkpoint_dir=tmp_path, resume_from=tmp_path / "final")
    assert state.epoch == 1
    assert_bitwise_equal(before, snapshot(again.trainer), "idempotent resume")
    assert sorted((p.name, os.lstat(p).st_ino, os.lstat(p).st_mtime_ns) for p in tmp_path.iterdir()) == checkpoints


def test_resuming_with_another_torch_thread_count_warns(tmp_path):
    spec = RunSpec(epochs=1)
    fresh_accelerate()
    paused = build(spec)
    stop = StopRequest()
    paused.trainer.step = StopInWindow(stop, 1)
    paused.trainer.train(paused.config, checkpoint_dir=tmp_path, stop=stop)
    threads = torch.get_num_threads()
    fresh_accelerate()
    resumed = build(spec)
    torch.set_num_threads(threads + 1)
    try:
        with pytest.warns(UserWarning, match=rf"written with {threads} torch threads.*uses {threads + 1}.*OMP_NUM_THREADS"):
            resumed.trainer.train(resumed.config, checkpoint_dir=tmp_path, resume_from=tmp_path / "last")
    finally:
        torch.set_num_threads(threads)


def test_early_stopping_survives_a_pause_and_a_resume(tmp_path):
    """The uninterrupted run stops early; paused at that very boundary and resumed, it stops there too."""
    from elfes.engine import Monitor

    spec = RunSpec(epochs=3, warmup=False)

    def early_stopping(run):
        run.config = dataclasses.replace(run.config, monitor=Monitor("validation/loss", patience=1, min_delta=1e9))
        return run

    fresh_accelerate()
    reference = early_stopping(build(spec))
    stopped = reference.trainer.train(reference.config, checkpoint_dir=tmp_path / "reference")
    assert stopped.stop_reason == "early_stopping"
    expected = snapshot(reference.trainer)
    final = torch.load(tmp_path / "reference" / "final", weights_only=True)
    assert final["state"]["stop_reason"] == "early_stopping"  # the final file holds the final state

    # The second evaluation (step 4) exhausts patience: pause in the window that ends there.
    directory = tmp_path / "paused"
    fresh_accelerate()
    paused = early_stopping(build(spec))
    stop = StopRequest()
    paused.trainer.step = StopInWindow(stop, first_call_of_window(spec, 3))
    assert paused.trainer.train(paused.config, checkpoint_dir=directory, stop=stop).step == 4
    fresh_accelerate()
    resumed = early_stopping(build(spec))
    state = resumed.trainer.train(resumed.config, checkpoint_dir=directory, resume_from=directory / "last")
    assert (state.step, state.stop_reason) == (stopped.step, "early_stopping")
    assert_bitwise_equal(expected, snapshot(resumed.trainer), "early stop after a pause")

    # Resuming the finished run with the same configuration trains no further.
    fresh_accelerate()
    again = early_stopping(build(spec))
    state = again.trainer.train(again.config, checkpoint_dir=directory, resume_from=directory / "final")
    assert state.step == stopped.step
    assert_bitwise_equal(expected, snapshot(again.trainer), "resumed after early stopping")


def test_a_stop_saves_last_before_a_due_evaluation_which_runs_after_the_resume(tmp_path):
    """Within a preemption grace period, `last` must not wait for an evaluation."""
    import io

    from rich.console import Console

    from elfes.engine import RunLogger
    from elfes.records import read_events

    spec = RunSpec()  # evaluation every 2 steps
    expected, position, _ = uninterrupted(spec)
    fresh_accelerate()
    with RunLogger(tmp_path, is_main_process=True, console=Console(file=io.StringIO())) as logger:
        paused = build(spec, logger=logger)
        stop = StopRequest()
        paused.trainer.step = StopInWindow(stop, first_call_of_window(spec, 1))  # the window ending at step 2
        paused.trainer.train(paused.config, checkpoint_dir=tmp_path / "checkpoints", stop=stop)
    fresh_accelerate()
    with RunLogger(tmp_path, is_main_process=True, console=Console(file=io.StringIO())) as logger:
        resumed = build(spec, logger=logger)
        state = resumed.trainer.train(resumed.config, checkpoint_dir=tmp_path / "checkpoints",
                                      resume_from=tmp_path / "checkpoints" / "last")
    names = [(event["event"], event.get("step")) for event in read_events(tmp_path)]
    stopped = next(index for index, (name, _) in enumerate(names) if name == "stopped")
    assert ("evaluation", 2) not in names[:stopped], "the pause saved last without evaluating first"
    assert names[stopped + 1] == ("resumed", None)
    assert names[stopped + 2] == ("evaluation", 2), "the deferred evaluation runs first after the resume"
    assert (state.epoch, state.step, state.batches, state.samples) == position
    assert_bitwise_equal(expected, snapshot(resumed.trainer), "deferred evaluation")


def test_a_fresh_run_refuses_a_directory_that_holds_another_runs_checkpoints(tmp_path):
    fresh_accelerate()
    first = build(RunSpec(epochs=1))
    first.trainer.train(first.config, checkpoint_dir=tmp_path)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.iterdir() if not p.is_symlink())
    fresh_accelerate()
    second = build(RunSpec(epochs=1))
    with pytest.raises(ValueError, match=r"already holds checkpoints.*resume_from=.*last"):
        second.trainer.train(second.config, checkpoint_dir=tmp_path)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.iterdir() if not p.is_symlink()) == before


def test_sigterm_to_the_process_group_during_evaluation_spares_its_workers(tmp_path):
    completed = subprocess.run(
        [sys.executable, str(HERE / "signal_cases.py"), "group-sigterm-evaluation", str(tmp_path)],
        env=launch_environment(OMP_NUM_THREADS=str(torch.get_num_threads())),
        capture_output=True, text=True, timeout=120, start_new_session=True,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    # The first evaluation ends at step 2; the stop takes effect at the next window boundary.
    assert "stopped SIGTERM at step 3" in completed.stdout, completed.stdout
    assert (tmp_path / "last").is_symlink()


def test_raising_max_steps_of_a_run_that_ended_mid_epoch_continues_it(tmp_path):
    """A normal end at max_steps=3 (inside the first epoch) adds a final evaluation, which restores
    the RNG; raising the limit continues from the same data position to the same bits."""
    spec = RunSpec(warmup=False)
    expected, position, _ = uninterrupted(spec)
    fresh_accelerate()
    short = build(spec.with_(max_steps=3))
    first = short.trainer.train(short.config, checkpoint_dir=tmp_path)
    assert (first.epoch, first.step, first.next_batch) == (0, 3, 3 * spec.accumulation)
    fresh_accelerate()
    longer = build(spec)
    final = longer.trainer.train(longer.config, checkpoint_dir=tmp_path, resume_from=tmp_path / "final")
    assert (final.epoch, final.step, final.batches, final.samples) == position
    assert_bitwise_equal(expected, snapshot(longer.trainer), "continued after raising max_steps")
