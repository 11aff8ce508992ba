"""Checkpoint files, pointers, retention, refusals and historical weight loading.

Every test runs a real single-process trainer (``Accelerator(cpu=True)``) and inspects the real
files it publishes; nothing is mocked.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch._dynamo  # Accelerate imports it lazily (seconds); pay that at collection, not in a test
from accelerate import Accelerator
from checkpoint_files import PUBLISHED, assert_same_payload, published, step_of
from rich.console import Console
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from workloads import (
    DropoutMLP,
    RegressionData,
    RunSpec,
    build,
    fresh_accelerate,
    mse_step,
)

from elfes.engine import (
    CheckpointError,
    Interval,
    Monitor,
    Objective,
    RunLogger,
    StepOutput,
    TrainConfig,
    Trainer,
    WarmupDecay,
    export_weights,
    load_weights,
)
from elfes.engine.checkpoint import CheckpointDirectory, CheckpointName
from elfes.records import read_events

PAYLOAD_KEYS = {"format", "version", "run_id", "layout", "ranks", "model", "ema", "optimizer", "scheduler", "scaler", "state", "progress"}
QUIET = {"evaluate_every": None, "checkpoint_every": None}


def folder_state(directory: Path) -> dict[str, tuple]:
    """Everything observable about a folder's entries: kind, link text or size, inode, mtime, content hash."""
    entries = {}
    for entry in sorted(directory.iterdir()):
        status = os.lstat(entry)
        if entry.is_symlink():
            entries[entry.name] = ("link", os.readlink(entry), status.st_ino, status.st_mtime_ns)
        else:
            digest = hashlib.sha256(entry.read_bytes()).hexdigest()
            entries[entry.name] = ("file", status.st_size, status.st_ino, status.st_mtime_ns, digest)
    return entries


def trained(spec: RunSpec, directory: Path, config: TrainConfig | None = None):
    fresh_accelerate()
    run = build(spec)
    state = run.trainer.train(config or run.config, checkpoint_dir=directory)
    return run, state


# ------------------------------------------------------------------------------------------------
# Published files, pointers and the payload


def test_pointers_are_relative_links_to_published_files_and_every_file_is_a_complete_payload(tmp_path):
    run, state = trained(RunSpec(checkpoint_every=Interval(1, "step"), evaluate_every=Interval(2, "step")), tmp_path)
    trainer = run.trainer
    assert state.step == 8

    for pointer in ("last", "best", "final"):
        link = tmp_path / pointer
        assert link.is_symlink(), pointer
        text = os.readlink(link)
        assert not os.path.isabs(text), f"{pointer} -> {text} is absolute"
        target = link.resolve()
        assert target.parent == tmp_path.resolve(), f"{pointer} resolves outside the folder: {target}"
        assert PUBLISHED.match(target.name), target.name
        assert target.is_file()
    assert step_of((tmp_path / "final").resolve()) == 8
    assert (tmp_path / "last").resolve() == (tmp_path / "final").resolve()
    assert step_of((tmp_path / "best").resolve()) == state.best_step

    names = sorted(p.name for p in tmp_path.iterdir())
    assert not [name for name in names if name.startswith(".tmp-")], names
    files = published(tmp_path)
    assert [step_of(p) for p in files] == list(range(1, 9))
    assert set(names) == {p.name for p in files} | {"last", "best", "final"}

    for path in files:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        assert set(payload) == PAYLOAD_KEYS, f"{path.name}: {sorted(payload)}"
        assert payload["format"] == "elfes-checkpoint" and payload["version"] == 3
        assert isinstance(payload["ranks"], list) and len(payload["ranks"]) == 1  # one entry per rank
        assert set(payload["ranks"][0]) == {"rng", "log_interval", "data"}
        assert set(payload["ranks"][0]["rng"]) == {"python", "numpy", "torch", "cuda"}
        assert payload["state"]["step"] == step_of(path)
        assert isinstance(payload["ema"], dict) and payload["ema"]

    final = torch.load(tmp_path / "final", map_location="cpu", weights_only=True)
    schedule = trainer.scheduler.lr_lambdas[0]
    assert isinstance(trainer.scheduler, LambdaLR) and isinstance(schedule, WarmupDecay)
    assert final["scheduler"]["lr_lambdas"][0] == schedule.__dict__
    assert set(final["scheduler"]["lr_lambdas"][0]) == {"total_steps", "warmup_steps", "start_factor", "minimum_factor", "decay"}
    assert final["state"] == trainer.state.state_dict()
    for name, tensor in trainer.module.state_dict().items():
        assert torch.equal(final["model"][name], tensor), name
    for name, tensor in trainer.ema.state_dict().items():
        assert torch.equal(final["ema"][name], tensor), name


def test_final_checkpoint_holds_the_state_after_the_final_evaluation(tmp_path):
    """The epoch-end interval save at step 4 precedes the final evaluation (evaluations every 3 steps).

    The final checkpoint must still hold the monitor and progress as they are after that evaluation:
    otherwise ``best`` points at a file whose state names another best step, and resuming the
    finished run evaluates again.
    """
    spec = RunSpec(epochs=1, evaluate_every=Interval(3, "step"), checkpoint_every=Interval(1, "epoch"))
    directory = tmp_path / "checkpoints"
    run, state = trained(spec, directory)
    trainer = run.trainer
    assert state.step == 4 and trainer.progress.last_evaluation == [4, 10]
    final = torch.load(directory / "final", map_location="cpu", weights_only=True)
    assert final["progress"] == trainer.progress.state_dict()
    assert final["state"] == trainer.state.state_dict()
    best = torch.load(directory / "best", map_location="cpu", weights_only=True)
    assert best["state"]["best_step"] == step_of((directory / "best").resolve())

    # Resuming the finished run with the same budget changes nothing: no evaluation, not one file
    # or link rewritten (same inodes, times and contents).
    before = folder_state(directory)
    fresh_accelerate()
    with RunLogger(tmp_path / "resumed", is_main_process=True, console=Console(file=io.StringIO())) as logger:
        again = build(spec, logger=logger)
        resumed = again.trainer.train(again.config, checkpoint_dir=directory, resume_from=directory / "final")
    assert [e["step"] for e in read_events(tmp_path / "resumed") if e["event"] == "evaluation"] == []
    assert resumed.state_dict() == state.state_dict()
    assert folder_state(directory) == before
    assert_same_payload(final, torch.load(directory / "final", map_location="cpu", weights_only=True))


@pytest.mark.parametrize("when", ["constructed", "trained"])
def test_every_stateful_attribute_of_the_trainer_is_checkpointed(tmp_path, when):
    fresh_accelerate()
    run = build(RunSpec(epochs=1))
    trainer = run.trainer
    if when == "trained":
        trainer.train(run.config, checkpoint_dir=tmp_path)
    stateful = list(trainer.checkpointer.components().values())
    assert trainer.ema is not None and trainer.scheduler is not None  # the parts under test exist
    missing = []
    for name, value in vars(trainer).items():
        if not (hasattr(value, "state_dict") and hasattr(value, "load_state_dict")):
            continue
        if isinstance(value, DataLoader):
            continue
        if value is trainer.model and trainer.model is not trainer.module:
            continue  # the prepared (wrapped) model; its plain module is checkpointed
        if not any(value is component for component in stateful):
            missing.append(f"{name} ({type(value).__name__})")
    assert not missing, f"stateful Trainer attributes that no checkpoint saves: {missing}"


def test_the_single_file_and_the_sharded_checkpointer_are_two_implementations_of_one_protocol():
    """Neither derives from the other nor names the other's checkpoints; each offers what a session asks."""
    import inspect

    from elfes.engine.checkpointer import Checkpointer, FileCheckpointer
    from elfes.engine.sharded import ShardedCheckpointer

    assert FileCheckpointer.__mro__ == (FileCheckpointer, object)
    assert ShardedCheckpointer.__mro__ == (ShardedCheckpointer, object)
    asked = {"sharded", "layout", "components", "snapshot", "restore"}
    assert {name for name in vars(Checkpointer) if not name.startswith("_")} == asked
    for implementation in (FileCheckpointer, ShardedCheckpointer):
        assert asked <= set(vars(implementation)), implementation
    assert "sharded checkpoint" not in inspect.getsource(FileCheckpointer).lower()
    assert "FileCheckpointer" not in inspect.getsource(ShardedCheckpointer)


def test_checkpoint_components_are_named_once_each_a_shared_or_a_per_rank_one():
    from elfes.engine.checkpointer import CheckpointContents
    from elfes.engine.components import PerRankComponent, SharedComponent
    from elfes.engine.config import TrainState
    from elfes.engine.rng import RandomState

    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match=r"Checkpoint components \['state'\] are named twice; give each"):
        CheckpointContents(accelerator, [SharedComponent("state", TrainState()), PerRankComponent("state", RandomState())], dict)
    with pytest.raises(TypeError, match="a SharedComponent or a PerRankComponent .*; got RandomState. Wrap each"):
        CheckpointContents(accelerator, [RandomState()], dict)  # type: ignore[list-item]


# ------------------------------------------------------------------------------------------------
# Pointer replacement


_AUDIT: list[tuple[str, tuple]] | None = None


def _audit(event: str, arguments: tuple) -> None:
    if _AUDIT is not None and event in ("os.remove", "os.rename", "os.symlink", "os.rmdir"):
        _AUDIT.append((event, arguments))


sys.addaudithook(_audit)  # inert unless a test sets _AUDIT; audit hooks cannot be removed


def test_pointer_is_replaced_by_renaming_a_new_link_over_the_old_one(tmp_path):
    global _AUDIT
    directory = CheckpointDirectory(tmp_path)
    first, _ = directory.save({"x": torch.zeros(1)}, CheckpointName(1, 3))
    second, _ = directory.save({"x": torch.ones(1)}, CheckpointName(2, 6))
    directory.point("last", first)
    link = tmp_path / "last"
    old_inode = os.lstat(link).st_ino
    assert link.resolve() == first.resolve()

    _AUDIT = []
    try:
        directory.point("last", second)
        operations = list(_AUDIT)
    finally:
        _AUDIT = None

    assert os.readlink(link) == second.name  # relative, inside the folder
    assert link.resolve() == second.resolve()
    # The old link's inode was replaced, not rewritten, and no temporary link is left behind.
    assert os.lstat(link).st_ino != old_inode
    assert old_inode not in {os.lstat(entry).st_ino for entry in tmp_path.iterdir()}
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    # The pointer itself was never removed (which would leave a moment without it); a rename onto it published it.
    removed = [Path(arguments[0]) for event, arguments in operations if event in ("os.remove", "os.rmdir")]
    assert link not in removed, operations
    renamed_onto = [Path(arguments[1]) for event, arguments in operations if event == "os.rename"]
    assert renamed_onto == [link], operations
    created = [Path(arguments[1]) for event, arguments in operations if event == "os.symlink"]
    assert created and link not in created, operations


# ------------------------------------------------------------------------------------------------
# Retention


def test_retention_keeps_the_newest_files_and_every_pointer_target(tmp_path):
    directory = CheckpointDirectory(tmp_path)
    files = [directory.save({"step": torch.tensor(step)}, CheckpointName(step, 2 * step))[0] for step in range(1, 7)]
    directory.point("best", files[0])
    directory.point("final", files[1])
    directory.point("last", files[2])
    deleted = directory.apply_retention(2)
    assert sorted(deleted) == [files[3]]
    assert published(tmp_path) == [files[0], files[1], files[2], files[4], files[5]]
    assert directory.apply_retention(None) == []
    for pointer in ("best", "final", "last"):
        assert (tmp_path / pointer).resolve().is_file(), pointer


def test_training_retention_preserves_an_early_best_checkpoint(tmp_path):
    spec = RunSpec(epochs=2, checkpoint_every=Interval(1, "step"), evaluate_every=Interval(1, "step"), keep_checkpoints=2)
    fresh_accelerate()
    run = build(spec)
    # The first evaluation always improves on "nothing yet"; with a huge min_delta no later one can.
    config = replace(run.config, monitor=Monitor("validation/loss", min_delta=1e9))
    state = run.trainer.train(config, checkpoint_dir=tmp_path)
    assert state.step == 8 and state.best_step == 1
    assert [step_of(p) for p in published(tmp_path)] == [1, 7, 8]
    assert step_of((tmp_path / "best").resolve()) == 1
    assert step_of((tmp_path / "last").resolve()) == 8
    assert step_of((tmp_path / "final").resolve()) == 8


# ------------------------------------------------------------------------------------------------
# Unusable files are refused with a useful message, without touching the folder


def _refusals(run_spec: RunSpec, pointer: Path, tmp_path: Path) -> list[CheckpointError]:
    """The errors of resuming from, loading from and exporting from ``pointer``."""
    errors = []
    fresh_accelerate()
    run = build(run_spec)
    before = {name: tensor.clone() for name, tensor in run.trainer.module.state_dict().items()}
    with pytest.raises(CheckpointError) as resumed:
        run.trainer.train(run.config, checkpoint_dir=pointer.parent, resume_from=pointer)
    errors.append(resumed.value)
    assert run.trainer.state.step == 0 and run.trainer.state.batches == 0
    for name, tensor in run.trainer.module.state_dict().items():
        assert torch.equal(before[name], tensor), f"{name} changed by a refused resume"
    with pytest.raises(CheckpointError) as loaded:
        load_weights(DropoutMLP(), pointer)
    errors.append(loaded.value)
    output = tmp_path / "exported.pt"
    with pytest.raises(CheckpointError) as exported:
        export_weights(pointer, output)
    errors.append(exported.value)
    assert not output.exists()
    return errors


def test_truncated_checkpoint_names_the_file_its_step_and_the_previous_complete_one(tmp_path):
    spec = RunSpec(epochs=2, evaluate=False, checkpoint_every=Interval(1, "epoch"))
    directory = tmp_path / "checkpoints"
    trained(spec, directory)
    target = (directory / "last").resolve()
    earlier = [p for p in published(directory) if p.resolve() != target]
    assert step_of(target) == 8 and [step_of(p) for p in earlier] == [4]
    os.truncate(target, target.stat().st_size // 2)
    before = folder_state(directory)

    for error in _refusals(spec, directory / "last", tmp_path):
        message = str(error)
        assert str(target) in message, message
        assert re.search(r"\bstep 8\b", message), message
        assert str(earlier[0].resolve()) in message, message
    assert folder_state(directory) == before


def test_truncated_checkpoint_skips_an_also_truncated_predecessor(tmp_path):
    spec = RunSpec(epochs=2, evaluate=False, checkpoint_every=Interval(2, "step"))
    directory = tmp_path / "checkpoints"
    trained(spec, directory)
    files = published(directory)
    assert [step_of(p) for p in files] == [2, 4, 6, 8]
    for path in files[2:]:
        os.truncate(path, path.stat().st_size // 2)
    before = folder_state(directory)
    for error in _refusals(spec, directory / "last", tmp_path):
        message = str(error)
        assert re.search(r"\bstep 8\b", message), message
        assert str(files[1].resolve()) in message and str(files[2].resolve()) not in message, message
    assert folder_state(directory) == before


def test_truncated_only_checkpoint_says_there_is_no_earlier_one(tmp_path):
    spec = RunSpec(epochs=1, evaluate=False, checkpoint_every=None)
    directory = tmp_path / "checkpoints"
    trained(spec, directory)
    (target,) = published(directory)
    os.truncate(target, target.stat().st_size // 2)
    before = folder_state(directory)
    for error in _refusals(spec, directory / "final", tmp_path):
        message = str(error)
        assert str(target.resolve()) in message and re.search(r"\bstep 4\b", message), message
        assert "no earlier complete checkpoint" in message.lower(), message
    assert folder_state(directory) == before


def _create_marker(path: str) -> None:
    Path(path).write_text("code from a checkpoint file ran")


class ArbitraryObject:
    """Unpickling this object runs code: it creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (_create_marker, (self.marker,))


def test_a_pickled_python_object_is_refused_without_running_its_code(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "foreign.pt"
    torch.save({"format": "elfes-checkpoint", "version": 1, "x": ArbitraryObject(marker)}, path)
    assert not marker.exists()

    with pytest.raises(CheckpointError, match=re.escape(str(path.resolve()))):
        load_weights(DropoutMLP(), path)
    with pytest.raises(CheckpointError):
        export_weights(path, tmp_path / "out.pt")
    fresh_accelerate()
    run = build(RunSpec(epochs=1, evaluate=False))
    with pytest.raises(CheckpointError):
        run.trainer.train(run.config, resume_from=path)
    assert not marker.exists(), "loading the checkpoint executed code from the file"
    assert not (tmp_path / "out.pt").exists()

    # The file really would run code when unpickled without weights_only (so the test above means something).
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_a_plain_state_dict_is_not_mistaken_for_a_checkpoint(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(DropoutMLP().state_dict(), path)
    with pytest.raises(CheckpointError, match="not an ELFES checkpoint"):
        load_weights(DropoutMLP(), path)


# ------------------------------------------------------------------------------------------------
# Layout mismatches


def _mismatch_lines(message: str) -> list[str]:
    return [line.strip()[2:] for line in message.splitlines() if line.strip().startswith("- ")]


def _assert_names_mismatch(message: str, field: str, checkpoint_value, run_value) -> None:
    lines = _mismatch_lines(message)
    assert len(lines) == 1, f"expected only {field} to mismatch:\n{message}"
    (line,) = lines
    assert line.startswith(f"{field}:"), message
    assert repr(checkpoint_value) in line and repr(run_value) in line, message
    assert line.index(repr(checkpoint_value)) < line.index(repr(run_value)) or repr(checkpoint_value) == repr(run_value)


@pytest.mark.parametrize(
    "change, field, checkpoint_value, run_value",
    [
        ({"accumulation": 2}, "gradient_accumulation_steps", 3, 2),
        ({"optimizer": "sgd"}, "optimizer", "AdamW", "SGD"),
        ({"ema_decay": None}, "ema_decay", 0.9, None),
        ({"mixed_precision": "bf16"}, "mixed_precision", "no", "bf16"),
        ({"warmup": False}, "scheduler", "LambdaLR", None),
    ],
    ids=["batching", "optimizer", "ema", "precision", "scheduler"],
)
def test_layout_mismatch_is_refused_naming_the_field_and_both_values(tmp_path, change, field, checkpoint_value, run_value):
    spec = RunSpec(epochs=1, evaluate=False, checkpoint_every=None)
    trained(spec, tmp_path)
    fresh_accelerate()
    other = build(spec.with_(**change))
    before = {name: tensor.clone() for name, tensor in other.trainer.module.state_dict().items()}
    with pytest.raises(CheckpointError) as refused:
        other.trainer.train(other.config, resume_from=tmp_path / "final")
    message = str(refused.value)
    assert str((tmp_path / "final").resolve()) in message
    _assert_names_mismatch(message, field, checkpoint_value, run_value)
    assert other.trainer.state.step == 0
    for name, tensor in other.trainer.module.state_dict().items():
        assert torch.equal(before[name], tensor), f"{name} was loaded from a refused checkpoint"


def sum_step(model: nn.Module, batch) -> StepOutput:
    inputs, targets = batch
    return StepOutput(loss={"mse": (model(inputs) - targets).square().sum()}, num_samples=len(inputs))


def mean_step(model: nn.Module, batch) -> StepOutput:
    inputs, targets = batch
    return StepOutput(loss=(model(inputs) - targets).square().mean(), num_samples=len(inputs))


def tiny_trainer(objective: bool) -> Trainer:
    fresh_accelerate()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(RegressionData(8), batch_size=4)
    if objective:
        terms = Objective({"mse": 1.0}, counts=lambda batch: {"mse": batch[1].numel()})
        return Trainer(accelerator, model, optimizer, loader, sum_step, objective=terms)
    return Trainer(accelerator, model, optimizer, loader, mean_step)


@pytest.mark.parametrize("written_with_objective", [False, True], ids=["mean-then-objective", "objective-then-mean"])
def test_objective_mismatch_is_refused_naming_both_definitions(tmp_path, written_with_objective):
    tiny_trainer(written_with_objective).train(TrainConfig(epochs=1, **QUIET), checkpoint_dir=tmp_path)
    other = tiny_trainer(not written_with_objective)
    with pytest.raises(CheckpointError) as refused:
        other.train(TrainConfig(epochs=2, **QUIET), resume_from=tmp_path / "final")
    with_terms, without = {"mse": 1.0}, None
    found, expected = (with_terms, without) if written_with_objective else (without, with_terms)
    _assert_names_mismatch(str(refused.value), "objective", found, expected)
    assert other.state.step == 0


# ------------------------------------------------------------------------------------------------
# Missing files


def test_missing_checkpoint_raises_file_not_found_naming_the_path(tmp_path):
    missing = tmp_path / "never-written" / "last"
    pattern = re.escape(str(missing))
    with pytest.raises(FileNotFoundError, match=pattern):
        load_weights(DropoutMLP(), missing)
    with pytest.raises(FileNotFoundError, match=pattern):
        export_weights(missing, tmp_path / "out.pt")
    fresh_accelerate()
    run = build(RunSpec(epochs=1, evaluate=False))
    with pytest.raises(FileNotFoundError, match=pattern):
        run.trainer.train(run.config, resume_from=missing)
    assert not (tmp_path / "out.pt").exists()


# ------------------------------------------------------------------------------------------------
# Historical weights: load_weights and export_weights


def batch_norm_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))


def batch_norm_trainer(ema_decay: float | None) -> Trainer:
    fresh_accelerate()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = batch_norm_model(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    loader = DataLoader(RegressionData(24, seed=3), batch_size=4, shuffle=True)
    return Trainer(accelerator, model, optimizer, loader, mse_step, ema_decay=ema_decay)


def clone_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in state.items()}


def assert_state_equal(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor], what: str) -> None:
    assert expected.keys() == actual.keys(), f"{what}: {sorted(expected.keys() ^ actual.keys())}"
    different = [name for name in expected if not torch.equal(expected[name], actual[name])]
    assert not different, f"{what}: not bitwise equal: {different}"


def test_load_and_export_raw_or_ema_weights_of_a_historical_position(tmp_path):
    trainer = batch_norm_trainer(ema_decay=0.5)
    trainer.train(TrainConfig(epochs=1, **QUIET), checkpoint_dir=tmp_path)
    historical = (tmp_path / "final").resolve()
    raw = clone_state(trainer.module.state_dict())
    ema = clone_state(trainer.ema.state_dict())
    buffers = {name: tensor.clone() for name, tensor in trainer.module.named_buffers()}
    assert set(buffers) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert int(buffers["1.num_batches_tracked"]) == 6 and not torch.equal(buffers["1.running_mean"], torch.zeros(8))
    assert any(not torch.equal(ema[name], raw[name]) for name in ema), "EMA equals raw: the test would prove nothing"

    trainer.train(TrainConfig(epochs=2, **QUIET), checkpoint_dir=tmp_path)  # the run moves on
    assert (tmp_path / "final").resolve() != historical
    assert not torch.equal(trainer.module.get_buffer("1.running_mean"), buffers["1.running_mean"])

    model = batch_norm_model(seed=7)
    load_weights(model, historical, weights="raw")
    assert_state_equal(raw, model.state_dict(), "raw weights")

    model = batch_norm_model(seed=7)
    load_weights(model, historical, weights="ema")
    expected_ema = {**raw, **ema}  # averaged parameters with the checkpoint-time raw buffers
    assert set(ema) == {name for name, _ in model.named_parameters()}
    assert_state_equal(expected_ema, model.state_dict(), "EMA weights")

    for weights, expected in (("raw", raw), ("ema", expected_ema)):
        output = tmp_path / "exports" / f"{weights}.pt"
        export_weights(historical, output, weights=weights)
        exported = torch.load(output, weights_only=True)
        assert type(exported) is dict
        assert not [k for k in exported if k.startswith(("module.", "_orig_mod."))], sorted(exported)
        assert_state_equal(expected, exported, f"exported {weights}")
        fresh = batch_norm_model(seed=11)
        fresh.load_state_dict(exported)  # strict
        assert_state_equal(expected, fresh.state_dict(), f"model loaded from exported {weights}")
    assert not [p.name for p in (tmp_path / "exports").iterdir() if p.name.startswith(".tmp-")]


def test_ema_weights_from_a_checkpoint_without_ema_are_refused(tmp_path):
    batch_norm_trainer(ema_decay=None).train(TrainConfig(epochs=1, **QUIET), checkpoint_dir=tmp_path)
    model = batch_norm_model(seed=7)
    before = clone_state(model.state_dict())
    with pytest.raises(CheckpointError, match="without EMA") as refused:
        load_weights(model, tmp_path / "final", weights="ema")
    assert "weights='raw'" in str(refused.value)
    assert_state_equal(before, model.state_dict(), "model after a refused EMA load")
    with pytest.raises(CheckpointError, match="without EMA"):
        export_weights(tmp_path / "final", tmp_path / "ema.pt", weights="ema")
    assert not (tmp_path / "ema.pt").exists()
    with pytest.raises(ValueError, match="'raw' or 'ema'"):
        load_weights(model, tmp_path / "final", weights="averaged")


def test_load_weights_refuses_a_compiled_model(tmp_path):
    batch_norm_trainer(ema_decay=None).train(TrainConfig(epochs=1, **QUIET), checkpoint_dir=tmp_path)
    model = batch_norm_model(seed=7)
    before = clone_state(model.state_dict())
    compiled = torch.compile(model, backend="eager")  # compiles lazily: nothing runs here
    with pytest.raises(TypeError, match="plain model"):
        load_weights(compiled, tmp_path / "final")
    assert_state_equal(before, model.state_dict(), "model after a refused load")
    load_weights(compiled._orig_mod, tmp_path / "final")  # the plain module is accepted
    assert not torch.equal(before["0.weight"], model.state_dict()["0.weight"])


def test_load_weights_refuses_a_ddp_model(tmp_path):
    import torch.distributed as dist

    batch_norm_trainer(ema_decay=None).train(TrainConfig(epochs=1, **QUIET), checkpoint_dir=tmp_path)
    model = batch_norm_model(seed=7)
    before = clone_state(model.state_dict())
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        wrapped = nn.parallel.DistributedDataParallel(model)
        with pytest.raises(TypeError, match="plain model"):
            load_weights(wrapped, tmp_path / "final")
    finally:
        dist.destroy_process_group()
    assert_state_equal(before, model.state_dict(), "model after a refused load")


class TiedModel(nn.Module):
    """An embedding and an output layer sharing one weight, as language models do."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(6, 4)
        self.output = nn.Linear(4, 6, bias=False)
        self.output.weight = self.embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.output(self.embedding(tokens)).logsumexp(-1, keepdim=True)


def test_ema_weights_of_tied_parameters_are_exported_under_every_name(tmp_path):
    fresh_accelerate()
    model = TiedModel()
    tokens = torch.arange(12) % 6
    loader = DataLoader(torch.utils.data.TensorDataset(tokens, torch.zeros(12, 1)), batch_size=4)
    trainer = Trainer(Accelerator(cpu=True), model, torch.optim.SGD(model.parameters(), lr=0.05), loader, mse_step,
                      ema_decay=0.5)
    trainer.train(TrainConfig(epochs=2, evaluate_every=None), checkpoint_dir=tmp_path)
    export_weights(tmp_path / "final", tmp_path / "ema.pt", weights="ema")
    exported = torch.load(tmp_path / "ema.pt", weights_only=True)
    average = trainer.ema.average["embedding.weight"]
    assert not torch.equal(average, model.embedding.weight.detach())  # EMA really differs from raw
    assert torch.equal(exported["embedding.weight"], average)
    assert torch.equal(exported["output.weight"], average)
    fresh = TiedModel()
    load_weights(fresh, tmp_path / "final", weights="ema")
    assert torch.equal(fresh.output.weight.detach(), average) and fresh.output.weight is fresh.embedding.weight


def test_a_checkpoint_of_another_model_is_refused_before_anything_is_loaded(tmp_path):
    trained(RunSpec(epochs=1), tmp_path / "run")
    fresh_accelerate()
    other = build(RunSpec(epochs=1))
    other.trainer.module.output = nn.Linear(16, 2)  # a different head
    other.trainer.optimizer.param_groups[0]["params"] = [p for p in other.trainer.module.parameters() if p.ndim >= 2]
    before = {name: tensor.clone() for name, tensor in other.trainer.module.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"model parameters reshaped: output.bias \(1,\) -> \(2,\), output.weight \(1, 16\) -> \(2, 16\)"):
        other.trainer.train(other.config, resume_from=tmp_path / "run" / "final")
    after = other.trainer.module.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_a_compiled_model_is_checkpointed_and_exported_without_compile_prefixes(tmp_path):
    fresh_accelerate()
    model = torch.compile(DropoutMLP(), backend="eager")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = DataLoader(RegressionData(16, seed=1), batch_size=4)
    trainer = Trainer(Accelerator(cpu=True), model, optimizer, loader, mse_step, ema_decay=0.9)
    trainer.train(TrainConfig(epochs=1, evaluate_every=None), checkpoint_dir=tmp_path / "checkpoints")
    trainer.save_model(tmp_path / "model.pt", weights="ema")
    plain_names = set(DropoutMLP().state_dict())
    assert set(torch.load(tmp_path / "model.pt", weights_only=True)) == plain_names
    payload = torch.load(tmp_path / "checkpoints" / "final", weights_only=True)
    assert set(payload["model"]) == plain_names and set(payload["ema"]) <= plain_names
    fresh = DropoutMLP()
    load_weights(fresh, tmp_path / "checkpoints" / "final", weights="ema")


def test_a_checkpoint_is_fsynced_under_its_temporary_name_renamed_and_its_folder_fsynced(tmp_path, monkeypatch):
    """The real os calls run; a recorder only notes their order and targets."""
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor):
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        return real_fsync(descriptor)

    def replace(source, destination):
        calls.append(("replace", str(source), str(destination)))
        return real_replace(source, destination)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    directory = CheckpointDirectory(tmp_path)
    path, size = directory.save({"tensor": torch.ones(3)}, CheckpointName(step=5, batches=9))
    directory.point("last", path)
    folder = str(tmp_path)
    (_, written), (_, temporary, final), (_, synced_folder), (_, link_source, link), (_, pointer_folder) = calls
    assert written == temporary and Path(temporary).name.startswith(".tmp-") and Path(temporary).parent == tmp_path
    assert final == str(path) and synced_folder == folder
    assert Path(link_source).name.startswith(".tmp-last") and link == str(tmp_path / "last") and pointer_folder == folder
    assert size == path.stat().st_size and torch.load(path, weights_only=True)["tensor"].sum() == 3
