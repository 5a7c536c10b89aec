#!/usr/bin/env bash
# The first GPU's measurements (issue 15): bf16 matmul peak, PAR step throughput and MFU of random-init Qwen2.5-0.5B
# and Qwen3-0.6B retrofits, peak memory at R = 8 / 32 (window 8) vs par_ray.planner, FSDP2 and ZeRO-3 one-GPU steps,
# and a 20-step paper-preset trial through Ray Train with NCCL. Sections and JSON: benchmarks/gpu_check.py.
#
#   OUT=/some/dir benchmarks/gpu_check.sh            # writes $OUT/gpu_check.json (default OUT: ./gpu_check_out)
#   benchmarks/gpu_check.sh --dry-run                # CPU, tiny shapes, same JSON (automatic without CUDA)
#   benchmarks/gpu_check.sh --skip zero3 ray_train   # leave sections out
#
# Hard limit: 7 min 45 s in all (the Python side budgets 420 s for its sections, then TERM at 450 s, KILL 15 s later);
# the JSON is rewritten after every section, so a killed run keeps what it measured. Exit status: 0 when every
# section that ran passed, 1 when one failed, 124/143 when the limit cut it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout --signal=TERM --kill-after=15 450 "$PYTHON" benchmarks/gpu_check.py --out "$OUT/gpu_check.json" "$@"
rc=$?
echo "gpu_check.sh: exit $rc; results in $OUT/gpu_check.json"
exit $rc
