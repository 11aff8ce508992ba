"""Specs that would exhaust the machine are refused, exit 2 naming the limit, before anything is created:
an alias bomb, a file above 1 MiB, nesting deeper than 64 levels, a recursive alias, a spec whose
recorded copy would pass 1 MiB, a number too long to read. YAML merge keys (``<<: *base``) work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elfes.launcher.cli.main import main
from elfes.launcher.spec import SpecError, load_spec, validate_spec_data
from elfes.launcher.spec.limits import MAX_SPEC_BYTES, MAX_SPEC_DEPTH, MAX_SPEC_VALUES

HEAD = "name: bounded\ncommand: [python, -c, pass]\nrun_dir: run\n"


def alias_bomb() -> str:
    """7 levels of 10 aliases each: under 500 bytes that expand to 10**8 strings."""
    lines = [HEAD + "config:", '  l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"  l{level}: &l{level} [" + ",".join([f"*l{level - 1}"] * 10) + "]" for level in range(1, 8)]
    return "\n".join(lines) + "\n"


def nested(levels: int) -> str:
    """A spec whose config nests mappings so that the deepest one is at level ``levels``."""
    inner = levels - 1  # the top-level mapping is level 1
    return HEAD + "config: " + "{a: " * inner + "1" + "}" * inner + "\n"


def run_elfes(project: Path, text: str, verb: str, capsys) -> tuple[int, str]:
    spec = project / "job.yaml"
    spec.write_text(text)
    code = main([verb, str(spec), "--executor", "local"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.err


def created(project: Path) -> list[str]:
    return sorted(str(path.relative_to(project)) for path in project.rglob("*") if path.name != "job.yaml")


@pytest.mark.parametrize("verb", ["validate", "submit"])
def test_an_alias_bomb_is_refused_naming_the_limit(tmp_path: Path, capsys, verb):
    text = alias_bomb()
    assert len(text.encode()) < 500
    code, err = run_elfes(tmp_path, text, verb, capsys)
    assert code == 2, err
    assert "values with its aliases expanded, above the limit of 100,000" in err, err
    assert err.startswith(f"elfes: error: {tmp_path / 'job.yaml'}: ")
    assert created(tmp_path) == []


@pytest.mark.parametrize("verb", ["validate", "submit"])
def test_a_file_above_one_mib_is_refused_naming_the_limit(tmp_path: Path, capsys, verb):
    padding = "# " + "x" * 78 + "\n"
    text = HEAD + padding * (2 * MAX_SPEC_BYTES // len(padding))
    code, err = run_elfes(tmp_path, text, verb, capsys)
    assert code == 2, err
    assert f"larger than {MAX_SPEC_BYTES:,} bytes, the limit of a job spec file" in err, err
    assert created(tmp_path) == []


@pytest.mark.parametrize("levels", [MAX_SPEC_DEPTH + 1, 500, 5000])
@pytest.mark.parametrize("verb", ["validate", "submit"])
def test_nesting_deeper_than_the_limit_is_refused_naming_the_line(tmp_path: Path, capsys, verb, levels):
    code, err = run_elfes(tmp_path, nested(levels), verb, capsys)
    assert code == 2, err
    assert f"line 4, column {9 + 4 * MAX_SPEC_DEPTH - 4}: mappings and lists nested deeper than 64 levels" in err, err
    assert created(tmp_path) == []


def test_nesting_at_the_limit_is_accepted_and_recorded(tmp_path: Path):
    (tmp_path / "job.yaml").write_text(nested(MAX_SPEC_DEPTH))
    spec = load_spec(tmp_path / "job.yaml")
    (tmp_path / "again.yaml").write_text(spec.to_yaml())
    assert load_spec(tmp_path / "again.yaml") == spec


def test_a_list_nested_in_its_own_anchor_is_refused(tmp_path: Path, capsys):
    code, err = run_elfes(tmp_path, HEAD + "config:\n  loop: &loop [1, *loop]\n", "validate", capsys)
    assert code == 2, err
    assert "line 5: a mapping or list contains itself" in err and "remove that alias" in err, err


def test_aliases_expanding_past_the_limit_through_depth_are_refused(tmp_path: Path, capsys):
    # Each anchor nests the one before 8 levels deeper: 9 anchors make 72 levels once expanded.
    lines = [HEAD + "config:", "  d0: &d0 1"]
    lines += [f"  d{i}: &d{i} " + "[" * 8 + f"*d{i - 1}" + "]" * 8 for i in range(1, 10)]
    code, err = run_elfes(tmp_path, "\n".join(lines) + "\n", "validate", capsys)
    assert code == 2, err
    assert "nested 74 levels deep, above the limit of 64" in err, err


def test_a_recorded_spec_above_one_mib_is_refused_before_the_run_directory_exists(tmp_path: Path, capsys):
    # 49,000 short keys 4 levels down: a 0.9 MB file under every bound; its recorded copy (block style,
    # indented) is 1.3 MB.
    entries = ", ".join(f"k{index:010d}: 1234" for index in range(49_000))
    text = HEAD + "config: {a: {b: {c: {" + entries + "}}}}\n"
    assert len(text.encode()) < MAX_SPEC_BYTES
    code, err = run_elfes(tmp_path, text, "submit", capsys)
    assert code == 2, err
    assert "recorded in the run directory" in err and f"above the limit of {MAX_SPEC_BYTES:,}" in err, err
    assert created(tmp_path) == []


def test_an_integer_too_long_to_read_is_refused_naming_the_line(tmp_path: Path, capsys):
    code, err = run_elfes(tmp_path, HEAD + "config: {seed: " + "9" * 5000 + "}\n", "validate", capsys)
    assert code == 2, err
    assert "line 4, column 16: an integer too long to read" in err and "write it as a string" in err, err


def test_merge_keys_merge_and_the_mapping_own_keys_win(tmp_path: Path, capsys):
    text = HEAD + (
        "config:\n"
        "  base: &base {lr: 0.1, epochs: 3}\n"
        "  fine:\n"
        "    <<: *base\n"
        "    lr: 0.01\n"
        "resources: &resources {timeout_min: 30}\n"
        "slurm: {<<: {signal_delay_s: 90}, setup: []}\n"
    )
    code, err = run_elfes(tmp_path, text, "validate", capsys)
    assert code == 0, err
    spec = load_spec(tmp_path / "job.yaml")
    assert spec.config["fine"] == {"lr": 0.01, "epochs": 3}
    assert spec.slurm.signal_delay_s == 90
    assert "<<" not in spec.to_yaml()


def test_a_key_given_twice_beside_a_merge_key_is_still_refused(tmp_path: Path, capsys):
    text = HEAD + "config:\n  base: &base {lr: 0.1}\n  fine: {<<: *base, lr: 0.2, lr: 0.3}\n"
    code, err = run_elfes(tmp_path, text, "validate", capsys)
    assert code == 2 and "'lr' is given twice" in err, err


def test_a_merge_of_a_scalar_is_explained_as_a_merge_problem(tmp_path: Path, capsys):
    code, err = run_elfes(tmp_path, HEAD + "config: {<<: 3}\n", "validate", capsys)
    assert code == 2 and "expected a mapping or list of mappings for merging" in err, err
    assert "Python tags" not in err


def test_validating_a_mapping_bounds_its_shared_parts_too(tmp_path: Path):
    # A mapping built in Python (as overrides build one) may share objects exactly as YAML aliases do.
    level: object = ["lol"] * 10
    for _ in range(6):
        level = [level] * 10
    data = json.loads(json.dumps({"name": "bounded", "command": ["python"], "run_dir": "run"}))
    data["config"] = {"bomb": level}
    with pytest.raises(SpecError, match=f"above the limit of {MAX_SPEC_VALUES:,}"):
        validate_spec_data(data, source="override", base=tmp_path, check_files=False)
    data["config"] = {"loop": []}
    data["config"]["loop"].append(data["config"])
    with pytest.raises(SpecError, match="contains itself"):
        validate_spec_data(data, source="override", base=tmp_path, check_files=False)
