"""What a badly timed kill leaves behind, and how the next launch recovers from it bitwise."""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

import pytest
import torch
from workloads import RunSpec, assert_bitwise_equal, build, fresh_accelerate, snapshot

from elfes.engine import CheckpointError, Interval, Monitor
from elfes.engine.checkpoint import CheckpointName, read_checkpoint


def train(spec: RunSpec, directory: Path, **kwargs):
    fresh_accelerate()
    run = build(spec)
    state = run.trainer.train(run.config, checkpoint_dir=directory, **kwargs)
    return run, state


def step_of(path: Path) -> int:
    return CheckpointName.parse(path.name).step


def test_a_missing_last_resumes_from_the_newest_complete_checkpoint_with_a_warning(tmp_path):
    """A kill after the first checkpoint was renamed into place but before ``last`` existed."""
    spec = RunSpec(checkpoint_every=Interval(2, "step"), warmup=False)
    expected, _ = train(spec, tmp_path / "straight")
    short = spec.with_(max_steps=2)
    train(short, tmp_path / "run")
    checkpoints = tmp_path / "run"
    for pointer in ("last", "best", "final"):
        (checkpoints / pointer).unlink()
    published = sorted(p for p in checkpoints.iterdir() if CheckpointName.parse(p.name))
    assert [step_of(p) for p in published] == [2]

    with pytest.warns(UserWarning, match=r"last does not exist .*resuming from .*step-00000002"):
        run, state = train(spec, checkpoints, resume_from=checkpoints / "last")
    assert state.stop_reason is None and (checkpoints / "last").is_symlink()
    assert_bitwise_equal(snapshot(expected.trainer), snapshot(run.trainer), "resumed from the newest complete file")


def test_a_dangling_last_is_skipped_but_a_folder_of_two_runs_is_refused(tmp_path):
    spec = RunSpec(epochs=1, checkpoint_every=Interval(1, "step"), evaluate=False, warmup=False)
    train(spec.with_(max_steps=2), tmp_path)
    newest = max((p for p in tmp_path.iterdir() if CheckpointName.parse(p.name)), key=step_of)
    (tmp_path / "last").unlink()
    os.symlink("step-00000099-batches-0000000999.pt", tmp_path / "last")  # dangling
    with pytest.warns(UserWarning, match=r"last is dangling"):
        run, state = train(spec.with_(max_steps=3), tmp_path, resume_from=tmp_path / "last")
    assert state.step == 3

    other = tmp_path.parent / "other"
    train(spec.with_(max_steps=1, seed=7), other)
    foreign = next(p for p in other.iterdir() if CheckpointName.parse(p.name))
    os.replace(foreign, tmp_path / "step-00000100-batches-0000001000.pt")  # a file of another run
    (tmp_path / "last").unlink()
    with pytest.raises(CheckpointError, match=r"checkpoints of 2 different runs"):
        train(spec.with_(max_steps=3), tmp_path, resume_from=tmp_path / "last")
    assert newest.exists()


def test_every_checkpoint_of_a_run_carries_its_id(tmp_path):
    spec = RunSpec(epochs=1, checkpoint_every=Interval(1, "step"), evaluate=False, warmup=False, max_steps=3)
    train(spec, tmp_path)
    ids = {read_checkpoint(p)["run_id"] for p in tmp_path.iterdir() if CheckpointName.parse(p.name)}
    assert len(ids) == 1 and len(next(iter(ids))) == 32
    train(spec.with_(max_steps=4), tmp_path, resume_from=tmp_path / "last")
    assert {read_checkpoint(p)["run_id"] for p in tmp_path.iterdir() if CheckpointName.parse(p.name)} == ids


def test_a_stale_best_pointer_is_repaired_on_resume_and_retention_keeps_the_real_best(tmp_path):
    """A kill between re-pointing ``last`` and ``best`` leaves ``best`` at an older file."""
    spec = RunSpec(evaluate_every=Interval(1, "step"), checkpoint_every=Interval(1, "step"), keep_checkpoints=2, warmup=False)
    _, state = train(spec.with_(max_steps=4), tmp_path)
    best_file = (tmp_path / "best").resolve()
    assert step_of(best_file) == state.best_step
    stale = next(p for p in tmp_path.iterdir() if CheckpointName.parse(p.name) and p.resolve() != best_file)
    (tmp_path / "best").unlink()
    os.symlink(stale.name, tmp_path / "best")

    fresh_accelerate()
    run = build(spec)
    run.trainer.step = _raise_after(run.trainer.step, calls=1)  # stop right after the resume
    with pytest.raises(RuntimeError, match="stop here"):
        run.trainer.train(run.config, checkpoint_dir=tmp_path, resume_from=tmp_path / "last")
    assert (tmp_path / "best").resolve() == best_file

    # Retention (keep 2) runs at every save; the state's best file survives even when best is stale.
    (tmp_path / "best").unlink()
    os.symlink(stale.name, tmp_path / "best")
    resumed, final = train(spec, tmp_path, resume_from=tmp_path / "last")
    assert (tmp_path / "best").resolve().exists()
    assert step_of((tmp_path / "best").resolve()) == final.best_step


def _raise_after(step, calls: int):
    count = 0

    def wrapped(model, batch):
        nonlocal count
        count += 1
        if count > calls:
            raise RuntimeError("stop here")
        return step(model, batch)

    return wrapped


def test_a_float32_checkpoint_is_refused_by_a_float64_model(tmp_path):
    spec = RunSpec(epochs=1, evaluate=False, warmup=False, max_steps=1)
    train(spec, tmp_path)
    fresh_accelerate()
    run = build(spec.with_(dtype="float64", max_steps=2))
    before = snapshot(run.trainer)
    with pytest.raises(CheckpointError, match=r"of another dtype: .*torch.float32 -> torch.float64"):
        run.trainer.train(run.config, checkpoint_dir=tmp_path, resume_from=tmp_path / "last")
    assert_bitwise_equal(before, snapshot(run.trainer), "nothing loaded")


def test_a_truncated_checkpoint_is_reported_without_a_chained_traceback(tmp_path):
    spec = RunSpec(epochs=1, evaluate=False, warmup=False, checkpoint_every=Interval(1, "step"), max_steps=2)
    train(spec, tmp_path)
    last = (tmp_path / "last").resolve()
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"truncated or corrupted.*Resume from the previous checkpoint") as caught:
        read_checkpoint(tmp_path / "last")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_numpy_scalars_from_a_lambda_schedule_do_not_make_checkpoints_unloadable(tmp_path):
    """np.float64 factors end up in the scheduler's and optimizer's state dicts."""
    import numpy as np
    from torch.optim.lr_scheduler import LambdaLR

    spec = RunSpec(epochs=1, evaluate=False, warmup=False, checkpoint_every=Interval(1, "step"), max_steps=2)
    fresh_accelerate()
    run = build(spec)
    run.trainer.scheduler = LambdaLR(run.trainer.optimizer, lambda step: np.float64(0.5) ** step)
    run.trainer.train(run.config, checkpoint_dir=tmp_path)
    payload = read_checkpoint(tmp_path / "last")  # weights_only=True
    assert payload["state"]["step"] == 2
    assert all(type(lr) is float for lr in payload["scheduler"]["_last_lr"])


def test_a_field_safe_loading_cannot_rebuild_is_refused_at_the_first_save_with_its_name(tmp_path):
    class Opaque:
        pass

    class Schedule:
        def __init__(self):
            self.opaque = Opaque()

        def __call__(self, step):
            return 1.0

    from torch.optim.lr_scheduler import LambdaLR

    spec = RunSpec(epochs=1, evaluate=False, warmup=False, checkpoint_every=Interval(1, "step"), max_steps=3)
    fresh_accelerate()
    run = build(spec)
    run.trainer.scheduler = LambdaLR(run.trainer.optimizer, Schedule())
    with pytest.raises(TypeError, match=r"checkpoint\['scheduler'\]\['lr_lambdas'\]\[0\]\['opaque'\] holds a .*Opaque"):
        run.trainer.train(run.config, checkpoint_dir=tmp_path)
    assert run.trainer.state.step == 1  # refused at the first save, not after training
    assert not [p for p in tmp_path.iterdir() if CheckpointName.parse(p.name)]


def test_raising_max_steps_of_a_finished_run_with_patience_and_a_plateau_scheduler_is_the_straight_run(tmp_path):
    """The end-of-budget evaluation fed patience and the plateau scheduler; a continuation forgets it."""
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    spec = RunSpec(warmup=False, epochs=3, evaluate_every=Interval(4, "step"), checkpoint_every=None)

    def run_with(spec: RunSpec, directory: Path, **kwargs):
        fresh_accelerate()
        run = build(spec)
        run.trainer.scheduler = ReduceLROnPlateau(run.trainer.optimizer, patience=0, factor=0.5)
        config = dataclasses.replace(run.config, monitor=Monitor("validation/loss", patience=2))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = run.trainer.train(config, checkpoint_dir=directory, **kwargs)
        return run, state

    straight, straight_state = run_with(spec, tmp_path / "straight")
    short, short_state = run_with(spec.with_(max_steps=6), tmp_path / "run")
    assert short_state.step == 6
    continued, state = run_with(spec, tmp_path / "run", resume_from=tmp_path / "run" / "final")
    assert (state.step, state.stop_reason) == (straight_state.step, straight_state.stop_reason)
    assert state.best_step == straight_state.best_step
    assert_bitwise_equal(snapshot(straight.trainer), snapshot(continued.trainer), "continued past a final evaluation")
    lrs = [group["lr"] for group in continued.trainer.optimizer.param_groups]
    assert lrs == [group["lr"] for group in straight.trainer.optimizer.param_groups]
    assert torch.equal(torch.tensor(lrs), torch.tensor([group["lr"] for group in straight.trainer.optimizer.param_groups]))
