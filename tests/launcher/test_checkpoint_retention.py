"""The quickstart job keeps a bounded number of checkpoints: its spec asks for the newest 3, and its
entrypoint hands that to the engine (one process, CPU, a checkpoint each epoch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from launching import REPOSITORY, launch_environment

QUICKSTART_SPEC = REPOSITORY / "examples" / "quickstart" / "job.yaml"

RUN = """
import json, sys
from pathlib import Path
from elfes.engine import StopRequest
from elfes.launcher.job.runtime import Job
from examples.quickstart.job import main
run_dir = Path(sys.argv[1])
config = {**json.loads(sys.argv[2]), "epochs": 6, "train_samples": 64, "validation_samples": 16}
main(Job(config=config, run_dir=run_dir, checkpoint_dir=run_dir / "checkpoints", resume_from=None,
         stop=StopRequest(), attempt=1, rank=0, local_rank=0, world_size=1))
"""


def test_the_quickstart_spec_keeps_the_newest_three_checkpoints(tmp_path: Path):
    config = yaml.safe_load(QUICKSTART_SPEC.read_text())["config"]
    assert config["keep_checkpoints"] == 3
    environment = {**launch_environment(), "ACCELERATE_USE_CPU": "1"}
    completed = subprocess.run([sys.executable, "-c", RUN, str(tmp_path), json.dumps(config)], cwd=REPOSITORY,
                               env=environment, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    checkpoints = tmp_path / "checkpoints"
    kept = sorted(path.name for path in checkpoints.iterdir() if not path.is_symlink())
    written = {json.loads(line)["path"] for line in (tmp_path / "events.jsonl").read_text().splitlines()
               if json.loads(line)["event"] == "checkpoint"}
    assert len(written) == 6 and len(kept) == 3, (sorted(written), kept)
    assert (checkpoints / "last").resolve().name == kept[-1]
