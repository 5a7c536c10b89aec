"""Faults end to end on a local Ray cluster (each sweep starts its own), with the sweep's own retry settings
(``TRAIN_MAX_FAILURES``, ``TUNE_MAX_FAILURES``): a diverging trial fails once with its reason on its MLflow run while
the others finish; SIGTERM to a sweep driver (``ray job stop``) leaves no RUNNING run and ``--resume`` completes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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
    env = {**_env(), "RAY_ADDRESS": ""}
    first = subprocess.run(base + ["--workers", "2", "--strategy", "fsdp"], capture_output=True, text=True,
                           timeout=900, cwd=ROOT, env=env)
    print(first.stdout[-3000:], first.stderr[-3000:], sep="\n----- stderr -----\n")
    assert first.returncode == 0, first.stderr[-3000:]
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
    import psutil
    import ray

    from par_ray.sweep import resources

    temp_dir = Path(f"/tmp/rt{os.getpid()}")  # short: Ray's socket paths must stay under 108 characters
    port = mlflow_ui.free_port()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    started = subprocess.run([ray_bin, "start", "--head", "--temp-dir", str(temp_dir), "--port", str(port),
                              "--num-cpus", "1", "--include-dashboard", "false"], capture_output=True, text=True,
                             timeout=300, env=env)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        assert (temp_dir / "ray_current_cluster").exists()
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # nothing in the default place
        address = resources.ray_address()
        assert address.endswith(f":{port}")
        assert resources.connect() is not None
        ray.shutdown()
        assert f"Ray: joined {address}" in capsys.readouterr().out
    finally:
        ray.shutdown()
        # stop this head only (`ray stop` would stop every Ray instance on the host)
        for proc in psutil.process_iter(["cmdline"]):
            if any(str(temp_dir) in arg for arg in proc.info.get("cmdline") or []):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.full_only
def test_a_cluster_wanting_a_token_the_laptop_lacks_is_one_line(tmp_path):
    """A head started with token authentication; a sweep driver with no token (no ``RAY_AUTH_*``, no
    ``~/.ray/auth_token``: a fresh ``HOME``) gets one ``error:`` line naming the cluster and the variables to set,
    no traceback. Its own process, so this test process's cached auth state is not involved."""
    import psutil

    temp_dir = Path(f"/tmp/rta{os.getpid()}")  # short: Ray's socket paths must stay under 108 characters
    port = mlflow_ui.free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    head_env = {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "a" * 32}
    ray_bin = str(Path(sys.executable).with_name("ray"))
    started = subprocess.run([ray_bin, "start", "--head", "--temp-dir", str(temp_dir), "--port", str(port),
                              "--num-cpus", "1", "--include-dashboard", "false"], capture_output=True, text=True,
                             timeout=300, env=head_env)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        (tmp_path / "home").mkdir()
        driver_env = {**base, "HOME": str(tmp_path / "home"), "RAY_ADDRESS": f"127.0.0.1:{port}",
                      "RAY_TMPDIR": str(tmp_path / "rt")}
        code = ("import sys\n"
                "from par_ray.sweep import resources\n"
                "from par_ray.sweep.spec import SweepConfigError\n"
                "try:\n    resources.connect()\n"
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
    finally:
        for proc in psutil.process_iter(["cmdline"]):
            if any(str(temp_dir) in arg for arg in proc.info.get("cmdline") or []):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.full_only
def test_a_full_disk_ends_the_sweep_with_closed_runs_and_resume_completes(tmp_path, sweep_runs):
    """Storage on a small tmpfs that fills during the sweep; the MLflow store elsewhere. Skipped where tmpfs cannot
    be mounted (not root, no mount namespace)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=60m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
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
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
