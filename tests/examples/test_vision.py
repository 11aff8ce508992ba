"""The vision example: augmentation drawn in four DataLoader workers, preempted through its README's
commands on the local executor, ends bitwise equal (torch.equal on every tensor) to a straight run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from local_jobs import JOB_TIMEOUT_S, diagnostics, reaped_run_dirs, training_in_attempt_1, wait_ended, wait_for
from run_comparison import assert_runs_bitwise_equal

from examples.vision.data import RandomCropAndFlip, augmentation, bars

REPOSITORY = Path(__file__).resolve().parents[2]
# 128 images in batches of 16, 3 epochs: 24 updates, a train record each; four workers as in job.yaml.
TINY = {"train_images": 128, "validation_images": 64, "batch_size": 16, "epochs": 3, "workers": 4, "log_every": 1}


@pytest.fixture
def run_dirs() -> Iterator[list[Path]]:
    yield from reaped_run_dirs()


def test_the_stand_in_augmentation_draws_from_the_global_torch_generator_as_torchvision_does() -> None:
    image = bars(1, 20, seed=0)[0][0]
    crops = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        crops.append(RandomCropAndFlip(16)(image))
    assert crops[0].shape == (3, 16, 16)
    assert torch.equal(crops[0], crops[1]) and not torch.equal(crops[0], crops[2])
    transform, source = augmentation(16)
    assert source in ("torchvision", "stand-in") and transform(image).shape == (3, 16, 16)


def _readme_block(name: str) -> list[str]:
    text = (REPOSITORY / "examples" / "vision" / "README.md").read_text()
    block = text.split(f"<!-- doc-test: {name} -->\n```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def _elfes(command: str, cwd: Path) -> subprocess.CompletedProcess:
    assert command.startswith("elfes ")
    completed = subprocess.run([str(Path(sys.executable).with_name("elfes")), *command.split()[1:]], cwd=cwd,
                               capture_output=True, text=True, timeout=JOB_TIMEOUT_S, env={**os.environ, "PYTHONPATH": str(cwd)})
    assert completed.returncode == 0, f"{command}: {completed.stdout[-2000:]}{completed.stderr[-2000:]}"
    return completed


# The job of the README's commands, whose first attempt waits after its 5th batch while a hold file exists
# and no stop is requested (waiting changes no number): the preemption lands mid-run however fast it trains.
HELD_JOB = """
import os, time
from examples.vision import job as vision

def main(job):
    hold = job.config.pop("hold_file")
    batches = 0

    def held_step(model, batch):
        nonlocal batches
        batches += 1
        while job.attempt == 1 and batches > 5 and os.path.exists(hold) and job.stop.signal is None:
            time.sleep(0.02)
        return vision.step(model, batch)

    return vision.run(job, held_step)
"""


def test_the_commands_of_its_readme_preempt_the_job_which_resumes_bitwise(tmp_path: Path, run_dirs: list[Path]) -> None:
    """The README's submit, preempt and status lines in a copy whose job.yaml holds the TINY config (and a
    step that holds attempt 1 mid-run until the preemption), beside a straight run of the same spec."""
    shutil.copytree(REPOSITORY / "examples", tmp_path / "examples")
    (tmp_path / "held_vision.py").write_text(HELD_JOB)
    hold = tmp_path / "hold"
    hold.touch()
    spec_file = tmp_path / "examples" / "vision" / "job.yaml"
    spec = {**yaml.safe_load(spec_file.read_text()), "config": TINY}
    straight_spec = tmp_path / "straight.yaml"
    straight_spec.write_text(yaml.safe_dump({**spec, "name": "straight", "workdir": str(tmp_path),
                                             "run_dir": str(tmp_path / "runs" / "straight")}, sort_keys=False))
    spec.update(entrypoint="held_vision:main", config={**TINY, "hold_file": str(hold)})
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    submit, preempt, until_ended = _readme_block("vision/run")
    run_dir, straight = tmp_path / "runs" / "vision", tmp_path / "runs" / "straight"
    run_dirs.extend([run_dir, straight])
    _elfes(submit, tmp_path)
    _elfes(f"elfes submit {straight_spec}", tmp_path)
    wait_for(lambda: training_in_attempt_1(run_dir, 1), "attempt 1 to train", run_dir)
    _elfes(preempt, tmp_path)
    _elfes(until_ended, tmp_path)
    state = wait_ended(run_dir)
    assert [a.outcome for a in state.attempts] == ["requeued", "finished"], diagnostics(run_dir)
    assert 1 <= state.attempts[0].step < state.attempts[-1].step == 24, "the preemption landed mid-run"
    assert wait_ended(straight).status == "finished", diagnostics(straight)
    assert_runs_bitwise_equal(run_dir, straight)


def _train_in_process(directory: Path, *, pause_at: int | None = None, resume: bool = False) -> list[torch.Tensor]:
    """The vision job's model and data with torchvision's own transforms, trained here; its final weights."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader

    from elfes.engine import Interval, StopRequest, TrainConfig, Trainer
    from examples.vision.data import AugmentedBars
    from examples.vision.job import SmallCNN, step

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    set_seed(0)
    transform, source = augmentation(16)
    assert source == "torchvision"
    images, labels = bars(64, 20, seed=1)
    loader = DataLoader(AugmentedBars(images, labels, transform), batch_size=8, shuffle=True, num_workers=2)
    model, stop, calls = SmallCNN(), StopRequest(), {"n": 0}

    def pausing(module, batch):
        calls["n"] += 1
        if calls["n"] == pause_at:
            stop.request("test pause")
        return step(module, batch)

    trainer = Trainer(Accelerator(cpu=True), model, torch.optim.AdamW(model.parameters(), lr=3e-3), loader, pausing)
    trainer.train(TrainConfig(epochs=2, checkpoint_every=Interval(1, "step")), checkpoint_dir=directory, stop=stop,
                  resume_from=directory / "last" if resume else None)
    return [tensor.clone() for tensor in model.state_dict().values()]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torchvision's wheels need the CUDA build of torch")
def test_torchvision_transforms_in_workers_resume_bitwise(tmp_path: Path) -> None:
    """The real RandomResizedCrop and RandomHorizontalFlip, in two workers: paused mid-epoch and resumed,
    the weights end torch.equal to a straight run (run by benchmarks/gpu_check.sh)."""
    pytest.importorskip("torchvision", reason="install torchvision for the torch build of this machine")
    straight = _train_in_process(tmp_path / "straight")
    _train_in_process(tmp_path / "paused", pause_at=3)
    resumed = _train_in_process(tmp_path / "paused", resume=True)
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed, strict=True))
