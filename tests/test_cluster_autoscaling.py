"""A sweep on a changing cluster, on one machine (issue 7): the autoscaler adds worker nodes for trials that wait for
CPUs and removes them once idle; a trial whose worker node is lost mid-training resumes elsewhere from its checkpoint.

Autoscaling runs ``cluster/local/fake_multinode.yaml`` (the shipped config; a head with no CPU here and a 6 s idle
timeout) under Ray's fake multi-node provider and the v1 autoscaler, started as ``ray.cluster_utils.AutoscalingCluster``
starts it (``RAY_FAKE_CLUSTER=1``, ``AUTOSCALER_UPDATE_INTERVAL_S=1``, ``ray start --head --autoscaling-config``).
``AutoscalingCluster`` itself is not usable here: its constructor reads ``fake_multi_node/example.yaml``, which the
Ray 2.60.0 wheel does not ship, and its ``start()`` first runs ``ray stop --force``, which kills every Ray process on
the machine (CI jobs and other developers' clusters included). Node loss uses ``ray.cluster_utils.Cluster``.

Both clusters are private: their own short temp dir (``RAY_TMPDIR``, so ``ray_current_cluster`` is never written
where another ``ray.init()`` would find it), free ports, a dashboard on a known port for the State API
(``RAY_API_SERVER_ADDRESS``, see ``par_ray.train.trainer.local_ray``), and teardown kills only the processes whose
command line names that temp dir. Sweeps run as ``python sweeps/*.py`` subprocesses with ``RAY_ADDRESS`` set to the
cluster, tracked in the SQLite store under their ``--storage``. Waits are polls with deadlines. Each test takes about
2-2.5 minutes on 2 busy cores.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml

from par_ray import tracking
from par_ray.mlflow_ui import free_port

ROOT = Path(__file__).resolve().parents[1]
# ~10 minutes on 2 cores (a 4-trial sweep on a fake autoscaling cluster, then a node-loss resume): past CI's budget
# with the rest of the suite, so CI skips them; PAR_RAY_FULL=1 runs them (passed on their own in session 5: 367 s).
pytestmark = [pytest.mark.ray, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("PAR_RAY_FULL") != "1",
                                 reason="multi-node autoscaling tests (~10 min): set PAR_RAY_FULL=1 to run them")]

SWEEP_TIMEOUT_S = 600
"""Bound on one sweep (seconds); a smoke sweep takes 1-2 minutes on 2 busy cores."""
SCALE_DOWN_TIMEOUT_S = 180
"""Bound on the idle scale-down after the sweep: 6 s idle timeout + 1 s autoscaler updates + node shutdown."""


# --------------------------------------------------------------------------------------------------------------------
# Private Ray instances


@contextlib.contextmanager
def private_ray():
    """Environment of one private Ray instance, set in ``os.environ`` (inherited by every process this test starts)
    and undone on exit; yields (its temp dir, its dashboard port).

    A short temp dir of its own (``RAY_TMPDIR``: sockets under it stay below 108 bytes, and ``ray_current_cluster``
    is written there, not where another ``ray.init()`` would find it), the State API at a known dashboard port, and
    token authentication with a fresh token: explicit, because Ray only turns token mode on by itself where a token
    file exists and a local ``ray.init()`` earlier in this process may have set ``RAY_AUTH_MODE`` already. On exit,
    every process left under the temp dir is killed.
    """
    from ray._private.authentication_test_utils import reset_auth_token_state

    temp_dir = tempfile.mkdtemp(prefix="par_ray_cluster_", dir="/tmp")
    dashboard = free_port()
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name, value in {"RAY_TMPDIR": temp_dir, "RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{dashboard}",
                                "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}.items():
                mp.setenv(name, value)
            for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
                mp.delenv(name, raising=False)
            reset_auth_token_state()  # this process's cached auth mode and token
            try:
                yield temp_dir, dashboard
            finally:
                _kill_processes_of(temp_dir)
    finally:
        reset_auth_token_state()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _kill_processes_of(temp_dir: str, timeout_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``, every process whose command line names ``temp_dir`` (the raylets,
    GCS, dashboard, autoscaler and workers of the Ray instance under it), by pid; no other process is touched."""
    def names_temp_dir(arg: str) -> bool:
        return arg.endswith(temp_dir) or temp_dir + "/" in arg

    procs = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and any(names_temp_dir(arg) for arg in p.info["cmdline"] or ()):
                procs.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=timeout_s)


def _ray_bin() -> str:
    ray_bin = Path(sys.executable).with_name("ray")
    return str(ray_bin) if ray_bin.exists() else "ray"


@contextlib.contextmanager
def fake_autoscaling_cluster(config: dict):
    """Start a head with the v1 autoscaler over the fake multi-node provider; yields its GCS address."""
    import ray._private.services

    with private_ray() as (temp_dir, dashboard):
        ip = ray._private.services.get_node_ip_address()
        port = free_port()
        config = copy.deepcopy(config)
        # The provider starts worker raylets against this GCS (its default, <ip>:6379, may be another instance).
        config["provider"]["gcs_address"] = f"{ip}:{port}"
        path = Path(temp_dir) / "autoscaling.yaml"
        path.write_text(yaml.safe_dump(config))
        head_cpus = config["available_node_types"][config["head_node_type"]]["resources"].get("CPU", 0)
        cmd = [_ray_bin(), "start", "--head", f"--node-ip-address={ip}", f"--port={port}", f"--num-cpus={head_cpus}",
               f"--autoscaling-config={path}", f"--temp-dir={temp_dir}/ray", "--include-dashboard=true",
               "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
               f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}",
               "--disable-usage-stats"]
        env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, f"ray start --head failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        yield f"{ip}:{port}"


@contextlib.contextmanager
def connected(address: str):
    """This process as a Ray driver of ``address`` (for ``ray.nodes()``), disconnected on exit."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _alive_workers(ray) -> list[dict]:
    return [n for n in ray.nodes() if n["Alive"] and "node:__internal_head__" not in n["Resources"]]


# --------------------------------------------------------------------------------------------------------------------
# Sweeps and their MLflow runs


@contextlib.contextmanager
def sweep_process(script: str | Path, address: str, log_dir: Path, *args: str):
    """A sweep script running on the cluster at ``address`` (killed on exit if still running). Its stdout and stderr
    go to files in ``log_dir``: a pipe nobody reads while the test polls would fill up and stall the sweep."""
    env = {**os.environ, "RAY_ADDRESS": address, "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    path = script if isinstance(script, Path) else ROOT / "sweeps" / f"{script}.py"
    with open(log_dir / "stdout.txt", "w") as out, open(log_dir / "stderr.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, str(path), *args], stdout=out, stderr=err, text=True, cwd=ROOT,
                                env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _finish(proc: subprocess.Popen, log_dir: Path, deadline: float) -> tuple[str, str]:
    """Wait for the sweep until ``deadline`` (``time.monotonic()``; killed then); prints and returns its output."""
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    out, err = ((log_dir / name).read_text() for name in ("stdout.txt", "stderr.txt"))
    print(out[-6000:], err[-6000:], sep="\n----- stderr -----\n")
    if proc.returncode == -9:
        pytest.fail("the sweep did not finish in time (killed)")
    return out, err


# --------------------------------------------------------------------------------------------------------------------
# 1. Autoscaling: workers come for waiting trials and go when idle


def autoscaling_config() -> dict:
    """The shipped fake multi-node config with a head that has no CPU (every trial waits for a worker node), at most
    two 2-CPU workers, and a 6 s idle timeout."""
    config = yaml.safe_load((ROOT / "cluster/local/fake_multinode.yaml").read_text())
    config["available_node_types"]["ray.head.default"]["resources"] = {"CPU": 0}
    config["available_node_types"]["ray.worker.cpu"].update(resources={"CPU": 2}, max_workers=2)
    config.update(max_workers=2, idle_timeout_minutes=0.1)
    return config


def test_autoscaler_adds_workers_for_a_waiting_sweep_and_removes_them_when_idle(tmp_path, sweep_runs):
    storage = tmp_path / "storage"
    timeline: list[tuple[float, int]] = []  # (seconds since the sweep started, alive worker nodes), at each change

    def record(ray, t0):
        n = len(_alive_workers(ray))
        if not timeline or timeline[-1][1] != n:
            timeline.append((round(time.monotonic() - t0, 1), n))
        return n

    with fake_autoscaling_cluster(autoscaling_config()) as address, connected(address) as ray:
        assert not _alive_workers(ray) and not ray.cluster_resources().get("CPU"), "expected a CPU-less head only"
        t0 = time.monotonic()
        # 4 trials of one CPU each, all waiting for workers: up to both 2-CPU workers (the config's max_workers).
        with sweep_process("backbone_scaling", address, tmp_path, "--preset", "local", "--smoke-test",
                           "--seeds", "0,1", "--storage", str(storage)) as proc:
            deadline = t0 + SWEEP_TIMEOUT_S
            while proc.poll() is None and time.monotonic() < deadline:
                record(ray, t0)
                time.sleep(0.5)
            out, err = _finish(proc, tmp_path, deadline)
        peak = max((n for _, n in timeline), default=0)
        deadline = time.monotonic() + SCALE_DOWN_TIMEOUT_S
        while record(ray, t0) and time.monotonic() < deadline:
            time.sleep(0.5)
        print("alive worker nodes over time (s, n):", timeline)

        assert proc.returncode == 0, err[-3000:]
        assert "trials: 4 finished" in out
        assert "the cluster autoscales without publishing its limits" in out  # par_ray.sweep.autoscaler_limits_unknown
        assert "up to 4 at once" in out  # not capped by what the CPU-less head fits
        assert 1 <= peak <= 2, f"no worker node was added for the waiting trials (max_workers 2): {timeline}"
        assert timeline[-1][1] == 0, f"idle workers not removed within {SCALE_DOWN_TIMEOUT_S} s: {timeline}"
        assert len(ray.nodes()) >= 1 + peak  # removed workers stay listed, dead

    parent, children = sweep_runs(f"sqlite:///{storage}/mlflow.db", "backbone_scaling")
    assert parent.info.status == "FINISHED"
    assert sorted((c.data.tags["par_ray.backbone"], c.data.tags["par_ray.seed"]) for c in children) == [
        (b, s) for b in ("tiny-qwen2", "tiny-qwen3") for s in ("0", "1")]
    assert {c.info.status for c in children} == {"FINISHED"}


# --------------------------------------------------------------------------------------------------------------------
# 2. Node loss: the trial resumes from its checkpoint on a replacement node

NODE_LOSS_STEPS = 40
NODE_LOSS_SWEEP = textwrap.dedent(f'''
    """One smoke trial, {NODE_LOSS_STEPS} steps long (a checkpoint every 2 steps, one evaluation at the end), so its
    worker node can be removed mid-training."""
    import sys

    from par_ray.config import with_overrides
    from par_ray.recipes import par
    from par_ray.sweep import SweepSpec, main


    def par_long(cfg):
        return with_overrides(par(cfg), recipe=dict(name="par_long"),
                              train=dict(steps={NODE_LOSS_STEPS}, eval_every={NODE_LOSS_STEPS}))


    SPEC = SweepSpec(name="node_loss", recipes=("par_long",), extra_recipes={{"par_long": par_long}},
                     backbones={{"local": ("tiny-qwen2",)}}, seeds=(0,))

    if __name__ == "__main__":
        sys.exit(main(SPEC))
''')
WORKER_MEMORY = 256 * 2**20
"""Worker nodes advertise less memory than a trial driver reserves (``par_ray.sweep.DRIVER_RESOURCES``), so drivers
(and with them Train's controllers) stay on the head, and the node lost is a pure training node."""


@contextlib.contextmanager
def private_cluster():
    """``ray.cluster_utils.Cluster`` with a head that has no CPU, under :func:`private_ray`."""
    from ray.cluster_utils import Cluster

    with private_ray() as (temp_dir, dashboard):
        cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=0, temp_dir=f"{temp_dir}/ray", include_dashboard=True, dashboard_host="127.0.0.1",
            dashboard_port=dashboard, dashboard_agent_listen_port=free_port(), ray_client_server_port=free_port()))
        try:
            yield cluster
        finally:
            cluster.shutdown()


def _trial_step(uri: str) -> int:
    """The latest ``step`` MLflow holds for the sweep's trial (0 before its first report or while SQLite is busy)."""
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(tracking.experiment_name("node_loss"))
        runs = client.search_runs([exp.experiment_id], "tags.`par_ray.role` = 'trial'") if exp else []
        return max((int(r.data.metrics.get("step", 0)) for r in runs), default=0)
    except Exception:  # noqa: BLE001 - the sweep may be writing or creating the store; the next poll sees it
        return 0


def _training_node(ray) -> str | None:
    """Node id of the trial's Ray Train worker actor, if it is alive."""
    from ray.util.state import list_actors

    actors = list_actors(filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
    return actors[0].node_id if actors else None


def test_trial_resumes_from_checkpoint_after_losing_its_worker_node(tmp_path, sweep_runs):
    script = tmp_path / "node_loss.py"
    script.write_text(NODE_LOSS_SWEEP)
    storage = tmp_path / "storage"
    uri = f"sqlite:///{storage}/mlflow.db"

    with private_cluster() as cluster:
        first = cluster.add_node(num_cpus=1, memory=WORKER_MEMORY)
        with sweep_process(script, cluster.address, tmp_path, "--preset", "local", "--smoke-test", "--storage",
                           str(storage)) as proc, connected(cluster.address) as ray:
            deadline = time.monotonic() + SWEEP_TIMEOUT_S
            while (step := _trial_step(uri)) < 4 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            assert proc.poll() is None, "the sweep ended before its trial reached step 4:\n" + _finish(
                proc, tmp_path, deadline)[1][-3000:]
            assert step >= 4, f"the trial did not reach step 4 within {SWEEP_TIMEOUT_S} s"
            assert _training_node(ray) == first.node_id, "the trial's Train worker should run on the worker node"
            cluster.remove_node(first)  # its raylet and every process on it: the Train worker dies mid-training
            print(f"removed the worker node after MLflow showed step {step}")
            cluster.add_node(num_cpus=1, memory=WORKER_MEMORY)  # the replacement an autoscaler would launch
            out, err = _finish(proc, tmp_path, deadline)

    assert proc.returncode == 0, err[-3000:]
    assert "trials: 1 finished" in out
    # Train's controller saw the worker die with its node and restarted the group (Train FailureConfig), which
    # resumed from the latest checkpoint (Ray prints a worker's line to both streams: count distinct steps).
    assert "The actor died because its node has died" in err, (
        "no Train worker died with the removed node: did the trial end first? (raise NODE_LOSS_STEPS)")
    resumed = sorted({int(s) for s in re.findall(r"resumed from step (\d+)", out + err)})
    print("resumed from step:", resumed)
    # Not before the checkpoint MLflow had seen when the node went, and not from scratch or the end.
    assert len(resumed) == 1 and step <= resumed[0] < NODE_LOSS_STEPS, f"resumed from {resumed}; node lost after {step}"

    from mlflow.tracking import MlflowClient

    parent, children = sweep_runs(uri, "node_loss")
    assert len(children) == 1, "one trial, one child run: the restart must reuse it"
    child = children[0]
    assert parent.info.status == child.info.status == "FINISHED"
    assert child.data.metrics["step"] == NODE_LOSS_STEPS
    steps = [m.step for m in MlflowClient(uri).get_metric_history(child.info.run_id, "loss")]
    assert steps == list(range(2, NODE_LOSS_STEPS + 1, 2)), f"steps lost or logged twice: {steps}"
