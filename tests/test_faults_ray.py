"""Faults end to end on a local Ray cluster (each sweep starts its own), with the sweep's own retry settings
(``TRAIN_MAX_FAILURES``, ``TUNE_MAX_FAILURES``): a diverging trial fails once with its reason on its MLflow run while
the others finish; SIGTERM to a sweep driver (``ray job stop``) leaves no RUNNING run and ``--resume`` completes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from par_ray import mlflow_ui, tracking

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.ray


def _env() -> dict:
    env = {**os.environ, "RAY_ADDRESS": "local", "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _sweep(script: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT, env=_env())
    print(r.stdout[-6000:], r.stderr[-6000:], sep="\n----- stderr -----\n")
    return r


DIVERGING_SWEEP = textwrap.dedent('''
    """Two trials with the sweep's own retry settings; the second diverges at step 2 (train.lr = 1e30)."""
    import sys

    from par_ray.config import with_overrides
    from par_ray.recipes import par
    from par_ray.sweep import SweepSpec, main


    def par_diverge(cfg):
        return with_overrides(par(cfg), recipe=dict(name="par_diverge"), train=dict(lr=1e30))


    SPEC = SweepSpec(name="diverge_demo", recipes=("par", "par_diverge"), extra_recipes={"par_diverge": par_diverge},
                     backbones={"local": ("tiny-qwen2",)}, seeds=(0,))

    if __name__ == "__main__":
        sys.exit(main(SPEC))
''')


@pytest.fixture
def another_ray_instance(tmp_path):
    """A private Ray instance of another process on this host (a notebook's, another job's), for the test's
    duration."""
    proc = subprocess.Popen([sys.executable, "-c", "import ray, time; ray.init(num_cpus=1, include_dashboard=False); "
                             "print('up', flush=True); time.sleep(3600)"], stdout=subprocess.PIPE, text=True,
                            env={**{k: v for k, v in _env().items() if k != "RAY_ADDRESS"},
                                 "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "1"})
    try:
        assert proc.stdout.readline().strip() == "up"
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_diverging_trial_fails_once_with_its_reason_and_the_others_finish(tmp_path, sweep_runs,
                                                                            another_ray_instance):
    """Also beside another Ray instance on the host: no Ray Train PlacementGroupCleaner traceback."""
    from mlflow.tracking import MlflowClient

    from par_ray.sweep import TRAIN_MAX_FAILURES, TUNE_MAX_FAILURES

    assert TRAIN_MAX_FAILURES > 0 and TUNE_MAX_FAILURES > 0  # the settings under test retry other errors
    script = tmp_path / "diverge_demo.py"
    script.write_text(DIVERGING_SWEEP)
    storage = tmp_path / "storage"
    r = _sweep(script, "--preset", "local", "--smoke-test", "--storage", str(storage))
    assert r.returncode == 1, r.stderr[-3000:]
    assert "1 finished" in r.stdout and "1 failed" in r.stdout
    # one Train attempt: no worker-group restart, no second driver training again
    assert r.stderr.count("Train worker rank 0 failed: NonFiniteLossError") == 1, r.stderr[-3000:]
    assert "a restart cannot fix this error: the trial fails now" in r.stderr
    assert r.stderr.count(") failed: NonFiniteLossError: training diverged at step 2") == 1  # the trial's one line
    assert "Ray: started a local cluster (" in r.stdout
    assert "Found multiple active Ray instances" not in r.stderr and "PlacementGroupCleaner" not in r.stderr
    assert r.stderr.count("Traceback") == 1  # the diverged worker's own log of its error, once

    uri = f"sqlite:///{storage}/mlflow.db"
    _, children = sweep_runs(uri, "diverge_demo")
    by_recipe = {c.data.tags["par_ray.recipe"]: c for c in children}
    assert by_recipe["par"].info.status == "FINISHED" and tracking.TAG_ERROR not in by_recipe["par"].data.tags
    failed = by_recipe["par_diverge"]
    assert failed.info.status == "FAILED"
    assert failed.data.tags[tracking.TAG_ERROR].startswith("NonFiniteLossError: training diverged at step 2")
    client = MlflowClient(uri)
    assert tracking.ARTIFACT_ERROR in {a.path for a in client.list_artifacts(failed.info.run_id)}
    trials_csv = (storage / "analysis" / "trials.csv").read_text()
    assert "NonFiniteLossError: training diverged at step 2" in trials_csv


LONG_SWEEP = textwrap.dedent('''
    """One trial long enough to be stopped mid-training."""
    import sys

    from par_ray.sweep import SweepSpec, main

    SPEC = SweepSpec(name="sigterm_demo", backbones={"local": ("tiny-qwen2",)}, seeds=(0,))

    if __name__ == "__main__":
        sys.exit(main(SPEC))
''')


def test_sigterm_to_a_sweep_driver_closes_every_run_and_resume_completes(tmp_path, sweep_runs):
    """SIGTERM reaches the driver as the MLflow callback is handed step 2's report, whose checkpoint Train has
    registered already (``SIGTERM_BEFORE_LOGGING_STEP_ENV``: the window made deterministic; the report is dropped).
    Every run is closed, the same summary and ``--resume`` hint as Ctrl-C are printed, and the resumed sweep finishes
    in the same runs with every checkpointed step in the metric history exactly once (step 2's from its checkpoint)."""
    from mlflow import MlflowClient

    from par_ray.sweep.run import SIGTERM_BEFORE_LOGGING_STEP_ENV

    script = tmp_path / "sigterm_demo.py"
    script.write_text(LONG_SWEEP)
    storage = tmp_path / "storage"
    uri = f"sqlite:///{storage}/mlflow.db"
    # every checkpoint kept (12 of 24 steps), so every checkpointed step can be checked after the resume
    flags = ["--preset", "local", "--smoke-test", "--set", "train.steps=24", "--set", "train.keep_checkpoints=12",
             "--storage", str(storage)]
    r = subprocess.run([sys.executable, str(script), *flags], capture_output=True, text=True, timeout=900, cwd=ROOT,
                       env={**_env(), SIGTERM_BEFORE_LOGGING_STEP_ENV: "2"})
    out, err = r.stdout, r.stderr
    print(out[-4000:], err[-4000:], sep="\n----- stderr -----\n")
    assert "SIGTERM received: stopping the sweep as Ctrl-C does" in err
    assert "--resume" in err and "trials: 1 unfinished" in out
    parent, children = sweep_runs(uri, "sigterm_demo")
    assert parent.info.status == "KILLED" and [c.info.status for c in children] == ["KILLED"]
    assert children[0].data.metrics.get("step", 0) < 24  # stopped mid-training
    history = MlflowClient(uri).get_metric_history(children[0].info.run_id, "loss")
    assert 2 not in [m.step for m in history]  # the dropped report

    second = _sweep(script, *flags, "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    parent2, children2 = sweep_runs(uri, "sigterm_demo")
    assert parent2.info.run_id == parent.info.run_id and parent2.info.status == "FINISHED"
    assert [c.info.run_id for c in children2] == [children[0].info.run_id]
    assert children2[0].info.status == "FINISHED" and children2[0].data.metrics["step"] == 24
    steps = [m.step for m in MlflowClient(uri).get_metric_history(children2[0].info.run_id, "loss")]
    assert sorted(steps) == list(range(2, 25, 2))  # every checkpointed step, once


def test_cli_run_on_two_fsdp_workers_resumes_on_one_without_a_stale_shard(tmp_path):
    """``--workers 1`` is Ray Train's local mode, which ignores Ray storage: a run with Ray checkpoints in OUT
    continues on one Ray worker instead, and final/ holds only the new export."""
    out = tmp_path / "run"
    base = [sys.executable, "-m", "par_ray.train", "--train-depth", "4", "--eval-depths", "4,8", "--steps", "4",
            "--set", "eval.num_sequences=8", "--set", "train.batch_size=8", "--set", "train.eval_every=100",
            "--set", "train.warmup_steps=1", "--set", "train.checkpoint_every=2", "--out", str(out)]
    env = _env()
    first = subprocess.run(base + ["--workers", "2", "--strategy", "fsdp"], capture_output=True, text=True,
                           timeout=900, cwd=ROOT, env=env)
    print(first.stdout[-3000:], first.stderr[-3000:], sep="\n----- stderr -----\n")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "returned a view tensor" not in first.stdout + first.stderr  # FSDP2's warning of a view output
    export = {"extra.json", "model.safetensors"}  # the weights only, gathered from both ranks' shards
    assert {p.name for p in (out / "final").iterdir()} == export
    first_export = (out / "final" / "model.safetensors").stat().st_mtime_ns

    second = subprocess.run(base + ["--workers", "1", "--strategy", "fsdp"], capture_output=True, text=True,
                            timeout=900, cwd=ROOT, env=env)
    print(second.stdout[-3000:], second.stderr[-3000:], sep="\n----- stderr -----\n")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming the run in" in second.stdout and "resumed from step 4" in second.stdout
    assert "step      2/4" not in second.stdout  # nothing retrained
    assert {p.name for p in (out / "final").iterdir()} == export
    assert (out / "final" / "model.safetensors").stat().st_mtime_ns > first_export  # the new run's export
    assert not (out / "final.partial").exists()
    assert json.loads((out / "result.json").read_text())["config"]["train.num_workers"] == 1


@contextlib.contextmanager
def ray_head(temp_dir: Path, port: int, env: dict):
    """``ray start --head --temp-dir temp_dir --port port`` (one CPU, no dashboard) under ``env``; yields the
    CompletedProcess of ``ray start``, then stops this head only (``ray stop`` would stop every Ray instance on the
    host: its processes are those whose command line names ``temp_dir``) and removes ``temp_dir``."""
    import psutil

    ray_bin = str(Path(sys.executable).with_name("ray"))
    started = subprocess.run([ray_bin, "start", "--head", "--temp-dir", str(temp_dir), "--port", str(port),
                              "--num-cpus", "1", "--include-dashboard", "false"], capture_output=True, text=True,
                             timeout=300, env=env)
    try:
        yield started
    finally:
        for proc in psutil.process_iter(["cmdline"]):
            if any(str(temp_dir) in arg for arg in proc.info.get("cmdline") or []):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def auth_disabled():
    """``RAY_AUTH_MODE=disabled`` in this process for one test, then the previous value back and Ray's cached
    auth config re-read. Without the reset, the connection made with auth disabled stays cached in this process:
    the next local ``ray.init()`` (which finds ``RAY_AUTH_MODE=token``, set by Ray at the first local start) starts
    a GCS that wants a token while this process's client still sends none."""
    from ray._private.authentication_test_utils import reset_auth_token_state

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        reset_auth_token_state()
        yield
    reset_auth_token_state()


def test_a_head_started_with_its_own_temp_dir_is_joined_and_named(tmp_path, monkeypatch, capsys, auth_disabled):
    """``ray start --head --temp-dir X`` writes ``X/ray_current_cluster``; the sweep finds it from the head's
    processes, as ``ray.init(address="auto")`` does, and says it joined it."""
    import ray

    from par_ray.sweep import resources

    temp_dir = Path(f"/tmp/rt{os.getpid()}")  # short: Ray's socket paths must stay under 108 characters
    port = mlflow_ui.free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with ray_head(temp_dir, port, env) as started:
        assert started.returncode == 0, started.stderr[-3000:]
        try:
            assert (temp_dir / "ray_current_cluster").exists()
            monkeypatch.delenv("RAY_ADDRESS", raising=False)
            monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # nothing in the default place
            address = resources.ray_address()
            assert address.endswith(f":{port}")
            with resources.joined() as context:
                assert context is not None
            assert f"Ray: joined {address}" in capsys.readouterr().out
        finally:
            ray.shutdown()


@pytest.mark.full_only
def test_a_cluster_wanting_a_token_the_laptop_lacks_is_one_line(tmp_path):
    """A head started with token authentication; a sweep driver with no token (no ``RAY_AUTH_*``, no
    ``~/.ray/auth_token``: a fresh ``HOME``) gets one ``error:`` line naming the cluster and the variables to set,
    no traceback. Its own process, so this test process's cached auth state is not involved."""
    temp_dir = Path(f"/tmp/rta{os.getpid()}")  # short: Ray's socket paths must stay under 108 characters
    port = mlflow_ui.free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    head_env = {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "a" * 32}
    with ray_head(temp_dir, port, head_env) as started:
        assert started.returncode == 0, started.stderr[-3000:]
        (tmp_path / "home").mkdir()
        driver_env = {**base, "HOME": str(tmp_path / "home"), "RAY_ADDRESS": f"127.0.0.1:{port}",
                      "RAY_TMPDIR": str(tmp_path / "rt")}
        code = ("import sys\n"
                "from par_ray.sweep import resources\n"
                "from par_ray.sweep.spec import SweepConfigError\n"
                "try:\n    with resources.joined():\n        pass\n"
                "except SweepConfigError as e:\n    print(f'error: {e}'); sys.exit(2)\n")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=driver_env,
                           cwd=ROOT)
        print(r.stdout, r.stderr, sep="\n----- stderr -----\n")
        assert r.returncode == 2
        assert r.stdout.strip().splitlines() == [
            f"error: Ray: the cluster at 127.0.0.1:{port} requires token authentication and this process has no "
            f"token for it; set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token"]
        assert "Traceback" not in r.stderr
        assert r.stderr.count("InvalidAuthToken") <= 2  # one attempt, not ray.init's ~20 s of retries


def test_token_mode_without_any_token_is_one_line_not_an_abort(tmp_path):
    """``RAY_AUTH_MODE=token`` exported (as docs/gpu.md has every shell do) in a shell with no token (a fresh
    ``HOME``, no ``RAY_AUTH_TOKEN*``): Ray's client aborts the process in a failed C++ check when it connects; the
    driver says so in one line, exit 2, before connecting (nothing needs to listen at the address)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    (tmp_path / "home").mkdir()
    address = f"127.0.0.1:{mlflow_ui.free_port()}"
    env = {**base, "HOME": str(tmp_path / "home"), "RAY_AUTH_MODE": "token", "RAY_ADDRESS": address}
    code = ("import sys\n"
            "from par_ray.sweep import resources\n"
            "from par_ray.sweep.spec import SweepConfigError\n"
            "try:\n    with resources.joined():\n        pass\n"
            "except SweepConfigError as e:\n    print(f'error: {e}'); sys.exit(2)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stdout.strip().splitlines() == [
        f"error: Ray: RAY_AUTH_MODE=token is set but this process has no token for the cluster at {address} (no "
        f"RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token); set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to "
        f"the cluster's token"]
    assert "Check failed" not in r.stderr and "Traceback" not in r.stderr


def test_the_cli_joins_a_running_cluster_and_trains_even_one_worker_on_it(tmp_path):
    """``ray job submit -- python -m par_ray.train …`` runs the CLI with ``RAY_ADDRESS`` naming the cluster: it joins
    it (the capacity check needs ``ray.init``: it used to fail "Ray has not been started yet" for ``--workers 2``) and
    runs even one worker as a Ray worker there, where the cluster has room and with checkpoints, not in Ray Train's
    local mode in this process (on a cluster, the head). Without the cluster's token: one line, exit 2."""
    from par_ray.train.trainer import SNAPSHOT_FILE

    temp_dir = Path(f"/tmp/rtc{os.getpid()}")  # short: Ray's socket paths must stay under 108 characters
    port = mlflow_ui.free_port()
    base = {k: v for k, v in _env().items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    token = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "b" * 32}
    driver = {"RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_TMPDIR": str(tmp_path / "rt")}
    args = ("--steps", "4", "--set", "train.batch_size=8", "--set", "train.checkpoint_every=2")
    with ray_head(temp_dir, port, {**base, **token}) as started:
        assert started.returncode == 0, started.stderr[-3000:]
        out = tmp_path / "run"
        r = subprocess.run(_cli(*args, "--out", str(out)), capture_output=True, text=True, timeout=600, cwd=ROOT,
                           env={**base, **token, **driver})
        print(r.stdout[-3000:], r.stderr[-3000:], sep="\n----- stderr -----\n")
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"Ray: joined 127.0.0.1:{port}" in r.stdout.splitlines()
        assert "(RayTrainWorker pid=" in r.stdout and "step      4/4" in r.stdout  # a Ray worker's forwarded lines
        (run,) = (out / "ray").iterdir()
        assert (run / SNAPSHOT_FILE).is_file()  # Ray Train's checkpoints: local mode keeps none
        assert (out / "final" / "model.safetensors").is_file() and (out / "result.json").is_file()

        (tmp_path / "home").mkdir()  # no ~/.ray/auth_token
        out = tmp_path / "refused"
        r = subprocess.run(_cli(*args, "--out", str(out)), capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env={**base, **driver, "HOME": str(tmp_path / "home")})
        print(r.stdout[-3000:], r.stderr[-3000:], sep="\n----- stderr -----\n")
        assert r.returncode == 2
        assert [line for line in r.stderr.splitlines() if line.startswith("error:")] == [
            f"error: Ray: the cluster at 127.0.0.1:{port} requires token authentication and this process has no "
            f"token for it; set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token; nothing was started"]
        assert "Traceback" not in r.stderr and not out.exists()


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs of ``size`` (``mount -o size=…``) mounted at the new folder ``path``, unmounted afterwards; skips the
    test where one cannot be mounted (not root, no mount namespace)."""
    path.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mount.returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.mark.full_only
def test_a_full_disk_ends_the_sweep_with_closed_runs_and_resume_completes(tmp_path, sweep_runs):
    """Storage on a small tmpfs that fills during the sweep; the MLflow store elsewhere. Skipped where tmpfs cannot
    be mounted (not root, no mount namespace)."""
    with tmpfs(tmp_path / "disk", "60m") as disk:
        script = tmp_path / "sigterm_demo.py"
        script.write_text(LONG_SWEEP)
        filler = disk / "filler"
        filler.write_bytes(b"\0" * 45 * 2**20)  # leaves ~15 MB: the first checkpoints fit, later ones do not
        uri = f"sqlite:///{tmp_path}/mlflow.db"
        flags = ["--preset", "local", "--smoke-test", "--set", "train.steps=12", "--storage", str(disk / "storage"),
                 "--mlflow-uri", uri]
        first = _sweep(script, *flags)
        assert first.returncode != 0
        assert first.stderr.strip().splitlines()[-1] == f"error: No space left on device: {disk / 'storage'}"
        parent, children = sweep_runs(uri, "sigterm_demo")
        assert parent.info.status != "RUNNING" and all(c.info.status != "RUNNING" for c in children)

        filler.unlink()  # space freed
        second = _sweep(script, *flags, "--resume")
        assert second.returncode == 0, second.stderr[-3000:]
        _, children = sweep_runs(uri, "sigterm_demo")
        assert [(c.info.status, c.data.metrics["step"]) for c in children] == [("FINISHED", 12)]


# ----------------------------------------------------------------------------------------------------------------
# Issue 39: remote storage, a full tracking store, a cluster too small for a CLI run, Ctrl-C, a damaged checkpoint

def test_a_sweep_on_s3_storage_says_how_to_resume_and_the_resume_finishes_with_status_0(tmp_path, s3_bucket,
                                                                                         sweep_runs):
    """``--storage s3://…`` against a local S3 server. Stopped at step 2 (SIGTERM, as ``ray job stop`` sends it), the
    sweep prints its counts and the ``--resume`` hint; resumed, it finishes with exit status 0 (no ``error:`` from
    the analysis, whose tables go to the parent run only) and its checkpoints are in the bucket."""
    import boto3

    from par_ray.sweep.run import SIGTERM_BEFORE_LOGGING_STEP_ENV

    script = tmp_path / "sigterm_demo.py"
    script.write_text(LONG_SWEEP)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    flags = ["--preset", "local", "--smoke-test", "--storage", f"{s3_bucket}/sweeps/demo", "--mlflow-uri", uri]
    first = subprocess.run([sys.executable, str(script), *flags], capture_output=True, text=True, timeout=900,
                           cwd=ROOT, env={**_env(), SIGTERM_BEFORE_LOGGING_STEP_ENV: "2"})
    print(first.stdout[-4000:], first.stderr[-4000:], sep="\n----- stderr -----\n")
    assert first.returncode == 1
    assert "trials: 1 unfinished" in first.stdout
    assert "rerun with --resume (same --storage and --set)" in first.stderr
    assert "error:" not in first.stderr and "analysis failed" not in first.stderr

    second = _sweep(script, *flags, "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "trials: 1 finished" in second.stdout
    assert "analysis: tables and figures logged to parent run" in second.stdout
    assert "error:" not in second.stderr and "analysis failed" not in second.stderr
    parent, children = sweep_runs(uri, "sigterm_demo")
    assert parent.info.status == "FINISHED" and [c.info.status for c in children] == ["FINISHED"]
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="par-ray", Prefix="sweeps/demo/")["Contents"]]
    assert any(k.startswith("sweeps/demo/train/sigterm_demo/trial_") and k.endswith("/extra.json") for k in keys)
    assert any(k.startswith("sweeps/demo/tune/sigterm_demo/") for k in keys)


@pytest.mark.full_only
def test_a_full_tracking_store_ends_the_sweep_in_one_line_and_resume_completes(tmp_path, sweep_runs):
    """The SQLite MLflow store on its own small tmpfs, filled while the trial trains (the test fills it once the first
    checkpoint is stored): one ``error:`` line as for a full storage disk, the runs closed or said not to be, no
    traceback; the checkpoints survive and ``--resume`` after freeing space completes in the same runs. Skipped where
    tmpfs cannot be mounted (not root, no mount namespace)."""
    with tmpfs(tmp_path / "disk", "8m") as disk:
        script = tmp_path / "sigterm_demo.py"
        script.write_text(LONG_SWEEP)
        storage = tmp_path / "storage"
        db = disk / "mlflow.db"
        flags = ["--preset", "local", "--smoke-test", "--set", "train.steps=24", "--storage", str(storage),
                 "--mlflow-uri", f"sqlite:///{db}"]
        proc = subprocess.Popen([sys.executable, str(script), *flags], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT, env=_env())
        filler = disk / "filler"
        deadline = time.monotonic() + 600
        while not list((storage / "train").glob("sigterm_demo/trial_*/checkpoint_*/extra.json")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        with open(filler, "wb") as f:  # every byte left: the next metrics insert has no room
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
        out, err = proc.communicate(timeout=600)
        print(out[-4000:], err[-6000:], sep="\n----- stderr -----\n")
        assert proc.returncode == 1
        lines = err.strip().splitlines()
        assert lines[-1] == (f"error: No space left on device (MLflow tracking store: database or disk is full): "
                             f"{db}")
        assert "Traceback" not in err and "-1 trial run(s)" not in err
        stopped = next(line for line in lines if line.startswith("sweep sigterm_demo stopped by"))
        assert stopped.startswith("sweep sigterm_demo stopped by the MLflow tracking store; ")
        assert ("1 trial run(s) and the sweep run closed as KILLED" in stopped
                or "the MLflow runs could not be closed (" in stopped and "--resume closes them" in stopped), stopped

        filler.unlink()  # space freed
        second = _sweep(script, *flags, "--resume")
        assert second.returncode == 0, second.stderr[-3000:]
        parent, children = sweep_runs(f"sqlite:///{db}", "sigterm_demo")
        assert parent.info.status == "FINISHED"
        assert [(c.info.status, c.data.metrics["step"]) for c in children] == [("FINISHED", 24)]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "par_ray.train", "--train-depth", "4", "--eval-depths", "4,8", "--set",
            "eval.num_sequences=8", "--set", "train.eval_every=1000", "--set", "train.warmup_steps=1", *args]


def test_a_cli_run_on_more_workers_than_the_cluster_has_cpus_is_one_line_before_anything_starts(tmp_path):
    """``--workers`` past the local cluster's CPUs: Ray Train would wait for the workers forever (a worker-group
    timeout logged every minute); the capacity check the sweeps make refuses it, before --out is created."""
    workers = (os.cpu_count() or 1) + 1
    out = tmp_path / "run"
    r = subprocess.run(_cli("--workers", str(workers), "--set", f"train.batch_size={4 * workers}", "--out", str(out)),
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env())
    print(r.stdout[-3000:], r.stderr[-3000:], sep="\n----- stderr -----\n")
    assert r.returncode == 2
    (line,) = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: --workers: the Ray cluster (")
    assert f"cannot fit this run on {workers} worker(s): it needs {workers} CPU" in line
    assert line.endswith("use fewer --workers, or join a larger cluster (RAY_ADDRESS); nothing was started")
    assert "Traceback" not in r.stderr and not out.exists()


def _stacks(pid: int) -> str:
    """Every thread's Python stack in process ``pid`` and its children (py-spy, which ``ray[default]`` installs), for
    a test whose process did not exit: what it waits on."""
    import psutil

    spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if spy is None:
        return "(py-spy not installed: no stacks)"
    dumps = []
    for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        with contextlib.suppress(subprocess.SubprocessError):
            r = subprocess.run([spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True, timeout=30)
            dumps.append(f"----- {p.pid} {_cmdline(p)[:150]}\n{r.stdout}{r.stderr}")
    return "\n".join(dumps)


def _cmdline(p) -> str:
    """``p``'s command line, or "" once it has exited (``psutil.Process``)."""
    import psutil

    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


@pytest.mark.parametrize(("signum", "when"), [
    (signal.SIGINT, "training"),
    (signal.SIGINT, "Ray starting"),
    pytest.param(signal.SIGTERM, "training", marks=pytest.mark.full_only),
])
def test_one_ctrl_c_stops_a_cli_run_on_ray_workers_and_no_ray_process_is_left(tmp_path, signum, when):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) or SIGTERM (``kill``) once, mid-training on two
    Ray workers or while the run starts its Ray instance: one line, exit status 130, and every process of the Ray
    instance the run started (GCS, raylet, dashboard and its agents and modules, Train's controller and workers) gone.
    A Ctrl-C while Ray starts is held until it has (``par_ray.train.trainer.signals_held``): taken inside
    ``ray.init``, it left the raylet's agents running up to a minute, crashed the interpreter at exit, or (reaching
    the dashboard's modules) kept ``ray.init`` waiting 60 s for the dashboard."""
    import queue
    import threading

    import psutil

    from par_ray.train.trainer import SNAPSHOT_FILE

    out = tmp_path / "run"
    proc = subprocess.Popen(_cli("--workers", "2", "--steps", "100000", "--set", "train.batch_size=8",
                                 "--set", "train.report_every=20", "--out", str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=_env(), start_new_session=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)
    reader.start()
    seen, stacks = [], ""
    started = (lambda line: " step " in line and "/100000" in line) if when == "training" else (
        lambda line: line.startswith("Ray: starting a local instance"))
    try:
        while not any(started(line) for line in seen):
            seen.append(lines.get(timeout=300))
        ray_processes = psutil.Process(proc.pid).children(recursive=True)
        # while Ray starts: once the raylet has started its agents (ray::DashboardAgent, ray::RuntimeEnvAgent), the
        # moment an unheld Ctrl-C left them running after the driver exited
        deadline = time.monotonic() + 120
        while when == "Ray starting" and not any("Agent" in _cmdline(p) for p in ray_processes):
            assert time.monotonic() < deadline and proc.poll() is None, "Ray did not start its agents"
            time.sleep(0.05)
            ray_processes = psutil.Process(proc.pid).children(recursive=True)
        assert any("gcs_server" in _cmdline(p) for p in ray_processes)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signum)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            stacks = _stacks(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(timeout=30)
    while not lines.empty():
        seen.append(lines.get())
    text = "".join(seen)
    print(text[-4000:], *([stacks] if stacks else []), sep="\n----- the stacks of the processes left -----\n")
    assert proc.returncode == 130
    checkpointed = any((out / "ray").glob(f"*/{SNAPSHOT_FILE}"))  # the line says what is on disk
    assert not (checkpointed and when == "Ray starting")
    assert text.strip().splitlines()[-1] == (
        f"interrupted: rerun the same command to continue from the latest checkpoint in {out}" if checkpointed
        else "interrupted: no checkpoint was written yet: rerunning starts afresh")
    assert "Traceback" not in text and "ERROR" not in text
    for p in list(ray_processes):  # and those they started since (a worker's own children)
        with contextlib.suppress(psutil.Error):
            ray_processes += p.children(recursive=True)
    _, alive = psutil.wait_procs([p for p in ray_processes if p.is_running()], timeout=15)
    assert not alive, [_cmdline(p)[:200] for p in alive]


@pytest.mark.full_only
def test_a_cli_run_resumes_from_the_newest_intact_checkpoint_when_the_latest_is_damaged(tmp_path):
    """Random bytes of the same size over the latest ``state.pt`` of a run on two Ray workers (ddp): the rerun names
    the damaged checkpoint in one ``resume:`` line, sets it aside and resumes from the one before."""
    out = tmp_path / "run"
    args = _cli("--workers", "2", "--steps", "4", "--set", "train.batch_size=8", "--set", "train.checkpoint_every=2",
                "--set", "train.keep_checkpoints=2", "--out", str(out))
    env = _env()
    first = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    run = next((out / "ray").iterdir())
    latest = max((d for d in run.glob("checkpoint_*") if d.is_dir()),
                 key=lambda d: json.loads((d / "extra.json").read_text())["step"])
    state = latest / "state.pt"
    state.write_bytes(os.urandom(state.stat().st_size))

    second = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    print(second.stdout[-3000:], second.stderr[-3000:], sep="\n----- stderr -----\n")
    assert second.returncode == 0, second.stderr[-3000:]
    notes = [line for line in second.stdout.splitlines() if line.startswith("resume: ")]
    assert len(notes) == 1, notes
    assert notes[0].startswith(f"resume: damaged checkpoint set aside in damaged/: {latest.name} (step 4): state.pt "
                               f"does not match its SHA-256 in extra.json; resuming from step 2 (checkpoint_"), notes
    assert "resumed from step 2" in second.stdout and "weights_only" not in second.stdout + second.stderr
    assert (run / "damaged" / latest.name / "state.pt").is_file()
