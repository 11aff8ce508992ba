"""Whether a SLURM job that leaves some nodes out (``requeue.exclude_failed_nodes``) can still be placed.

SLURM does not refuse a requeued job whose ``ExcNodeList`` leaves its partition too few nodes: the job
stays PENDING (``BadConstraints``) for good. So before a requeue that excludes nodes, the job compares
the nodes its partition has (``sinfo``, through launcher/slurm) with those it needs and those the run
excludes; when too few would remain, it leaves nothing out and says so, instead of requeueing into a wait
that never ends.
(``sbatch --exclude`` with too few nodes left is refused at once: "Requested node configuration is not
available".) Torch-free.

>>> placement_problem(needed=2, partition="low", nodes=("node1", "node2"), excluded=("node2",))
'the requeued job cannot be placed without node2: partition low has 2 nodes (node1, node2) ...'
"""

from __future__ import annotations

from collections.abc import Sequence


def placement_problem(*, needed: int, partition: str | None, nodes: Sequence[str],
                      excluded: Sequence[str], job: str = "the requeued job",
                      placed: str = "it is requeued onto them all") -> str | None:
    """Why a job that needs ``needed`` nodes of ``partition`` (whose nodes are ``nodes``) cannot be placed once
    ``excluded`` are left out; None when enough remain. ``job`` names it and ``placed`` says where it goes
    instead (a sweep's job array is submitted, not requeued)."""
    left = [node for node in nodes if node not in set(excluded)]
    if len(left) >= needed:
        return None
    where = f"partition {partition}" if partition else "the cluster"
    return (f"{job} cannot be placed without {', '.join(excluded)}: {where} has {len(nodes)} "
            f"node{'s' if len(nodes) != 1 else ''} ({', '.join(nodes)}) and the job needs {needed} (resources.nodes), "
            f"so no node is left out (requeue.exclude_failed_nodes) and {placed}; if a node is "
            "bad, drain it (scontrol update NodeName=NODE State=DRAIN Reason=...) or add nodes to the partition")
