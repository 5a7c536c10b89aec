#!/usr/bin/env bash
# The MLflow tracking server of a par_ray cluster. It runs on the Ray head only.
#
# Bound to 127.0.0.1:5000: the Tune driver (the job's entrypoint, which Ray runs on the head) logs to it through
# MLFLOW_TRACKING_URI=http://127.0.0.1:5000, and people open the UI through an SSH tunnel (`ray attach
# cluster/aws.yaml -p 5000`) or `kubectl port-forward`. No firewall rule or service exposes it. Runs, params and
# metrics live in SQLite under $MLFLOW_HOME; artifacts go to $PAR_RAY_STORAGE/mlflow/artifacts through the server
# (--serve-artifacts), so clients need no bucket access of their own.
#
# The SQLite file lives on the head's disk, which `ray down` deletes: `backup` copies it to the bucket, and `run` /
# `restart` restore it from there when the local file is missing (a new head).
#
# usage: mlflow_server.sh run       serve in the foreground (the KubeRay head's sidecar container)
#        mlflow_server.sh restart   (re)start in the background; pid in $MLFLOW_HOME/server.pid (launcher head)
#        mlflow_server.sh backup    copy a consistent snapshot of the database to $PAR_RAY_STORAGE/mlflow/mlflow.db
# env:   PAR_RAY_STORAGE (required) the sweep bucket prefix, s3://... or gs://...
#        MLFLOW_HOME     (default ~/mlflow) directory of mlflow.db, server.log, server.pid
set -euo pipefail

: "${PAR_RAY_STORAGE:?set PAR_RAY_STORAGE to the sweep bucket prefix, e.g. s3://<your-bucket>/par_ray}"
home="${MLFLOW_HOME:-${HOME}/mlflow}"
db="${home}/mlflow.db"
remote_db="${PAR_RAY_STORAGE%/}/mlflow/mlflow.db"
mkdir -p "${home}"

server_args=(
    --host 127.0.0.1 --port 5000
    --backend-store-uri "sqlite:///${db}"
    --serve-artifacts --artifacts-destination "${PAR_RAY_STORAGE%/}/mlflow/artifacts"
)

# Copies between local files and s3:// or gs:// URIs go through pyarrow, installed with ray and mlflow.
restore_if_missing() {
    [ -f "${db}" ] && return 0
    python - "${remote_db}" "${db}" <<'PY'
import sys
from pyarrow import fs

remote, local = sys.argv[1:]
filesystem, path = fs.FileSystem.from_uri(remote)
if filesystem.get_file_info(path).type != fs.FileType.NotFound:
    fs.copy_files(remote, local)
    print(f"restored {local} from {remote}")
PY
}

stop() {
    [ -f "${home}/server.pid" ] || return 0
    # The server forks uvicorn workers; `set -m` below gave it its own process group, so stop the whole group.
    kill -TERM -- "-$(cat "${home}/server.pid")" 2>/dev/null || true
    rm -f "${home}/server.pid"
}

case "${1:-}" in
    run)
        restore_if_missing
        exec mlflow server "${server_args[@]}"
        ;;
    restart)
        stop
        restore_if_missing
        set -m
        nohup mlflow server "${server_args[@]}" > "${home}/server.log" 2>&1 < /dev/null &
        echo $! > "${home}/server.pid"
        ;;
    backup)
        python - "${db}" "${remote_db}" <<'PY'
import sqlite3
import sys
import tempfile
from pyarrow import fs

local, remote = sys.argv[1:]
with tempfile.TemporaryDirectory() as tmp:
    snapshot = f"{tmp}/mlflow.db"
    with sqlite3.connect(local) as src, sqlite3.connect(snapshot) as dst:
        src.backup(dst)  # consistent even while the server writes
    fs.copy_files(snapshot, remote)
print(f"backed up {local} to {remote}")
PY
        ;;
    *)
        echo "usage: $0 run|restart|backup" >&2
        exit 2
        ;;
esac
