#!/usr/bin/env bash
# GPU readiness in one script, on a machine with one CUDA GPU and its own torch (under 8 minutes):
#
#   benchmarks/gpu_check.sh [RESULTS_DIR]     # default: $OUT when set, else ./gpu-check-results
#
# 1. install: the project into this Python without touching its torch (pip install --no-deps -e .),
#    then whichever of its other dependencies (and pytest) are missing, from the wheels in .whl/ when
#    that folder exists (for a machine without network), else from the index; torch is pinned to the
#    installed build throughout; with .whl/, the editable build's setuptools comes from there too. Fill
#    .whl/ elsewhere with, e.g.
#      pip download -d .whl --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#          pydantic submitit pytest "setuptools>=77"
# 2. gpu-tests: python -m pytest -m gpu -rs on the test files that hold GPU tests (the engine's CUDA
#    tests: placement, CUDA RNG, fp16/bf16 AMP and fused AdamW under pause and resume at every window
#    boundary, bitwise; torchvision's own RandomResizedCrop and RandomHorizontalFlip in DataLoader
#    workers, paused and resumed bitwise, which needs torchvision for this torch: its wheel in .whl/
#    or from the index); only those files, so that a module skipped for a missing optional package
#    (matplotlib, tensorboard) is not counted.
# 3. charlm-cuda: the charlm example on the GPU (bf16, fused AdamW) through `elfes submit`, preempted
#    with `elfes preempt`, resumed, and compared with a straight run tensor by tensor
#    (tests/examples/test_charlm.py, its cuda cases): replicated, read as documents and as a stream,
#    and its model sharded with FSDP2 over NCCL (bf16 by its MixedPrecisionPolicy), whose checkpoints
#    are folders of DCP shards, read back whole for the comparison.
# 4. loop-cuda: python -m benchmarks --only loop-cuda (ELFES against the hand loop on the GPU, bf16).
#
# A step passes when its command exits 0 and, for the tests, nothing was skipped (a skip is no pass).
# RESULTS_DIR/summary.txt lists every step's outcome and time; each step's output is in
# RESULTS_DIR/<step>.log, the benchmark's figures in RESULTS_DIR/loop-cuda.json. Exit status: 0 when
# every step passed, 1 when one failed, 3 when this machine shows no CUDA device (then only the
# install runs). PYTHON names the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
RESULTS=${1:-${OUT:-gpu-check-results}}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
SUMMARY=$RESULTS/summary.txt
# Each step's most seconds; together under 8 minutes. INSTALL_S may be raised where the machine is shared (the test
# suite runs this script beside three other workers: a pip install of the project then takes minutes, not seconds).
INSTALL_S=${INSTALL_S:-60} GPU_TESTS_S=120 CHARLM_S=210 LOOP_S=90
failed=0
: >"$SUMMARY"

note() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME SECONDS COMMAND...: run it time-boxed, its output in NAME.log, its outcome in the summary.
step() {
    local name=$1 seconds=$2 started=$SECONDS status
    shift 2
    echo "gpu_check: $name: $*" >&2
    timeout --signal=TERM --kill-after=15 "$seconds" "$@" >"$RESULTS/$name.log" 2>&1
    status=$?
    local outcome=PASS
    if ((status == 124 || status == 137)); then
        outcome="FAIL (timed out after $seconds s)"
    elif ((status != 0)); then
        outcome="FAIL (exit $status)"
    elif grep -Eq '^=+ .*[0-9]+ skipped' "$RESULTS/$name.log"; then
        outcome="FAIL (tests skipped; reasons in $name.log)"
    fi
    [[ $outcome == PASS ]] || failed=1
    note "$(printf '%-12s %-45s %4d s  %s' "$name" "$outcome" $((SECONDS - started)) "$name.log")"
    [[ $outcome == PASS ]] || tail -n 30 "$RESULTS/$name.log" >&2
}

install() {
    export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1  # this machine's Python is the target
    local constraints
    constraints=$(mktemp) || return 1
    "$PYTHON" -c "import torch; print(f'torch=={torch.__version__}')" >"$constraints" || {
        echo "gpu_check: $PYTHON has no torch; this check uses the machine's own torch build"; return 1; }
    echo "keeping $(cat "$constraints")"
    if [[ -d .whl ]]; then
        "$PYTHON" -m pip install --no-deps --no-index --find-links .whl -e . || return 1
    else
        "$PYTHON" -m pip install --no-deps -e . || return 1
    fi
    local missing
    missing=$("$PYTHON" - <<'EOF'
import importlib.metadata as metadata
import re

import torch

wanted = [r for r in metadata.requires("elfes") or [] if "extra ==" not in r] + ["pytest>=8"]
if torch.cuda.is_available():  # torchvision's wheels are built against the CUDA torch only
    wanted.append("torchvision")
for requirement in wanted:
    name = re.match(r"[A-Za-z0-9_.-]+", requirement)[0]
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        print(requirement)
EOF
) || return 1
    if [[ -z $missing ]]; then
        echo "every dependency is installed"
    elif [[ -d .whl ]]; then
        echo "from .whl/: $missing"
        # shellcheck disable=SC2086  # one requirement per word
        "$PYTHON" -m pip install --no-index --find-links .whl -c "$constraints" $missing || return 1
    else
        echo "from the index: $missing"
        # shellcheck disable=SC2086
        "$PYTHON" -m pip install -c "$constraints" $missing || return 1
    fi
    "$PYTHON" -c "import elfes.engine, elfes.launcher.cli, pydantic, submitit, pytest; print('the project imports')"
}

note "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
note "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi: none')"
export PYTHON
export -f install
step install "$INSTALL_S" bash -c install
if ((failed)); then
    note "the install failed: nothing else was run"
    exit 1
fi
note "$("$PYTHON" -c "import sys, torch; print(f'Python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, devices {torch.cuda.device_count()}')")"
if ! "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    note "no CUDA device: torch sees no GPU here; gpu-tests, charlm-cuda and loop-cuda need one (not run)"
    exit 3
fi

mapfile -t gpu_test_files < <(grep -rl --include='test_*.py' 'mark\.gpu' tests | grep -v '^tests/examples/test_charlm\.py$' | sort)
step gpu-tests "$GPU_TESTS_S" "$PYTHON" -m pytest -m gpu -rs -p no:cacheprovider "${gpu_test_files[@]}"
step charlm-cuda "$CHARLM_S" "$PYTHON" -m pytest -m gpu -rs -p no:cacheprovider tests/examples/test_charlm.py
step loop-cuda "$LOOP_S" "$PYTHON" -m benchmarks --only loop-cuda --rounds 3 --json "$RESULTS/loop-cuda.json"
grep -A 12 'ELFES benchmarks' "$RESULTS/loop-cuda.log" >>"$SUMMARY" 2>/dev/null

note "$( ((failed)) && echo 'gpu_check: FAILED (see above)' || echo 'gpu_check: every step passed')"
exit "$failed"
