"""Bad input gets a clear error that names the value and the fix, before anything changes."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator
from torch import nn
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.utils.data import DataLoader, TensorDataset
from workloads import RunSpec, assert_bitwise_equal, build, snapshot

from elfes.engine import Monitor, StepOutput, TrainConfig, Trainer
from elfes.refusals import ConfigurationError

QUIET = dict(evaluate_every=None, checkpoint_every=None)


def tiny_trainer(step, *, batches: int = 4, batch_sampler=None) -> Trainer:
    data = TensorDataset(torch.arange(batches * 2, dtype=torch.float32).unsqueeze(1))
    model = nn.Linear(1, 1)
    loader = DataLoader(data, batch_sampler=batch_sampler) if batch_sampler is not None else DataLoader(data, batch_size=2)
    return Trainer(Accelerator(cpu=True, gradient_accumulation_steps=2), model,
                   torch.optim.SGD(model.parameters(), lr=0.1), loader, step)


@pytest.mark.parametrize("weight", [-1.0, float("nan"), float("inf")])
def test_a_negative_or_nonfinite_loss_weight_is_refused_before_the_update(weight):
    def step(model, batch):
        (inputs,) = batch
        bad = inputs[0, 0] >= 4  # the third batch
        return StepOutput(loss=model(inputs).square().mean(), num_samples=len(inputs),
                          loss_weight=torch.tensor(weight) if bad else torch.tensor(2.0))

    trainer = tiny_trainer(step)
    with pytest.raises(ValueError, match=r"loss_weight at epoch 0, batch 2 is negative or nonfinite"):
        trainer.train(TrainConfig(epochs=1, **QUIET))
    assert trainer.state.step == 1  # the first window trained; the second was refused before updating


@pytest.mark.parametrize("num_samples", [-1, 2.5, "2", None])
def test_num_samples_must_be_a_count(num_samples):
    def step(model, batch):
        (inputs,) = batch
        return StepOutput(loss=model(inputs).square().mean(), num_samples=num_samples)

    trainer = tiny_trainer(step)
    before = {name: tensor.clone() for name, tensor in trainer.module.state_dict().items()}
    with pytest.raises(ValueError, match=rf"num_samples at epoch 0, batch 0 is {num_samples!r}.*int >= 0"):
        trainer.train(TrainConfig(epochs=1, **QUIET))
    assert trainer.state.step == 0 and trainer.state.samples == 0
    assert all(torch.equal(before[name], tensor) for name, tensor in trainer.module.state_dict().items())


def test_a_loader_that_yields_fewer_batches_than_its_length_is_refused():
    class ShortBatchSampler:
        def __len__(self) -> int:
            return 4

        def __iter__(self):
            yield from ([0, 1], [2, 3], [4, 5])  # one batch fewer than promised

    def step(model, batch):
        (inputs,) = batch
        return StepOutput(loss=model(inputs).square().mean(), num_samples=len(inputs))

    trainer = tiny_trainer(step, batch_sampler=ShortBatchSampler())
    with pytest.raises(RuntimeError, match=r"yielded 3 batches in epoch 0 where its length promised 4"):
        trainer.train(TrainConfig(epochs=1, **QUIET))
    assert trainer.state.step == 1 and trainer.state.next_batch == 2  # the short window was not counted


def test_reduce_lr_on_plateau_must_read_the_monitor_the_same_way():
    run = build(RunSpec(warmup=False))
    run.trainer.scheduler = ReduceLROnPlateau(run.trainer.optimizer, mode="max")
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau\(mode='max'\).*Monitor\(mode='min'\).*same mode"):
        run.trainer.train(run.config)
    assert run.trainer.state.batches == 0


def test_a_process_of_a_multi_process_launch_that_trains_alone_is_refused(monkeypatch):
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(1, 1)
    loader = DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2)
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun exports to each of its processes
    with pytest.raises(ConfigurationError, match=r"WORLD_SIZE=2.*num_processes=1.*Accelerator\(cpu=True\) or set ACCELERATE_USE_CPU=1"):
        Trainer(accelerator, model, torch.optim.SGD(model.parameters(), lr=0.1), loader, lambda m, b: None)


def test_monitor_mode_and_patience_are_validated_by_name():
    with pytest.raises(ValueError, match="Monitor.patience is 0"):
        Monitor("validation/loss", patience=0)


def test_a_monitor_naming_a_metric_the_evaluation_does_not_report_is_refused_with_the_choices(tmp_path):
    run = build(RunSpec(warmup=False))
    run.config = TrainConfig(epochs=1, monitor=Monitor("validation/accuracy"))
    with pytest.raises(ValueError, match=r"'validation/accuracy' is not among the evaluation results \[.*'validation/loss'.*\]; name one of them"):
        run.trainer.train(run.config, checkpoint_dir=tmp_path)
    assert run.trainer.state.step == 4  # raised at the first evaluation, the end of epoch 0


def test_a_resume_that_switches_model_randomness_is_refused_and_a_checkpoint_older_than_the_record_resumes(tmp_path):
    """TrainConfig.model_randomness is recorded in every checkpoint: switching it at a resume (which would change
    every dropout draw silently) is refused naming both values and what to do; a checkpoint written before the
    record existed resumes, and the checkpoints written after it record the run's value."""
    from workloads import fresh_accelerate

    from elfes.engine.checkpoint import resume_source

    spec = RunSpec(epochs=1, evaluate=False, monitor=False, warmup=False)
    fresh_accelerate()
    first = build(spec)
    first.trainer.train(first.config, checkpoint_dir=tmp_path / "a")
    last = resume_source(tmp_path / "a" / "last")[0].resolve()
    payload = torch.load(last, weights_only=True)
    assert payload["progress"]["model_randomness"] == "per_rank"

    fresh_accelerate()
    switched = build(spec.with_(epochs=2, model_randomness="per_batch"))
    before = snapshot(switched.trainer)
    with pytest.raises(ConfigurationError) as refused:
        switched.trainer.train(switched.config, checkpoint_dir=tmp_path / "a", resume_from=last)
    assert str(refused.value) == (
        f"Checkpoint {last} does not match this run:\n"
        "  - model_randomness: the checkpoint has 'per_rank', this run has 'per_batch'; the dropout and every other "
        "torch draw of the model would change at the resume\n"
        "Resume with the same batching (on another world size, the same window of microbatches per update), "
        "objective, EMA, precision, optimizer, scheduler, TrainConfig.model_randomness and model (names, shapes and "
        "dtypes); to change them, start a new run from its weights (load_weights).")
    assert switched.trainer.state.step == 0, "refused before anything of the checkpoint was loaded"
    assert_bitwise_equal(before, snapshot(switched.trainer), "the refused trainer")

    del payload["progress"]["model_randomness"]  # as every checkpoint written before the record existed
    older = tmp_path / "b" / last.name
    older.parent.mkdir()
    torch.save(payload, older)
    fresh_accelerate()
    continued = build(spec.with_(epochs=2, model_randomness="per_batch"))
    state = continued.trainer.train(continued.config, checkpoint_dir=tmp_path / "b", resume_from=older)
    assert state.epoch == 2
    final = torch.load(resume_source(tmp_path / "b" / "last")[0], weights_only=True)
    assert final["progress"]["model_randomness"] == "per_batch"
