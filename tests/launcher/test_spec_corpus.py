"""A corpus of malformed job specs: each exits 2 from `elfes validate` and `elfes submit`, names the
field (or the YAML line), prints no traceback and creates nothing."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from elfes.launcher.cli.main import main

BASE: dict[str, Any] = {
    "name": "corpus",
    "entrypoint": "train:main",
    "workdir": ".",
    "run_dir": "runs/corpus",
    "config": {"epochs": 1},
    "resources": {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 1,
                  "timeout_min": 10},
    "slurm": {"signal_delay_s": 60},
    "requeue": {"max_requeues": 2},
    "env": {"OMP_NUM_THREADS": "1"},
}


def changed(**changes: Any) -> Callable[[dict[str, Any]], None]:
    """Set dotted fields (``resources__nodes=0`` sets resources.nodes); ``None`` values... are values."""

    def apply(spec: dict[str, Any]) -> None:
        for dotted, value in changes.items():
            *parents, last = dotted.split("__")
            target = spec
            for parent in parents:
                target = target.setdefault(parent, {})
            target[last] = value

    return apply


def removed(*fields: str) -> Callable[[dict[str, Any]], None]:
    def apply(spec: dict[str, Any]) -> None:
        for field in fields:
            spec.pop(field)

    return apply


RAW = "raw"  # the case gives the file's text itself
CASES: list[tuple[str, Any, str]] = [
    ("yaml_syntax", (RAW, "name: [unclosed\nentrypoint: train:main\n"), "line 2, column 11"),
    ("python_tag", (RAW, "name: x\nrun_dir: r\nentrypoint: train:main\n"
                         "config: !!python/object/apply:os.system ['touch pwned']\n"), "!!python"),
    ("duplicate_key", (RAW, "name: a\nname: b\nentrypoint: train:main\nrun_dir: r\n"), "'name' is given twice"),
    ("not_a_mapping", (RAW, "- name\n- run_dir\n"), "found a list"),
    ("empty_file", (RAW, ""), "found an empty file"),
    ("unknown_top_key", changed(epochs=3), "epochs = 3: unknown field"),
    ("unknown_resources_key", changed(resources__gpus=1), "resources.gpus = 1: unknown field"),
    ("name_missing", removed("name"), "name is missing"),
    ("name_bad_characters", changed(name="my job!"), 'name = "my job!"'),
    ("name_not_a_string", changed(name=12), "name = 12"),
    ("name_too_long", changed(name="a" * 129), "name = "),
    ("neither_entrypoint_nor_command", removed("entrypoint"), "give exactly one of entrypoint"),
    ("both_entrypoint_and_command", changed(command=["python", "train.py"]), "this spec gives both"),
    ("entrypoint_without_function", changed(entrypoint="train.main"), "must be 'module:function'"),
    ("entrypoint_bad_module_name", changed(entrypoint="my-train:main"), 'entrypoint = "my-train:main"'),
    ("entrypoint_module_not_found", changed(entrypoint="nomodule:main"), "module nomodule is not found"),
    ("entrypoint_function_not_defined", changed(entrypoint="train:nope"), "defines no top-level nope"),
    ("command_empty", [removed("entrypoint"), changed(command=[])], "command = []"),
    ("command_not_a_list", [removed("entrypoint"), changed(command="python train.py")], "command = "),
    ("command_unknown_placeholder", [removed("entrypoint"), changed(command=["{python}", "{rundir}"])],
     "command[1] = \"{rundir}\": unknown placeholder {rundir}"),
    ("command_item_not_a_string", [removed("entrypoint"), changed(command=["python", 3])], "command[1] = 3"),
    ("workdir_missing", changed(workdir="not-there"), "workdir = "),
    ("run_dir_missing", removed("run_dir"), "run_dir is missing"),
    ("run_dir_cannot_be_created", changed(run_dir="train.py/run"), "is a file"),
    ("run_dir_not_a_path", changed(run_dir=5), "run_dir = 5"),
    ("config_not_a_mapping", changed(config=[1, 2]), "config = [1, 2]"),
    ("nodes_zero", changed(resources__nodes=0), "resources.nodes = 0"),
    ("tasks_per_node_negative", changed(resources__tasks_per_node=-2), "resources.tasks_per_node = -2"),
    ("gpus_per_node_negative", changed(resources__gpus_per_node=-1), "resources.gpus_per_node = -1"),
    ("gpus_per_node_fraction", changed(resources__gpus_per_node=1.5), "resources.gpus_per_node = 1.5"),
    ("gpus_per_node_boolean", changed(resources__gpus_per_node=True), "resources.gpus_per_node = true"),
    ("tasks_differ_from_gpus", changed(resources__gpus_per_node=2), "set tasks_per_node: 2"),
    ("cpus_per_task_zero", changed(resources__cpus_per_task=0), "resources.cpus_per_task = 0"),
    ("mem_gb_zero", changed(resources__mem_gb=0), "resources.mem_gb = 0"),
    ("mem_gb_with_unit", changed(resources__mem_gb="4G"), 'resources.mem_gb = "4G"'),
    ("timeout_min_zero", changed(resources__timeout_min=0), "resources.timeout_min = 0"),
    ("signal_delay_zero", changed(slurm__signal_delay_s=0), "slurm.signal_delay_s = 0"),
    ("signal_delay_beyond_limit", changed(slurm__signal_delay_s=600), "slurm.signal_delay_s = 600: must be below"),
    ("partition_not_a_string", changed(slurm__partition=3), "slurm.partition = 3"),
    ("partition_empty", changed(slurm__partition=""), 'slurm.partition = ""'),
    ("setup_not_a_list", changed(slurm__setup="module load cuda"), "slurm.setup = "),
    ("additional_sets_a_managed_option", changed(slurm__additional={"requeue": True}), "slurm.additional.requeue"),
    ("additional_false_flag", changed(slurm__additional={"exclusive": False}), "slurm.additional.exclusive"),
    ("unknown_slurm_key", changed(slurm__partitions="gpu"), "slurm.partitions"),
    ("max_requeues_negative", changed(requeue__max_requeues=-1), "requeue.max_requeues = -1"),
    ("requeue_not_a_mapping", changed(requeue=5), "requeue = 5"),
    ("resources_not_a_mapping", changed(resources=4), "resources = 4"),
    ("env_value_not_a_string", changed(env={"OMP_NUM_THREADS": 1}), "env.OMP_NUM_THREADS = 1"),
    ("env_sets_a_launcher_variable", changed(env={"RANK": "0"}), "env.RANK"),
    ("env_bad_variable_name", changed(env={"MY-VAR": "1"}), "env.MY-VAR"),
    # Control characters in a value that reaches the batch script or a shell.
    ("additional_value_injects_a_line", changed(slurm__additional={"comment": "x\n touch pwned\n#"}),
     'slurm.additional.comment = "x\\n touch pwned\\n#": contains a newline'),
    ("partition_from_a_yaml_block", (RAW, "name: x\nentrypoint: train:main\nrun_dir: r\nslurm:\n  partition: |\n"
                                          "    gpu\n"), "use |- or >-"),
    ("account_carriage_return", changed(slurm__account="proj\r"), "slurm.account"),
    ("qos_escape_sequence", changed(slurm__qos="normal\x1b[2J"), "contains the control character U+001B"),
    ("constraint_nul", changed(slurm__constraint="a100\x00"), "slurm.constraint"),
    ("setup_line_with_two_lines", changed(slurm__setup=["module load cuda\ntouch pwned"]), "slurm.setup[0]"),
    ("env_value_newline", changed(env={"OMP_NUM_THREADS": "1\ntouch pwned"}), "env.OMP_NUM_THREADS"),
    ("workdir_newline", changed(workdir=".\n"), "workdir"),
    ("run_dir_line_separator", changed(run_dir="runs/a\u2028b"), "contains the control character U+2028"),
    ("command_nul", [removed("entrypoint"), changed(command=["python", "a\x00b"])], "contains a NUL character"),
    # Specs that would exhaust the machine.
    ("alias_bomb", (RAW, "name: x\nentrypoint: train:main\nrun_dir: r\nconfig:\n  a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
                         + "".join(f"  {n}: &{n} [" + ", ".join([f"*{p}"] * 10) + "]\n" for p, n in zip("abcdef", "bcdefg"))),
     "above the limit of 100,000"),
    ("nested_too_deep", (RAW, "name: x\nentrypoint: train:main\nrun_dir: r\nconfig: " + "[" * 600 + "]" * 600 + "\n"),
     "nested deeper than 64 levels"),
    ("merge_of_a_scalar", (RAW, "name: x\nentrypoint: train:main\nrun_dir: r\nconfig: {<<: 1}\n"), "for merging"),
]


def spec_text(case: Any) -> str:
    if isinstance(case, tuple) and case[0] == RAW:
        return case[1]
    spec = copy.deepcopy(BASE)
    for apply in case if isinstance(case, list) else [case]:
        apply(spec)
    return yaml.safe_dump(spec, sort_keys=False)


def tree(root: Path) -> set[tuple[str, int]]:
    return {(str(path.relative_to(root)), path.stat().st_size) for path in root.rglob("*")}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("def main(job):\n    return None\n")
    return tmp_path


def test_the_corpus_is_large_and_its_base_is_valid(project: Path, capsys):
    assert len(CASES) >= 30 and len({name for name, _, _ in CASES}) == len(CASES)
    (project / "job.yaml").write_text(spec_text([]))
    assert main(["validate", str(project / "job.yaml"), "--executor", "local"]) == 0
    assert "valid job 'corpus'" in capsys.readouterr().out


@pytest.mark.parametrize("verb", ["validate", "submit"])
@pytest.mark.parametrize(("case", "needle"), [(case, needle) for _, case, needle in CASES],
                         ids=[name for name, _, _ in CASES])
def test_a_malformed_spec_exits_2_naming_the_field_and_creates_nothing(project: Path, capsys, verb, case, needle):
    spec = project / "job.yaml"
    spec.write_text(spec_text(case))
    before = tree(project)
    code = main([verb, str(spec), "--executor", "local"])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert needle in captured.err, captured.err
    assert captured.err.startswith(f"elfes: error: {spec}"), captured.err  # names the file first
    assert "Traceback" not in captured.out + captured.err
    assert captured.out == ""
    assert tree(project) == before  # nothing created (no run directory, no `pwned` file)
