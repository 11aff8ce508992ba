"""One source for what may change when a run continues (launcher/spec/continuing.py): each field declares it, the
rule of launcher/submit/continuation.py and the list in docs/job-spec.md are read from the declarations; and a
problem in ``snapshot:`` is reported once, where it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.spec import JobSpec, SpecError, validate_spec_data
from elfes.launcher.spec.continuing import may_change, rules
from elfes.launcher.spec.reference import CONTINUING_BEGIN, CONTINUING_END, fields
from elfes.launcher.submit.continuation import refused_changes

REPOSITORY = Path(__file__).resolve().parents[2]
SPEC = {"name": "demo", "entrypoint": "train:main", "run_dir": "/tmp/elfes-demo-run", "config": {"epochs": 2, "lr": 0.1}}


def documented() -> dict[str, list[str]]:
    """The fields docs/job-spec.md lists under "may change" and "may not change", as dotted paths."""
    text = (REPOSITORY / "docs" / "job-spec.md").read_text()
    block = text.split(CONTINUING_BEGIN, 1)[1].split(CONTINUING_END, 1)[0]
    lists = {}
    for line in block.strip().splitlines():
        label, _, names = line.partition(":** ")
        lists[label.removeprefix("- **")] = re.findall(r"`([^`]+)`", names)
    return lists


def test_every_field_declares_whether_it_may_change_and_the_docs_list_the_declarations():
    declared = [path for path, _ in rules()]
    for path, *_ in fields():  # every field of the reference is covered by its own or its section's declaration
        assert any(path == name or path.startswith(f"{name}.") or name.startswith(f"{path}.") for name in declared), path
    lists = documented()
    assert set(lists) == {"may change", "may not change"}
    assert "resources.kill_wait_s" in lists["may change"] and "resources.nodes" in lists["may change"]
    assert "entrypoint" in lists["may not change"]
    for path in lists["may change"]:
        assert may_change(path), path
    for path in lists["may not change"]:
        assert not may_change(path) or path == "config", path
    assert not may_change("config.lr") and may_change("config.epochs") and may_change("slurm.partition")


def test_a_field_the_docs_call_changeable_is_taken_by_a_continuing_run(tmp_path: Path):
    run = RunPaths(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    (run.checkpoints / "step-00000004-batches-0000000004.pt").write_bytes(b"a checkpoint")
    recorded = validate_spec_data(SPEC, source="job.yaml", base=tmp_path, check_files=False)
    for change, refused in ((("resources", "kill_wait_s", 60), []), (("resources", "timeout_min", 90), []),
                            (("resources", "nodes", 2), []),  # the engine checks the window of a new world size
                            (("resources", "gpus_per_node", 1), ["resources.gpus_per_node (0 -> 1: from CPUs to GPUs "
                                                                 "or back)"])):
        section, name, value = change
        data = {**SPEC, section: {name: value}}
        new = validate_spec_data(data, source="job.yaml", base=tmp_path, check_files=False)
        assert refused_changes(recorded, new, run) == refused, change
    other_lr = validate_spec_data({**SPEC, "config": {"epochs": 4, "lr": 0.2}}, source="job.yaml", base=tmp_path, check_files=False)
    assert refused_changes(recorded, other_lr, run) == ["config.lr"]


@pytest.mark.parametrize("snapshot, where, said", [
    ({"exclude": [""]}, "snapshot.exclude[0]", "must be a non-empty pattern"),
    ({"max_mb": -1}, "snapshot.max_mb", "greater than 0"),
    ({"exclud": ["data"]}, "snapshot.exclud", "unknown field. The fields of snapshot are: exclude, include, max_mb"),
    ("yes", "snapshot", "must be true (the default snapshot), false (no snapshot) or a mapping"),
])
def test_a_problem_in_snapshot_is_reported_once_where_it_is(snapshot, where, said, tmp_path: Path):
    with pytest.raises(SpecError) as refused:
        validate_spec_data({**SPEC, "snapshot": snapshot}, source="job.yaml", base=tmp_path, check_files=False)
    message = str(refused.value)
    assert len(message.splitlines()) == 1, message  # one problem, one line
    assert message.startswith(f"job.yaml: {where} = ") and said in message, message
    assert "literal" not in message.lower() and "Snapshot." not in message and "Input should be False" not in message
    assert validate_spec_data({**SPEC, "snapshot": False}, source="job.yaml", base=tmp_path, check_files=False).snapshot is False
    assert validate_spec_data({**SPEC, "snapshot": True}, source="job.yaml", base=tmp_path, check_files=False).snapshot.max_mb == 100
    assert isinstance(JobSpec.model_validate({**SPEC, "snapshot": {"exclude": ["data"]}}).snapshot.exclude, list)
