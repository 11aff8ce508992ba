"""CUDA: placement, CUDA RNG restore, AMP fp16/bf16 and fused AdamW under bitwise pause/resume.

These run only where CUDA is present (CI has no GPU: they skip there, and a skip is not a pass).
"""

from __future__ import annotations

import pytest
import torch
from workloads import (
    RunSpec,
    assert_bitwise_equal,
    build,
    first_call_of_window,
    fresh_accelerate,
    pause_and_resume,
    snapshot,
    windows_per_epoch,
)

from elfes.engine.rng import capture_rng, restore_rng

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA_SPECS = {
    "fp32-fused-adamw": RunSpec(cpu=False, optimizer="adamw_fused"),
    "amp-fp16": RunSpec(cpu=False, mixed_precision="fp16"),
    "amp-bf16": RunSpec(cpu=False, mixed_precision="bf16"),
    "amp-fp16-fused-adamw-workers": RunSpec(cpu=False, mixed_precision="fp16", optimizer="adamw_fused", num_workers=2),
}


def test_model_batches_and_optimizer_state_live_on_cuda(tmp_path):
    fresh_accelerate()
    run = build(RunSpec(cpu=False, epochs=1))
    run.trainer.train(run.config, checkpoint_dir=tmp_path)
    assert all(parameter.is_cuda for parameter in run.trainer.module.parameters())
    assert all(value.is_cuda for state in run.trainer.optimizer.state.values() for key, value in state.items() if key != "step" or value.dim())


def test_cuda_generator_state_is_captured_and_restored():
    state = capture_rng()
    expected = torch.rand(4, device="cuda")
    torch.rand(100, device="cuda")
    restore_rng(state)
    assert torch.equal(torch.rand(4, device="cuda"), expected)


def test_fp16_uses_a_grad_scaler_and_its_state_is_checkpointed(tmp_path):
    fresh_accelerate()
    run = build(RunSpec(cpu=False, mixed_precision="fp16", epochs=1))
    assert run.accelerator.scaler is not None
    run.trainer.train(run.config, checkpoint_dir=tmp_path)
    payload = torch.load(tmp_path / "final", weights_only=True)
    assert payload["scaler"]["scale"] == run.accelerator.scaler.get_scale()


@pytest.mark.parametrize("name", list(CUDA_SPECS))
def test_pause_at_every_window_boundary_resumes_bitwise_on_cuda(name, tmp_path):
    spec = CUDA_SPECS[name]
    fresh_accelerate()
    reference = build(spec)
    reference.trainer.train(reference.config, checkpoint_dir=tmp_path / "reference")
    expected = snapshot(reference.trainer)
    for window in range(windows_per_epoch(spec) * spec.epochs):
        run, _ = pause_and_resume(spec, tmp_path / f"pause-{window}", [first_call_of_window(spec, window)])
        assert_bitwise_equal(expected, snapshot(run.trainer), f"{name}: paused in window {window}")



@pytest.mark.parametrize("name", ["fp32-fused-adamw", "amp-fp16"])
def test_asynchronous_checkpoints_on_cuda_equal_synchronous_ones_through_pinned_buffers(name, tmp_path):
    from checkpoint_files import assert_same_payload, comparable, published
    from workloads import held_background_writes

    from elfes.engine import Interval
    from elfes.engine.publish import Snapshot

    spec = CUDA_SPECS[name].with_(checkpoint_every=Interval(1, "step"))
    pinned = []
    original = Snapshot.__call__

    def snapshot_call(self, tensor, where):
        copy = original(self, tensor, where)
        if tensor.is_cuda:
            pinned.append(copy.is_pinned() and copy.device.type == "cpu")
        return copy

    for directory, asynchronous in (("sync", False), ("async", True)):
        fresh_accelerate()
        run = build(spec.with_(async_checkpoints=asynchronous))
        Snapshot.__call__ = snapshot_call
        try:
            with held_background_writes(run.trainer, until="wait"):
                run.trainer.train(run.config, checkpoint_dir=tmp_path / directory)
        finally:
            Snapshot.__call__ = original
    assert pinned and all(pinned), "every CUDA tensor is copied into pinned host memory"
    files = [path.name for path in published(tmp_path / "sync")]
    assert [path.name for path in published(tmp_path / "async")] == files
    for file in files:
        expected, actual = (torch.load(tmp_path / folder / file, map_location="cpu", weights_only=True) for folder in ("sync", "async"))
        assert_same_payload(comparable(expected), comparable(actual), file)
