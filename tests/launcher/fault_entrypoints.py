"""Entrypoints of the fault tests (tests/launcher/test_faults.py): real faults of the run directory's
file system at chosen moments. Imported inside the jobs (the specs put the repository on the job's path)."""

from __future__ import annotations

import time
from typing import Any

from examples.quickstart import job as quickstart
from tests.launcher.entrypoints import slow_quickstart


def fill_the_disk(job: Any) -> None:
    """Write into the run directory until its file system has no byte left."""
    with open(job.run_dir / f"filler-{job.rank}", "ab") as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
                filler.flush()
        except OSError:
            pass


def fills_the_disk_after_training(job: Any) -> Any:
    """Trains to the end, then fills the run directory's file system before returning."""
    state = slow_quickstart(job)
    fill_the_disk(job)
    return state


def slow_to_stop(job: Any) -> Any:
    """The slowed quickstart job whose window in progress, once a stop is requested, takes 30 s more:
    a window longer than ``slurm.signal_delay_s``, so a time limit kills it before it saves."""
    config = dict(job.config)
    delay = float(config.pop("step_delay_s", 0.0))
    job.config = config

    def step(model, batch):
        time.sleep(delay)
        if job.stop.reason is not None:  # asked during this step's delay too: the window takes 30 s more
            time.sleep(30.0)
        return quickstart.step(model, batch)

    return quickstart.run(job, step)


def _fails_at(job: Any, step: int, fault: Any) -> Any:
    """The slowed quickstart job in which rank ``config["fault_rank"]`` calls ``fault()`` while it computes
    update ``step`` (``job.stop.heartbeat``: the updates done so far) in the attempts listed in
    ``config["fault_attempts"]`` (every attempt when absent)."""
    config = dict(job.config)
    delay = float(config.pop("step_delay_s", 0.0))
    rank = int(config.pop("fault_rank", 1))
    attempts = config.pop("fault_attempts", None)
    job.config = config
    armed = job.rank == rank and (attempts is None or job.attempt in attempts)

    def step_function(model, batch):
        time.sleep(delay)
        heartbeat = job.stop.heartbeat
        if armed and model.training and heartbeat.phase == "training" and heartbeat.step == step - 1:
            fault()
        return quickstart.step(model, batch)

    return quickstart.run(job, step_function)


def raises_at_step_7(job: Any) -> Any:
    """Rank 1 raises while computing update 7 (in the attempts ``fault_attempts`` names)."""
    def fault() -> None:
        raise RuntimeError("the loss is NaN at step 7")

    return _fails_at(job, 7, fault)


def sleeps_at_step_7(job: Any) -> Any:
    """Rank 1 sleeps for good while computing update 7 (a hung rank; the others wait in its collective)."""
    def fault() -> None:
        while True:
            time.sleep(3600)

    return _fails_at(job, 7, fault)


def slow_evaluation(job: Any) -> Any:
    """The quickstart job whose evaluation batches take ``eval_delay_s`` (popped from the config) each: an
    evaluation of several batches lasts longer than a hang timeout shorter than it, while each batch does not."""
    config = dict(job.config)
    delay = float(config.pop("eval_delay_s", 0.0))
    job.config = config

    def step(model, batch):
        if not model.training:
            time.sleep(delay)
        return quickstart.step(model, batch)

    return quickstart.run(job, step)


def raises_then_sleeps_at_step_7(job: Any) -> Any:
    """Rank 1 raises at step 7 in attempt 1 and sleeps for good at step 7 in attempt 2 (``fault_attempts``)."""
    def fault() -> None:
        if job.attempt == 1:
            raise RuntimeError("the loss is NaN at step 7")
        while True:
            time.sleep(3600)

    return _fails_at(job, 7, fault)



def raises_before_the_group_forms(job: Any) -> Any:
    """Rank ``config["fault_rank"]`` raises before ``Accelerator()`` in every attempt: the other ranks wait for it
    in the process group's rendezvous (torch's default timeout: 30 minutes), never learning that it is gone."""
    config = dict(job.config)
    rank = int(config.pop("fault_rank", 1))
    job.config = config
    if job.rank == rank:
        raise RuntimeError(f"rank {rank} cannot read its data")
    return slow_quickstart(job)


def exits_at_step_7(job: Any) -> Any:
    """Rank ``fault_rank`` calls ``sys.exit(3)`` while computing update 7 (in the attempts ``fault_attempts`` names)."""
    import sys

    def fault() -> None:
        sys.exit(3)

    return _fails_at(job, 7, fault)


def raises_at_its_second_update(job: Any) -> Any:
    """The slowed quickstart job that raises ``RuntimeError("attempt A fails")`` while computing the second update of
    each attempt ``config["fault_attempts"]`` names: a failure after an update boundary that never repeats the
    previous attempt's (its message names the attempt), so only ``requeue.max_failures`` decides its retry."""
    config = dict(job.config)
    delay = float(config.pop("step_delay_s", 0.0))
    attempts = config.pop("fault_attempts", None)
    job.config = config
    armed = attempts is None or job.attempt in attempts
    first: list[int] = []

    def step_function(model, batch):
        time.sleep(delay)
        heartbeat = job.stop.heartbeat
        if armed and model.training and heartbeat.phase == "training":
            if not first:
                first.append(heartbeat.step)  # the boundary this attempt started from
            if heartbeat.step == first[0] + 1:
                raise RuntimeError(f"attempt {job.attempt} fails")
        return quickstart.step(model, batch)

    return quickstart.run(job, step_function)


def slow_but_healthy(job: Any) -> Any:
    """The quickstart job with every slow part a healthy run has, each chosen by the config (popped): a step of
    ``step_delay_s`` per batch; rank 1 starting ``late_start_s`` after the others (before the process group
    forms, which holds them in its rendezvous); the first step of each epoch and the first evaluation batch
    ``first_factor`` times a step (``accumulation`` batches); ``after_train_s`` of work after ``train()``
    returned, which then leaves ``after-train-<rank>`` in the run directory. Needs ``train_samples`` to give
    every rank whole batches of 16 (the epoch's first batch is told by counting)."""
    config = dict(job.config)
    delay = float(config.pop("step_delay_s"))
    late_start_s = float(config.pop("late_start_s", 0.0))
    first_factor = float(config.pop("first_factor", 1.0))
    after_train_s = float(config.pop("after_train_s", 0.0))
    job.config = config
    settings = {**quickstart.DEFAULTS, **config}
    step_s = delay * settings["accumulation"]
    batches_per_epoch = settings["train_samples"] // settings["batch_size"] // job.world_size
    calls = {"train": 0, "last_training": False}

    def step(model, batch):
        first = (calls["train"] % batches_per_epoch == 0) if model.training else calls["last_training"]
        time.sleep(delay + (first_factor - 1) * step_s * first)
        calls["train"] += model.training
        calls["last_training"] = model.training
        return quickstart.step(model, batch)

    if job.rank == 1:
        time.sleep(late_start_s)
    state = quickstart.run(job, step)
    time.sleep(after_train_s)  # an upload, a test pass
    (job.run_dir / f"after-train-{job.rank}").write_text("done\n")
    return state
