#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): bf16 matmul peak; MFU of a Qwen2.5-0.5B-shape PAR training step averaged
# over the training depths; peak memory of a step vs par_ray.planner; evaluation time per 1,024 sequences at d = 512
# (from a timed share) and its memory; halting evaluation's memory; an optional one-rank FSDP2 step. Needs only
# torch + transformers + this working tree (random-init weights; no Ray, DeepSpeed, MLflow, polars, no download).
#
#   OUT=/some/dir benchmarks/gpu_check.sh            # GPU: writes $OUT/gpu_check.json (default OUT: ./gpu_check_out)
#   benchmarks/gpu_check.sh --dry-run                # CPU, tiny shapes, same JSON
#   benchmarks/gpu_check.sh --skip fsdp2             # leave sections out
#
# Hard limit: 7 min 30 s in all (the Python side budgets 380 s for its sections, whose alarms sum to 355 s, then TERM
# at 450 s, KILL 15 s later); the JSON is rewritten after every section, so a killed run keeps what it measured.
# Exit status: 0 when every section that ran passed, 1 when one failed, 3 when a GPU run finds no CUDA (never a
# quiet CPU run), 124/143 when the limit cut it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout --signal=TERM --kill-after=15 450 "$PYTHON" benchmarks/gpu_check.py --out "$OUT/gpu_check.json" "$@"
rc=$?
echo "gpu_check.sh: exit $rc; results in $OUT/gpu_check.json"
exit $rc
