"""`elfes plot` as a command: where it writes, overlays labelled by run name, refusals that say what to
do, the message without matplotlib, and what it imports (never torch; matplotlib only to draw)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elfes.launcher.cli.main import main as elfes
from elfes.launcher.commands.plot import plot
from elfes.launcher.rundir.paths import RunPaths
from elfes.launcher.rundir.state import begin_attempt, end_attempt, load_state, record_submission, update_state

pytest.importorskip("matplotlib", reason="the plot extra: pip install -e '.[test]' installs it")

REPOSITORY = Path(__file__).resolve().parents[2]
STATE = {"epoch": 0, "next_batch": 0, "step": 0, "batches": 0, "samples": 0, "best_metric": None, "best_step": None,
         "evaluations_without_improvement": 0, "stop_reason": None}


def write_run(run_dir: Path, losses: dict[int, float], *, stop_at: int | None = None,
              start_times: tuple[str, str] = ("2026-01-02T03:04:05+00:00",) * 2) -> Path:
    """A run directory as train.py leaves it (no launcher files): started, train records, maybe a stop
    by SIGTERM and a resume (``start_times``: when each start was logged), an evaluation at the last step."""
    def start(step: int) -> dict:
        name = "started" if step == 0 else "resumed"
        return {"event": name, "time": start_times[step != 0], "state": {**STATE, "step": step}}

    records = [start(0)]
    for step, loss in losses.items():
        records.append({"event": "train", "step": step, "epoch": 1, "planned_steps": len(losses), "samples": step,
                        "metrics": {"loss": loss, "grad_norm": 1.0}})
        if step == stop_at:
            records += [{"event": "stop_requested", "signal": "SIGTERM", "reason": "SIGTERM", "epoch": 1, "step": step},
                        {"event": "stopped", "reason": "SIGTERM", "state": {**STATE, "step": step}}, start(step)]
    last = max(losses)
    records.append({"event": "evaluation", "step": last, "epoch": 1, "weights": "raw",
                    "metrics": {"validation": {"loss": 0.5}}})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return run_dir


def test_one_run_is_drawn_to_plot_png_in_its_run_directory_and_svg_on_request(tmp_path, capsys):
    run_dir = write_run(tmp_path / "alpha", {1: 1.0, 2: 0.8, 3: 0.7, 4: 0.5}, stop_at=2)
    assert elfes(["plot", str(run_dir)]) == 0
    assert (run_dir / "plot.png").read_bytes().startswith(b"\x89PNG")
    assert capsys.readouterr().out == f"wrote {run_dir / 'plot.png'}: train/loss, eval/validation/loss of alpha\n"
    assert elfes(["plot", str(run_dir), "-o", str(tmp_path / "out" / "alpha.svg"), "--metric", "train/grad_norm"]) == 0
    assert "<svg" in (tmp_path / "out" / "alpha.svg").read_text()
    assert "train/grad_norm of alpha" in capsys.readouterr().out


def test_several_runs_overlay_in_each_panel_labelled_by_run_name(tmp_path):
    alpha = write_run(tmp_path / "alpha", {1: 1.0, 2: 0.8, 3: 0.7}, stop_at=2)
    beta = write_run(tmp_path / "beta", {1: 0.9, 2: 0.6})
    result = plot([alpha, beta], output=tmp_path / "both.png")
    for ax in result.figure.get_axes():
        kept = {line.get_gid(): list(line.get_xdata()) for line in ax.get_lines()
                if (line.get_gid() or "").startswith("kept:")}
        assert kept.keys() == {"kept:alpha", "kept:beta"}
    legend = [text.get_text() for text in result.figure.get_axes()[0].get_legend().get_texts()]
    assert legend[:2] == ["alpha", "beta"]
    markers = {line.get_gid() for line in result.figure.get_axes()[0].get_lines()
               if (line.get_gid() or "").startswith("marker:")}
    assert markers == {"marker:start:1:alpha", "marker:stop:1:alpha", "marker:resume:2:alpha", "marker:start:1:beta"}


def test_many_runs_get_a_colour_each_and_a_legend_that_names_the_first_and_the_last(tmp_path, capsys):
    """Twelve runs: more than the eight distinct colours, so a colour map over their order; the legend names the
    ends of it instead of covering the panel with every run, and so does the command's message."""
    runs = [write_run(tmp_path / f"run{index:02}", {1: 1.0 + index, 2: 0.5 + index}) for index in range(12)]
    result = plot(runs, output=tmp_path / "many.png")
    ax = result.figure.get_axes()[0]
    colors = {line.get_gid(): tuple(line.get_color()) for line in ax.get_lines()
              if (line.get_gid() or "").startswith("kept:")}
    assert len(colors) == 12 and len(set(colors.values())) == 12
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert legend == ["run00 (first of 12)", "run11 (last)", "start"]
    assert elfes(["plot", *map(str, runs), "-o", str(tmp_path / "many.png")]) == 0
    assert capsys.readouterr().out == (f"wrote {tmp_path / 'many.png'}: train/loss, eval/validation/loss of "
                                       "12 runs, run00 to run11\n")


def test_a_cancelled_then_resumed_run_is_labelled_cancel_not_sigterm(tmp_path):
    """`elfes cancel` stops the run with SIGTERM; state.json records the attempt cancelled, and so does the plot."""
    paths = RunPaths(tmp_path / "alpha")
    paths.run_dir.mkdir()
    for token, launch, outcome in (("1:0", "submit", "cancelled"), ("2:0", "resume", "finished")):
        update_state(paths, lambda s, launch=launch: record_submission(s, executor="local", kind=launch,
                                                                       max_requeues=3, run_dir=str(paths.run_dir)))
        update_state(paths, lambda s, token=token, launch=launch: begin_attempt(s, token=token, job_id=token[0],
                                                                                launch=launch, hosts=["h"],
                                                                                world_size=1))
        update_state(paths, lambda s, token=token, outcome=outcome: end_attempt(
            s, token=token, outcome=outcome, step=2, signal="SIGTERM" if outcome == "cancelled" else None))
    begun = tuple(attempt.started_at for attempt in load_state(paths).attempts)
    write_run(paths.run_dir, {1: 1.0, 2: 0.8, 3: 0.7}, stop_at=2, start_times=begun)
    result = plot([paths.run_dir])
    labels = {text.get_position()[0]: text.get_text() for text in result.figure.get_axes()[0].texts}
    assert labels[2] == "cancel / resume"
    stop = next(marker for marker in result.runs[0].timeline.markers if marker.kind == "stop")
    assert stop.label == "cancel (SIGTERM)"


@pytest.mark.parametrize(("arguments", "message"), [
    (["{alpha}", "{beta}"], "several runs are drawn into one file: name it with -o FILE.png"),
    (["{alpha}", "-o", "{folder}/plot.jpg"], "plot.jpg: give a file name ending in .png or .svg"),
    (["{alpha}", "--metric", "validation/loss"],
     "no run recorded the metric(s) 'validation/loss'; the runs have: train/loss, train/grad_norm, eval/validation/loss"),
    (["{folder}/missing"], "missing is not a run directory (no such folder)"),
    (["{folder}/empty"], "no events file at"),
], ids=["several-without-output", "format", "metric", "missing-folder", "no-events"])
def test_bad_input_exits_2_saying_what_to_do(tmp_path, capsys, arguments, message):
    write_run(tmp_path / "alpha", {1: 1.0})
    write_run(tmp_path / "beta", {1: 1.0})
    (tmp_path / "empty").mkdir()
    values = {"alpha": tmp_path / "alpha", "beta": tmp_path / "beta", "folder": tmp_path}
    assert elfes(["plot", *(argument.format(**values) for argument in arguments)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "alpha" / "plot.png").exists()


PROBE = """
import json, sys
blocked = json.loads(sys.argv[2])
for name in blocked:
    sys.modules[name] = None  # as if it were not installed
from elfes.launcher.cli.main import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "loaded": sorted(m for m in ("torch", "matplotlib") if sys.modules.get(m))}))
"""


def probe(arguments: list[str], blocked: tuple[str, ...] = ()) -> tuple[dict, str]:
    completed = subprocess.run([sys.executable, "-c", PROBE, json.dumps(arguments), json.dumps(blocked)],
                               cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
                               env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
    return json.loads(completed.stdout.splitlines()[-1]), completed.stderr


def test_plot_imports_matplotlib_only_to_draw_and_never_torch(tmp_path):
    run_dir = write_run(tmp_path / "alpha", {1: 1.0, 2: 0.5})
    report, _ = probe(["plot", "--help"])
    assert report == {"code": 0, "loaded": []}
    report, stderr = probe(["plot", str(run_dir)])
    assert report == {"code": 0, "loaded": ["matplotlib"]}, stderr


def test_without_matplotlib_plot_exits_3_naming_the_pip_command(tmp_path):
    run_dir = write_run(tmp_path / "alpha", {1: 1.0, 2: 0.5})
    report, stderr = probe(["plot", str(run_dir)], blocked=("matplotlib",))
    assert report["code"] == 3
    assert "elfes: error: elfes plot draws with matplotlib, which is not installed; install it with: " \
           "pip install 'elfes[plot]' (or pip install matplotlib)" in stderr
    assert not (run_dir / "plot.png").exists()
