"""Evaluation with raw or EMA weights, the Evaluator's counting, the monitor, intervals and StopRequest.

Real single-process trainers (``Accelerator(cpu=True)``) write real run records that are read back
with :func:`elfes.records.read_events`; nothing is mocked.
"""

from __future__ import annotations

import random
import re
import signal
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch._dynamo  # Accelerate imports it lazily (seconds); pay that at collection, not in a test
from accelerate import Accelerator
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler
from workloads import (
    DropoutMLP,
    RegressionData,
    RunSpec,
    build,
    fresh_accelerate,
    mse_step,
    quiet_logger,
)

from elfes.engine import (
    Evaluator,
    Interval,
    MeanMetric,
    Monitor,
    RunLogger,
    StepOutput,
    StopRequest,
    SumMetric,
    TrainConfig,
    Trainer,
    export_weights,
)
from elfes.records import read_events

PUBLISHED = re.compile(r"^step-(\d+)-batches-(\d+)\.pt$")






def events(run_dir: Path, name: str) -> list[dict]:
    return [event for event in read_events(run_dir) if event["event"] == name]


def step_of(path: Path) -> int:
    return int(PUBLISHED.match(Path(path).name)[1])


def load(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_state_equal(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor], what: str) -> None:
    assert expected.keys() == actual.keys(), f"{what}: {sorted(expected.keys() ^ actual.keys())}"
    different = [name for name in expected if not torch.equal(expected[name], actual[name])]
    assert not different, f"{what}: not bitwise equal: {different}"


@pytest.fixture
def logger(tmp_path):
    """A real RunLogger writing ``tmp_path / "run" / "events.jsonl"`` (flushed per event), closed after the test."""
    with quiet_logger(tmp_path / "run") as run_logger:
        yield run_logger


def logged_run(spec: RunSpec, logger: RunLogger, config: TrainConfig | None = None):
    """Train ``spec`` logging to ``logger``; returns the run, its state, the run and checkpoint folders."""
    fresh_accelerate()
    run_dir = logger.run_dir
    checkpoints = run_dir / "checkpoints"
    run = build(spec, logger=logger)
    state = run.trainer.train(config or run.config, checkpoint_dir=checkpoints)
    return run, state, run_dir, checkpoints


# ------------------------------------------------------------------------------------------------
# Raw or EMA weights


def test_periodic_evaluation_uses_ema_weights_and_explicit_apis_default_to_raw(tmp_path, logger):
    run, state, run_dir, checkpoints = logged_run(RunSpec(), logger)
    trainer = run.trainer
    evaluations = events(run_dir, "evaluation")
    assert [event["step"] for event in evaluations] == [2, 4, 6, 8]
    assert {event["weights"] for event in evaluations} == {"ema"}

    ema = trainer.evaluate(weights="ema")
    raw = trainer.evaluate(weights="raw")
    assert evaluations[-1]["metrics"] == ema
    assert ema["validation"]["loss"] != raw["validation"]["loss"]
    assert evaluations[-1]["metrics"] != raw
    assert trainer.evaluate() == raw  # explicit evaluation defaults to raw
    # best-model selection followed the EMA metrics
    assert state.best_metric == min(event["metrics"]["validation"]["loss"] for event in evaluations)

    trainer.save_model(tmp_path / "default.pt")
    trainer.save_model(tmp_path / "ema.pt", weights="ema")
    export_weights(checkpoints / "final", tmp_path / "exported-ema.pt", weights="ema")
    raw_weights = {name: tensor.detach().clone() for name, tensor in trainer.module.state_dict().items()}
    assert_state_equal(raw_weights, load(tmp_path / "default.pt"), "save_model() default")
    assert_state_equal(load(tmp_path / "exported-ema.pt"), load(tmp_path / "ema.pt"), "save_model(ema) vs export_weights(final, ema)")
    exports = [(event["weights"], event["path"]) for event in events(run_dir, "export")]
    assert exports == [("raw", str(tmp_path / "default.pt")), ("ema", str(tmp_path / "ema.pt"))]
    averaged = load(tmp_path / "ema.pt")
    assert any(not torch.equal(averaged[name], raw_weights[name]) for name in trainer.ema.state_dict())

    # The EMA metrics are those of a plain model holding the EMA weights.
    fresh_accelerate()
    accelerator = Accelerator(cpu=True)
    model = DropoutMLP()
    model.load_state_dict(averaged)
    evaluator = Evaluator(accelerator, {"validation": DataLoader(RegressionData(13, seed=2), batch_size=4)}, mse_step)
    assert evaluator.evaluate(model) == ema


def test_without_ema_periodic_evaluation_is_raw_and_ema_requests_fail(tmp_path, logger):
    run, _, run_dir, _ = logged_run(RunSpec(ema_decay=None), logger)
    trainer = run.trainer
    evaluations = events(run_dir, "evaluation")
    assert evaluations and {event["weights"] for event in evaluations} == {"raw"}
    assert evaluations[-1]["metrics"] == trainer.evaluate()
    with pytest.raises(ValueError, match="EMA"):
        trainer.evaluate(weights="ema")
    output = tmp_path / "model.pt"
    with pytest.raises(ValueError, match="EMA"):
        trainer.save_model(output, weights="ema")
    assert not output.exists()
    with pytest.raises(ValueError, match="'raw' or 'ema'"):
        trainer.evaluate(weights="averaged")


# ------------------------------------------------------------------------------------------------
# evaluate() restores mode, RNG and raw weights


class RandomEvaluationStep:
    """An evaluation step that draws from torch, Python and NumPy generators and records the mode."""

    def __init__(self) -> None:
        self.calls = 0
        self.modes: list[bool] = []
        self.fail = False

    def __call__(self, model, batch) -> StepOutput:
        self.calls += 1
        self.modes.append(model.training)
        torch.rand(1)
        random.random()
        np.random.rand()
        if self.fail:
            raise RuntimeError("evaluation step failed")
        return mse_step(model, batch)


def trainer_with(evaluation_step, *, ema_decay: float | None = 0.5) -> Trainer:
    fresh_accelerate()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = DropoutMLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    train = DataLoader(RegressionData(16, seed=1), batch_size=4, shuffle=True)
    validation = DataLoader(RegressionData(13, seed=2), batch_size=4)
    evaluator = Evaluator(accelerator, {"validation": validation}, evaluation_step)
    return Trainer(accelerator, model, optimizer, train, mse_step, evaluator=evaluator, ema_decay=ema_decay)


def generator_states():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def assert_generators_equal(before, after) -> None:
    assert torch.equal(before[0], after[0]), "torch RNG changed"
    assert before[1] == after[1], "python RNG changed"
    assert all(np.array_equal(a, b) for a, b in zip(before[2], after[2])), "numpy RNG changed"


def raw_parameters(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in trainer.module.state_dict().items()}


def test_evaluate_restores_mode_rng_and_raw_weights(tmp_path):
    step = RandomEvaluationStep()
    trainer = trainer_with(step)
    trainer.train(TrainConfig(epochs=1, evaluate_every=None, checkpoint_every=None))
    assert trainer.module.training
    raw = raw_parameters(trainer)
    assert any(not torch.equal(trainer.ema.average[name], raw[name]) for name in trainer.ema.average)

    for weights in ("raw", "ema"):
        step.calls, step.modes = 0, []
        trainer.module.train()
        before = generator_states()
        trainer.evaluate(weights=weights)
        assert step.calls == 4 and step.modes == [False] * 4, weights  # it ran in eval mode and drew numbers
        assert trainer.module.training, f"{weights}: training mode not restored"
        assert_generators_equal(before, generator_states())
        assert_state_equal(raw, raw_parameters(trainer), f"raw weights after {weights} evaluation")

    trainer.module.eval()
    trainer.evaluate(weights="ema")
    assert not trainer.module.training, "an eval-mode model was left in training mode"

    trainer.module.train()
    trainer.module.dropout.eval()  # a submodule the user keeps in eval mode stays there
    trainer.evaluate(weights="ema")
    modes = {name: module.training for name, module in trainer.module.named_modules()}
    assert modes == {"": True, "hidden": True, "norm": True, "dropout": False, "output": True}, modes


def test_a_failing_ema_evaluation_still_restores_everything(tmp_path):
    step = RandomEvaluationStep()
    trainer = trainer_with(step)
    trainer.train(TrainConfig(epochs=1, evaluate_every=None, checkpoint_every=None))
    trainer.module.train()
    raw = raw_parameters(trainer)
    before = generator_states()
    step.fail = True
    with pytest.raises(RuntimeError, match="evaluation step failed"):
        trainer.evaluate(weights="ema")
    assert trainer.module.training
    assert_generators_equal(before, generator_states())
    assert_state_equal(raw, raw_parameters(trainer), "raw weights after a failed EMA evaluation")


# ------------------------------------------------------------------------------------------------
# The Evaluator


class IndexedData(Dataset):
    """Float64 samples that also return their index, so the test sees which were evaluated."""

    def __init__(self, samples: int) -> None:
        generator = torch.Generator().manual_seed(5)
        self.inputs = torch.randn(samples, 4, generator=generator, dtype=torch.float64)
        self.targets = torch.randn(samples, 1, generator=generator, dtype=torch.float64)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int):
        return index, self.inputs[index], self.targets[index]


class CountingStep:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, model, batch) -> StepOutput:
        indices, inputs, targets = batch
        self.seen.extend(int(i) for i in indices)
        error = model(inputs) - targets
        selected = indices % 5 == 0
        return StepOutput(
            loss=error.square().mean(),
            num_samples=len(inputs),
            metrics={
                "num_samples": SumMetric(len(inputs)),
                "never_observed": MeanMetric(torch.zeros((), dtype=torch.float64), 0),
                "every_fifth": MeanMetric(error[selected].abs().sum(), int(selected.sum())),
            },
        )


def test_evaluator_refuses_a_drop_last_loader_naming_it():
    data = IndexedData(13)
    accelerator = Accelerator(cpu=True)
    fine = DataLoader(data, batch_size=4)
    for bad in (
        DataLoader(data, batch_size=4, drop_last=True),
        DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), batch_size=4, drop_last=True)),
    ):
        with pytest.raises(ValueError, match="drop_last") as refused:
            Evaluator(accelerator, {"fine": fine, "holdout": bad}, CountingStep())
        assert "'holdout'" in str(refused.value) and "'fine'" not in str(refused.value)


def test_evaluator_counts_every_sample_once_and_omits_unobserved_means():
    data = IndexedData(13)
    step = CountingStep()
    accelerator = Accelerator(cpu=True)
    evaluator = Evaluator(accelerator, {"validation": DataLoader(data, batch_size=4)}, step)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    (results,) = evaluator.evaluate(model).values()

    assert sorted(step.seen) == list(range(13)) and len(step.seen) == 13
    assert results["num_samples"] == len(data)
    assert "never_observed" not in results, results  # no count: omitted, not reported as 0
    with torch.no_grad():
        error = model(data.inputs) - data.targets
    assert results["loss"] == pytest.approx(float(error.square().mean()), rel=1e-12)
    assert results["every_fifth"] == pytest.approx(float(error[::5].abs().mean()), rel=1e-12)
    assert set(results) == {"loss", "num_samples", "every_fifth"}


# ------------------------------------------------------------------------------------------------
# The monitor: early stopping and best-model selection


def test_early_stopping_saves_final_and_best_points_at_the_best_step(logger):
    spec = RunSpec(epochs=2, evaluate_every=Interval(1, "step"), checkpoint_every=Interval(1, "epoch"))
    fresh_accelerate()
    base = build(spec).config
    # Only the first evaluation can improve (on "nothing yet"): a huge min_delta makes the outcome certain.
    config = replace(base, monitor=Monitor("validation/loss", patience=2, min_delta=1e9))
    run, state, run_dir, checkpoints = logged_run(spec, logger, config)
    assert run.trainer.planned_steps(config) == 8

    assert state.stop_reason == "early_stopping"
    assert state.evaluations_without_improvement == 2
    assert state.step == 3 and state.best_step == 1
    evaluations = events(run_dir, "evaluation")
    assert [event["step"] for event in evaluations] == [1, 2, 3]  # no extra final evaluation
    assert [event["improved"] for event in evaluations] == [True, False, False]

    final = (checkpoints / "final").resolve()
    best = (checkpoints / "best").resolve()
    assert final.is_file() and step_of(final) == 3
    assert best.is_file() and step_of(best) == state.best_step
    assert load(best)["state"]["step"] == state.best_step
    assert load(final)["state"]["stop_reason"] == "early_stopping"
    saves = [(event["step"], event["best"], event["final"]) for event in events(run_dir, "checkpoint")]
    assert saves == [(1, True, False), (3, False, True)]
    (finished,) = events(run_dir, "finished")
    assert finished["state"]["stop_reason"] == "early_stopping"


class ScriptedMetricStep:
    """Reports ``scripted`` = the next value of a fixed sequence at each call (one batch per evaluation)."""

    def __init__(self, values: list[float]) -> None:
        self.values = list(values)
        self.calls = 0

    def __call__(self, model, batch) -> StepOutput:
        output = mse_step(model, batch)
        value = self.values[self.calls]
        self.calls += 1
        output.metrics["scripted"] = MeanMetric(value * output.num_samples, output.num_samples)
        return output


def test_patience_counts_evaluations_since_the_last_improvement(tmp_path):
    """Scripted values 3, 4, 2, 5, 6 (mode min, patience 2): improvements at evaluations 1 and 3 reset the
    count, so training stops after evaluation 5 (not 4) with the best at step 3."""
    fresh_accelerate()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = DropoutMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train = DataLoader(RegressionData(16, seed=1), batch_size=4)
    step = ScriptedMetricStep([3.0, 4.0, 2.0, 5.0, 6.0, 1.0, 1.0])
    evaluator = Evaluator(accelerator, {"validation": DataLoader(RegressionData(4, seed=2), batch_size=4)}, step)
    trainer = Trainer(accelerator, model, optimizer, train, mse_step, evaluator=evaluator)
    config = TrainConfig(
        epochs=3, evaluate_every=Interval(1, "step"), checkpoint_every=None,
        monitor=Monitor("validation/scripted", patience=2),
    )
    state = trainer.train(config, checkpoint_dir=tmp_path)
    assert step.calls == 5
    assert state.stop_reason == "early_stopping" and state.step == 5
    assert state.best_step == 3 and state.best_metric == 2.0 and state.evaluations_without_improvement == 2
    assert sorted(step_of(p) for p in tmp_path.iterdir() if PUBLISHED.match(p.name)) == [1, 3, 5]
    assert step_of((tmp_path / "best").resolve()) == 3
    assert step_of((tmp_path / "final").resolve()) == 5


# ------------------------------------------------------------------------------------------------
# Evaluation and checkpoint intervals


@pytest.mark.parametrize(
    "changes, evaluated_steps, saves",
    [
        # 4 updates per epoch (windows of 3, 3, 3, 1 batches); epoch ends at steps 4 and 8. Events count
        # epochs from 1, and the boundary at an epoch's end belongs to the epoch that ended.
        ({"evaluate_every": Interval(3, "step")}, [3, 6, 8], [(4, 1, "interval"), (8, 2, "interval"), (8, 2, "final")]),
        ({"evaluate_every": Interval(3, "step"), "max_steps": 6}, [3, 6], [(4, 1, "interval"), (6, 2, "final")]),
        ({"evaluate_every": Interval(1, "epoch")}, [4, 8], [(4, 1, "interval"), (8, 2, "interval"), (8, 2, "final")]),
    ],
    ids=["every-3-steps-plus-final", "every-3-steps-ending-on-one", "every-epoch"],
)
def test_intervals_fire_at_their_steps_and_epochs_and_final_evaluation_only_when_needed(logger, changes, evaluated_steps, saves):
    spec = RunSpec(epochs=2, monitor=False, checkpoint_every=Interval(1, "epoch"), **changes)
    _, state, run_dir, checkpoints = logged_run(spec, logger)
    assert state.step == evaluated_steps[-1]
    assert [event["step"] for event in events(run_dir, "evaluation")] == evaluated_steps
    checkpoint_events = events(run_dir, "checkpoint")
    assert [(event["step"], event["epoch"], event["reason"]) for event in checkpoint_events] == saves
    assert all(event["next_batch"] == 0 for event in checkpoint_events if event["reason"] == "interval")
    files = sorted(p.name for p in checkpoints.iterdir() if PUBLISHED.match(p.name))
    assert [step_of(name) for name in files] == sorted({step for step, _, _ in saves})
    assert step_of((checkpoints / "final").resolve()) == state.step


# ------------------------------------------------------------------------------------------------
# StopRequest


def test_catch_signals_refuses_to_run_outside_the_main_thread():
    stop = StopRequest()
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    errors: list[BaseException] = []

    def enter():
        try:
            with stop.catch_signals():
                pass
        except BaseException as error:  # noqa: BLE001  the thread reports whatever it got
            errors.append(error)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError) and "main thread" in str(errors[0])
    assert {signum: signal.getsignal(signum) for signum in handlers} == handlers


def test_catch_signals_restores_previous_handlers_even_on_exception():
    def previous_handler(signum, frame):  # pragma: no cover - never called
        raise AssertionError("the previous handler must not run inside the block")

    saved = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, previous_handler)
    term = signal.getsignal(signal.SIGTERM)
    try:
        stop = StopRequest()
        with pytest.raises(ZeroDivisionError), stop.catch_signals():
            assert signal.getsignal(signal.SIGINT) is not previous_handler
            assert signal.getsignal(signal.SIGTERM) is not term
            1 / 0  # noqa: B018
        assert signal.getsignal(signal.SIGINT) is previous_handler
        assert signal.getsignal(signal.SIGTERM) is term
        with stop.catch_signals():
            pass
        assert signal.getsignal(signal.SIGINT) is previous_handler
        assert signal.getsignal(signal.SIGTERM) is term
        assert stop.reason is None
    finally:
        signal.signal(signal.SIGINT, saved)


def test_sigint_inside_the_block_only_sets_the_flag_and_the_first_reason_wins():
    stop = StopRequest()
    try:
        with stop.catch_signals():
            signal.raise_signal(signal.SIGINT)
            after_sigint = (stop.reason, stop.signal)
            signal.raise_signal(signal.SIGTERM)
            stop.request("later reason")
    except KeyboardInterrupt:
        pytest.fail("SIGINT inside catch_signals() raised KeyboardInterrupt instead of setting the flag")
    assert after_sigint == ("SIGINT", "SIGINT")
    assert (stop.reason, stop.signal) == ("SIGINT", "SIGINT")

    manual = StopRequest()
    manual.request("first")
    with manual.catch_signals():
        signal.raise_signal(signal.SIGTERM)
    manual.request("second")
    assert (manual.reason, manual.signal) == ("first", None)


@pytest.mark.parametrize("reason, error", [("", ValueError), (None, TypeError), (3, TypeError)])
def test_an_empty_or_non_string_reason_is_refused(reason, error):
    stop = StopRequest()
    with pytest.raises(error, match=r"StopRequest.request\(reason\) needs a"):
        stop.request(reason)
    assert stop.reason is None


def test_requires_grad_lets_an_evaluation_step_differentiate_its_predictions(tmp_path):
    """Forces as the negative gradient of a predicted energy: autograd must be on during evaluation."""
    fresh_accelerate()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = accelerator.prepare_model(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)))
    positions = torch.randn(10, 3)

    def force_step(model, batch):
        (inputs,) = batch
        inputs = inputs.clone().requires_grad_(True)
        energy = model(inputs).sum()
        (forces,) = torch.autograd.grad(energy, inputs)
        forces = -forces
        return StepOutput(loss=forces.square().mean(), num_samples=len(inputs),
                          metrics={"force_norm": MeanMetric(forces.norm(dim=1).sum(), len(inputs))})

    loader = DataLoader(torch.utils.data.TensorDataset(positions), batch_size=4)
    results = Evaluator(accelerator, {"md": loader}, force_step, requires_grad=True).evaluate(model)
    inputs = positions.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(model(inputs).sum(), inputs)
    assert results["md"]["force_norm"] == pytest.approx(expected.norm(dim=1).mean().item(), rel=1e-6)
    assert all(parameter.grad is None for parameter in model.parameters())
    with pytest.raises(RuntimeError, match="does not require grad"):
        Evaluator(accelerator, {"md": loader}, force_step).evaluate(model)
