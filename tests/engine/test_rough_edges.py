"""What new users and an adversarial trial hit: each case failed before its fix."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from checkpoint_files import tmpfs
from launching import launch_environment
from workloads import RunSpec, build, events_named, fresh_accelerate, mse_step, quiet_logger

from elfes.engine import Interval, Monitor, StopRequest, TrainConfig
from elfes.engine.checkpoint import CheckpointName
from elfes.engine.stop import stop_signals_in_use

HERE = Path(__file__).resolve().parent


def published(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if CheckpointName.parse(p.name)) if directory.is_dir() else []


# ------------------------------------------------------------------------------------------------
# Signals and stops


def test_a_second_sigint_interrupts_at_once_and_sigterm_never_escalates():
    stop = StopRequest()
    with stop.catch_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM only repeats the request
        assert (stop.reason, stop.signal) == ("SIGTERM", "SIGTERM")
    other = StopRequest()
    with other.catch_signals():
        os.kill(os.getpid(), signal.SIGINT)
        assert other.reason == "SIGINT"
        with pytest.raises(KeyboardInterrupt, match="interrupted again: not saving"):
            os.kill(os.getpid(), signal.SIGINT)


def test_the_caught_signal_set_is_configurable_and_restored():
    stop = StopRequest()
    before = signal.getsignal(signal.SIGUSR2)
    with stop.catch_signals(signals=(signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)):
        assert signal.SIGUSR2 in stop.signals and signal.SIGUSR2 in stop_signals_in_use()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert (stop.reason, stop.signal) == ("SIGUSR2", "SIGUSR2")
    assert signal.getsignal(signal.SIGUSR2) is before
    assert signal.SIGUSR2 not in stop_signals_in_use()


def test_dataloader_workers_ignore_the_requeue_signal_when_it_is_caught(tmp_path):
    """SIGUSR2 to the whole process group while two workers are alive: the run pauses, no worker dies."""
    result = subprocess.run(
        [sys.executable, str(HERE / "signal_cases.py"), "group-sigusr2", str(tmp_path)],
        env=launch_environment(), capture_output=True, text=True, timeout=300, start_new_session=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stopped SIGUSR2 at step 2" in result.stdout
    assert (tmp_path / "last").is_symlink()


def test_a_stop_requested_before_train_saves_last_at_once_and_trains_nothing(tmp_path):
    spec = RunSpec(epochs=1, evaluate=False)
    run = build(spec)
    calls = []
    run.trainer.step = lambda model, batch: calls.append(1) or mse_step(model, batch)
    stop = StopRequest()
    stop.request("preempted before start")
    with quiet_logger(tmp_path) as logger:
        run.trainer.logger = logger
        state = run.trainer.train(run.config, checkpoint_dir=tmp_path / "checkpoints", stop=stop)
    assert calls == [] and state.step == 0 and state.stop_reason == "preempted before start"
    assert CheckpointName.parse((tmp_path / "checkpoints" / "last").resolve().name) == CheckpointName(0, 0)
    assert [e["reason"] for e in events_named(tmp_path, "stopped")] == ["preempted before start"]


def test_a_stop_is_announced_before_its_window_ends(tmp_path):
    """The handler only sets the flag; the loop logs ``stop_signal`` before the next microbatch."""
    spec = RunSpec(epochs=1, evaluate=False, accumulation=3)
    run = build(spec)
    stop = StopRequest()
    seen_mid_window = []

    def step(model, batch):
        calls = len(seen_mid_window)
        if calls == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # during the first microbatch of a window of three
        seen_mid_window.append([e["signal"] for e in events_named(tmp_path, "stop_signal")])
        return mse_step(model, batch)

    run.trainer.step = step
    with quiet_logger(tmp_path) as logger, stop.catch_signals():
        run.trainer.logger = logger
        state = run.trainer.train(run.config, checkpoint_dir=tmp_path / "checkpoints", stop=stop)
    assert state.stop_reason == "SIGTERM" and state.step == 1
    assert seen_mid_window == [[], ["SIGTERM"], ["SIGTERM"]]
    assert len(events_named(tmp_path, "stop_signal")) == 1


def test_an_exception_in_user_code_is_recorded_as_failed_before_it_propagates(tmp_path):
    run = build(RunSpec(epochs=1, evaluate=False))
    calls = []

    def step(model, batch):
        calls.append(1)
        if len(calls) == 5:
            raise KeyError("no such column: 'label'")
        return mse_step(model, batch)

    run.trainer.step = step
    with quiet_logger(tmp_path) as logger:
        run.trainer.logger = logger
        with pytest.raises(KeyError):
            run.trainer.train(run.config)
    (failed,) = events_named(tmp_path, "failed")
    assert failed["exception"] == "KeyError" and "no such column" in failed["message"]
    assert (failed["epoch"], failed["step"]) == (1, 1)


# ------------------------------------------------------------------------------------------------
# Refusals before the first batch


def test_a_checkpoint_dir_that_is_a_file_is_refused_before_the_first_batch(tmp_path):
    target = tmp_path / "checkpoints"
    target.write_text("not a folder")
    run = build(RunSpec(epochs=1, evaluate=False))
    with pytest.raises(ValueError, match=r"checkpoint_dir .*checkpoints is a file, not a folder"):
        run.trainer.train(run.config, checkpoint_dir=target)
    assert run.trainer.state.batches == 0 and target.read_text() == "not a folder"


def test_a_read_only_checkpoint_dir_is_refused_before_the_first_batch(tmp_path):
    with tmpfs(tmp_path / "readonly", "ro", "size=1m") as folder:
        run = build(RunSpec(epochs=1, evaluate=False))
        with pytest.raises(ValueError, match=r"checkpoint_dir .*readonly cannot be written \(Read-only file system\)") as caught:
            run.trainer.train(run.config, checkpoint_dir=folder)
        assert ".tmp-" not in str(caught.value)
        assert run.trainer.state.batches == 0


def test_no_space_left_names_the_checkpoint_and_keeps_the_previous_last(tmp_path):
    with tmpfs(tmp_path / "small", "size=2m") as folder:
        run = build(RunSpec(epochs=1, evaluate=False, checkpoint_every=Interval(1, "step")))
        calls = []

        def step(model, batch):
            calls.append(1)
            if len(calls) == 4:  # in the second window: fill the disk after the first checkpoint
                with open(folder / "filler", "wb") as filler:
                    try:
                        while True:
                            filler.write(b"\0" * 65536)
                            filler.flush()
                    except OSError:
                        pass
            return mse_step(model, batch)

        run.trainer.step = step
        with pytest.raises(OSError, match=r"No space left to write .*step-00000002-batches-0000000006\.pt.*previous file"):
            run.trainer.train(run.config, checkpoint_dir=folder)
        assert [CheckpointName.parse(p.name).step for p in published(folder)] == [1]
        assert (folder / "last").resolve() == published(folder)[0]
        assert not [p for p in folder.iterdir() if p.name.startswith(".tmp-")]


def test_a_misspelt_monitor_loader_is_refused_before_the_first_batch():
    run = build(RunSpec(epochs=1))
    config = dataclasses.replace(run.config, monitor=Monitor("valdiation/loss"))
    with pytest.raises(ValueError, match=r"no loader named 'valdiation' \(it has \['validation'\]\)"):
        run.trainer.train(config)
    assert run.trainer.state.batches == 0


def test_a_misspelt_monitor_metric_keeps_the_checkpoint_due_at_that_boundary(tmp_path):
    run = build(RunSpec(epochs=1, evaluate_every=Interval(2, "step"), checkpoint_every=Interval(2, "step")))
    config = dataclasses.replace(run.config, monitor=Monitor("validation/los"))
    with pytest.raises(ValueError, match=r"Monitor metric 'validation/los' is not among the evaluation results"):
        run.trainer.train(config, checkpoint_dir=tmp_path)
    assert [CheckpointName.parse(p.name).step for p in published(tmp_path)] == [2]
    assert CheckpointName.parse((tmp_path / "last").resolve().name).step == 2


@pytest.mark.parametrize(("decay", "error"), [("0.9", TypeError), (True, TypeError), (1.0, ValueError), (0.0, ValueError)])
def test_ema_decay_refusals_follow_the_type_and_value_convention(decay, error):
    from elfes.engine.ema import ExponentialMovingAverage

    with pytest.raises(error, match=r"ema_decay is .*; use a number strictly between 0 and 1"):
        ExponentialMovingAverage(torch.nn.Linear(2, 2), decay)


def test_epochs_zero_is_refused_by_the_config():
    with pytest.raises(ValueError, match=r"TrainConfig.epochs is 0; use an integer >= 1"):
        TrainConfig(epochs=0)


# ------------------------------------------------------------------------------------------------
# Run records


def test_learning_rates_are_logged_by_parameter_group_name(tmp_path):
    run = build(RunSpec(epochs=1, evaluate=False))  # weight_decay_groups names its groups
    with quiet_logger(tmp_path) as logger:
        run.trainer.logger = logger
        run.trainer.train(run.config)
    metrics = events_named(tmp_path, "train")[0]["metrics"]
    assert {"lr/decay", "lr/no_decay"} <= set(metrics) and not any(name in metrics for name in ("lr/0", "lr/1"))


def test_resuming_past_a_smaller_budget_says_so(tmp_path):
    spec = RunSpec(epochs=2, evaluate=False)
    run = build(spec)
    run.trainer.train(run.config, checkpoint_dir=tmp_path / "checkpoints")
    fresh_accelerate()
    smaller = build(spec.with_(epochs=1))
    with quiet_logger(tmp_path) as logger, pytest.warns(UserWarning, match=r"past the 4 steps \(1 epochs\) this TrainConfig allows"):
        smaller.trainer.logger = logger
        state = smaller.trainer.train(smaller.config, checkpoint_dir=tmp_path / "checkpoints", resume_from=tmp_path / "checkpoints" / "final")
    assert state.step == 8
    (resumed,) = events_named(tmp_path, "resumed")
    assert resumed["past_budget"] is True and resumed["budget"]["planned_steps"] == 4


class PauseAt:
    def __init__(self, stop: StopRequest, call: int) -> None:
        self.stop, self.call, self.calls = stop, call, 0

    def __call__(self, model, batch):
        self.calls += 1
        if self.calls == self.call:
            self.stop.request("test pause")
        return mse_step(model, batch)


def test_a_pause_does_not_change_the_logged_train_metrics(tmp_path):
    """log_every=3 with a pause after step 2: the step-3 event covers steps 1-3 in both runs."""
    spec = RunSpec(epochs=2, log_every=3, evaluate=False)

    def train_events(directory: Path, pause_at_call: int | None) -> list[dict]:
        resume_from = None
        for attempt in ("first", "second"):
            fresh_accelerate()
            run = build(spec)
            stop = StopRequest()
            if attempt == "first" and pause_at_call is not None:
                run.trainer.step = PauseAt(stop, pause_at_call)
            with quiet_logger(directory) as logger:
                run.trainer.logger = logger
                state = run.trainer.train(run.config, checkpoint_dir=directory / "checkpoints", resume_from=resume_from, stop=stop)
            if state.stop_reason is None:
                break
            resume_from = directory / "checkpoints" / "last"
        events = events_named(directory, "train")
        for event in events:
            del event["time"], event["metrics"]["samples_per_second"]
        return events

    straight = train_events(tmp_path / "straight", None)
    paused = train_events(tmp_path / "paused", pause_at_call=4)  # the 2nd window ends at step 2
    assert [e["step"] for e in straight] == [3, 6]
    assert paused == straight


def test_persistent_dataloader_workers_let_a_finished_run_exit(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from torch.utils.data import DataLoader
        from workloads import RegressionData, RunSpec, build, mse_step
        from elfes.engine import Evaluator, StopRequest
        run = build(RunSpec(epochs=2, num_workers=2))
        loader = DataLoader(RegressionData(13, seed=2), batch_size=4, num_workers=2, persistent_workers=True)
        run.trainer.evaluator = Evaluator(run.accelerator, {{"validation": loader}}, mse_step)
        train_loader = DataLoader(run.train_data, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)
        from elfes.engine import Trainer
        trainer = Trainer(run.accelerator, run.trainer.module, run.trainer.optimizer, train_loader, mse_step,
                          evaluator=run.trainer.evaluator)
        stop = StopRequest()
        with stop.catch_signals():
            state = trainer.train(run.config, stop=stop)
        print("trained", state.step, flush=True)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], env=launch_environment(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained 8" in result.stdout
