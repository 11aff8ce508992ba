"""SIGKILL at random moments, checkpoint writes included: every run resumes from `last` and ends bitwise equal."""

from __future__ import annotations

import multiprocessing
import random

import pytest
import torch
from workloads import assert_bitwise_equal

from elfes.engine.checkpoint import read_checkpoint

TRIALS = 24
SEED = 20261130


@pytest.fixture(scope="module")
def forkserver():
    # Children fork from a server that imported torch but never ran an op: fast, fresh, fork-safe.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch._dynamo", "accelerate", "workloads", "kill_harness"])
    return context


@pytest.fixture(scope="module")
def reference(forkserver, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The snapshot of a launch never killed, with synchronous checkpoints: once for every test here."""
    folder = tmp_path_factory.mktemp("reference")
    assert run_launch(forkserver, folder / "run", None, folder / "reference.pt") == 0
    return torch.load(folder / "reference.pt", weights_only=True)


def run_launch(context, directory, kill, output, asynchronous: bool = False) -> int:
    import kill_harness

    process = context.Process(target=kill_harness.launch, args=(str(directory), kill, str(output), asynchronous))
    process.start()
    process.join(timeout=120)
    if process.exitcode is None:
        process.kill()
        process.join()
        pytest.fail(f"a training launch with kill point {kill} hung and was killed")
    return process.exitcode


def random_kill(rng: random.Random) -> tuple:
    kind = rng.choice(["call", "call", "write", "replace"])
    if kind == "call":
        return ("call", rng.randint(1, 20))
    if kind == "write":
        return ("write", rng.randint(1, 8))
    return ("replace", rng.randint(1, 16), rng.choice(["before", "after"]))


def test_sigkill_at_random_moments_always_resumes_bitwise(forkserver, reference, tmp_path):
    expected = reference

    rng = random.Random(SEED)
    kinds_that_landed = set()
    for trial in range(TRIALS):
        directory = tmp_path / f"trial-{trial}"
        kills = [random_kill(rng) for _ in range(rng.randint(1, 2))]
        for kill in kills:
            exitcode = run_launch(forkserver, directory, kill, tmp_path / "unused.pt")
            if exitcode == -9:
                kinds_that_landed.add(kill[0])
            else:
                # The kill point lay beyond the end of the run; the launch simply finished.
                assert exitcode == 0, f"trial {trial}: launch with kill {kill} failed with {exitcode}"
            last = directory / "last"
            if last.exists():
                read_checkpoint(last)  # `last` always names a complete, loadable checkpoint
        output = tmp_path / f"trial-{trial}.pt"
        assert run_launch(forkserver, directory, None, output) == 0, f"trial {trial} (kills {kills}) did not finish"
        assert_bitwise_equal(expected, torch.load(output, weights_only=True), f"trial {trial}, kills {kills}")
        assert not list(directory.glob(".tmp-*")), "a finished run leaves no temporary files"
    assert kinds_that_landed == {"call", "write", "replace"}, f"seed {SEED} exercised only {kinds_that_landed}"


ASYNCHRONOUS_TRIALS = 16


def random_asynchronous_kill(rng: random.Random) -> tuple:
    return ("overlap", rng.randint(1, 7)) if rng.random() < 0.4 else random_kill(rng)


def test_sigkill_with_background_writes_in_flight_always_resumes_bitwise_like_the_synchronous_run(forkserver, reference, tmp_path):
    """Interval checkpoints written in the background: a kill mid-file, mid-rename, mid-microbatch, or
    half-way through a file while training goes on never leaves `last` unloadable, and every run ends
    bitwise equal to the uninterrupted synchronous one."""
    expected = reference

    rng = random.Random(SEED + 1)
    kinds_that_landed = set()
    for trial in range(ASYNCHRONOUS_TRIALS):
        directory = tmp_path / f"trial-{trial}"
        kills = [random_asynchronous_kill(rng) for _ in range(rng.randint(1, 2))]
        for kill in kills:
            exitcode = run_launch(forkserver, directory, kill, tmp_path / "unused.pt", asynchronous=True)
            if exitcode == -9:
                kinds_that_landed.add(kill[0])
            else:
                assert exitcode == 0, f"trial {trial}: launch with kill {kill} failed with {exitcode}"
            last = directory / "last"
            if last.exists():
                read_checkpoint(last)
        output = tmp_path / f"trial-{trial}.pt"
        assert run_launch(forkserver, directory, None, output, asynchronous=True) == 0, f"trial {trial} (kills {kills}) did not finish"
        assert_bitwise_equal(expected, torch.load(output, weights_only=True), f"trial {trial}, kills {kills}")
        assert not list(directory.glob(".tmp-*")), "a finished run leaves no temporary files"
    assert kinds_that_landed == {"call", "write", "replace", "overlap"}, f"seed {SEED + 1} exercised only {kinds_that_landed}"
    assert list(tmp_path.glob("trial-*.overlapped")), "no kill landed while training and a background write overlapped"


@pytest.mark.parametrize("asynchronous", [False, True], ids=["synchronous", "asynchronous"])
def test_a_kill_between_publishing_the_first_file_and_pointing_last_resumes_from_that_file(forkserver, reference, tmp_path, asynchronous):
    directory = tmp_path / "run"
    # os.replace calls: the directory's write probe, then the first checkpoint file, then `last`.
    assert run_launch(forkserver, directory, ("replace", 2, "after"), tmp_path / "unused.pt", asynchronous) == -9
    published = sorted(path.name for path in directory.glob("step-*.pt"))
    assert len(published) == 1 and not (directory / "last").is_symlink(), "killed after the file, before `last`"
    output = tmp_path / "resumed.pt"
    assert run_launch(forkserver, directory, None, output, asynchronous) == 0
    assert_bitwise_equal(reference, torch.load(output, weights_only=True), "resumed")
    assert (directory / "last").resolve().name != published[0]  # the run went on and re-pointed `last`
