#!/usr/bin/env bash
# Prepare one cluster-launcher node (cluster/aws.yaml, cluster/gcp.yaml) for par_ray.
#
# `ray up` rsyncs this working tree to ~/par_ray on every node (file_mounts); this script installs it, editable,
# into a Python 3.11 virtual environment at ~/par_ray_venv with the exact pins of pyproject.toml (ray==2.60.0,
# torch, transformers, mlflow ...), so every node runs what the laptop tested. The environment is activated from
# ~/.bashrc, which the launcher sources before each setup and start command. Idempotent: `ray up` reruns it
# whenever the synced files or the setup commands change.
#
# Pretrained weights (the paper preset): trials never download. With PAR_RAY_MODEL_DIR set (a directory every node
# sees at the same path: a shared file system, or the same local path on each node), this script downloads each
# paper backbone once into PAR_RAY_MODEL_DIR/<hub id> with `hf download` (files already there are kept) and exports
# PAR_RAY_MODEL_DIR, which the sweeps' --model-dir defaults to. PAR_RAY_MODELS narrows the list (space-separated hub
# ids; default: every paper backbone, ~45 GB). A sweep checks every backbone resolves before it claims anything.
#
# usage: setup_node.sh                                  a worker node
#        setup_node.sh --head STORAGE_URI [PACKAGE ...]  the head: also writes ~/.par_ray_env (PAR_RAY_STORAGE,
#                                                        MLFLOW_TRACKING_URI) and installs PACKAGEs (cloud SDKs
#                                                        the autoscaler and MLflow's artifact store need)
set -euo pipefail

repo="${HOME}/par_ray"
venv="${HOME}/par_ray_venv"
head_storage=""
if [ "${1:-}" = "--head" ]; then
    head_storage="${2:?--head needs the storage URI, e.g. s3://<your-bucket>/par_ray}"
    shift 2
fi

# uv installs pyproject's pins and a managed CPython 3.11 (the version par_ray is tested with), leaving the image's
# own Python alone.
if [ ! -x "${HOME}/.local/bin/uv" ] && ! command -v uv >/dev/null 2>&1; then
    curl -LsSf https://astral.sh/uv/install.sh | sh
fi
uv="$(command -v uv || echo "${HOME}/.local/bin/uv")"
[ -x "${venv}/bin/python" ] || "${uv}" venv --python 3.11 "${venv}"
"${uv}" pip install --python "${venv}/bin/python" -e "${repo}" "$@"

add_line() { grep -qxF "$1" "${HOME}/.bashrc" 2>/dev/null || echo "$1" >> "${HOME}/.bashrc"; }
add_line "source ${venv}/bin/activate"
add_line "if [ -f ${HOME}/.par_ray_env ]; then source ${HOME}/.par_ray_env; fi"

if [ -n "${PAR_RAY_MODEL_DIR:-}" ]; then
    models="${PAR_RAY_MODELS:-$("${venv}/bin/python" -c 'from par_ray.model.registry import BACKBONES
from par_ray.presets import PAPER_BACKBONES
print(" ".join(BACKBONES[b].hub_name for b in PAPER_BACKBONES))')}"
    for id in ${models}; do
        "${venv}/bin/hf" download "${id}" \
            --local-dir "${PAR_RAY_MODEL_DIR}/${id}" --include '*.json' --include '*.safetensors' --include merges.txt \
            --include vocab.json
    done
    add_line "export PAR_RAY_MODEL_DIR=$(printf %q "${PAR_RAY_MODEL_DIR}")"
fi

# The Ray token arrives through file_mounts from the laptop's ~/.ray/auth_token; keep it private to this user.
if [ -f "${HOME}/.ray/auth_token" ]; then chmod 600 "${HOME}/.ray/auth_token"; fi

if [ -n "${head_storage}" ]; then
    # Read by cluster/mlflow_server.sh and by shells opened with `ray attach`; jobs get MLFLOW_TRACKING_URI from
    # the head's start command, which Ray's worker processes inherit.
    printf 'export PAR_RAY_STORAGE=%q\nexport MLFLOW_TRACKING_URI=http://127.0.0.1:5000\n' "${head_storage}" \
        > "${HOME}/.par_ray_env"
fi
