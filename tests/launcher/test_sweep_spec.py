"""A sweep's members on the login node: expanded from `sweep:` and `--sweep`, named from their overrides,
each validated before anything is created; the status of a hand-built sweep folder. No job runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from run_fixtures import write_project

from elfes.files import write_text_atomically
from elfes.launcher.cli.main import main as elfes
from elfes.launcher.rundir import state as run_state
from elfes.launcher.rundir.paths import RunPaths, SweepPaths
from elfes.launcher.rundir.sweep_record import MemberRecord, SweepRecord, save_sweep
from elfes.launcher.spec import SpecError
from elfes.launcher.spec.sweep import member_names, plan_sweep


def sweep_spec(folder: Path, sweep: dict | None, **fields) -> Path:
    spec = write_project(folder)
    data = yaml.safe_load(spec.read_text())
    data.update(fields)
    if sweep is not None:
        data["sweep"] = sweep
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


def test_a_grid_is_the_cartesian_product_each_member_named_from_its_overrides(tmp_path: Path) -> None:
    spec = sweep_spec(tmp_path, {"grid": {"config.lr": [0.001, 0.003], "config.seed": [0, 1]}, "max_parallel": 2})
    plan = plan_sweep(spec)
    assert [member.name for member in plan.members] == [
        "lr=0.001,seed=0", "lr=0.001,seed=1", "lr=0.003,seed=0", "lr=0.003,seed=1"]
    assert plan.max_parallel == 2
    third = plan.members[2].spec
    assert third.config == {"epochs": 1, "lr": 0.003, "seed": 0}
    assert third.run_dir == tmp_path / "runs" / "demo" / "lr=0.003,seed=0"
    recorded = yaml.safe_load(third.to_yaml())
    assert "sweep" not in recorded and recorded["config"]["lr"] == 0.003


def test_the_command_line_sweep_replaces_and_adds_grid_keys_and_crosses_members(tmp_path: Path) -> None:
    spec = sweep_spec(tmp_path / "grid", {"grid": {"config.lr": [0.1, 0.2]}})
    plan = plan_sweep(spec, sweeps=["config.lr=0.5,0.001", "resources.tasks_per_node=1,2"])
    assert [member.overrides for member in plan.members] == [
        {"config.lr": 0.5, "resources.tasks_per_node": 1}, {"config.lr": 0.5, "resources.tasks_per_node": 2},
        {"config.lr": 0.001, "resources.tasks_per_node": 1}, {"config.lr": 0.001, "resources.tasks_per_node": 2}]
    assert plan.max_parallel == 4  # no max_parallel: all at once
    spec = sweep_spec(tmp_path / "members", {"members": [{"config.lr": 0.1}, {"config.lr": 0.2, "config.wd": 0.5}]})
    plan = plan_sweep(spec, sweeps=["config.seed=0,1"], max_parallel=1)
    assert [member.name for member in plan.members] == [
        "lr=0.1,seed=0", "lr=0.1,seed=1", "lr=0.2,wd=0.5,seed=0", "lr=0.2,wd=0.5,seed=1"]
    assert plan.max_parallel == 1


def test_member_names_are_filesystem_safe_short_and_unique() -> None:
    names = member_names([{"config.a.lr": 1, "config.b.lr": 2}, {"config.path": "a/b c"}, {"config.path": "a_b_c"},
                          {"config.path": "x" * 300}, {"config.path": "x" * 300 + "y"}, {"config.path": ".."}, {}])
    assert names[0] == "config.a.lr=1,config.b.lr=2"  # two keys end in "lr": the full paths tell them apart
    assert names[1] == "path=a_b_c" and names[2] == "path=a_b_c~2"
    assert len(names[3]) <= 120 and len(names[4]) <= 120 and names[3] != names[4]
    assert names[5] == "path=.." and names[6] == "base"
    assert all("/" not in name and not name.startswith(".") for name in names)


def test_a_bad_member_names_the_member_and_the_field_and_nothing_is_created(tmp_path: Path, capsys) -> None:
    spec = sweep_spec(tmp_path, {"grid": {"resources.tasks_per_node": [1, 0], "config.lr": [0.1]}})
    assert elfes(["submit", str(spec), "--executor", "local"]) == 2
    error = capsys.readouterr().err
    assert "sweep member 1 (tasks_per_node=0,lr=0.1)" in error and "resources.tasks_per_node" in error
    assert "sweep member 0" not in error
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("sweep", "says"), [
    ({"grid": {"resources.gpus": [1, 2]}}, "resources has no field 'gpus'"),
    ({"grid": {"run_dir": ["a", "b"]}}, "run_dir: a member may not set it"),
    ({"grid": {"config.lr": []}}, "grid.config.lr has no values"),
    ({"grid": {"config.lr": [1]}, "members": [{"config.lr": 1}]}, "give exactly one of grid"),
    ({"members": [{"config.lr": 1}, {"config.lr": 1}]}, "sweep member 1 (lr=1~2) repeats member 0 (lr=1)"),
    ({"grid": {"config.lr": [1]}, "max_parallel": 0}, "sweep.max_parallel"),
    ({"grid": {"config.lr": [1, [64, 64]]}}, 'sweep.grid["config.lr"][1] = [64, 64]: a sweep value is one scalar'),
    ({"members": [{"config.lr": {"a": 1}}]}, 'sweep.members[0]["config.lr"] = {"a": 1}: a sweep value is one'),
])
def test_bad_sweeps_are_refused_by_name(tmp_path: Path, capsys, sweep: dict, says: str) -> None:
    spec = sweep_spec(tmp_path, sweep)
    assert elfes(["submit", str(spec), "--executor", "local"]) == 2
    said = capsys.readouterr().err
    assert says in said and "(1 problem)" in said or "problem" not in said, said
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("option", "says"), [
    ("config.lr", "write --sweep KEY=VALUE1,VALUE2"),
    ("config.lr=", "write --sweep KEY=VALUE1,VALUE2"),
    ("config..lr=1,2", "is not a dotted field path"),
    ("run_dir=a,b", "run_dir: a member may not set it"),
])
def test_bad_sweep_options_are_refused(tmp_path: Path, capsys, option: str, says: str) -> None:
    spec = write_project(tmp_path)
    assert elfes(["submit", str(spec), "--executor", "local", "--sweep", option]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_dry_run_lists_the_members_and_creates_nothing(tmp_path: Path, capsys) -> None:
    spec = write_project(tmp_path)
    assert elfes(["submit", str(spec), "--executor", "local", "--dry-run", "--sweep", "config.lr=0.1,0.2",
                  "--max-parallel", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 member(s), at most 1 at once" in out and "runs/demo/lr=0.2" in out
    assert not (tmp_path / "runs").exists()


def test_a_folder_that_holds_a_sweep_or_a_run_is_refused(tmp_path: Path, capsys) -> None:
    spec = write_project(tmp_path)
    folder = tmp_path / "runs" / "demo"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text("{}")
    assert elfes(["submit", str(spec), "--executor", "local", "--sweep", "config.lr=1,2"]) == 2
    assert "is the run directory of a single run" in capsys.readouterr().err
    assert sorted(path.name for path in folder.iterdir()) == ["state.json"]
    with pytest.raises(SpecError, match="no sweep to run"):
        plan_sweep(spec, max_parallel=2)


# -- the status of a sweep folder (hand-built: no job runs) ------------------------------------------------------
def _member(sweep_dir: Path, index: int, name: str, *, outcome: str | None, best: float | None) -> MemberRecord:
    paths = RunPaths(sweep_dir / name)
    paths.run_dir.mkdir(parents=True)
    write_text_atomically(paths.spec, "name: demo\n")
    if outcome is not None:
        token = f"{4194990 + index}:0/1"
        run_state.update_state(paths, lambda s: run_state.record_submission(
            s, executor="local", kind="submit", max_requeues=3, run_dir=str(paths.run_dir)))
        run_state.update_state(paths, lambda s: run_state.mark_pending(s, job_id=str(4194990 + index)))
        run_state.update_state(paths, lambda s: run_state.begin_attempt(
            s, token=token, job_id=str(4194990 + index), launch="submit", hosts=["h"], world_size=1))
        run_state.update_state(paths, lambda s: run_state.end_attempt(s, token=token, outcome=outcome, step=5))
        lines = [{"event": "started", "budget": {"planned_steps": 10, "epochs": 1}},
                 {"event": "train", "step": 5, "planned_steps": 10, "metrics": {"loss": 0.5}}]
        if best is not None:
            lines.append({"event": "evaluation", "step": 5, "monitor": "validation/loss", "best_metric": best,
                          "best_step": 5})
        paths.events.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return MemberRecord(index, name, str(paths.run_dir), {"config.lr": index})


def test_sweep_status_sorts_members_by_the_metric_and_counts_them(tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "sweep"
    members = (_member(sweep_dir, 0, "lr=0", outcome="finished", best=0.9),
               _member(sweep_dir, 1, "lr=1", outcome="finished", best=0.2),
               _member(sweep_dir, 2, "lr=2", outcome="cancelled", best=0.5),
               _member(sweep_dir, 3, "lr=3", outcome=None, best=None))
    save_sweep(SweepPaths(sweep_dir), SweepRecord(name="demo", executor="local", max_parallel=2, members=members,
                                                 queue=({"name": "lr=3", "at": run_state.now()},)))
    assert elfes(["status", str(sweep_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [member["name"] for member in data["members"]] == ["lr=1", "lr=2", "lr=0", "lr=3"]
    assert data["counts"] == {"finished": 2, "cancelled": 1, "waiting": 1, "total": 4}
    first = data["members"][0]
    assert (first["status"], first["step"], first["planned_steps"], first["attempts"]) == ("finished", 5, 10, 1)
    assert elfes(["status", str(sweep_dir)]) == 0
    table = capsys.readouterr().out
    assert "4 member(s): finished 2, cancelled 1, waiting 1" in table
    assert table.index("lr=1") < table.index("lr=2") < table.index("lr=0 ")
    # A member is a run directory: status takes it alone, and several folders at once.
    assert elfes(["status", str(sweep_dir), str(sweep_dir / "lr=0"), "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both[0]["counts"]["total"] == 4 and both[1]["status"] == "finished"


def test_piped_sweep_status_follows_columns_where_it_is_set(tmp_path: Path, capsys, monkeypatch) -> None:
    sweep_dir = tmp_path / "sweep"
    members = (_member(sweep_dir, 0, "lr=0", outcome="finished", best=0.9),)
    save_sweep(SweepPaths(sweep_dir), SweepRecord(name="demo", executor="local", max_parallel=2, members=members))
    monkeypatch.setenv("COLUMNS", "60")
    assert elfes(["status", str(sweep_dir)]) == 0
    table = capsys.readouterr().out
    assert "1 member(s): finished 1" in table
    assert all(len(line) <= 60 for line in table.splitlines()), table


def test_plot_of_a_sweep_overlays_its_members_labelled_by_their_overrides(tmp_path: Path) -> None:
    from elfes.launcher.commands.plot import plot

    sweep_dir = tmp_path / "sweep"
    members = (_member(sweep_dir, 0, "lr=0", outcome="finished", best=0.9),
               _member(sweep_dir, 1, "lr=1", outcome="finished", best=0.2))
    save_sweep(SweepPaths(sweep_dir), SweepRecord(name="demo", executor="local", max_parallel=2, members=members))
    result = plot([str(sweep_dir)], metrics=["train/loss"])
    assert result.output == sweep_dir / "plot.png" and result.output.is_file()
    assert [run.name for run in result.runs] == ["config.lr=0", "config.lr=1"]


@pytest.mark.parametrize("values", [[1, True], [0, False], [1, 1.0]])
def test_values_equal_in_python_but_not_in_yaml_are_distinct_members(tmp_path: Path, values: list) -> None:
    plan = plan_sweep(sweep_spec(tmp_path, {"grid": {"config.flag": values}}))
    assert [member.spec.config["flag"] for member in plan.members] == values
    assert [type(member.spec.config["flag"]) for member in plan.members] == [type(value) for value in values]
    assert len({member.name for member in plan.members}) == 2


def test_plot_of_a_sweep_with_waiting_members_draws_those_with_records(tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "sweep"
    members = (_member(sweep_dir, 0, "lr=0", outcome="finished", best=0.9),
               _member(sweep_dir, 1, "lr=1", outcome=None, best=None))
    save_sweep(SweepPaths(sweep_dir), SweepRecord(name="demo", executor="local", max_parallel=1, members=members,
                                                 queue=({"name": "lr=1", "at": run_state.now()},)))
    assert elfes(["plot", str(sweep_dir), "--metric", "train/loss"]) == 0
    said = capsys.readouterr().out
    assert "of config.lr=0" in said and "not drawn (no run records yet): config.lr=1" in said
    assert "stalled: 1 member(s) wait for a slot" in said  # and nothing will start it: said here too
    assert (sweep_dir / "plot.png").is_file()


def test_status_until_of_a_sweep_waits_for_every_member_and_exits_as_they_ended(tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "sweep"
    members = (_member(sweep_dir, 0, "lr=0", outcome="finished", best=0.9),
               _member(sweep_dir, 1, "lr=1", outcome="cancelled", best=0.5))
    save_sweep(SweepPaths(sweep_dir), SweepRecord(name="demo", executor="local", max_parallel=2, members=members))
    assert elfes(["status", str(sweep_dir), "--until", "ended"]) == 5  # one member was cancelled
    assert elfes(["status", str(sweep_dir), "--until", "step=5"]) == 0  # both records reached step 5
    capsys.readouterr()
    assert elfes(["status", str(sweep_dir), "--until", "step=6"]) == 5
    assert "member lr=1 ended cancelled before step 6" in capsys.readouterr().err
    assert elfes(["status", str(sweep_dir), "--until", "training"]) == 0  # each has trained
