#!/usr/bin/env bash
# Prepare one cluster-launcher node (cluster/aws.yaml, cluster/gcp.yaml) for par_ray.
#
# `ray up` rsyncs this working tree to ~/par_ray on every node (file_mounts); this script installs it, editable,
# into a Python 3.11 virtual environment at ~/par_ray_venv with the exact pins of pyproject.toml (ray==2.60.0,
# torch, transformers, mlflow ...), so every node runs what the laptop tested. The environment is activated from
# ~/.bashrc, which the launcher sources before each setup and start command. Idempotent: `ray up` reruns it
# whenever the synced files or the setup commands change.
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

# The Ray token arrives through file_mounts from the laptop's ~/.ray/auth_token; keep it private to this user.
if [ -f "${HOME}/.ray/auth_token" ]; then chmod 600 "${HOME}/.ray/auth_token"; fi

if [ -n "${head_storage}" ]; then
    # Read by cluster/mlflow_server.sh and by shells opened with `ray attach`; jobs get MLFLOW_TRACKING_URI from
    # the head's start command, which Ray's worker processes inherit.
    printf 'export PAR_RAY_STORAGE=%q\nexport MLFLOW_TRACKING_URI=http://127.0.0.1:5000\n' "${head_storage}" \
        > "${HOME}/.par_ray_env"
fi
