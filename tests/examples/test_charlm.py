"""The charlm example: its data and loss, and a real job preempted through `elfes preempt` on the local
executor that ends bitwise equal (torch.equal on every tensor) to a straight run on this machine."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml
from local_jobs import (
    JOB_TIMEOUT_S,
    diagnostics,
    events,
    reaped_run_dirs,
    state_of,
    training_in_attempt_1,
    wait_ended,
    wait_for,
)
from run_comparison import assert_runs_bitwise_equal

from elfes.launcher.cli.main import main as elfes
from examples.charlm import job as charlm
from examples.charlm import sample
from examples.charlm.data import IGNORED, VOCABULARY, LibraryText, documents, encode, pad
from examples.charlm.model import CharTransformer

REPOSITORY = Path(__file__).resolve().parents[2]
# A tiny model on the first whole files past 8 000 characters (287 documents of at most 32): 3 epochs of about
# 18 optimizer steps on two ranks, a train record each (a preemption sent after the first lands mid-run).
TINY = {"train_chars": 8_000, "context": 32, "width": 32, "depth": 1, "heads": 2, "epochs": 3, "batch_size": 4,
        "accumulation": 2, "warmup_steps": 5, "evaluate_every": 10, "checkpoint_every": 10, "log_every": 1}


def test_documents_keep_the_text_and_fit_the_context() -> None:
    text = "def a():\n pass\n\nclass B:\n x = 1\n\n" + "y" * 32 + "\n\nz = 2\n"
    assert documents(text, 16) == ["def a():\n pass", "class B:\n x = 1", "y" * 16, "y" * 16, "z = 2\n"]
    assert documents("a = 1\n\nb = 2\n", 16) == ["a = 1\n\nb = 2\n"]  # paragraphs join while they fit


def test_held_out_files_are_not_trained_on_and_the_corpus_is_fixed() -> None:
    train = LibraryText("train", train_chars=50_000, context=64)
    validation = LibraryText("validation", train_chars=50_000, context=64)
    assert len(train) and len(validation)
    trained = {tuple(document.tolist()) for document in train.documents}
    assert not any(tuple(document.tolist()) in trained for document in validation.documents if len(document) > 40)
    again = LibraryText("train", train_chars=50_000, context=64)
    assert all(torch.equal(a, b) for a, b in zip(train.documents, again.documents, strict=True))
    assert max(int(document.max()) for document in train.documents) < VOCABULARY


def test_the_step_weighs_the_mean_loss_by_the_real_characters() -> None:
    """Padding adds no target; loss_weight counts the real ones, and padding changes no real logit."""
    batch = [encode("import os\n"), encode("x = 1\n"), encode("pass")]
    inputs, targets = pad(batch)
    assert inputs.shape == (3, 9) and int((targets != IGNORED).sum()) == 9 + 5 + 3
    torch.manual_seed(0)
    model = CharTransformer(VOCABULARY, context=16, width=16, depth=1, heads=2, dropout=0.0).eval()
    output = charlm.step(model, (inputs, targets))
    assert int(output.loss_weight) == 17 and output.num_samples == 3
    torch.testing.assert_close(model(inputs)[1, :5], model(encode("x = 1")[None])[0])
    total, count = (float(statistic) for statistic in output.metrics["bits_per_character"].statistics)
    assert count == 17 and math.isclose(total / count, float(output.loss.detach()) / math.log(2), rel_tol=1e-6)


def test_an_unknown_config_key_is_refused_by_name(tmp_path: Path) -> None:
    job = SimpleNamespace(config={"width": 8, "learning_rate": 0.1}, run_dir=tmp_path / "run")
    with pytest.raises(ValueError, match=r"unknown keys \['learning_rate'\].*reads \["):
        charlm.main(job)
    assert not job.run_dir.exists()


@pytest.mark.parametrize("name", ["job.yaml", "slurm-gpu.yaml"])
def test_the_specs_are_valid_and_set_only_keys_the_job_reads(name: str) -> None:
    from elfes.launcher.spec import load_spec

    spec = load_spec(REPOSITORY / "examples" / "charlm" / name)
    assert spec.entrypoint == "examples.charlm.job:main" and spec.workdir == REPOSITORY
    assert set(spec.config) <= set(charlm.DEFAULTS)


# -- a real job, preempted and resumed ----------------------------------------------------------------------------
# Where the job trains: two gloo ranks on CPUs, or one GPU (bf16 autocast, fused AdamW).
DEVICES = {
    "cpu": {"tasks_per_node": 2, "gpus_per_node": 0},
    "cuda": pytest.param({"tasks_per_node": 1, "gpus_per_node": 1}, marks=[
        pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
}


def write_spec(folder: Path, name: str, devices: dict[str, int], **config: Any) -> Path:
    """examples/charlm/job.yaml with the TINY config (and ``config``) on ``devices``, its run directory ``folder/name``."""
    spec = yaml.safe_load((REPOSITORY / "examples" / "charlm" / "job.yaml").read_text())
    spec.update(name=name, workdir=str(REPOSITORY), run_dir=str(folder / name), config={**TINY, **config})
    spec["resources"].update(devices)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture
def run_dirs() -> Iterator[list[Path]]:
    yield from reaped_run_dirs()


# How the job reads its documents, and whether its model is sharded over the ranks (FSDP2).
READERS = {"documents": {"reader": "documents"}, "stream": {"reader": "stream"},
           "sharded": {"reader": "documents", "shard": True}}


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
@pytest.mark.parametrize("devices", DEVICES.values(), ids=DEVICES.keys())
def test_a_preempted_charlm_job_resumes_bitwise(tmp_path: Path, run_dirs: list[Path], devices: dict[str, int],
                                                reader: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """Documents of different lengths (a shuffled dataset, or each rank's stream of randomly cropped
    documents resumed from its state), a replicated model or one sharded with FSDP2 (its checkpoints
    folders of shards), on two gloo ranks or one GPU: preempted after its first train record, the job
    saves `last`, relaunches, resumes and ends tensor for tensor equal to a straight run."""
    for name in ("straight", "preempted"):
        spec = write_spec(tmp_path, name, devices, **reader)
        assert elfes(["submit", str(spec), "--executor", "local"]) == 0
        run_dirs.append(tmp_path / name)
    straight, preempted = run_dirs

    wait_for(lambda: training_in_attempt_1(preempted, devices["tasks_per_node"]), "attempt 1 to train", preempted)
    assert elfes(["preempt", str(preempted)]) == 0
    state = wait_ended(preempted)
    assert state.status == "finished", diagnostics(preempted)
    assert [(a.outcome, a.signal) for a in state.attempts] == [("requeued", "SIGUSR2"), ("finished", None)]
    planned = state.attempts[-1].step
    assert 1 <= state.attempts[0].step < planned, "the preemption landed mid-run"
    starts = [e for e in events(preempted) if e["event"] in ("started", "resumed")]
    assert [e["event"] for e in starts] == ["started", "resumed"]
    assert {(e["world_size"], e["precision"]) for e in starts} == {
        (devices["tasks_per_node"], "bf16" if devices["gpus_per_node"] else "no")}
    assert wait_ended(straight).status == "finished", diagnostics(straight)
    assert state_of(straight).attempts[-1].step == planned
    assert_runs_bitwise_equal(preempted, straight)
    assert (preempted / "checkpoints" / "final").resolve().suffix == (".dcp" if reader.get("shard") else ".pt")
    # `elfes export` of the run (its `last`, here the final folder of shards) gives the exported EMA model's tensors.
    assert elfes(["export", str(preempted), str(tmp_path / "exported.pt"), "--weights", "ema"]) == 0
    exported, saved = (torch.load(path, weights_only=True) for path in (tmp_path / "exported.pt", preempted / "model.pt"))
    assert exported.keys() == saved.keys() and all(torch.equal(exported[k], saved[k]) for k in saved)

    evaluation = [e for e in events(preempted) if e["event"] == "evaluation"][-1]["metrics"]["validation"]
    assert math.isclose(evaluation["bits_per_character"], evaluation["loss"] / math.log(2), rel_tol=1e-5)

    capsys.readouterr()  # what the CLI printed so far
    assert sample.main([str(preempted), "--prompt", "import ", "--characters", "40"]) == 0
    written = capsys.readouterr().out
    assert written.startswith("import ") and len(written) == len("import ") + 40 + 1  # and the newline


def test_sampling_an_unfinished_run_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"model.pt is missing: .* holds no finished charlm run; `elfes status"):
        sample.main([str(tmp_path)])


def _readme_block(name: str) -> list[str]:
    text = (REPOSITORY / "examples" / "charlm" / "README.md").read_text()
    block = text.split(f"<!-- doc-test: {name} -->\n```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def _shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` as bash runs it, this interpreter's folder (its `elfes` and `python`) first on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])
    completed = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
                               env={**os.environ, "PATH": path, "PYTHONPATH": str(cwd)})
    assert completed.returncode == 0, f"{command}: {completed.stdout[-2000:]}{completed.stderr[-2000:]}"
    return completed


def test_the_commands_of_its_readme_run(tmp_path: Path, run_dirs: list[Path]) -> None:
    """The README's run, preempt, logs, plot and sample lines, in a copy whose job.yaml holds the TINY
    config (the real one trains for minutes); the preemption waits until attempt 1 trains, as the
    README's "any time while it trains" says."""
    shutil.copytree(REPOSITORY / "examples", tmp_path / "examples")
    spec_file = tmp_path / "examples" / "charlm" / "job.yaml"
    spec = yaml.safe_load(spec_file.read_text())
    spec_file.write_text(yaml.safe_dump({**spec, "config": TINY}, sort_keys=False))
    submit, preempt, follow, plot = _readme_block("charlm/run")
    run_dir = tmp_path / "runs" / "charlm"
    run_dirs.append(run_dir)
    _shell(submit, tmp_path)
    wait_for(lambda: training_in_attempt_1(run_dir, 2), "attempt 1 to train", run_dir)
    _shell(preempt, tmp_path)
    followed = _shell(follow, tmp_path).stdout
    assert "attempt 2 (requeue)" in followed
    assert [a.outcome for a in wait_ended(run_dir).attempts] == ["requeued", "finished"]
    _shell(plot, tmp_path)
    assert (tmp_path / "examples" / "charlm" / "plot.png").stat().st_size > 0
    (prompt,) = _readme_block("charlm/sample")
    assert _shell(prompt, tmp_path).stdout.startswith("class Parser:\n    def ")


def test_the_gpu_spec_validates_and_dry_runs_for_slurm(tmp_path: Path) -> None:
    """The GPU section's dry run, for SLURM (here no cluster answers, so the cluster's own checks are
    skipped and sbatch would decide); its submission needs a GPU cluster."""
    dry_run, follow = _readme_block("charlm/gpu")
    assert follow == "elfes submit examples/charlm/slurm-gpu.yaml --follow"
    environment = {key: value for key, value in os.environ.items() if key != "SLURM_CONF"}
    completed = subprocess.run([str(Path(sys.executable).with_name("elfes")), *dry_run.split()[1:], "--executor",
                                "slurm"], cwd=REPOSITORY, capture_output=True, text=True, timeout=120, env=environment)
    assert completed.returncode == 0, completed.stderr
    assert "#SBATCH --gpus-per-node=4" in completed.stdout and "#SBATCH --requeue" in completed.stdout
