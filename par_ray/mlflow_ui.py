"""A light MLflow server and UI over a sweep's store: ``python -m par_ray.mlflow_ui --storage runs/<sweep>``
(also ``python -m par_ray.tracking ui --storage runs/<sweep>``).

:func:`local_server` runs ``mlflow server`` on 127.0.0.1 with one worker and no job runner (tests,
``scripts/mlflow_screenshot.py`` and the UI command use it); :func:`ui_url` gives the page an experiment should open
on. MLflow 3.17's UI: the experiment's kind tag (``par_ray.tracking_schema.EXPERIMENT_KIND``) is shown as its kind,
but the page an experiment opens on follows the sidebar's workflow switch ("GenAI" / "Model training", remembered by
the browser; the URL parameter ``workflowType=machine_learning`` sets it), whose default opens the GenAI "Overview"
of traces.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import typing
import urllib.request
from pathlib import Path

from par_ray.tracking_schema import EXPERIMENT_PREFIX


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port`` (another MLflow UI, say)."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def local_server(backend_uri: str, artifacts_dir: str, port: int | None = None,
                 timeout_s: float = 180.0) -> typing.Iterator[str]:
    """Run ``mlflow server`` on 127.0.0.1 (one worker, no job runner) over ``backend_uri``; yields its URL.

    MLflow 3.17's defaults (``mlflow ui``: four workers plus a job-runner pool) measured 11 s to answer ``/health``
    and 3.5 GB resident over 15 processes on the 2-core development machine; this measured 6 s and 0.55 GB over 2.
    Raises ``RuntimeError`` with the server's log tail if it does not answer ``/health`` within ``timeout_s``.
    """
    if port and port_in_use(port):
        # its /health would answer for another server's store
        raise RuntimeError(f"port {port} on 127.0.0.1 is in use by another server; choose another port")
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = tempfile.NamedTemporaryFile("w+", prefix="mlflow_server_", suffix=".log", delete=False)
    mlflow_bin = str(Path(sys.executable).with_name("mlflow"))
    cmd = [mlflow_bin if os.path.exists(mlflow_bin) else "mlflow", "server", "--backend-store-uri", backend_uri,
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--artifacts-destination", artifacts_dir]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.time() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                raise RuntimeError(f"mlflow server did not start on {url}:\n{log.read()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)  # the server's own process group: uvicorn worker included
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        log.close()
        os.unlink(log.name)


def ui_url(server: str, experiment_id: str | None = None) -> str:
    """The MLflow 3.17 UI page of ``experiment_id`` (or the experiment list) in the "Machine learning" workflow, so the
    experiment opens on its runs table rather than the GenAI overview of traces."""
    page = f"experiments/{experiment_id}" if experiment_id else "experiments"
    return f"{server}/#/{page}?workflowType=machine_learning"


def build_parser(prog: str = "python -m par_ray.mlflow_ui") -> argparse.ArgumentParser:
    """The UI command's argument parser (``prog``: how it was called), built without running anything."""
    p = argparse.ArgumentParser(
        allow_abbrev=False,  # a flag's prefix is an error, never another flag
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve the MLflow UI over a sweep's store on 127.0.0.1 until Ctrl-C.",
        epilog="Lighter than `mlflow ui`: one server worker and no job runner (`mlflow server --workers 1` with\n"
               "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false). Prints a link per par_ray experiment that opens on its\n"
               "runs table; when the port is taken it serves on a free one and says so.\n"
               f"\nexample:\n  {prog} --storage runs/backbone_scaling")
    store = p.add_argument_group("which store")
    store.add_argument("--storage", default=None,
                       help="the sweep's --storage folder (holds mlflow.db and mlartifacts/), e.g. "
                            "runs/backbone_scaling")
    store.add_argument("--backend-store-uri", default=None,
                       help="MLflow store URI (default sqlite:///<storage>/mlflow.db)")
    store.add_argument("--artifacts", default=None, help="artifact folder to serve (default <storage>/mlartifacts)")
    server = p.add_argument_group("server")
    server.add_argument("--port", type=_port, default=5000, help="port on 127.0.0.1, 1-65535 (default 5000)")
    return p


def _port(text: str) -> int:
    """``--port``'s type: a TCP port, 1-65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1-65535)")
    return port


def main(argv: list[str] | None = None, prog: str = "python -m par_ray.mlflow_ui") -> int:
    """``python -m par_ray.mlflow_ui --storage runs/<sweep>`` (or ``python -m par_ray.tracking ui --storage …``): the
    MLflow UI over a sweep's store with :func:`local_server` (one worker, no job runner), until Ctrl-C. Prints the URL
    of each ``par_ray/*`` experiment. A leading ``ui`` in ``argv`` is accepted (the tracking module's command)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["ui"]:
        argv = argv[1:]
    p = build_parser(prog)
    args = p.parse_args(argv)
    if not args.storage and not args.backend_store_uri:
        p.error("--storage: give the sweep's storage folder (or --backend-store-uri and --artifacts)")
    storage = Path(args.storage or ".").expanduser().resolve()
    backend = args.backend_store_uri or f"sqlite:///{storage / 'mlflow.db'}"
    if "://" not in backend:  # MLflow would take a path for its retired file store
        p.error(f"--backend-store-uri: {backend} is a path, not a store URI; a sweep's store is "
                f"sqlite:///{Path(backend).expanduser().resolve()} (or pass --storage with its folder)")
    if backend.startswith("sqlite:///") and not Path(backend[len("sqlite:///"):]).exists():
        p.error(f"--storage: no MLflow store at {backend}")
    artifacts = args.artifacts or str(storage / "mlartifacts")
    print(f"starting mlflow server over {backend} (one worker, no job runner) ...", flush=True)
    # kill / timeout / a closed terminal stop the server too: the server runs in its own session (so a Ctrl-C reaches
    # only this process), and SystemExit unwinds local_server's cleanup as KeyboardInterrupt does
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    port = args.port
    if port_in_use(port):
        port = free_port()
        print(f"port {args.port} is in use (another MLflow UI?); serving this store on port {port} instead",
              flush=True)
    serving = False
    try:  # a Ctrl-C stops the server whenever it comes (local_server's cleanup), one line, no traceback
        with contextlib.ExitStack() as stack:
            try:
                url = stack.enter_context(local_server(backend, artifacts, port=port))
            except RuntimeError as e:  # the server did not start: its log's last error says why (a non-store)
                head, _, log = str(e).partition("\n")
                why = [line for line in log.splitlines() if re.match(r"[\w.]*(Error|Exception)\b.*: ", line)][-1:]
                print(f"error: {head.rstrip(':')}{': ' + why[0] if why else ''}", file=sys.stderr)
                return 1
            from mlflow.tracking import MlflowClient

            exps = [e for e in MlflowClient(url).search_experiments() if e.name.startswith(EXPERIMENT_PREFIX)]
            print(f"MLflow UI: {ui_url(url)}")
            for e in exps:
                print(f"  {e.name}: {ui_url(url, e.experiment_id)}")
            print("Ctrl-C to stop.", flush=True)
            serving = True
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        if serving:
            print("server stopped")
            return 0
        print("\ninterrupted while the server started; it is stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
