#!/usr/bin/env bash
# A Python 3.12 venv that stands in for the device image on the CPU, to rehearse benchmarks/gpu_session.sh --dry-run
# with the carry bundle: the image's torch 2.11.0 and transformers 5.17.0 and the other packages of
# benchmarks/gpu_image.txt, and nothing of benchmarks/gpu_bundle.txt (Ray, MLflow, Optuna, DeepSpeed, pydantic…),
# which the session installs from the bundle alone, as on the device.
#
#   benchmarks/gpu_rehearsal.sh [VENV]      # default build/gpu_rehearsal/venv; prints the venv's python
#   PAR_RAY_REHEARSAL_PYTHON=$(benchmarks/gpu_rehearsal.sh | tail -1) python -m pytest tests/test_gpu_session.py
#
# What it does, in order:
#   1. makes VENV with a Python 3.12 ($PYTHON312, default: pyenv's newest 3.12.x, else python3.12) unless it exists;
#   2. `pip download -r benchmarks/gpu_image.txt` into build/gpu_rehearsal/wheels, with dependencies (network to PyPI;
#      files already there are not downloaded again). PyPI's torch 2.11.0 for Linux x86-64 is the CUDA 13 build
#      (530 MB) and pulls its CUDA libraries: ~2.7 GB in all, the same build as the image's, run here on the CPU;
#   3. installs every wheel in that folder, with --no-index --no-deps, except those named in benchmarks/gpu_bundle.txt
#      and not in gpu_image.txt (dependencies of the image's packages that the image lacks too: the session must find
#      them in the bundle; a package of both, carried newer than the image may have it, is installed as the image's);
#   4. prints torch's and transformers' versions (stderr) and the venv's python (stdout).
# Measured on a 2-core machine with the wheels already downloaded: 1 min 24 s, 93 packages with pip (torch 2.11.0+cu130,
# transformers 5.17.0); the venv takes 5.2 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-build/gpu_rehearsal/venv}"
CACHE=build/gpu_rehearsal/wheels
PY312="${PYTHON312:-$(ls -d "$HOME"/.pyenv/versions/3.12.*/bin/python 2>/dev/null | tail -1)}"
PY312="${PY312:-$(command -v python3.12 || true)}"
[ -x "$PY312" ] || { echo "gpu_rehearsal: no Python 3.12 (set PYTHON312)" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || "$PY312" -m venv "$VENV"
mkdir -p "$CACHE"
"$VENV/bin/python" -m pip download -q -d "$CACHE" -r benchmarks/gpu_image.txt >&2
# everything downloaded but what the bundle carries (the image lacks those: they must come from the bundle); of a
# package downloaded in several versions over time (a floating dependency such as idna), the newest only
names() { grep -v '^#' "$1" | sed 's/==.*//; /^$/d' | tr 'A-Z_.' 'a-z--'; }
image=$(names benchmarks/gpu_image.txt | paste -sd'|')
carried=$(names benchmarks/gpu_bundle.txt | grep -vxE "$image" | paste -sd'|')
wheels=$(ls "$CACHE"/*.whl | sort -V | while read -r w; do
  name=$(basename "$w" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')
  echo "$name" | grep -qxE "$carried" || echo "$name $w"
done | awk '{newest[$1] = $2} END {for (n in newest) print newest[n]}')
"$VENV/bin/python" -m pip install -q --no-index --no-deps $wheels >&2
"$VENV/bin/python" -c "import torch, transformers; print('gpu_rehearsal: torch', torch.__version__, 'transformers',
transformers.__version__)" >&2
echo "$(cd "$VENV" && pwd)/bin/python"
