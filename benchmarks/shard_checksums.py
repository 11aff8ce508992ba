"""What checking a sharded checkpoint's checksums costs: one folder read whole in one process by DCP's own
reader, and by ELFES's :class:`~elfes.engine.dcp_reader.SafeReader` (which reads each entry, checks its records'
CRC-32s, then lets torch load it), in interleaved rounds, from the page cache (a cold disk adds the same read
time to both); wall and CPU seconds (this process), the CPU's less disturbed by a loaded machine.

    python -m benchmarks.shard_checksums --megabytes 256 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from elfes.engine.dcp_reader import SafeReader

ENTRIES = 16  # tensors in the folder, of equal size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shard_checksums", description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256, help="the folder's size (default 256)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    arguments = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    tensors = {f"model.layer{i}": torch.randn(arguments.megabytes * 2**20 // 4 // ENTRIES) for i in range(ENTRIES)}
    seconds: dict[str, list[tuple[float, float]]] = {"DCP's reader": [], "SafeReader (checksums checked)": []}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "checkpoint.dcp"
        dcp.save(tensors, storage_writer=FileSystemWriter(folder), no_dist=True)
        for _ in range(arguments.rounds):
            for name, reader in zip(seconds, (FileSystemReader, SafeReader)):
                target = {key: torch.empty_like(tensor) for key, tensor in tensors.items()}
                wall, cpu = time.perf_counter(), time.process_time()
                dcp.load(target, storage_reader=reader(folder), no_dist=True)
                seconds[name].append((time.perf_counter() - wall, time.process_time() - cpu))
                assert all(torch.equal(target[key], tensors[key]) for key in tensors)
    gigabytes = arguments.megabytes / 1024
    print(f"| {arguments.megabytes} MB, {ENTRIES} tensors | DCP's reader | SafeReader | added | added per GB |\n"
          "|---|---|---|---|---|")
    for column, measure in enumerate(("wall", "CPU")):
        plain, checked = (statistics.median(sample[column] for sample in samples) for samples in seconds.values())
        print(f"| {measure} | {plain:.3f} s | {checked:.3f} s | {checked - plain:+.3f} s ({(checked / plain - 1) * 100:+.0f}%) "
              f"| {(checked - plain) / gigabytes:+.2f} s |")
    print(f"(medians of {arguments.rounds} interleaved rounds)")

if __name__ == "__main__":
    main()
