"""Launches of a rank script on real gloo ranks, each rank forked from one process that imported everything once.

    python forked_ranks.py SCRIPT

reads a launch request per line of its standard input, ``{"ranks": 2, "launches": [[ARGUMENT, ...], ...]}``
(the launches of a line run at once), and answers each with a line: per launch, the exit status of each rank
and the ranks' output. Each rank runs SCRIPT as ``__main__`` with torchrun's environment
(RANK, WORLD_SIZE, MASTER_ADDR, ...) and ends as a rank that torchrun started would: through the interpreter's
shutdown, or its own ``os._exit``, or a signal. As torchrun does, a launch whose rank fails has its other ranks
sent SIGTERM (and SIGKILL if they are still there 30 s later). A torchrun launch costs an interpreter's imports per rank and for the agent; this costs them once.

:class:`ForkedRanks` runs this script and sends it the requests.
"""

from __future__ import annotations

import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ANSWER_TIMEOUT_S = 600.0  # a launch on a loaded machine may take minutes; one that hangs fails the test
TERM_GRACE_S = 30.0  # how long a rank sent SIGTERM (another rank of its launch failed) has to end


class ForkedRanks:
    """``launch(*launches, ranks=2)``: the (exit status per rank, output) of each launch (a list of arguments of SCRIPT),
    run at once on ``ranks`` ranks each by a ``forked_ranks.py SCRIPT`` process started once."""

    def __init__(self, script: Path, environment: dict[str, str]) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, str(script)], env=environment,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)

    def launch(self, *launches: list[str], ranks: int = 2) -> list[tuple[list[int], str]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"ranks": ranks, "launches": launches}) + "\n")
        self.process.stdin.flush()
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(ANSWER_TIMEOUT_S):
                os.killpg(self.process.pid, signal.SIGKILL)
                raise TimeoutError(f"no answer within {ANSWER_TIMEOUT_S} s to the launches {launches}")
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"forked_ranks.py ended (status {self.process.wait()}) before answering {launches}")
        return [(statuses, output) for statuses, output in json.loads(answer)]

    def close(self) -> None:
        """Let the process end; kill it and any rank it still runs (in its session's process group) if it does not."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_rank(script: str, arguments: list[str], rank: int, ranks: int, port: int, log: Path) -> int:
    """Fork a rank; the child runs ``script`` and never returns from here (it leaves by SystemExit)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(ranks),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.argv = [script, *arguments]
    runpy.run_path(script, run_name="__main__")
    raise SystemExit(0)  # up through the top level: the interpreter shuts down as a launched rank's does


def run_launches(script: str, ranks: int, launches: list[list[str]], folder: Path) -> list[tuple[list[int], str]]:
    """Run ``launches`` at once; per launch, the exit status of each rank and their output."""
    rank_of: dict[int, tuple[int, int, Path]] = {}  # pid: (launch, rank, log)
    for launch, arguments in enumerate(launches):
        port = free_port()
        for rank in range(ranks):
            log = folder / f"launch{launch}.rank{rank}.log"
            rank_of[start_rank(script, arguments, rank, ranks, port, log)] = (launch, rank, log)
    statuses = [[0] * ranks for _ in launches]
    running, deadlines = set(rank_of), {}  # deadlines: pid -> when a rank sent SIGTERM is killed
    while running:
        pid, wait_status = os.waitpid(-1, os.WNOHANG if deadlines else 0)
        if pid == 0:
            for late in [pid for pid, deadline in deadlines.items() if time.monotonic() > deadline]:
                os.kill(late, signal.SIGKILL)
                del deadlines[late]
            time.sleep(0.05)  # polling interval while ranks sent SIGTERM end
            continue
        running.discard(pid)
        deadlines.pop(pid, None)
        launch, rank, _ = rank_of[pid]
        statuses[launch][rank] = os.waitstatus_to_exitcode(wait_status)
        if statuses[launch][rank] != 0:  # as torchrun does when a rank fails: SIGTERM the others, SIGKILL later
            for other in running - deadlines.keys():
                if rank_of[other][0] == launch:
                    os.kill(other, signal.SIGTERM)
                    deadlines[other] = time.monotonic() + TERM_GRACE_S
    outputs = ["".join(log.read_text(errors="replace") for each, _, log in rank_of.values() if each == launch)
               for launch in range(len(launches))]
    return list(zip(statuses, outputs, strict=True))


def serve(script: str) -> None:
    # The script's imports (torch, Accelerate, the engine), once: its ranks re-run it as __main__ on top of them.
    runpy.run_path(script, run_name="__forked_ranks_preload__")
    # ... but not the modules beside it: the cases read RANK and WORLD_SIZE when imported, so each rank imports them.
    for name, module in list(sys.modules.items()):
        if Path(getattr(module, "__file__", None) or "/").resolve().parent == Path(script).resolve().parent:
            del sys.modules[name]
    # torch's optimizers and DDP import torch._dynamo when first used (over 2 s of CPU): once here, not per rank.
    import torch._dynamo  # noqa: F401
    # A fork of a process with threads may freeze (a runtime lock held by another thread): none may run here.
    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        raise SystemExit(f"forked_ranks.py: threads run before the ranks are forked: {os.listdir('/proc/self/task')}")
    # No `with` or `finally` around the forks: a rank leaves through this stack and must not run their exits.
    folder = Path(tempfile.mkdtemp(prefix="forked-ranks-"))
    for line in sys.stdin:
        request = json.loads(line)
        answer = run_launches(script, request["ranks"], request["launches"], folder)
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    shutil.rmtree(folder)


if __name__ == "__main__":
    serve(sys.argv[1])
