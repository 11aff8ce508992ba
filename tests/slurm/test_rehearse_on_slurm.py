"""`elfes rehearse` on the private SLURM cluster: the requeue kind goes through `scancel --signal=USR2`, the
same path a real preemption's user signal takes, and the job requeues itself; the verdict is exact."""

from __future__ import annotations

import json

from cluster import SlurmCluster
from slurm_runs import elfes, write_spec

from elfes.launcher.commands.rehearsal.pipeline import candidate_steps, plan_interruptions

LOGGED_STEPS = candidate_steps(16)  # the steps a rehearsal of the straight run (16 updates) aims at


def seed_landing_in(steps: range) -> int:
    """A rehearsal seed whose one requeue comes at one of ``steps``: the updates after it are the slack a
    follower on a loaded machine has to land the signal before the last update (which would save the end)."""
    return next(s for s in range(1000) if plan_interruptions(1, ("requeue",), LOGGED_STEPS, s)[0].step in steps)


def test_a_rehearsal_on_slurm_requeues_through_the_user_signal_and_is_exact(slurm_user_signal: SlurmCluster,
                                                                          tmp_path):
    spec = write_spec(tmp_path, "rehearsed", step_delay_s=0.25)
    completed = elfes(slurm_user_signal, "rehearse", str(spec), "--executor", "slurm", "--interruptions", "1",
                      "--kinds", "requeue", "--seed", str(seed_landing_in(range(4, 9))), "--keep", "--json", check=False)
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["verdict"] == "exact" and report["executor"] == "slurm"
    [interruption] = report["interruptions"]
    assert interruption["kind"] == "requeue" and interruption["saved_step"] is not None
    state = json.loads((tmp_path / "rehearsed.rehearsal" / "interrupted" / "state.json").read_text())
    assert [a["outcome"] for a in state["attempts"]] == ["requeued", "finished"]
    assert [a["signal"] for a in state["attempts"]][0] == "SIGUSR2"
    assert len({a["job_id"] for a in state["attempts"]}) == 1  # requeued in place: the same SLURM job
