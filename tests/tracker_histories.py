"""Read back what the tracker mirrors sent, from the trackers themselves: an MLflow run's metric histories
through MlflowClient, and a W&B run's history, summary and ends from the SDK's offline transaction logs
(``run-<id>.wandb``).

wandb 0.31 has no Python reader of its transaction log left (its core is a Go binary), so
:func:`wandb_offline_history` reads the log's record framing (a 7-byte header, 32 KiB blocks, records of
crc32, length, type, possibly split over blocks) and parses each record with the SDK's own protobuf
(``wandb.proto.wandb_internal_pb2.Record``)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

History = dict[str, list[tuple[int, float]]]  # metric -> (step, value) in the order the tracker holds them

# Metrics whose values differ between two runs of the same training: left out of comparisons.
NONDETERMINISTIC = ("train/samples_per_second",)

_HEADER_SIZE = 7
_BLOCK_SIZE = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def deterministic(history: History) -> History:
    return {key: rows for key, rows in history.items() if key not in NONDETERMINISTIC}


def mlflow_history(tracking_uri: str, run_id: str) -> History:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    history = {}
    for key in sorted(run.data.metrics):
        rows = sorted(client.get_metric_history(run_id, key), key=lambda metric: (metric.step, metric.timestamp))
        history[key] = [(metric.step, metric.value) for metric in rows]
    return history


def _records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    records, pending, position = [], b"", _HEADER_SIZE
    while position + 7 <= len(data):
        room = _BLOCK_SIZE - position % _BLOCK_SIZE
        if room < 7:  # the block's tail is padding
            position += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if kind == 0 and length == 0:
            break
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            records.append(pending + chunk)
    return records


def _parsed(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    records = []
    for raw in _records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        records.append(record)
    return records


def wandb_offline_records(wandb_root: Path, run_id: str) -> list:
    """Every record of the W&B run ``run_id`` in the offline runs under ``wandb_root``, oldest run first (each
    offline folder is named by the time its ``wandb.init`` began), as W&B would receive them on `wandb sync`.
    Read as the logs are: the sink tears W&B's service down when it closes, which writes each log out whole."""
    files = sorted(wandb_root.glob(f"**/run-{run_id}.wandb"), key=lambda path: path.parent.name)
    assert files, f"no offline run {run_id} under {wandb_root}"
    return [record for path in files for record in _parsed(path)]


def wandb_offline_ends(wandb_root: Path, run_id: str) -> list[tuple[bool, int]]:
    """Each ``finish`` of the W&B run, in order: (marked preempting before it, its exit code)."""
    ends, preempting = [], False
    for record in wandb_offline_records(wandb_root, run_id):
        kind = record.WhichOneof("record_type")
        if kind == "preempting":
            preempting = True
        elif kind == "exit":
            ends.append((preempting, record.exit.exit_code))
            preempting = False
    return ends


def wandb_offline_summary(wandb_root: Path, run_id: str) -> dict:
    """The W&B run's summary as its updates leave it (the last value of each key)."""
    return _wandb_offline_updates(wandb_root, run_id, "summary")


def wandb_offline_config(wandb_root: Path, run_id: str) -> dict:
    """The W&B run's config as its updates leave it (the last value of each top-level key)."""
    return _wandb_offline_updates(wandb_root, run_id, "config")


def _wandb_offline_updates(wandb_root: Path, run_id: str, kind: str) -> dict:
    """The last value of each key the run's ``kind`` records ("summary" or "config") updated."""
    values = {}
    for record in wandb_offline_records(wandb_root, run_id):
        if record.WhichOneof("record_type") == kind:
            for item in getattr(record, kind).update:
                values[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return values


def wandb_offline_history(wandb_root: Path, run_id: str) -> History:
    """Every history row of the W&B run ``run_id`` in the offline runs under ``wandb_root``, oldest run first,
    as W&B would receive them on `wandb sync` (``_step`` is the step)."""
    history: History = {}
    for record in wandb_offline_records(wandb_root, run_id):
        if record.WhichOneof("record_type") != "history":
            continue
        values = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        step = values.pop("_step")
        for key, value in values.items():
            if not key.startswith("_"):
                history.setdefault(key, []).append((int(step), float(value)))
    return dict(sorted(history.items()))
