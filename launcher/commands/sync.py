"""``elfes sync``: send what a run's trackers lack, from its run directory's records (``events.jsonl``, the
lifecycle the launcher wrote), at any time and as often as wanted: each step is sent once, whoever sends it
(elfes/records/tracker_sync.py). A sweep folder syncs every member. Torch-free.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from elfes.records.tracker_sender import one_line
from elfes.records.tracker_sync import Synced, TrackerBusy, sync_tracker
from elfes.records.trackers import build_sinks

from ..job.tracker_publishing import tracker_group
from ..rundir.lookup import recorded_spec, run_paths
from ..rundir.paths import RunPaths, SweepPaths
from ..rundir.sweep_record import is_sweep_dir, load_sweep, member_paths


@dataclass(frozen=True)
class RunSync:
    """What ``elfes sync`` did for one run: what each tracker took, and why the others took nothing."""

    run_dir: str
    synced: list[Synced] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)  # tracker -> why it has not every record
    busy: set[str] = field(default_factory=set)  # trackers another sender holds: their problem says what to do
    trackers: tuple[str, ...] = ()  # the spec's trackers (none: the spec has no tracking: section)


def sync(run_dirs: Sequence[str | os.PathLike[str]]) -> list[RunSync]:
    """Sync each run directory, and every member of each sweep folder, in turn."""
    results: list[RunSync] = []
    for folder in run_dirs:
        if is_sweep_dir(folder):
            results.extend(sync_run(paths) for paths in member_paths(load_sweep(SweepPaths(Path(folder)))))
        else:
            results.append(sync_run(run_paths(folder)))
    return results


def sync_run(paths: RunPaths) -> RunSync:
    """Send what each tracker of the run's recorded spec lacks; a tracker that fails is named, the others go on."""
    spec = recorded_spec(paths)
    if spec is None or not spec.tracking.trackers:
        return RunSync(str(paths.run_dir))
    result = RunSync(str(paths.run_dir), trackers=spec.tracking.trackers)
    for sink in build_sinks(spec.tracking, paths.run_dir, group=tracker_group(paths.run_dir), sender="sync"):
        try:
            result.synced.append(sync_tracker(sink, paths.run_dir))
        except TrackerBusy as error:
            result.problems[sink.name] = str(error)
            result.busy.add(sink.name)
        except Exception as error:  # the tracker, its library or the network: the mirror's state says it too
            result.problems[sink.name] = f"{type(error).__name__}: {one_line(error)}"
    return result
