"""What a process of a plain run imports: never DCP or DTensor (a sharded model's checkpoints), matplotlib (``elfes
plot``) nor a tracker's SDK, each of which costs every job and rank process up to seconds. Each case runs in a
fresh interpreter, whose ``sys.modules`` is all that process ever imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from launching import REPOSITORY, launch_environment

# The modules a plain, untracked run must not load: each is imported where a run uses it.
IMPORTED_WHERE_USED = (
    "torch.distributed.checkpoint", "torch.distributed.tensor", "torch.distributed.fsdp",
    "matplotlib", "mlflow", "wandb", "tensorboard",
)
RANK_ENTRY = "import submitit.core._submit, elfes.launcher.job.runtime, elfes.engine, examples.quickstart.job"


def loaded_after(script: str) -> list[str]:
    """Which of :data:`IMPORTED_WHERE_USED` a fresh interpreter has imported once ``script`` has run."""
    report = f"\nimport json, sys\nprint(json.dumps(sorted(set({IMPORTED_WHERE_USED!r}) & set(sys.modules))))\n"
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script) + report], cwd=REPOSITORY,
                            env=launch_environment(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_the_engine_loads_no_module_a_plain_run_does_not_use():
    assert loaded_after("import elfes.engine") == []


def test_a_local_rank_process_imports_none_of_them_before_main_runs():
    # what submitit's task process imports to run launcher/job/runtime.py, then the quickstart job's entrypoint
    assert loaded_after(RANK_ENTRY) == []


def test_a_plain_run_that_checkpoints_resumes_and_exports_loads_no_dcp_plot_or_tracker(tmp_path):
    script = f"""
        from pathlib import Path
        from workloads import RunSpec, build
        from elfes.engine import export_checkpoint, export_weights, load_weights
        folder = Path({str(tmp_path)!r})
        spec = RunSpec(epochs=1, ema_decay=0.9)
        first = build(spec)
        first.trainer.train(first.config, checkpoint_dir=folder / "checkpoints")
        resumed = build(spec.with_(epochs=2))
        resumed.trainer.train(resumed.config, checkpoint_dir=folder / "checkpoints", resume_from=folder / "checkpoints" / "last")
        export_weights(folder / "checkpoints" / "last", folder / "weights.pt", weights="ema")
        export_checkpoint(folder / "checkpoints" / "last", folder / "whole.pt")
        load_weights(build(spec).trainer.module, folder / "checkpoints" / "last")
        assert (folder / "weights.pt").is_file() and (folder / "whole.pt").is_file()
    """
    # torch's own optimizer imports torch._dynamo on construction, and dynamo imports FSDP2 and DTensor: only DCP,
    # matplotlib and the trackers are a run's own to leave out
    assert set(loaded_after(script)) <= {"torch.distributed.fsdp", "torch.distributed.tensor"}


def test_the_check_sees_a_sharded_checkpoints_imports():
    # the report is the interpreter's own: importing the sharded checkpoints' module shows DCP and DTensor
    loaded = loaded_after("import elfes.engine.sharded")
    assert {"torch.distributed.checkpoint", "torch.distributed.tensor"} <= set(loaded)


def test_sharding_a_loader_over_ranks_imports_hf_datasets_only_for_an_hf_dataset():
    # accelerate imports `datasets` (1.3 s with pandas and pyarrow) to shard any loader where it is installed;
    # the engine's loaders leave it unimported, and shard an HF stream by its shards exactly as accelerate does
    script = """
        import sys, torch
        from accelerate import PartialState
        from torch.utils.data import DataLoader, TensorDataset
        from elfes.engine.data import prepare_data_loader
        PartialState(cpu=True)
        def second_rank(dataset):
            loader = prepare_data_loader(DataLoader(dataset, batch_size=2), num_processes=2, process_index=1,
                                         put_on_device=False)
            return [batch[0].tolist() if isinstance(batch, list) else batch["x"].tolist() for batch in loader]
        assert second_rank(TensorDataset(torch.arange(8.0))) == [[2.0, 3.0], [6.0, 7.0]]
        assert "datasets" not in sys.modules and "pandas" not in sys.modules
        import datasets
        stream = datasets.Dataset.from_dict({"x": list(range(8))}).to_iterable_dataset(num_shards=2)
        assert second_rank(stream) == [[4, 5], [6, 7]]  # its second shard, not every second half-batch
    """
    loaded_after(script)
