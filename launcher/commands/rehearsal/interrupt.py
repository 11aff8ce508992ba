"""The interrupted run of ``elfes rehearse``: its planned interruptions sent at their moments (the
requeue signal, SIGTERM then ``elfes resume``, SIGKILL then ``elfes resume``), each judged landed
or not from what the run saved. Torch-free.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from elfes.files import is_temporary

from ...backends import backend_for
from ...rundir import state as run_state
from ...rundir.liveness import liveness, recorded_tasks
from ...rundir.paths import RunPaths
from ...rundir.state import Outcome, RunStatus
from ..signalling import ActionFailed, preempt
from ..submission import resume
from .plan import PlannedInterruption, RunLength, pointer_step
from .report import Interruption, after_the_last_update
from .runs import Follower, ScratchRuns, kill_local_job, signal_tasks, slurm


class InterruptedRun:
    """One pass of the interrupted run: submitted afresh, interrupted as ``plan`` says, followed to its end."""

    def __init__(self, runs: ScratchRuns, length: RunLength, resume_sets: tuple[str, ...] = ()) -> None:
        self.runs, self.length = runs, length
        self.resume_sets = resume_sets  # what each `elfes resume` changes (--resize: the world size)
        self.say = runs.say

    def run(self, plan: list[PlannedInterruption]) -> list[Interruption]:
        run_dir = self.runs.submit("interrupted")
        paths = RunPaths(run_dir)
        progress = Follower(paths, self.length)
        done: list[Interruption] = []
        for number, planned in enumerate(plan, start=1):
            progress.poll()
            target = planned.step
            # One kill lands inside a checkpoint write where the run writes them: aim at the first one from here.
            aim_at_write = planned.kind == "kill" and not any(i.kind == "kill" for i in done)
            next_step = plan[number].step if number < len(plan) else None
            write_steps = [step for step in self.length.checkpoint_steps
                           if step >= target and (next_step is None or step < next_step)]
            if aim_at_write and write_steps:
                target = max(1, write_steps[0] - 1)
            attempt = self._wait_for_step(paths, progress, target)
            if attempt is None:
                self.say(f"interruption {number}/{len(plan)} ({planned.kind} at step {planned.step}): the run ended "
                         "first; not sent")
                done.append(Interruption(planned.kind, planned.step, None, "not sent: the run had ended", None,
                                         landed=False))
                continue
            if aim_at_write and write_steps:
                moment = self._wait_for_checkpoint_write(paths, progress)
            else:
                time.sleep(planned.fraction * self.length.update_time_s)  # a random moment within the update
                moment = f"{planned.fraction:.2f} of an update after step {progress.poll()}"
            interruption = Interruption(planned.kind, planned.step, progress.step, moment, attempt)
            self.say(f"interruption {number}/{len(plan)}: {planned.kind} at step {progress.step} ({moment}), "
                     f"attempt {attempt}")
            getattr(self, f"_{planned.kind}")(paths, attempt, interruption)
            self.say(f"interruption {number}/{len(plan)}: {planned.kind} "
                     + (f"landed; the run continues from step {interruption.saved_step}" if interruption.landed
                        and interruption.saved_step is not None and interruption.saved_step < self.length.final_step
                        else "landed" if interruption.landed else "came too late: the run had finished"))
            done.append(interruption)
        state = self.runs.wait_until_ended(run_dir, "interrupted", progress)
        final_step = state.last_attempt.step if state.last_attempt else None
        self.say(f"interrupted: finished at step {final_step if final_step is not None else '?'} after "
                 f"{len(state.attempts)} attempts")
        for interruption in after_the_last_update(done, self.length.final_step):
            self.say(f"interruption {done.index(interruption) + 1}/{len(plan)}: it saved the run's last update "
                     f"(step {self.length.final_step}), so nothing was resumed; it does not count as landed")
        return done

    # -- the three kinds ----------------------------------------------------------------------------------------
    def _requeue(self, paths: RunPaths, attempt: int, interruption: Interruption) -> None:
        try:
            preempt(paths.run_dir)
        except ActionFailed:
            state = _recorded_state(paths)
            if state.status not in run_state.ENDED:
                raise
            interruption.landed = False  # it ended between the last look and the signal
            return
        state = self.runs.wait(paths, lambda s: s.status in run_state.ENDED or (
            len(s.attempts) > attempt and s.status in (RunStatus.RUNNING, RunStatus.STOPPING)),
            "the requeued run to start its next attempt")
        self._judge(paths, state.attempts[attempt - 1], interruption)
        if state.status == RunStatus.STOPPED:  # no requeue left (requeue.max_requeues): continue by hand
            self._resume_when_gone(paths)

    def _stop(self, paths: RunPaths, attempt: int, interruption: Interruption) -> None:
        state = _recorded_state(paths)
        if not backend_for(state.executor).runs_here:
            slurm(backend_for(state.executor).signal(str(state.job_id), "TERM"))
        else:
            signal_tasks(paths, signal.SIGTERM)
        state = self.runs.wait(paths, lambda s: s.attempts[attempt - 1].ended and s.status in run_state.ENDED,
                               "the stopped run to save `last` and end")
        self._judge(paths, state.attempts[attempt - 1], interruption)
        if backend_for(state.executor).outlives_its_end and state.attempts[attempt - 1].outcome != Outcome.FINISHED:
            slurm(backend_for(state.executor).cancel(str(state.job_id)))  # it saved and waits for SLURM to end it
        self._resume_when_gone(paths)

    def _kill(self, paths: RunPaths, attempt: int, interruption: Interruption) -> None:
        state = _recorded_state(paths)
        if not backend_for(state.executor).runs_here:
            slurm(backend_for(state.executor).signal(str(state.job_id), "KILL", every_process=True))
        else:
            kill_local_job(paths)
        self._resume_when_gone(paths, interruption)

    def _judge(self, paths: RunPaths, ended: run_state.Attempt, interruption: Interruption) -> None:
        """Landed: the attempt ended before finishing, with steps left to train from what it saved."""
        interruption.saved_step = ended.step if ended.step is not None else pointer_step(paths)
        interruption.landed = ended.outcome != Outcome.FINISHED and (interruption.saved_step is None
                                                               or interruption.saved_step < self.length.final_step)

    def _resume_when_gone(self, paths: RunPaths, interruption: Interruption | None = None) -> None:
        state = self.runs.wait(paths, lambda s: liveness(paths, s).alive is False, "the interrupted job to be gone",
                               raw=True)
        if interruption is not None:  # a kill: the next attempt continues from what `last` names
            interruption.saved_step = pointer_step(paths)
            interruption.landed = state.status != RunStatus.FINISHED and (interruption.saved_step is None or
                                                                 interruption.saved_step < self.length.final_step)
        if state.status == RunStatus.FINISHED:  # it finished before the interruption reached it: nothing to resume
            return
        submitted = resume(paths.run_dir, sets=self.resume_sets)
        self.say(f"interrupted: resumed as {submitted.executor} job {submitted.job_id}")

    def _wait_for_checkpoint_write(self, paths: RunPaths, progress: Follower) -> str:
        """Hold the kill until a checkpoint file is being written: a kill inside a write must leave `last`
        loadable. A write too quick to be seen is followed by the kill right after it is published."""
        deadline = time.monotonic() + max(5.0, 4 * self.length.update_time_s)
        published = progress.checkpoints
        while time.monotonic() < deadline:
            if paths.checkpoints.is_dir() and any(is_temporary(Path(entry)) for entry in os.scandir(paths.checkpoints)):
                return f"during the checkpoint write after step {progress.poll()}"
            progress.poll()
            if progress.checkpoints > published:
                return f"right after the checkpoint of step {progress.step} was published"
            time.sleep(0.001)
        return f"after step {progress.poll()} (no checkpoint write seen)"

    def _wait_for_step(self, paths: RunPaths, progress: Follower, step: int) -> int | None:
        """Wait until the run is running with its tasks recorded and has reached ``step``; the attempt, or
        None when the run ended first."""
        def ready(state: run_state.RunState) -> bool:
            if state.status in run_state.ENDED:
                return True
            tasks = recorded_tasks(paths) if backend_for(state.executor).runs_here else [True]
            return state.status == RunStatus.RUNNING and bool(tasks) and progress.step >= step
        state = self.runs.wait(paths, ready, f"step {step}", follower=progress)
        return None if state.status in run_state.ENDED else len(state.attempts)


def _recorded_state(paths: RunPaths) -> run_state.RunState:
    """The state.json of a rehearsal run, which its submission wrote (RunDamaged, naming it, if it is gone)."""
    state = run_state.load_state(paths)
    if state is None:
        raise run_state.RunDamaged(f"{paths.state} is missing: the rehearsal's run lost its record; run the "
                                   "rehearsal again")
    return state
