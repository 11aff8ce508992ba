"""Every code block of the README and the guides is run (or, for text that is not a command, checked
against what the code says) by a test here, as a reader would copy it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from blocks import REPOSITORY, all_blocks, block
from launching import launch_environment

from elfes.records import event_reference, read_events

ELFES = str(Path(sys.executable).with_name("elfes"))
# A bare machine's PATH: no virtual environment activated, so no torchrun, elfes or python of this one.
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# Each block's name, and the test below that runs or checks it.
TESTED = {
    "readme/make-run": "test_make_run_finishes_the_example_job",
    "readme/make-test": "test_make_test_is_what_ci_runs",
    "readme/tour": "test_the_tour_preempts_resumes_extends_and_plots_as_written",
    "readme/install": "test_the_install_commands_set_up_a_venv_then_torch_then_the_package",
    "first-job/my_job.py": "test_the_first_job_of_the_guide_validates_runs_and_rehearses_exact",
    "first-job/job.yaml": "test_the_first_job_of_the_guide_validates_runs_and_rehearses_exact",
    "first-job/commands": "test_the_first_job_of_the_guide_validates_runs_and_rehearses_exact",
    "spec/job.yaml": "test_the_spec_examples_validate",
    "spec/set": "test_the_spec_examples_validate",
    "run-directory/tree": "test_the_run_directory_tree_names_what_runpaths_names",
    "run-directory/states": "test_the_state_diagram_names_every_status",
    "run-directory/snapshot": "test_the_snapshot_section_of_the_guide_validates_with_its_defaults",
    "slurm/cluster": "tests/slurm/test_cluster.py::test_the_cluster_commands_of_the_slurm_guide_start_and_stop_it",
    "data/augmented.py": "test_the_data_examples_of_the_guide_resume_bitwise",
    "data/streaming.py": "test_the_data_examples_of_the_guide_resume_bitwise",
    "data/shuffled.py": "test_the_data_examples_of_the_guide_resume_bitwise",
    "engine/plain-script": "test_the_plain_script_trains_continues_and_runs_on_two_processes",
    "engine/pause.py": "test_the_engine_snippets_run_on_a_real_trainer",
    "engine/weights.py": "test_the_engine_snippets_run_on_a_real_trainer",
    "engine/sharded.py": "tests/engine/test_sharded.py::test_the_guides_sharding_block_trains_a_sharded_model_on_two_ranks",
    "benchmarks/command": "test_the_benchmark_command_shows_progress_then_prints_its_table_and_writes_json",
    "sweeps/job.yaml": "test_the_sweep_of_the_guide_runs_every_member",
    "sweeps/commands": "test_the_sweep_of_the_guide_runs_every_member",
    "sweeps/status-table": "test_the_sweep_of_the_guide_runs_every_member",
    "readme/sweep-status": "test_the_sweep_of_the_guide_runs_every_member",
    "rehearse/command": "test_the_tours_rehearsal_prints_what_the_rehearsal_guide_shows",
    "rehearse/output": "test_the_tours_rehearsal_prints_what_the_rehearsal_guide_shows",
    "charlm/run": "tests/examples/test_charlm.py::test_the_commands_of_its_readme_run",
    "charlm/sample": "tests/examples/test_charlm.py::test_the_commands_of_its_readme_run",
    "vision/run": "tests/examples/test_vision.py::test_the_commands_of_its_readme_preempt_the_job_which_resumes_bitwise",
    "trackers/job.yaml": "tests/records/test_tracker_mirror.py::test_the_trackers_section_of_the_guide_validates",
    "charlm/gpu": "tests/examples/test_charlm.py::test_the_gpu_spec_validates_and_dry_runs_for_slurm",
    "resize/accumulation.py": "test_the_window_block_derives_the_accumulation_from_the_world_size",
    "rehearse/resize-line": "tests/launcher/test_rehearse.py::test_a_pause_continued_on_another_world_size_is_within_rounding_with_the_same_samples",
}


def run(commands: list[str], cwd: Path, timeout_s: float = 900) -> list[subprocess.CompletedProcess]:
    """Run each command as a shell would, with this interpreter's `elfes`, `python` and `torchrun` first on
    PATH (launch_environment), whatever the caller's PATH holds."""
    done = []
    for command in commands:
        completed = subprocess.run(command, shell=True, cwd=cwd, env=launch_environment(), capture_output=True,
                                   text=True, timeout=timeout_s)
        assert completed.returncode == 0, f"{command}: exit {completed.returncode}\n{completed.stdout[-3000:]}" \
                                          f"\n{completed.stderr[-3000:]}"
        done.append(completed)
    return done


def repository_copy(tmp_path: Path) -> Path:
    """A folder in which the examples' relative paths resolve under tmp_path (runs/ is written there)."""
    (tmp_path / "examples").symlink_to(REPOSITORY / "examples")
    return tmp_path


def test_every_code_block_is_named_and_tested():
    blocks = all_blocks()
    unnamed = [f"{b.document.relative_to(REPOSITORY)}: {b.text.splitlines()[0][:60]}" for b in blocks if not b.name]
    assert unnamed == [], "give each code block a <!-- doc-test: NAME --> comment and a test"
    names = [b.name for b in blocks]
    assert sorted(set(names)) == sorted(TESTED), "every named block is in TESTED, once"
    assert len(names) == len(set(names))
    here = Path(__file__).read_text()
    for test in set(TESTED.values()):
        path, _, function = test.rpartition("::")
        source = (REPOSITORY / path).read_text() if path else here
        assert f"def {function}(" in source, test


# -- the README ---------------------------------------------------------------------------------------------
# The README's `make run`, its tour and the tour's closing rehearsal are three tests: each trains runs of its own
# (`make run` runs/quickstart-job, the tour runs/tour, the rehearsal runs/quickstart-job.rehearsal), none reads
# what another wrote, so xdist runs them side by side.
def test_make_run_finishes_the_example_job(tmp_path):
    """`make run`'s job, as its recipe runs it once the set-up is done (tests/test_makefile.py: the set-up)."""
    assert block("readme/make-run").commands() == ["make run"]
    makefile = (REPOSITORY / "Makefile").read_text()
    recipe = re.search(r"^run: setup\n\t(.+)$", makefile, flags=re.M)[1]
    assert recipe == "$(VENV)/bin/elfes submit examples/quickstart/job.yaml --follow"  # tests/test_makefile.py: set-up
    folder = repository_copy(tmp_path)
    (completed,) = run([recipe.replace("$(VENV)/bin/elfes", "elfes")], folder)
    assert "submitted as local job" in completed.stdout and "elfes: run finished" in completed.stdout
    run_dir = tmp_path / "runs" / "quickstart-job"
    assert json.loads((run_dir / "state.json").read_text())["status"] == "finished"
    assert [event["event"] for event in read_events(run_dir)].count("finished") == 1


def test_the_tour_preempts_resumes_extends_and_plots_as_written(tmp_path):
    """The tour's commands in order, as a reader follows the README, but its last: the rehearsal, which trains
    runs of its own (the next test)."""
    commands = block("readme/tour").commands()
    assert block("rehearse/command").commands() == [commands[-1]]
    run(commands[:-1], repository_copy(tmp_path))
    run_dir = tmp_path / "runs" / "tour"
    state = json.loads((run_dir / "state.json").read_text())
    assert [(a["launch"], a["outcome"]) for a in state["attempts"]] == [
        ("submit", "requeued"), ("requeue", "finished"), ("resume", "finished")]
    assert state["attempts"][0]["signal"] == "SIGUSR2" and state["attempts"][-1]["step"] == 8 * 128  # 8 epochs of 128 updates
    assert (run_dir / "plot.png").stat().st_size > 0


def test_the_tours_rehearsal_prints_what_the_rehearsal_guide_shows(tmp_path):
    """The tour's last command (the rehearsal guide's), then its documented output: the same lines a real one
    prints."""
    (command,) = block("rehearse/command").commands()
    assert block("readme/tour").commands()[-1] == command
    (done,) = run([command], repository_copy(tmp_path))
    rehearsal = done.stdout
    assert "verdict: exact" in rehearsal
    documented = block("rehearse/output").text
    for kind in ("requeue", "stop", "kill"):
        assert re.search(rf"interruption \d/3: {kind} at step \d+", rehearsal) and kind in documented
    def shape(text: str) -> list[str]:  # the lines of each straight run, its provenance line apart
        return [re.sub(r"\d+", "N", line.split(" (")[0]) for line in text.splitlines()
                if line.startswith("straight") and " ran on " not in line]

    assert shape(documented) == shape(rehearsal)
    ran_on = r"^straight-1 ran on Python [\d.]+, torch \S+, CPU build, \d+ threads?; code: snapshot \S+/straight-1/code/1 \("
    assert re.search(ran_on, documented, flags=re.M) and re.search(ran_on, rehearsal, flags=re.M), rehearsal
    report = json.loads((tmp_path / "runs" / "quickstart-job.rehearsal" / "report.json").read_text())
    assert report["verdict"] == "exact" and len(report["interruptions"]) == 3


def test_make_test_is_what_ci_runs():
    assert block("readme/make-test").commands() == ["make test"]
    ci = [line for line in (REPOSITORY / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test" and "ELFES_REQUIRE_SLURM=1" in "\n".join(ci)
    assert re.search(r"^test: setup\n\t\$\(VENV\)/bin/python -m ruff check \.\n\t\$\(VENV\)/bin/python -m mypy\n"
                     r"\t\$\(VENV\)/bin/python -m pytest -q$", (REPOSITORY / "Makefile").read_text(), flags=re.M)


def test_the_install_commands_set_up_a_venv_then_torch_then_the_package():
    steps = block("readme/install").commands()
    assert steps[0] == "python3 -m venv .venv && source .venv/bin/activate"
    assert steps[1] == "python -m pip install torch --index-url https://download.pytorch.org/whl/cpu"
    assert steps[2] == 'python -m pip install -e ".[test]"'  # as the Makefile installs it, after torch
    assert '$(PIP) install --quiet -e ".[test]"' in (REPOSITORY / "Makefile").read_text()
    python = re.search(r'requires-python = ">=(\d+\.\d+)"', (REPOSITORY / "pyproject.toml").read_text())[1]
    assert f"Python {python} or newer" in (REPOSITORY / "README.md").read_text()


# -- the guides --------------------------------------------------------------------------------------------------
def test_the_first_job_of_the_guide_validates_runs_and_rehearses_exact(tmp_path):
    folder = tmp_path / "first-job"
    folder.mkdir()
    (folder / "my_job.py").write_text(block("first-job/my_job.py").text)
    (folder / "job.yaml").write_text(block("first-job/job.yaml").text)
    validated, submitted, rehearsed = run(block("first-job/commands").commands(), folder)
    assert "valid job 'first-job'" in validated.stdout and "elfes: run finished" in submitted.stdout
    assert "verdict: exact" in rehearsed.stdout
    run_dir = folder / "runs" / "first-job"
    assert json.loads((run_dir / "state.json").read_text())["status"] == "finished"
    assert (run_dir / "model.pt").exists()
    kept = [p for p in (run_dir / "checkpoints").glob("step-*.pt")]
    assert len(kept) <= 3  # keep_checkpoints=2, and best may name a third


def test_the_spec_examples_validate(tmp_path):
    folder = repository_copy(tmp_path)
    spec = folder / "spec-example.yaml"  # the example's relative paths are those of examples/quickstart/job.yaml
    real = tmp_path / "real" / "examples" / "quickstart"
    real.parent.mkdir(parents=True)
    (tmp_path / "real" / "examples" / "quickstart").symlink_to(REPOSITORY / "examples" / "quickstart")
    spec = tmp_path / "real" / "examples" / "spec.yaml"
    spec.write_text(block("spec/job.yaml").text.replace("../..", "..").replace("../../runs", "../runs"))
    run([f"elfes validate {spec}"], tmp_path)
    (tmp_path / "job.yaml").write_text(block("first-job/job.yaml").text)
    (tmp_path / "my_job.py").write_text(block("first-job/my_job.py").text)
    (validated,) = run(block("spec/set").commands(), tmp_path)
    assert "120 min per attempt" in validated.stdout


def test_the_run_directory_tree_names_what_runpaths_names():
    from elfes.launcher.rundir.paths import RunPaths

    tree = block("run-directory/tree").text
    paths = RunPaths("RUN_DIR")
    named = [paths.spec, paths.state, paths.events, paths.tensorboard, paths.plot, paths.checkpoints,
             paths.rank_log(7, 3), paths.pid_file(3), paths.task_exit(3), paths.submitit, paths.cancel_marker,
             paths.code_record]
    listed = {line.split()[0].replace("<A>", "7").replace("<R>", "3").rstrip("/") for line in tree.splitlines()[1:]}
    assert {str(path.relative_to(paths.run_dir)) for path in named} <= listed
    assert "pids/command-3.json" in listed and "pids/command-" in (REPOSITORY / "launcher/rundir/paths.py").read_text()


def test_the_snapshot_section_of_the_guide_validates_with_its_defaults(tmp_path):
    import yaml

    from elfes.launcher.rundir.paths import RunPaths
    from elfes.launcher.spec.models import JobSpec
    from elfes.launcher.spec.sections import Snapshot

    section = yaml.safe_load(block("run-directory/snapshot").text)
    spec = JobSpec.model_validate({"name": "demo", "entrypoint": "train:main", "run_dir": str(tmp_path), **section})
    assert spec.snapshot.max_mb == Snapshot().max_mb  # "the default"
    assert "code/<N>/" in block("run-directory/tree").text and str(RunPaths("RUN_DIR").code) == "RUN_DIR/code"


def test_the_state_diagram_names_every_status():
    from elfes.launcher.rundir.state import STATUSES

    diagram = block("run-directory/states").text
    named = {word for line in diagram.splitlines() if "-->" in line
             for word in re.findall(r"(\w+)\s*(?:-->|:|$)", line.split(":")[0])}
    assert set(STATUSES) == named - {"*"}


def test_the_plain_script_trains_continues_and_runs_on_two_processes(tmp_path):
    single, double = block("engine/plain-script").commands()
    folder = repository_copy(tmp_path)
    first, second = run([single + " --epochs 3", single + " --epochs 6"], folder)
    assert "finished at epoch 3" in first.stdout and "finished at epoch 6" in second.stdout
    events = read_events(tmp_path / "runs" / "quickstart")
    assert [event["event"] for event in events].count("started") == 1
    assert next(event for event in events if event["event"] == "resumed")["state"]["epoch"] == 3
    (two,) = run([double + " --epochs 2"], folder)
    assert read_events(tmp_path / "runs" / "quickstart-2")[0]["world_size"] == 2
    assert two.stdout.count("finished at epoch 2") == 1  # only the main process prints
    prose = " ".join((REPOSITORY / "docs" / "engine.md").read_text().split())
    assert "143 for SIGTERM, 130 for SIGINT or Ctrl-C, 140 for SIGUSR2" in prose  # tests/examples check them


def test_a_documented_torchrun_runs_on_a_path_that_holds_no_torchrun(tmp_path, monkeypatch):
    """`make test` runs .venv/bin/python with .venv/bin not on PATH: the guide's torchrun line still runs."""
    (command,) = [line for line in block("engine/plain-script").commands() if " torchrun " in f" {line}"]
    # The system folders less any that holds a torchrun of its own, which would hide the one missing here.
    bare = ":".join(folder for folder in SYSTEM_PATH.split(":") if not (Path(folder) / "torchrun").exists())
    monkeypatch.setenv("PATH", bare)
    (completed,) = run([command + " --epochs 1"], repository_copy(tmp_path))
    assert completed.stdout.count("finished at epoch 1") == 1
    assert read_events(tmp_path / "runs" / "quickstart-2")[0]["world_size"] == 2


def test_the_engine_snippets_run_on_a_real_trainer(tmp_path):
    """The snippets of the engine guide, executed with the names they assume bound to a quickstart trainer."""
    import torch
    from accelerate import Accelerator
    from torch import nn
    from torch.utils.data import DataLoader

    from elfes.engine import StopRequest, TrainConfig, Trainer, export_weights, load_weights
    from examples.quickstart.train import make_data, step

    model = nn.Linear(8, 1)
    trainer = Trainer(Accelerator(cpu=True), model, torch.optim.SGD(model.parameters(), lr=0.1),
                      DataLoader(make_data(64, seed=1), batch_size=16), step, ema_decay=0.9)
    names = {"trainer": trainer, "config": TrainConfig(epochs=2), "run_dir": tmp_path, "resuming": False,
             "StopRequest": StopRequest, "load_weights": load_weights, "export_weights": export_weights,
             "model": model}
    exec(block("engine/pause.py").text, names)  # noqa: S102 - the guide's own code
    assert names["state"].step == 8 and (tmp_path / "checkpoints" / "last").exists()
    (tmp_path / "checkpoints" / "best").symlink_to(os.readlink(tmp_path / "checkpoints" / "last"))
    exec(block("engine/weights.py").text, names)  # noqa: S102
    exported = torch.load(tmp_path / "model.pt", weights_only=True)
    assert set(exported) == {"weight", "bias"}


def _guide_run(loader, step, directory: Path, **train_options):
    """One launch of the guide's loader under a small trainer: the end state's tensors."""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import set_seed

    from elfes.engine import Interval, TrainConfig, Trainer

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.2), torch.nn.LazyLinear(2))
    model(torch.zeros(1, *train_options.pop("input_shape")))  # materialise the lazy layer
    trainer = Trainer(Accelerator(cpu=True), model, torch.optim.SGD(model.parameters(), lr=0.1), loader, step)
    max_steps = train_options.pop("max_steps", None)
    trainer.train(TrainConfig(epochs=2, max_steps=max_steps, checkpoint_every=Interval(1, "step")),
                  checkpoint_dir=directory, **train_options)
    return [tensor.clone() for tensor in model.state_dict().values()]


def test_the_data_examples_of_the_guide_resume_bitwise(tmp_path, monkeypatch):
    import torch

    from elfes.engine import StepOutput, StopRequest

    def classify(model, batch):
        inputs, labels = batch if isinstance(batch, (list, tuple)) else (batch["x"], batch["y"])
        return StepOutput(loss=torch.nn.functional.cross_entropy(model(inputs), labels), num_samples=len(labels))

    def paused_then_resumed(make_loader, directory, **options):
        stop, calls = StopRequest(), {"n": 0}

        def pausing(model, batch):
            calls["n"] += 1
            if calls["n"] == 3:
                stop.request("guide pause")
            return classify(model, batch)

        _guide_run(make_loader(), pausing, directory, stop=stop, **dict(options))
        return _guide_run(make_loader(), classify, directory, resume_from=directory / "last", **dict(options))

    names: dict = {}
    exec(block("data/augmented.py").text, names)  # noqa: S102 - the guide's own code
    images = torch.rand(40, 3, 10, 10, generator=torch.Generator().manual_seed(0))
    labels = (images.mean(dim=(1, 2, 3)) > 0.5).long()
    make = lambda: names["augmented_loader"](images, labels)  # noqa: E731
    straight = _guide_run(make(), classify, tmp_path / "augmented", input_shape=(3, 8, 8))
    resumed = paused_then_resumed(make, tmp_path / "augmented-paused", input_shape=(3, 8, 8))
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed, strict=True))

    pytest.importorskip("datasets", reason="the data extra (pip install -e '.[data]') is not installed")
    exec(block("data/streaming.py").text, names)  # noqa: S102
    files = []
    for shard in range(2):
        path = tmp_path / f"part-{shard}.jsonl"
        rows = [{"x": [float(shard), float(i)], "y": i % 2} for i in range(24)]
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        files.append(str(path))
    make = lambda: names["stream_loader"](files, rank=0, world_size=1)  # noqa: E731
    straight = _guide_run(make(), classify, tmp_path / "stream", input_shape=(2,), max_steps=8)
    resumed = paused_then_resumed(make, tmp_path / "stream-paused", input_shape=(2,), max_steps=8)
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed, strict=True))

    # The two exact ways to shuffle: no warning of an inexact stream, and bitwise after a pause.
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    exec(block("data/shuffled.py").text, names)  # noqa: S102
    shuffled = {"shards": (lambda: names["shard_shuffled_loader"](files, seed=3), {"max_steps": 8}),
                "sampler": (lambda: names["sampler_shuffled_loader"](files), {})}
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not exact")
        for name, (make, options) in shuffled.items():
            straight = _guide_run(make(), classify, tmp_path / name, input_shape=(2,), **options)
            resumed = paused_then_resumed(make, tmp_path / f"{name}-paused", input_shape=(2,), **options)
            assert all(torch.equal(a, b) for a, b in zip(straight, resumed, strict=True)), name


def _train_config_calls(text: str) -> list[str]:
    """Every ``TrainConfig(...)`` call written in ``text``, its parentheses balanced."""
    calls = []
    for match in re.finditer(r"\bTrainConfig\(", text):
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        calls.append(text[match.start():end + 1])
    return calls


def test_every_train_config_the_documents_show_is_valid_for_the_real_api():
    """Each `TrainConfig(...)` of the README and the guides, in code blocks and in the prose, names only real
    fields and every required one (``epochs``); one whose values are all written out is built for real. A
    ``...`` stands for a value the reader chooses."""
    import ast
    import dataclasses

    from elfes.engine import Interval, Monitor, TrainConfig

    fields = {field.name: field for field in dataclasses.fields(TrainConfig)}
    required = {name for name, field in fields.items()
                if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING}
    checked = []
    for document in (REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))):
        for text in _train_config_calls(document.read_text(encoding="utf-8")):
            where = f"{document.relative_to(REPOSITORY)}: {text}"
            call = ast.parse(text, mode="eval").body
            named = [keyword.arg for keyword in call.keywords]
            assert not call.args and None not in named, f"{where}: name every argument"
            assert set(named) <= set(fields), f"{where}: not fields of TrainConfig: {set(named) - set(fields)}"
            assert required <= set(named), f"{where}: TrainConfig requires {sorted(required - set(named))}"
            if not any(isinstance(node, ast.Constant) and node.value is Ellipsis for node in ast.walk(call)) and \
                    all(node.id in ("TrainConfig", "Monitor", "Interval") for node in ast.walk(call)
                        if isinstance(node, ast.Name)):
                eval(text, {"TrainConfig": TrainConfig, "Monitor": Monitor, "Interval": Interval})  # noqa: S307
            checked.append(where)
    assert any("max_steps=100" in where for where in checked), checked  # the streaming example is among them


def test_the_event_table_matches_the_schema():
    engine = (REPOSITORY / "docs" / "engine.md").read_text()
    table = engine.split("<!-- events:begin -->\n", 1)[1].split("\n<!-- events:end -->", 1)[0]
    assert table == event_reference()


def test_the_spec_reference_matches_the_models():
    from elfes.launcher.spec.continuing import reference_lists
    from elfes.launcher.spec.reference import BEGIN, CONTINUING_BEGIN, CONTINUING_END, END, reference_table

    document = (REPOSITORY / "docs" / "job-spec.md").read_text()
    assert document.split(BEGIN + "\n", 1)[1].split("\n" + END, 1)[0] == reference_table()
    assert document.split(CONTINUING_BEGIN + "\n", 1)[1].split("\n" + CONTINUING_END, 1)[0] == reference_lists()


def test_the_sweep_of_the_guide_runs_every_member(tmp_path):
    folder = repository_copy(tmp_path)
    (folder / "sweep.yaml").write_text(block("sweeps/job.yaml").text)
    dry, submitted, shown = run(block("sweeps/commands").commands(), folder)
    assert dry.stdout.count("lr=0.00") >= 4 and "sweep of 4 member(s), at most 2 at once" in submitted.stdout
    sweep = tmp_path / "runs" / "sweep-demo"
    deadline = 600
    run([f"{ELFES} status {sweep / name} --until ended --timeout-s {deadline}"
         for name in ("lr=0.001,seed=0", "lr=0.001,seed=1", "lr=0.003,seed=0", "lr=0.003,seed=1")], folder)
    (table,) = run([f"elfes status {sweep}"], folder)
    documented, shown = block("sweeps/status-table").text.splitlines(), table.stdout.splitlines()
    assert documented[0].startswith("sweep sweep-demo (runs/sweep-demo), local, at most 2 at once")
    assert shown[0].startswith(f"sweep sweep-demo ({sweep}), local, at most 2 at once")
    assert [cell.strip() for cell in documented[1].split("┃")] == [cell.strip() for cell in shown[1].split("┃")]
    assert sorted(line.split()[0] for line in documented[3:7]) == sorted(line.split()[0] for line in shown[3:7])
    assert documented[-1] == "4 member(s): finished 4" and shown[-1].strip() == documented[-1]
    assert block("readme/sweep-status").text == block("sweeps/status-table").text  # the README shows the same


def test_the_elfes_command_reports_its_version_without_importing_torch():
    completed = subprocess.run([ELFES, "--version"], capture_output=True, text=True)
    assert completed.returncode == 0 and completed.stdout.strip() == "elfes 0.1.0"
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from elfes.launcher.cli.main import main; main(['schema']); "
         "print('torch' in sys.modules)"], capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout.strip().endswith("False")


def test_the_benchmark_command_shows_progress_then_prints_its_table_and_writes_json(tmp_path):
    """`python -m benchmarks --smoke` runs every benchmark at tiny sizes. Nothing is timed here: only what
    the command prints and writes is checked (and that a resume reads none of the skipped batches)."""
    (command,) = block("benchmarks/command").commands()
    written = tmp_path / "results.json"
    benchmark = subprocess.Popen(
        [sys.executable, *command.split()[1:], "--json", str(written)], cwd=REPOSITORY,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=launch_environment(),
    )
    try:
        plan = benchmark.stderr.readline()
        first_round = benchmark.stderr.readline()
        still_running = benchmark.poll() is None  # progress is reported as it goes, not all at the end
        stdout, rest = benchmark.communicate(timeout=900)
    finally:
        benchmark.kill()
    assert benchmark.returncode == 0, rest[-3000:]
    assert re.search(r"\d+ benchmark\(s\) x 1 round\(s\) \(smoke sizes\)", plan)
    assert re.search(r"loop tiny: round 1/1: hand wall [\d.]+ s cpu [\d.]+ s, elfes wall", first_round)
    assert still_running
    assert "ELFES benchmarks" in stdout and "SMOKE SIZES" in stdout
    benchmarks = ("loop", "sharded", "checkpoint", "stop", "resume", "login", "sweep_status")
    for name in benchmarks:
        assert re.search(rf"^│ {name} +│", stdout, flags=re.M), name
    results = json.loads(written.read_text())
    assert set(results) == {"machine", "settings", "results"}
    rows = results["results"]
    assert {row["benchmark"] for row in rows} == set(benchmarks)
    assert any(row["case"] == "tiny, 2 ranks" for row in rows)
    assert any("async" in row["measure"] for row in rows if row["benchmark"] == "checkpoint")
    differences = {row["case"]: row["details"]["max_parameter_difference_vs_hand"] for row in rows
                   if "max_parameter_difference_vs_hand" in (row.get("details") or {})}
    # Without random draws in the data, the engine's arithmetic is the hand loop's (augmented batches it reads
    # under a seed of the batch's place, which the hand loop does not).
    assert differences["tiny"] == differences["tiny+eval+ema"] == 0.0, differences
    assert differences["fsdp2 mlp, 2 ranks"] == differences["fsdp2 mlp, 4 ranks"] == 0.0, differences
    (skipped,) = [row for row in rows if row["measure"].startswith("samples of skipped batches")]
    assert skipped["result"] == 0 and skipped["holds"] is True


@pytest.mark.parametrize("document", ["README.md", "docs/writing-a-job.md"])
def test_the_front_page_and_the_first_guide_stay_short_and_link_only_real_files(document):
    text = (REPOSITORY / document).read_text()
    if document == "README.md":
        assert len(text.splitlines()) <= 150
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert ((REPOSITORY / document).parent / target).exists(), target
    assert shutil.which("make") or document != "README.md"


def test_the_map_of_the_house_names_every_floor_and_only_paths_that_exist():
    page = (REPOSITORY / "docs" / "where-things-live.md").read_text()
    named = re.findall(r"`((?:elfes|launcher|tests)/[\w/.]*)`", page)
    assert named and not [path for path in named if not (REPOSITORY / path).exists()], named
    floors = [f"launcher/{folder.name}/" for folder in (REPOSITORY / "launcher").iterdir()
              if (folder / "__init__.py").is_file()]
    assert len(floors) >= 7 and not [floor for floor in floors + ["launcher/errors.py"] if f"`{floor}`" not in page]


def test_the_window_block_derives_the_accumulation_from_the_world_size():
    """The guide's block, run as `main(job)` runs it, for the world sizes a window of 8 allows and one it does not
    (the continuation itself: tests/engine/test_resize.py, tests/launcher/test_continuing_runs.py)."""
    from types import SimpleNamespace

    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.state import AcceleratorState, GradientState

    code = compile(block("resize/accumulation.py").text, "resize/accumulation.py", "exec")
    for world_size, accumulation in ((1, 8), (2, 4), (4, 2), (8, 1)):
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        names = {"job": SimpleNamespace(config={"window": 8}, world_size=world_size), "Accelerator": Accelerator,
                 "DataLoaderConfiguration": DataLoaderConfiguration}
        exec(code, names)
        assert names["accelerator"].gradient_accumulation_steps == accumulation
    with pytest.raises(ValueError, match="config window is 8, which 3 ranks cannot share; use a multiple"):
        exec(code, {"job": SimpleNamespace(config={"window": 8}, world_size=3)})
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
