"""Hostile spec values against real sbatch: each quoted value is read back by sbatch exactly as given
(and as tests/launcher/hostile.py's model of sbatch reads it); a job whose comment, workdir, run
directory and environment are hostile runs with its time limit, requeue, output and memory intact and
no injected command; and the cluster is asked before anything is created: a partition, account or QOS
it does not have is refused by name, with what it has."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cluster import SlurmCluster, wait_for

from elfes.launcher.submit.scripts import sbatch_quote
from tests.launcher.hostile import HOSTILE, sbatch_arguments

ELFES = str(Path(sys.executable).with_name("elfes"))
# One value that tries everything at once: quotes, substitutions, a directive, a comment, escapes.
COMPOSITE = "it's \"q\" $(touch pwned-1) `touch pwned-2` ; touch pwned-3 #SBATCH --time=1 \\ \\' ${HOME}"
RECORD = "import json, os, sys; json.dump(dict(cwd=os.getcwd(), hostile=os.environ['HOSTILE']), open(sys.argv[1], 'w'))"


def elfes(slurm: SlurmCluster, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([ELFES, *argv], cwd=cwd, env=slurm.env, capture_output=True, text=True, timeout=120)


def write_spec(folder: Path, name: str = "hostile", **fields: object) -> Path:
    spec = {"name": name, "command": ["{python}", "-c", RECORD, "{run_dir}/seen.json"], "run_dir": "run",
            "resources": {"tasks_per_node": 1, "timeout_min": 10, "mem_gb": 0.5}, "requeue": {"max_requeues": 1},
            **fields}
    spec.setdefault("slurm", {})["signal_delay_s"] = 60
    path = folder / "job.yaml"
    path.write_text(json.dumps(spec))
    return path


def job_fields(slurm: SlurmCluster, job_id: str) -> dict[str, str]:
    """``scontrol show job``'s ``Key=Value`` fields (values without spaces are the ones read here)."""
    shown = slurm.run("scontrol", "show", "job", job_id).stdout
    return dict(field.split("=", 1) for field in shown.split() if "=" in field)


def queued_comment(slurm: SlurmCluster, job_id: str) -> str:
    return slurm.run("squeue", "--states=all", "-h", "-j", job_id, "-O", "Comment:|").stdout.rstrip("\n")[:-1]


def test_sbatch_reads_each_quoted_value_back_as_given(slurm: SlurmCluster, tmp_path: Path):
    for index, value in enumerate(HOSTILE):
        script = tmp_path / f"job-{index}.sbatch"
        script.write_text(f"#!/bin/bash\n#SBATCH --comment={sbatch_quote(value)}\n#SBATCH --time=5\n"
                          f"#SBATCH --output={tmp_path}/out-%j\n#SBATCH --hold\ntrue\n")
        assert sbatch_arguments(script.read_text())[0] == f"--comment={value}"
        job_id = slurm.run("sbatch", "--parsable", str(script)).stdout.strip()
        assert queued_comment(slurm, job_id) == value
        assert job_fields(slurm, job_id)["TimeLimit"] == "00:05:00"
        slurm.run("scancel", job_id)
    assert not list(tmp_path.rglob("pwned*"))


def test_a_job_with_hostile_values_runs_with_its_directives_intact(slurm: SlurmCluster, tmp_path: Path):
    workdir = tmp_path / "work 'q' \"d\" $(touch pwned-4) `touch pwned-5` #SBATCH --time=1 \\ x"
    run_dir = tmp_path / "runs ; touch pwned-6 'r' # x" / "run"
    workdir.mkdir()
    spec = write_spec(tmp_path, workdir=str(workdir), run_dir=str(run_dir), env={"HOSTILE": COMPOSITE},
                      slurm={"partition": "low", "additional": {"comment": COMPOSITE}})
    dry_run = elfes(slurm, "submit", str(spec), "--dry-run", cwd=tmp_path)
    assert dry_run.returncode == 0, dry_run.stderr
    (tmp_path / "dry-run.sbatch").write_text(dry_run.stdout)
    tested = slurm.run("sbatch", "--test-only", str(tmp_path / "dry-run.sbatch"), check=False, cwd=tmp_path)
    assert tested.returncode == 0, tested.stderr

    submitted = elfes(slurm, "submit", str(spec), cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads((run_dir / "state.json").read_text())["job_id"]
    wait_for(lambda: (run_dir / "seen.json").is_file(), timeout_s=90, what="the job's command to run")

    fields = job_fields(slurm, job_id)
    assert (fields["TimeLimit"], fields["Requeue"], fields["MinMemoryNode"]) == ("00:10:00", "1", "512M")
    assert fields["Partition"] == "low"
    assert queued_comment(slurm, job_id) == COMPOSITE
    shown = slurm.run("scontrol", "show", "job", job_id).stdout
    snapshot = run_dir / "code" / "1"  # the job runs in its code snapshot, a copy of workdir
    assert f"WorkDir={snapshot}\n" in shown and f"StdOut={run_dir / 'submitit' / job_id}_0_log.out\n" in shown
    assert json.loads((run_dir / "seen.json").read_text()) == {"cwd": str(snapshot), "hostile": COMPOSITE}
    assert json.loads((run_dir / "code.json").read_text())["source"] == str(workdir)
    assert not list(tmp_path.rglob("pwned*")) and not list(workdir.parent.rglob("pwned*"))


def test_a_partition_account_or_qos_the_cluster_lacks_is_refused_before_anything_is_created(
    slurm: SlurmCluster, tmp_path: Path
):
    cases = {
        "partition": ({"partition": "nosuch"},
                      'slurm.partition = "nosuch": no partition "nosuch" on this cluster; its partitions are low '
                      "(the default), high, shared."),
        "partitions": ({"partition": "high,nosuch"}, 'no partition "nosuch" on this cluster'),
        "account": ({"account": "nobody"},
                    'slurm.account = "nobody": not an account of user root on this cluster (sacctmgr lists root).'),
        "qos": ({"qos": "fast"}, 'slurm.qos = "fast": no such QOS on this cluster (sacctmgr lists normal).'),
    }
    for name, (options, needle) in cases.items():
        spec = write_spec(tmp_path, name="lacking", slurm=options)
        for argv in (["validate", str(spec), "--executor", "slurm"], ["submit", str(spec)],
                     ["submit", str(spec), "--executor", "slurm", "--dry-run"]):
            completed = elfes(slurm, *argv, cwd=tmp_path)
            assert completed.returncode == 2, (name, argv, completed.stderr)
            assert needle in completed.stderr, (name, argv, completed.stderr)
            assert sorted(path.name for path in tmp_path.iterdir()) == ["job.yaml"], (name, argv)
    assert slurm.run("squeue", "--states=all", "-h", "--name=lacking").stdout.strip() == ""

    accepted = elfes(slurm, "validate", str(write_spec(tmp_path, slurm={"partition": "high", "account": "root",
                                                                          "qos": "normal"})), cwd=tmp_path)
    assert accepted.returncode == 0, accepted.stderr
