"""Data pipelines as people write them resume bitwise: random augmentation, stateful loaders, streams."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from data_jobs import IMAGES, DataCase, train, write_hf_files
from launching import launch_environment
from workloads import assert_bitwise_equal

HERE = Path(__file__).resolve().parent

# Microbatch 7 is batch 6 of epoch 0 (10 batches of 4 per epoch, windows of 2): a mid-epoch interruption.
MID_EPOCH = 7

LOADERS = {
    "main-process": {},
    "two-workers": {"num_workers": 2},
    "persistent-workers": {"num_workers": 2, "persistent": True, "prefetch_factor": 3},
}


def sigkill_then_resume(case: DataCase, directory: Path, at: int) -> dict[str, torch.Tensor]:
    """Launch ``case`` in a process that SIGKILLs itself in microbatch ``at``, then resume it here from ``last``."""
    completed = subprocess.run(
        [sys.executable, str(HERE / "data_jobs.py"), json.dumps(asdict(case)), str(directory), str(at)],
        env=launch_environment(OMP_NUM_THREADS=str(torch.get_num_threads())), capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == -9, completed.stderr[-3000:]
    return train(case, directory, resume=True)


def interrupted_runs(case: DataCase, tmp_path: Path, at: int = MID_EPOCH) -> dict[str, dict[str, torch.Tensor]]:
    """The end states of ``case`` after a pause, a SIGTERM and a SIGKILL in microbatch ``at``, each resumed."""
    ends = {}
    for kind in ("pause", "sigterm"):
        stopped = train(case, tmp_path / kind, interrupt=(kind, at))
        assert bool(stopped["stopped"]), f"the {kind} did not stop the run"
        ends[kind] = train(case, tmp_path / kind, resume=True)
    ends["sigkill"] = sigkill_then_resume(case, tmp_path / "sigkill", at)
    return ends


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("source", ["torch", "numpy", "python"])
def test_random_augmentation_resumes_bitwise_after_a_pause_a_sigterm_and_a_sigkill(source, loader, tmp_path):
    case = DataCase(source=source, **LOADERS[loader])
    straight = train(case, tmp_path / "straight")
    for kind, end in interrupted_runs(case, tmp_path).items():
        assert_bitwise_equal(straight, end, f"{source} draws, {loader}, {kind}")


def test_worker_batches_do_not_depend_on_the_number_of_workers_or_their_prefetch(tmp_path):
    two = train(DataCase(num_workers=2), tmp_path / "two")
    three = train(DataCase(num_workers=3, prefetch_factor=4), tmp_path / "three")
    assert_bitwise_equal(two, three, "2 workers against 3")


def test_the_loader_reads_no_batch_ahead_so_main_process_draws_interleave_with_the_steps_as_in_a_plain_loop(tmp_path):
    """With num_workers=0 a batch is fetched just before its step: the draws of fetch and step alternate; an
    epoch ends (the sampler's code after its last item runs) before the next one begins, as in a plain loop."""
    order: list[str] = []

    class Recording(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            order.append(f"fetch {index}")
            return torch.zeros(2), torch.zeros(1)

    from accelerate import Accelerator
    from workloads import fresh_accelerate

    from elfes.engine import StepOutput, TrainConfig, Trainer

    def step(model, batch):
        order.append("step")
        return StepOutput(loss=(model(batch[0]) - batch[1]).square().mean(), num_samples=len(batch[0]))

    class RecordingSampler(torch.utils.data.Sampler):
        def __len__(self):
            return 8

        def __iter__(self):
            order.append("epoch begins")
            yield from range(8)
            order.append("epoch ends")  # runs only when the loop asks for the item after the last

    def loader():
        return torch.utils.data.DataLoader(Recording(), batch_size=4, sampler=RecordingSampler())

    fresh_accelerate()
    model = torch.nn.Linear(2, 1)
    Trainer(Accelerator(cpu=True), model, torch.optim.SGD(model.parameters(), lr=0.1), loader(), step).train(TrainConfig(epochs=2))
    trained, order[:] = list(order), []
    plain = loader()
    for _ in range(2):
        for batch in plain:
            step(model, batch)
    assert trained == order, "an epoch of the trainer reads what a plain loop reads, in the same order"
    epoch = ["epoch begins"] + [f"fetch {i}" for i in range(4)] + ["step"] + [f"fetch {i}" for i in range(4, 8)] + ["step"]
    assert order == 2 * (epoch + ["epoch ends"])


# ------------------------------------------------------------------------------------------------
# Stateful data and streams


def test_a_stateful_iterable_dataset_resumes_mid_epoch_bitwise(tmp_path):
    case = DataCase(reader="stateful-stream")
    straight = train(case, tmp_path / "straight")
    for kind, end in interrupted_runs(case, tmp_path).items():
        assert_bitwise_equal(straight, end, f"stateful stream, {kind}")


def test_a_stateful_stream_resumes_from_its_state_without_reading_the_consumed_batches(tmp_path):
    case = DataCase(reader="stateful-stream")
    train(case, tmp_path / "run", interrupt=("pause", MID_EPOCH))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no replay warning
        train(case, tmp_path / "run", resume=True)


def test_an_iterable_dataset_without_state_resumes_exactly_by_replay_and_warns(tmp_path):
    case = DataCase(reader="stream")
    straight = train(case, tmp_path / "straight")
    train(case, tmp_path / "run", interrupt=("pause", MID_EPOCH))
    with pytest.warns(UserWarning, match=r"ImageStream\) at batch 8 of epoch 1 by reading and discarding the 8 batches"):
        end = train(case, tmp_path / "run", resume=True, log=True)
    assert_bitwise_equal(straight, end, "replayed stream")
    from elfes.records import read_events

    warned = [event for event in read_events(tmp_path / "run") if event["event"] == "warning"]
    assert [event["kind"] for event in warned] == ["stream_replay"], "the replay's cost is in the run records"
    assert "reading and discarding the 8 batches" in warned[0]["message"]


def test_a_stream_read_by_workers_resumes_exactly_by_replay(tmp_path):
    case = DataCase(reader="stream", num_workers=2)
    straight = train(case, tmp_path / "straight")
    train(case, tmp_path / "run", interrupt=("pause", MID_EPOCH))
    with pytest.warns(UserWarning, match="by reading and discarding"):
        end = train(case, tmp_path / "run", resume=True)
    assert_bitwise_equal(straight, end, "replayed stream in workers")


def test_a_stream_without_length_trains_to_max_steps_and_each_epoch_ends_with_the_stream(tmp_path):
    # 10 batches per pass, windows of 2: 5 updates a pass; 12 steps cross two stream ends.
    case = DataCase(reader="stateful-stream", stream_length=False, epochs=100, max_steps=12)
    straight = train(case, tmp_path / "straight")
    assert straight["position"].tolist()[:3] == [2, 4, 12]
    for kind, end in interrupted_runs(case, tmp_path, at=13).items():
        assert_bitwise_equal(straight, end, f"stream without length, {kind}")


def test_a_stream_without_length_and_without_max_steps_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"stream without __len__.*Set TrainConfig\(max_steps=\.\.\.\)"):
        train(DataCase(reader="stream", stream_length=False), tmp_path)


def test_a_stateful_dataset_in_plain_workers_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"its dataset \(StatefulImageStream\) with state_dict\(\).*StatefulDataLoader"):
        train(DataCase(reader="stateful-stream", num_workers=2), tmp_path)


def test_a_torchdata_stateful_dataloader_resumes_mid_epoch_bitwise(tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader", reason="the data extra (pip install -e '.[data]') is not installed")
    for workers in (0, 2):
        case = DataCase(reader="stateful-loader", num_workers=workers)
        straight = train(case, tmp_path / f"straight-{workers}")
        for kind, end in interrupted_runs(case, tmp_path / f"w{workers}").items():
            assert_bitwise_equal(straight, end, f"StatefulDataLoader, {workers} workers, {kind}")


def test_a_hugging_face_streaming_dataset_resumes_mid_epoch_bitwise(tmp_path):
    pytest.importorskip("datasets", reason="the data extra (pip install -e '.[data]') is not installed")
    # No __len__: each pass ends with the stream (10 batches, 5 updates); 10 steps read two passes.
    case = DataCase(reader="hf-stream", collate_draws=False, max_steps=10, epochs=100, hf_files=write_hf_files(tmp_path / "files"))
    straight = train(case, tmp_path / "straight")
    # The second pass ends exactly at step 10, before its end is read: the run ends in epoch 1, batch 10.
    assert straight["position"].tolist()[:4] == [1, 10, 10, 2 * IMAGES // case.batch_size]
    train(case, tmp_path / "run", interrupt=("pause", MID_EPOCH))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*reading and discarding")  # resumed from its state_dict,
        warnings.filterwarnings("error", message=".*not exact")  # which holds all of an unshuffled stream's place
        end = train(case, tmp_path / "run", resume=True)
    assert_bitwise_equal(straight, end, "Hugging Face stream")
    assert_bitwise_equal(straight, sigkill_then_resume(case, tmp_path / "sigkill", MID_EPOCH), "Hugging Face stream, sigkill")


def test_a_stateful_stream_read_by_torchdata_workers_resumes_mid_epoch_bitwise(tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader", reason="the data extra (pip install -e '.[data]') is not installed")
    case = DataCase(reader="stateful-loader-stream", num_workers=2)
    straight = train(case, tmp_path / "straight")
    for kind, end in interrupted_runs(case, tmp_path).items():
        assert_bitwise_equal(straight, end, f"StatefulDataLoader over a stream in workers, {kind}")


def test_a_sampler_of_ones_own_with_state_is_saved_and_resumes_from_it_bitwise(tmp_path, monkeypatch):
    from data_jobs import ResumableSampler

    case = DataCase(reader="stateful-sampler")
    straight = train(case, tmp_path / "straight")
    loaded = []
    original = ResumableSampler.load_state_dict
    monkeypatch.setattr(ResumableSampler, "load_state_dict", lambda self, state: (loaded.append(state), original(self, state)))
    for kind, end in interrupted_runs(case, tmp_path).items():
        assert_bitwise_equal(straight, end, f"stateful sampler, {kind}")
    assert {"yielded": 32} in loaded, "the pause after batch 8 (32 samples) resumes from the sampler's own state"


def test_a_stateful_sampler_in_plain_workers_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"its sampler \(ResumableSampler\) with state_dict\(\).*Use num_workers=0"):
        train(DataCase(reader="stateful-sampler", num_workers=2), tmp_path)


def test_a_loader_that_yields_batches_out_of_order_is_refused(tmp_path):
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    from elfes.engine import Trainer

    model = torch.nn.Linear(2, 1)
    loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2, num_workers=2, in_order=False)
    with pytest.raises(ValueError, match=r"in_order=False.*Build it with in_order=True"):
        Trainer(Accelerator(cpu=True), model, torch.optim.SGD(model.parameters(), lr=0.1), loader, lambda m, b: None)


# ------------------------------------------------------------------------------------------------
# Every loader's epoch ends as a plain loop's does, and every shuffle resumes in every epoch


def test_a_shuffled_torchdata_stateful_dataloader_resumes_bitwise_in_a_later_epoch(tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader", reason="the data extra (pip install -e '.[data]') is not installed")
    # 10 batches per epoch: microbatch 27 is batch 6 of the third epoch, whose order its sampler's generator sets.
    case = DataCase(reader="stateful-loader", epochs=3)
    straight = train(case, tmp_path / "straight")
    train(case, tmp_path / "run", interrupt=("pause", 27))
    assert_bitwise_equal(straight, train(case, tmp_path / "run", resume=True), "StatefulDataLoader paused in epoch 3")


@pytest.mark.parametrize("reader", ["weighted-sampler", "subset-sampler"])
def test_a_sampler_that_draws_its_order_resumes_bitwise_in_a_later_epoch(reader, tmp_path):
    case = DataCase(reader=reader, epochs=3)
    straight = train(case, tmp_path / "straight")
    train(case, tmp_path / "run", interrupt=("pause", 27))
    assert_bitwise_equal(straight, train(case, tmp_path / "run", resume=True), f"{reader} paused in epoch 3")


def test_a_stream_that_rewinds_after_its_last_item_trains_every_epoch_and_resumes_bitwise(tmp_path):
    # The rewind after the last yield runs only when the loop asks for one more item, as `for` does.
    case = DataCase(reader="resetting-stream", epochs=3)
    straight = train(case, tmp_path / "straight")
    assert straight["position"].tolist()[:4] == [3, 0, 15, 3 * IMAGES // case.batch_size]
    for at in (MID_EPOCH, 17):  # a pause in the first epoch, and one in the second
        train(case, tmp_path / f"run-{at}", interrupt=("pause", at))
        assert_bitwise_equal(straight, train(case, tmp_path / f"run-{at}", resume=True), f"rewinding stream, pause at {at}")


def test_a_loader_that_yields_more_batches_than_its_length_is_refused_at_the_epoch_end(tmp_path):
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, IterableDataset

    from elfes.engine import StepOutput, TrainConfig, Trainer

    class LongerThanItsLength(IterableDataset):
        def __len__(self):
            return 8

        def __iter__(self):
            return iter([torch.zeros(2)] * 12)

    model = torch.nn.Linear(2, 1)
    loader = DataLoader(LongerThanItsLength(), batch_size=4)
    trainer = Trainer(Accelerator(cpu=True), model, torch.optim.SGD(model.parameters(), lr=0.1), loader,
                      lambda m, batch: StepOutput(loss=m(batch).square().mean(), num_samples=len(batch)))
    with pytest.raises(RuntimeError, match=r"yielded more than the 2 batches its length promised in epoch 0.*__len__"):
        trainer.train(TrainConfig(epochs=1))


# ------------------------------------------------------------------------------------------------
# Streams that cannot resume exactly say so


def test_a_hugging_face_stream_shuffled_in_a_buffer_is_named_at_the_start_of_training_and_in_the_run_records(tmp_path):
    pytest.importorskip("datasets", reason="the data extra (pip install -e '.[data]') is not installed")
    from elfes.records import read_events

    case = DataCase(reader="hf-stream", collate_draws=False, max_steps=3, epochs=100, hf_shuffle_buffer=8,
                    hf_files=write_hf_files(tmp_path / "files"))
    with pytest.warns(UserWarning, match=r"shuffle\(buffer_size=8\).*not exact.*shuffle the shards"):
        train(case, tmp_path / "run", log=True)
    warned = [event for event in read_events(tmp_path / "run") if event["event"] == "warning"]
    assert [event["kind"] for event in warned] == ["inexact_stream"]
    assert "shuffle(buffer_size=8)" in warned[0]["message"]

