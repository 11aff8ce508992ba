"""A model sharded with FSDP2 on real gloo ranks: bitwise pause, SIGTERM, asynchronous and SIGKILL resumes from
sharded (DCP) checkpoint folders on 2 and 4 ranks (HSDP included), the exact window denominator, and reading such
a folder in one process with no process group.

Each case of ``sharded_cases.py`` is one launch on gloo ranks forked from one process (forked_ranks.py); the ranks
write what they observed (whole tensors) and the assertions run here. Tests that read the same case share its launch.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import signal
import struct
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from forked_ranks import ForkedRanks
from launching import launch_environment
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from workloads import DropoutMLP, RunSpec, assert_bitwise_equal, build

from elfes.contract import CheckpointName
from elfes.engine import export_weights, load_weights
from elfes.engine.checkpoint import CheckpointDirectory, CheckpointError, read_checkpoint, safe_load_problem
from elfes.engine.payload import UnusableCheckpointError
from elfes.engine.sharded import SafeReader, sharded_weights, whole_sharded_checkpoint
from elfes.launcher.job.failures import FailureReport
from elfes.launcher.job.resume_point import resume_point
from elfes.launcher.rundir.paths import RunPaths

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).with_name("sharded_cases.py")
_launched: dict[str, Path] = {}


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedRanks]:
    """Launches of ``sharded_cases.py`` whose ranks fork from one process that imported torch once (each rank ends
    by os._exit, see sharded_cases.leave, as under torchrun)."""
    ranks = ForkedRanks(SCRIPT, launch_environment())
    yield ranks
    ranks.close()


def forked_launch(forked: ForkedRanks, *arguments: str, processes: int = 2, expect_kill: bool = False) -> str:
    """One launch of ``sharded_cases.py``: "killed" (a rank died of SIGKILL, with ``expect_kill``) or "finished";
    anything else fails the test with the ranks' output."""
    [(statuses, output)] = forked.launch(list(arguments), ranks=processes)
    killed = -signal.SIGKILL in statuses
    if statuses != [0] * processes and not (expect_kill and killed):
        pytest.fail(f"sharded_cases.py {' '.join(arguments)} ended with statuses {statuses}\n{output[-8000:]}")
    return "killed" if killed else "finished"


@pytest.fixture
def launch(forked, tmp_path_factory):
    def launch(case: str, processes: int) -> Path:
        if case not in _launched:
            output = tmp_path_factory.mktemp(case)
            forked_launch(forked, case, str(output), processes=processes)
            _launched[case] = output
        return _launched[case]

    return launch


def tensors(output: Path, name: str, ranks: int) -> list[dict[str, torch.Tensor]]:
    return [torch.load(output / f"{name}.rank{rank}.pt", weights_only=True) for rank in range(ranks)]


def report(output: Path, case: str) -> dict[str, Any]:
    return json.loads((output / f"{case}.rank0.json").read_text())


# ------------------------------------------------------------------------------------------------
# Two ranks


@pytest.mark.parametrize("name", ["before", "pause0", "pause1", "pause2", "sigterm", "async"])
def test_a_sharded_run_stopped_and_resumed_ends_bitwise_equal_to_the_straight_run(launch, name):
    """Stopped before training, in the first window, in the tail window (3 then 2 batches per rank), in the second
    epoch, by a real SIGTERM on one rank, and with asynchronous checkpoints every update: each resumed from `last`
    (a .dcp folder) ends with every tensor equal (whole raw and EMA weights, optimizer state, learning rates) to
    the uninterrupted run, on both ranks. The run has dropout, noise drawn in the dataset, EMA, clipping and
    evaluations whose 5 batches split 3 and 2 between the ranks."""
    output = launch("two_ranks", 2)
    facts = report(output, "two_ranks")
    assert facts["full"]["sharded"] and facts["full"]["model"].startswith("FSDP"), facts["full"]
    assert facts["full"]["accelerator"]["num_processes"] == 2 and facts["full"]["sizes"] == [3, 2, 3, 2]
    full = tensors(output, "full", 2)
    assert_bitwise_equal(full[0], full[1], "the whole tensors seen from rank 0 and rank 1")
    assert any(key.startswith("ema/") for key in full[0]) and any(key.endswith("exp_avg") for key in full[0])
    for rank, resumed in enumerate(tensors(output, name, 2)):
        assert_bitwise_equal(full[0], resumed, f"{name}, rank {rank}")
    stopped = facts[name]
    assert CheckpointName.parse(stopped["last"]).sharded, stopped["last"]
    assert stopped["entries"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "state.pt"]
    assert stopped["paused"]["stop_reason"] == ("SIGTERM" if name == "sigterm" else f"pause-{name}")
    if name == "before":
        assert stopped["paused"]["step"] == 0


def test_gradients_are_synchronised_once_per_window_and_the_ema_stays_sharded(launch):
    facts = report(launch("two_ranks", 2), "two_ranks")["full"]
    # Windows of 3, 2, 3, 2 microbatches: only the last microbatch of each reduce-scatters its gradients.
    assert facts["gradient_sync"] == [False, False, True, False, True, False, False, True, False, True]
    assert facts["ema_sharded"]


def test_sharded_evaluation_counts_every_sample_once_over_uneven_and_empty_shards(launch):
    """The run's raw weights evaluated on two sharded ranks (17 samples: batches of 4, 4, 4, 4, 1, the ranks holding
    3 and 2, so rank 1 runs one uncounted forward; and a loader of one batch) against the same weights in one plain
    process."""
    from torch.utils.data import DataLoader
    from workloads import RegressionData, mse_step

    from elfes.engine import Evaluator

    output = launch("two_ranks", 2)
    sharded = report(output, "two_ranks")["full"]["evaluation"]
    model = DropoutMLP()
    load_weights(model, output / "full" / "checkpoints" / "final")
    from accelerate import Accelerator

    plain = Evaluator(Accelerator(cpu=True), {"validation": DataLoader(RegressionData(17, seed=2), batch_size=4)}, mse_step)
    expected = plain.evaluate(model)
    assert sharded.keys() == expected.keys() and sharded["validation"].keys() == expected["validation"].keys()
    for metric, value in expected["validation"].items():
        assert sharded["validation"][metric] == pytest.approx(value, rel=1e-6), metric
    # One batch of 3 samples: rank 1 holds none, and runs the forward on the loader's first batch uncounted.
    sharded = report(output, "two_ranks")["full"]["evaluation_one_batch"]["one"]
    plain = Evaluator(Accelerator(cpu=True), {"one": DataLoader(RegressionData(3, seed=2), batch_size=4)}, mse_step)
    expected = plain.evaluate(model)["one"]
    assert sharded.keys() == expected.keys()
    for metric, value in expected.items():
        assert sharded[metric] == pytest.approx(value, rel=1e-6), metric


def test_the_guides_sharding_block_trains_a_sharded_model_on_two_ranks(launch):
    guide = report(launch("two_ranks", 2), "two_ranks")["guide"]
    assert guide == {"sharded": True, "ddp": False, "step": 2, "last": CheckpointName(2, 4, sharded=True).filename}


def test_a_run_whose_model_is_not_sharded_refuses_a_sharded_checkpoint_naming_the_layout(launch):
    run = build(RunSpec())
    with pytest.raises(CheckpointError) as refusal:
        run.trainer.train(run.config, resume_from=launch("two_ranks", 2) / "full" / "checkpoints" / "final")
    message = str(refusal.value)
    assert "sharding: the checkpoint's model is sharded, this run's is not sharded" in message


def test_accelerates_fsdp_plugin_is_refused_showing_the_fully_shard_way():
    """Accelerate's FSDP plugin does not engage on a CPU (accelerate 1.16 gives DistributedType.NO, or MULTI_CPU with
    cpu=True), so the accelerator here is a stand-in that says what a GPU one with the plugin says."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from elfes.engine.trainer import _check_sharding

    with pytest.raises(ValueError, match=r"fsdp_plugin.*fully_shard\(block, mesh=mesh\)"):
        _check_sharding(SimpleNamespace(distributed_type=DistributedType.FSDP, mixed_precision="no"), sharded=True)


def test_two_sharded_ranks_update_with_the_exact_global_window_mean(launch):
    """37 samples in batches of 4 on two sharded ranks with accumulation 2 (a tail window pairing a 4-sample batch
    with a 1-sample one) against one plain rank with accumulation 4 over the same batches: the same updates, to
    float64 rounding (a mean of the ranks' means would weight the 1-sample batch like the 4-sample one)."""
    from sharded_cases import EQUIVALENCE

    sharded = tensors(launch("two_ranks", 2), "equivalence", 2)[0]
    one = build(EQUIVALENCE.with_(shard=None, accumulation=4))
    one.trainer.train(one.config)
    from workloads import snapshot

    plain = snapshot(one.trainer)
    assert plain.keys() == sharded.keys()
    far = {key: (plain[key].double() - sharded[key].double()).abs().max().item() for key in plain}
    assert all(difference <= 1e-12 for difference in far.values()), far


def test_a_sharded_checkpoint_is_a_folder_of_shards_and_a_state_file_that_loads_safely(launch):
    output = launch("two_ranks", 2)
    checkpoints = output / "full" / "checkpoints"
    final = (checkpoints / "final").resolve()
    assert CheckpointName.parse(final.name) == CheckpointName(4, 20, sharded=True)
    assert sorted(path.name for path in final.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "state.pt"]
    state = torch.load(final / "state.pt", weights_only=True)
    assert read_checkpoint(checkpoints / "final")["run_id"] == state["run_id"] is not None
    assert state["layout"]["world_size"] == 2 and state["layout"]["sharding"] == [2]
    assert len(state["ranks"]) == 2 and set(state["ranks"][1]) == {"rng", "log_interval", "data"}
    assert state["state"]["step"] == 4 and "model" not in state and "optimizer_groups" in state
    keys = set(SafeReader(final).read_metadata().state_dict_metadata)
    assert {"model.hidden.weight", "ema.hidden.weight", "optimizer.0.exp_avg"} <= keys
    assert not list(checkpoints.glob(".tmp-*")), "no temporary folder is left"


def test_a_sharded_checkpoint_is_read_in_one_process_without_a_process_group(launch, tmp_path):
    """load_weights into a plain model and export_weights to a plain file, raw and EMA, in this pytest process
    (no process group): the whole weights of the run, equal to what Trainer.save_model wrote on two ranks."""
    output = launch("two_ranks", 2)
    assert not torch.distributed.is_initialized()
    full = tensors(output, "full", 2)[0]
    final = output / "full" / "checkpoints" / "final"
    for weights in ("raw", "ema"):
        model = DropoutMLP()
        load_weights(model, final, weights=weights)
        expected = {name: full[f"{weights}/{name}"] for name in model.state_dict()}
        assert_bitwise_equal(expected, dict(model.state_dict()), f"load_weights {weights}")
        export_weights(final, tmp_path / f"{weights}.pt", weights=weights)
        assert_bitwise_equal(expected, torch.load(tmp_path / f"{weights}.pt", weights_only=True), f"export {weights}")
    saved = torch.load(output / "full-ema-export.pt", weights_only=True)  # Trainer.save_model on two ranks
    assert_bitwise_equal({name: full[f"ema/{name}"] for name in saved}, saved, "save_model(weights='ema')")


class Planted:
    def __reduce__(self):
        return (Path.touch, (Path(__file__).parent / "planted-marker",))


def test_a_pickle_planted_in_a_sharded_checkpoints_metadata_is_refused_without_running(launch, tmp_path):
    folder = tmp_path / CheckpointName(4, 20, sharded=True).filename
    shutil.copytree((launch("two_ranks", 2) / "full" / "checkpoints" / "final").resolve(), folder)
    marker = Path(__file__).parent / "planted-marker"
    (folder / ".metadata").write_bytes(pickle.dumps(Planted()))
    with pytest.raises(CheckpointError, match="safe loading refuses"):
        load_weights(DropoutMLP(), folder)
    with pytest.raises(CheckpointError, match="safe loading refuses"):
        sharded_weights(folder, "raw")
    assert "metadata cannot be read safely" in safe_load_problem(folder)  # what the launcher asks before a resume
    assert not marker.exists()


def test_accelerate_mixed_precision_with_a_sharded_model_is_refused_showing_the_fsdp_way(launch):
    message = report(launch("two_ranks", 2), "two_ranks")["refusal"]
    assert "mixed_precision='bf16'" in message and "MixedPrecisionPolicy" in message


# ------------------------------------------------------------------------------------------------
# Four ranks: the model sharded over all four, and HSDP (2 replicas of 2 shards)


@pytest.mark.parametrize("mesh", ["flat", "hybrid"])
def test_four_sharded_ranks_resume_bitwise_flat_and_hybrid(launch, mesh):
    output = launch("four_ranks", 4)
    facts = report(output, "four_ranks")[mesh]
    assert facts["accelerator"]["num_processes"] == 4 and facts["sizes"] == [2, 1, 2, 1]
    full = tensors(output, f"{mesh}-full", 4)
    for rank, resumed in enumerate(tensors(output, f"{mesh}-pause", 4)):
        assert_bitwise_equal(full[rank], resumed, f"{mesh}, rank {rank}")
    state = read_checkpoint(output / f"{mesh}-full" / "checkpoints" / "final")
    assert state["layout"]["sharding"] == ([4] if mesh == "flat" else [2, 2])
    # The same updates whichever way the model is spread (to float32 rounding: the reductions run in another order).
    other = tensors(output, f"{'hybrid' if mesh == 'flat' else 'flat'}-full", 1)[0]
    far = {key: (full[0][key].double() - other[key].double()).abs().max().item() for key in other}
    assert all(difference <= 1e-5 for difference in far.values()), far


# ------------------------------------------------------------------------------------------------
# SIGKILL on one rank, during training and at every stage of a sharded write

# (mode, kind, number, rank): see sharded_cases.install_kill. Each launch resumes from `last` and dies at its kill,
# writing its checkpoints synchronously or in the background.
# The first kill lands after the first folder is renamed into place, before `last` points at it (renames on rank 0:
# the folder's write probe, state.pt, the folder): the next launch resumes from the newest complete folder.
KILLS = [
    ("sync", "replace-after", 3, 0), ("sync", "call", 4, 1), ("async", "shards", 1, 1), ("sync", "metadata", 1, 0),
    ("async", "replace-before", 3, 0),
]


def test_sigkill_during_sharded_writes_leaves_last_loadable_and_the_run_ends_bitwise(forked, tmp_path):
    """A rank SIGKILLed mid-microbatch, after writing its shards (the folder half written), as DCP's metadata is
    about to be written, or around a rename (state file, folder, pointer), with checkpoints written synchronously
    or in the background: `last` always names a complete folder that one process reads whole, and the run,
    resumed from it launch after launch, ends equal to a straight synchronous run."""
    forked_launch(forked, "kill", str(tmp_path / "reference"), str(tmp_path / "reference" / "checkpoints"), "sync", "none", "0")
    expected = torch.load(tmp_path / "reference" / "kill.rank0.pt", weights_only=True)
    checkpoints = tmp_path / "run" / "checkpoints"
    for mode, kind, number, rank in KILLS:
        outcome = forked_launch(forked, "kill", str(tmp_path / "run"), str(checkpoints), mode, kind, str(number), str(rank), expect_kill=True)
        assert outcome == "killed", f"the kill {kind} {number} on rank {rank} ({mode}) did not land"
        if kind == "replace-after" and number == 3:
            assert [path.name for path in checkpoints.glob("*.dcp")] == [CheckpointName(1, 6, sharded=True).filename]
            assert not (checkpoints / "last").is_symlink()
        last = checkpoints / "last"
        if last.exists():
            read_checkpoint(last)
            sharded_weights(last.resolve(), "ema")  # every shard and the metadata are there
    assert forked_launch(forked, "kill", str(tmp_path / "run"), str(checkpoints), "async", "none", "0") == "finished"
    for rank in range(2):
        assert_bitwise_equal(expected, torch.load(tmp_path / "run" / f"kill.rank{rank}.pt", weights_only=True), f"rank {rank}")
    assert not list(checkpoints.glob(".tmp-*")), "a finished run leaves no temporary folder"
    assert len(list(checkpoints.glob("*.dcp"))) <= 3  # keep_checkpoints=2, and what a pointer names


def test_elfes_export_writes_a_sharded_checkpoints_weights_from_a_pointer_or_a_run_directory(launch, tmp_path, capsys):
    """`elfes export` on a login node: a pointer, or a folder with checkpoints/ (its `last`), to a plain file."""
    from elfes.launcher.cli.main import main

    output = launch("two_ranks", 2)
    full = tensors(output, "full", 2)[0]
    assert main(["export", str(output / "full" / "checkpoints" / "final"), str(tmp_path / "ema.pt"), "--weights", "ema"]) == 0
    assert "exported the ema weights of" in capsys.readouterr().out
    exported = torch.load(tmp_path / "ema.pt", weights_only=True)
    assert_bitwise_equal({name: full[f"ema/{name}"] for name in exported}, exported, "elfes export --weights ema")
    assert main(["export", str(output / "full"), str(tmp_path / "raw.pt")]) == 0  # the folder's `last`: the end
    exported = torch.load(tmp_path / "raw.pt", weights_only=True)
    assert_bitwise_equal({name: full[f"raw/{name}"] for name in exported}, exported, "elfes export RUN_DIR")
    assert main(["export", str(tmp_path), str(tmp_path / "nothing.pt")]) == 2
    assert "neither a checkpoint" in capsys.readouterr().err and not (tmp_path / "nothing.pt").exists()


# ------------------------------------------------------------------------------------------------
# A planted or damaged folder: nothing of it runs or is loaded silently; the folder, its step and the checkpoint
# to use instead are named; the launcher does not retry it; `elfes export` says so without a traceback


def run_with_checkpoints(launch, tmp_path: Path) -> RunPaths:
    """A run directory holding a copy of the two-rank run's checkpoints, `last` naming its final folder (step 4)."""
    paths = RunPaths(tmp_path / "run")
    shutil.copytree(launch("two_ranks", 2) / "full" / "checkpoints", paths.checkpoints, symlinks=True)
    paths.last.unlink()
    paths.last.symlink_to(os.readlink(paths.checkpoints / "final"))
    return paths


def previous_folder(paths: RunPaths) -> Path:
    return CheckpointDirectory(paths.checkpoints).checkpoints()[-2]


def rewrite_metadata(folder: Path, change) -> None:
    """Rewrite ``folder``'s .metadata after ``change(metadata)``, with DCP's own classes (what the safe reader accepts)."""
    with open(folder / ".metadata", "rb") as stream:
        metadata = pickle.load(stream)
    change(metadata)
    with open(folder / ".metadata", "wb") as stream:
        pickle.dump(metadata, stream)


class MarkerOnLoad:
    """Unpickling it creates ``marker``: the proof that a planted file ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def plant_bytes_entry(folder: Path, key: str, marker: Path, *, file: str) -> None:
    """Declare ``key`` a bytes entry (DCP's BytesStorageMetadata) stored in ``file`` of the folder, a pickle whose
    loading creates ``marker``."""
    planted = io.BytesIO()
    torch.save(MarkerOnLoad(marker), planted)
    (folder / file).write_bytes(planted.getvalue())

    def change(metadata):
        metadata.state_dict_metadata[key] = BytesStorageMetadata()
        for index in [index for index in metadata.storage_data if index.fqn == key]:
            del metadata.storage_data[index]
        metadata.storage_data[MetadataIndex(key)] = _StorageInfo(file, 0, len(planted.getvalue()))

    rewrite_metadata(folder, change)


def assert_not_retried(error: BaseException) -> None:
    report = FailureReport.of_exception(error, rank=0, host="here", at=0.0, step=None, updated=False)
    assert report.final is not None, "the launcher would retry the attempt from the same checkpoint"


@pytest.mark.parametrize("file", ["__2_0.distcp", "optimizer-state.bin"])
def test_a_bytes_entry_planted_in_a_sharded_folder_never_runs_and_is_refused_naming_the_folder(launch, tmp_path, capsys, file):
    """The attack, with DCP's own metadata classes: `optimizer.0.exp_avg` declared a bytes entry in a planted pickle
    (under a shard's name, or another). DCP's own reader runs it; every ELFES way in refuses the folder first."""
    from elfes.launcher.cli.main import main

    paths = run_with_checkpoints(launch, tmp_path)
    folder = paths.last.resolve()
    marker = tmp_path / "it-ran"
    plant_bytes_entry(folder, "optimizer.0.exp_avg", marker, file=file)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"optimizer.0.exp_avg": torch.zeros(1)}, storage_reader=FileSystemReader(folder), no_dist=True)
    assert marker.exists(), "the planted entry is a real attack: DCP's own reader runs it"
    marker.unlink()

    for read in (read_checkpoint, lambda f: sharded_weights(f, "raw"), whole_sharded_checkpoint):
        with pytest.raises(CheckpointError, match="bytes entries") as refused:
            read(folder)
        assert str(folder) in str(refused.value) and "optimizer.0.exp_avg" in str(refused.value)
        assert_not_retried(refused.value)
    with pytest.raises(CheckpointError, match="bytes entries") as refused:  # `elfes resume`: before the attempt trains
        resume_point(paths)
    assert f"{paths.last} points to {folder.name}" in str(refused.value)
    assert main(["export", str(folder), str(tmp_path / "whole.pt"), "--whole"]) == 2
    err = capsys.readouterr().err
    assert "bytes entries" in err and "Traceback" not in err and not (tmp_path / "whole.pt").exists()
    assert not marker.exists(), "nothing of the planted file ran"


def test_a_sharded_entry_stored_outside_the_folders_shard_files_is_refused(launch, tmp_path):
    folder = run_with_checkpoints(launch, tmp_path).last.resolve()
    shutil.copy(folder / "__0_0.distcp", tmp_path / "elsewhere.distcp")

    def elsewhere(metadata):
        index = next(index for index in metadata.storage_data if index.fqn == "model.hidden.weight")
        where = metadata.storage_data[index]
        metadata.storage_data[index] = _StorageInfo("../../elsewhere.distcp", where.offset, where.length)

    rewrite_metadata(folder, elsewhere)
    with pytest.raises(CheckpointError, match="not in one of the folder's shard files") as refused:
        read_checkpoint(folder)
    assert "'../../elsewhere.distcp'" in str(refused.value) and "model.hidden.weight" in str(refused.value)


def test_the_reader_never_unpickles_a_bytes_item_whatever_the_metadata_says(launch, tmp_path):
    """Below the metadata's check: the reader itself refuses to read a bytes item a planner asks for."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    folder = run_with_checkpoints(launch, tmp_path).last.resolve()
    marker = tmp_path / "it-ran"
    plant_bytes_entry(folder, "optimizer.0.exp_avg", marker, file="__2_0.distcp")
    with open(folder / ".metadata", "rb") as stream:
        metadata = pickle.load(stream)  # as if it had passed the check
    state = {"optimizer.0.exp_avg": torch.zeros(1)}
    planner = DefaultLoadPlanner()
    planner.set_up_planner(state, metadata, True)
    reader = SafeReader(folder)
    reader.set_up_storage_reader(metadata, True)
    with pytest.raises(CheckpointError, match="asks to unpickle optimizer.0.exp_avg"):
        reader.read_data(planner.create_local_plan(), planner)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncated", "missing", "flipped"])
def test_a_damaged_shard_of_last_names_the_folder_its_step_and_the_previous_checkpoint(launch, tmp_path, capsys, damage):
    """`__1_0.distcp` of `last` cut short, deleted, or with one bit of a tensor flipped: the resume (checked before the
    attempt trains), a read in one process and `elfes export` name the folder, step 4 and the previous complete
    checkpoint, which the launcher does not retry; a missing `last` resumes from that previous one."""
    from elfes.launcher.cli.main import main

    paths = run_with_checkpoints(launch, tmp_path)
    folder, previous = paths.last.resolve(), previous_folder(paths)
    shard = folder / "__1_0.distcp"
    if damage == "truncated":
        os.truncate(shard, shard.stat().st_size - 100)
    elif damage == "missing":
        shard.unlink()
    else:
        flip_a_bit_of_a_tensor(folder, shard.name)
    says = [str(folder), "step 4 (after 20 batches)", f"Resume from the previous checkpoint instead: {previous}"]

    with pytest.raises(CheckpointError) as refused:
        sharded_weights(folder, "raw")
    assert all(part in str(refused.value) for part in says), str(refused.value)
    assert ("checksum" if damage == "flipped" else "__1_0.distcp") in str(refused.value)
    assert_not_retried(refused.value)
    assert main(["export", str(paths.last), str(tmp_path / "out.pt")]) == 2
    err = capsys.readouterr().err
    assert all(part in err for part in says) and "Traceback" not in err and not (tmp_path / "out.pt").exists()
    if damage == "flipped":
        return  # its sizes are right: only reading every entry finds it, which the resume does as it loads
    with pytest.raises(CheckpointError) as refused:
        resume_point(paths)
    assert all(part in str(refused.value) for part in says), str(refused.value)
    paths.last.unlink()  # the previous checkpoint is the newest complete one: a resume without `last` takes it
    assert resume_point(paths)[0] == previous


def flip_a_bit_of_a_tensor(folder: Path, shard: str) -> None:
    """Flip one bit inside the data of the largest model tensor ``shard`` holds (not in a header or padding)."""
    metadata = SafeReader(folder).read_metadata()
    where = max((info for index, info in metadata.storage_data.items()
                 if info.relative_path == shard and index.fqn.startswith("model.")), key=lambda info: info.length)
    with open(folder / shard, "r+b") as file:
        file.seek(where.offset)
        entry = file.read(where.length)
        with zipfile.ZipFile(io.BytesIO(entry)) as archive:
            record = max(archive.infolist(), key=lambda info: info.file_size)
        header = record.header_offset
        name_length, extra_length = struct.unpack("<HH", entry[header + 26:header + 30])
        position = where.offset + header + 30 + name_length + extra_length + record.file_size // 2
        file.seek(position)
        byte = file.read(1)[0]
        file.seek(position)
        file.write(bytes([byte ^ 0x01]))


def test_ema_weights_missing_a_tensor_are_refused_naming_it(launch, tmp_path, capsys):
    from elfes.launcher.cli.main import main

    folder = run_with_checkpoints(launch, tmp_path).last.resolve()

    def drop(metadata):
        del metadata.state_dict_metadata["ema.hidden.weight"]
        for index in [index for index in metadata.storage_data if index.fqn == "ema.hidden.weight"]:
            del metadata.storage_data[index]

    rewrite_metadata(folder, drop)
    assert main(["export", str(folder), str(tmp_path / "ema.pt"), "--weights", "ema"]) == 2
    err = capsys.readouterr().err
    assert "lacks the EMA tensor of hidden.weight" in err and "weights='raw'" in err and not (tmp_path / "ema.pt").exists()
    assert main(["export", str(folder), str(tmp_path / "raw.pt")]) == 0  # the raw weights are all there


def test_elfes_export_whole_writes_a_sharded_checkpoint_optimizer_included_as_one_safe_file(launch, tmp_path, capsys):
    """`elfes export --whole`: every tensor the two ranks held at the end (weights, EMA, optimizer state), whole,
    in one file that torch.load(weights_only=True) reads, with the rest of the checkpoint."""
    from elfes.launcher.cli.main import main

    output = launch("two_ranks", 2)
    full = tensors(output, "full", 2)[0]
    final = output / "full" / "checkpoints" / "final"
    assert main(["export", str(final), str(tmp_path / "whole.pt"), "--whole"]) == 0
    assert "exported the whole checkpoint" in capsys.readouterr().out
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    exported = {f"raw/{name}": tensor for name, tensor in whole["model"].items()}
    exported.update({f"ema/{name}": tensor for name, tensor in whole["ema"].items()})
    exported.update({f"optimizer/{index}/{key}": tensor for index, state in whole["optimizer"].items() for key, tensor in state.items()})
    expected = {name: tensor for name, tensor in full.items() if name.split("/")[0] in ("raw", "ema", "optimizer") and "group" not in name}
    assert_bitwise_equal(expected, exported, "elfes export --whole")
    assert whole["state"]["step"] == 4 and len(whole["ranks"]) == 2 and "optimizer_groups" in whole
    assert main(["export", str(final), str(tmp_path / "x.pt"), "--whole", "--weights", "ema"]) == 2
    assert "drop --weights ema" in capsys.readouterr().err


@pytest.mark.parametrize("storage", ["offset", "list", "length"])
def test_metadata_of_a_shape_dcp_never_writes_is_refused_naming_it_not_retried(tmp_path, storage):
    """DCP's own classes holding what DCP never puts there (an offset that is text, entries that are a list, a
    storage without its length): a refusal naming `.metadata`, not a TypeError that the launcher would retry."""
    (tmp_path / "__0_0.distcp").write_bytes(b"x" * 64)
    index = MetadataIndex("model.w", torch.Size([0]))
    where = _StorageInfo("__0_0.distcp", 0, 8)
    if storage == "offset":
        where.offset = "0"  # type: ignore[assignment]
    elif storage == "length":
        del where.length
    entry = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([2]),
                                  [ChunkStorageMetadata(torch.Size([0]), torch.Size([2]))])
    metadata = Metadata(state_dict_metadata={"model.w": entry},
                        storage_data=[where] if storage == "list" else {index: where})  # type: ignore[arg-type]
    with open(tmp_path / ".metadata", "wb") as stream:
        pickle.dump(metadata, stream)
    with pytest.raises(CheckpointError, match="of a shape DCP never writes") as refused:
        SafeReader(tmp_path).read_metadata()
    assert str(tmp_path / ".metadata") in str(refused.value)
    assert_not_retried(refused.value)


class BuiltWith:
    """Pickles as ``build(*arguments)``: one of the classes DCP's metadata is made of, given what DCP never passes."""

    def __init__(self, build, *arguments) -> None:
        self.build, self.arguments = build, arguments

    def __reduce__(self):
        return (self.build, self.arguments)


@pytest.mark.parametrize("built", ["size", "path", "layout", "memory_format"])
def test_metadata_building_its_classes_from_bad_arguments_is_refused_naming_the_file_not_retried(tmp_path, built):
    """torch.Size("x"), PosixPath(1), _get_layout("x"), _MEM_FORMAT_ENCODING(99): classes the safe unpickler allows,
    called with what DCP never writes, raise TypeError, KeyError or ValueError; every way in refuses the folder."""
    from pathlib import PosixPath

    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING
    from torch.serialization import _get_layout

    from elfes.engine.checkpoint import FORMAT, SHARDED_STATE_FILE, VERSION

    build, argument, error = {"size": (torch.Size, "x", "TypeError"), "path": (PosixPath, 1, "TypeError"),
                              "layout": (_get_layout, "x", "KeyError"),
                              "memory_format": (_MEM_FORMAT_ENCODING, 99, "ValueError")}[built]
    (tmp_path / ".metadata").write_bytes(pickle.dumps(BuiltWith(build, argument)))
    torch.save({"format": FORMAT, "version": VERSION}, tmp_path / SHARDED_STATE_FILE)
    for read in (lambda folder: SafeReader(folder).read_metadata(), read_checkpoint):
        with pytest.raises(UnusableCheckpointError, match="cannot be unpickled as DCP metadata") as refused:
            read(tmp_path)
        assert str(tmp_path / ".metadata") in str(refused.value) and f"({error}: " in str(refused.value)
        assert str(refused.value).endswith("Resume from another checkpoint.")
        assert_not_retried(refused.value)
    assert "metadata cannot be read safely" in safe_load_problem(tmp_path)  # what the launcher asks before a resume


def one_process_folder(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A sharded checkpoint folder written by DCP in this process (no process group): a model's two tensors in
    ``__0_0.distcp``, DCP's ``.metadata`` and ``state.pt``; and the tensors."""
    from torch.distributed.checkpoint import FileSystemWriter

    from elfes.engine.checkpoint import FORMAT, SHARDED_STATE_FILE, VERSION

    folder = tmp_path / CheckpointName(4, 20, sharded=True).filename
    model = {"hidden.weight": torch.arange(6.0).reshape(2, 3), "hidden.bias": torch.tensor([0.5, -1.5])}
    with warnings.catch_warnings():  # DCP warns when it runs in one process
        warnings.simplefilter("ignore")
        dcp.save({"model": model}, storage_writer=FileSystemWriter(folder), no_dist=True)
    torch.save({"format": FORMAT, "version": VERSION, "state": {"step": 4}}, folder / SHARDED_STATE_FILE)
    return folder, model


def test_a_sharded_folder_is_loaded_reading_and_checking_its_metadata_once(tmp_path, monkeypatch):
    """Every read of `.metadata` stats every shard file (on N ranks, N x N at a resume): a load reads it once, through
    the one reader it hands on (export_weights: its check of the folder, then the load)."""
    from elfes.engine import dcp_reader

    folder, model = one_process_folder(tmp_path)
    checks: list[Path] = []
    check_entries = dcp_reader._check_entries

    def counted(where: Path, metadata: Any) -> None:
        checks.append(where)
        check_entries(where, metadata)

    monkeypatch.setattr(dcp_reader, "_check_entries", counted)
    assert_bitwise_equal(model, sharded_weights(folder, "raw"), "sharded_weights")
    assert len(checks) == 1
    whole = whole_sharded_checkpoint(folder)
    assert_bitwise_equal(model, whole["model"], "whole_sharded_checkpoint")
    assert whole["state"] == {"step": 4}
    assert len(checks) == 2
    export_weights(folder, tmp_path / "raw.pt")
    assert_bitwise_equal(model, torch.load(tmp_path / "raw.pt", weights_only=True), "export_weights")
    assert len(checks) == 4
    reader = SafeReader(folder)
    assert reader.read_metadata() is reader.read_metadata() and len(checks) == 5


def test_a_refused_folder_is_refused_by_load_shards_as_itself_and_a_damaged_one_names_its_step(tmp_path):
    """load_shards with a reader whose metadata is refused raises that refusal (DCP's own read would bury it under
    'metadata is None'), the same at every ask, rank's own metadata included; a missing shard names the folder and
    its step, as every other way in does."""
    from elfes.engine.sharded import load_shards

    folder, model = one_process_folder(tmp_path)
    state = {"model": {name: torch.zeros_like(tensor) for name, tensor in model.items()}}
    marker = tmp_path / "it-ran"
    plant_bytes_entry(folder, "model.hidden.bias", marker, file="__1_0.distcp")
    reader = SafeReader(folder)
    for ask in (reader.read_metadata, lambda: reader.read_metadata(rank=0), lambda: load_shards(state, reader, no_dist=True)):
        with pytest.raises(UnusableCheckpointError) as refused:
            ask()
        assert str(refused.value).startswith(f"{folder / '.metadata'} declares model.hidden.bias as no tensor (bytes entries)")
        assert_not_retried(refused.value)
    assert not marker.exists()

    folder, model = one_process_folder(tmp_path / "damaged")
    (folder / "__0_0.distcp").unlink()
    with pytest.raises(UnusableCheckpointError) as refused:
        load_shards(state, SafeReader(folder), no_dist=True)
    assert str(refused.value).startswith(f"Checkpoint {folder} is truncated or corrupted (its shard __0_0.distcp is missing). "
                                         "It held step 4 (after 20 batches).")
    assert_not_retried(refused.value)


def test_the_metadata_allow_list_holds_dcps_classes_wherever_this_torch_keeps_them(tmp_path, monkeypatch):
    """The allow-list is resolved to DCP's classes themselves, not kept as module paths: listed by a place that only
    re-exports it (as a list written for a torch that kept Metadata elsewhere would name it), Metadata is still read
    from its home in this torch, and a place this torch lacks is left out."""
    from elfes.engine import dcp_reader

    listed = dcp_reader.AllowList({"torch.distributed.checkpoint": ("Metadata",)})
    assert listed.find("torch.distributed.checkpoint.metadata", "Metadata") is Metadata  # its home, not listed
    assert listed.find("torch.distributed.checkpoint", "Metadata") is Metadata
    assert listed.find("torch.distributed.checkpoint.metadata", "MetadataIndex") is None  # searched, not allowed
    assert dcp_reader.AllowList({"torch.distributed.checkpoint._moved_away": ("Metadata",)}).objects == ()
    places = {module: tuple(name for name in names if name != "Metadata")
              for module, names in dcp_reader._METADATA_PLACES.items()}
    places |= {"torch.distributed.checkpoint": ("Metadata",), "torch.distributed.checkpoint._moved_away": ("Metadata",)}
    monkeypatch.setattr(dcp_reader, "_METADATA", dcp_reader.AllowList(places))
    folder, model = one_process_folder(tmp_path)
    assert b"ctorch.distributed.checkpoint.metadata\nMetadata\n" in pickle.dumps(Metadata, protocol=2)  # its home
    assert_bitwise_equal(model, sharded_weights(folder, "raw"), "sharded_weights")


@pytest.mark.parametrize("named", ["torch.distributed.checkpoint.metadata.FutureStorageMetadata",
                                   "torch.distributed.checkpoint._storage_home._StorageInfo"])
def test_metadata_naming_a_class_this_torch_lacks_is_refused_naming_it_and_the_torch_version(tmp_path, named):
    """A class another torch keeps where this one has none (moved, renamed or new) is not called tampering: the
    refusal names it and this torch's version, says a newer torch may move DCP's classes, and ends with what to do."""
    folder, _ = one_process_folder(tmp_path)
    module, _, name = named.rpartition(".")
    (folder / ".metadata").write_bytes(f"c{module}\n{name}\n.".encode())
    for read in (lambda: SafeReader(folder).read_metadata(), lambda: sharded_weights(folder, "raw")):
        with pytest.raises(UnusableCheckpointError) as refused:
            read()
        message = str(refused.value)
        assert message.startswith(f"{folder / '.metadata'} names {named}, which torch {torch.__version__} does not hold")
        assert "a newer torch may move or rename DCP's classes" in message and "not written by ELFES" not in message
        assert message.endswith("Resume with the torch version that wrote the checkpoint, or from a checkpoint this "
                                "torch wrote.")
        assert_not_retried(refused.value)


def test_metadata_naming_anything_outside_torch_is_refused_as_not_written_by_elfes_naming_it(tmp_path):
    folder, _ = one_process_folder(tmp_path)
    (folder / ".metadata").write_bytes(b"cbuiltins\neval\n.")
    with pytest.raises(UnusableCheckpointError) as refused:
        SafeReader(folder).read_metadata()
    assert (f"safe loading refuses to build (builtins.eval is none of DCP's metadata classes in torch "
            f"{torch.__version__}); ELFES writes only DCP's metadata there, so this folder was not written by ELFES"
            ) in str(refused.value)
