"""Sweeps end to end on a local Ray cluster (each command starts its own): the smoke sweep tracked in MLflow over
HTTP, resuming an interrupted sweep without rerunning or duplicating trials, and an Optuna + ASHA search on G.

Tiny forms only (4 steps per trial, 16 evaluation sequences per depth); each test takes 1-3 minutes on 2 cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from par_ray import mlflow_ui
from par_ray.tracking_schema import ARTIFACTS

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.ray


def _sweep(script: str | Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run a sweep script on a fresh local Ray cluster (never one another process left running)."""
    env = {**os.environ, "RAY_ADDRESS": "local", "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    path = script if isinstance(script, Path) else ROOT / "sweeps" / f"{script}.py"
    r = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env=env)
    print(r.stdout[-6000:], r.stderr[-6000:], sep="\n----- stderr -----\n")
    return r


@pytest.fixture(scope="module")
def smoke_sweep(tmp_path_factory):
    """``python sweeps/backbone_scaling.py --smoke-test --seeds 0,1`` logging to an ``mlflow server`` over HTTP."""
    tmp = tmp_path_factory.mktemp("smoke")
    backend, artifacts = f"sqlite:///{tmp}/server.db", str(tmp / "artifacts")
    with mlflow_ui.local_server(backend, artifacts) as url:
        r = _sweep("backbone_scaling", "--smoke-test", "--seeds", "0,1", "--storage", str(tmp / "storage"),
                   "--mlflow-uri", url)
        yield {"result": r, "url": url, "backend": backend, "artifacts": artifacts, "tmp": tmp}


def test_smoke_sweep_is_one_parent_and_a_child_run_per_trial_over_http(smoke_sweep, sweep_runs):
    from mlflow.tracking import MlflowClient

    r, url = smoke_sweep["result"], smoke_sweep["url"]
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trials: 4 finished" in r.stdout
    assert "| par | tiny-qwen2 |" in r.stdout and "| par | tiny-qwen3 |" in r.stdout  # the seed-aggregated table

    parent, children = sweep_runs(url, "backbone_scaling")
    assert parent.data.tags["par_ray.sweep"] == "backbone_scaling" and parent.info.status == "FINISHED"
    assert sorted((c.data.tags["par_ray.backbone"], c.data.tags["par_ray.seed"]) for c in children) == [
        (b, s) for b in ("tiny-qwen2", "tiny-qwen3") for s in ("0", "1")]
    client = MlflowClient(url)
    for c in children:
        assert c.info.status == "FINISHED"
        tags, params, metrics = c.data.tags, c.data.params, c.data.metrics
        assert tags["par_ray.recipe"] == "par" and tags["par_ray.task"] == "swap_s5" and tags["par_ray.trial_id"]
        assert len(tags["par_ray.git_commit"]) in (40, len("unknown"))
        assert params["backbone.name"] == tags["par_ray.backbone"] and params["train.seed"] == tags["par_ray.seed"]
        assert params["train.steps"] == "4" and params["eval.depths"] == "16,32"
        assert metrics["step"] == 4 and {"G", "G_censored", "acc_d16", "acc_d32", "loss", "chance"} <= metrics.keys()
        assert [m.step for m in client.get_metric_history(c.info.run_id, "loss")] == [2, 4]
        assert {a.path for a in client.list_artifacts(c.info.run_id)} == set(ARTIFACTS)
    # analysis ran on the parent run and logged its tables and figures there
    assert any(a.path.startswith("analysis") for a in client.list_artifacts(parent.info.run_id))


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian chromium is not installed")
def test_mlflow_screenshot_of_the_smoke_sweep(smoke_sweep):
    out = smoke_sweep["tmp"] / "compare.png"
    r = subprocess.run([sys.executable, str(ROOT / "scripts/mlflow_screenshot.py"), "--storage",
                        str(smoke_sweep["tmp"]), "--backend-store-uri", smoke_sweep["backend"], "--artifacts",
                        smoke_sweep["artifacts"], "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 50_000


FAILING_SWEEP = textwrap.dedent('''
    """Two trials; the second's worker dies at step 3 (after its step-2 checkpoint) and nothing retries it."""
    import sys

    from par_ray.config import with_overrides
    from par_ray.recipes import par
    from par_ray.sweep import SweepSpec, main


    def par_fail(cfg):
        return with_overrides(par(cfg), recipe=dict(name="par_fail"), train=dict(fail_at_step=3))


    SPEC = SweepSpec(name="resume_demo", recipes=("par", "par_fail"), extra_recipes={"par_fail": par_fail},
                     backbones={"local": ("tiny-qwen2",)}, seeds=(0,), tune_max_failures=0, train_max_failures=0)

    if __name__ == "__main__":
        sys.exit(main(SPEC))
''')


@pytest.mark.full_only
def test_resume_finishes_failed_trials_without_rerunning_or_duplicating(tmp_path, sweep_runs):
    from mlflow.tracking import MlflowClient

    script = tmp_path / "resume_demo.py"
    script.write_text(FAILING_SWEEP)
    storage = tmp_path / "storage"
    uri = f"sqlite:///{storage}/mlflow.db"
    flags = ["--preset", "local", "--smoke-test", "--storage", str(storage)]

    first = _sweep(script, *flags)
    assert first.returncode == 1, first.stderr[-3000:]
    assert "rerun with --resume" in first.stderr
    parent, children = sweep_runs(uri, "resume_demo")
    status = {c.data.tags["par_ray.recipe"]: c.info.status for c in children}
    assert status == {"par": "FINISHED", "par_fail": "FAILED"}
    client = MlflowClient(uri)
    ids = {c.data.tags["par_ray.recipe"]: c.info.run_id for c in children}
    done_history = [(m.step, m.timestamp) for m in client.get_metric_history(ids["par"], "loss")]
    assert [m.step for m in client.get_metric_history(ids["par_fail"], "loss")] == [2]

    second = _sweep(script, *flags, "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    parent2, children2 = sweep_runs(uri, "resume_demo")
    assert parent2.info.run_id == parent.info.run_id  # the same sweep run ...
    assert {c.data.tags["par_ray.recipe"]: c.info.run_id for c in children2} == ids  # ... and no duplicate trials
    assert {c.info.status for c in children2} == {"FINISHED"}
    # The finished trial did not run again; the failed one continued from its step-2 checkpoint.
    assert [(m.step, m.timestamp) for m in client.get_metric_history(ids["par"], "loss")] == done_history
    assert [m.step for m in client.get_metric_history(ids["par_fail"], "loss")] == [2, 4]
    assert {a.path for a in client.list_artifacts(ids["par_fail"])} == set(ARTIFACTS)

    # --resume of the finished sweep: nothing to do, every trial finished, the runs stay FINISHED (it used to count
    # restored trials whose saved last result lacked Tune's "done" as unfinished, exit 1 and mark the sweep KILLED)
    third = _sweep(script, *flags, "--resume")
    assert third.returncode == 0, third.stderr[-3000:]
    assert "trials: 2 finished" in third.stdout and "--resume" not in third.stderr
    parent3, children3 = sweep_runs(uri, "resume_demo")
    assert parent3.info.status == "FINISHED" and {c.info.status for c in children3} == {"FINISHED"}


@pytest.mark.full_only
def test_optuna_search_with_asha_on_G(tmp_path, sweep_runs):
    storage = tmp_path / "storage"
    r = _sweep("search", "--preset", "local", "--smoke-test", "--num-samples", "3", "--storage", str(storage))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "best G = " in r.stdout
    parent, children = sweep_runs(f"sqlite:///{storage}/mlflow.db", "search")
    assert parent.data.params["search.metric"] == "G" and parent.data.params["num_trials"] == "3"
    assert len(children) == 3
    assert len({c.data.params["train.lr"] for c in children}) == 3  # Optuna proposed three configurations
    assert all(c.data.params["recipe.name"] == "par_hold" for c in children)
    assert all("G" in c.data.metrics for c in children)
    # ASHA may stop a trial at its first rung (step 2): its run is FINISHED too, tagged where it stopped; the rest
    # ran all 4 steps. The analysis leaves the stopped ones out of its aggregates and names them.
    assert {c.info.status for c in children} == {"FINISHED"}
    stopped = [c for c in children if c.data.metrics["step"] < 4]
    assert all(c.data.tags.get("par_ray.stopped_early") == f"step {c.data.metrics['step']:g} of 4"
               for c in stopped)
    assert not any("par_ray.stopped_early" in c.data.tags for c in children if c not in stopped)
    assert (f"{len(stopped)} stopped early (ASHA) trial(s)" in r.stdout) == bool(stopped)
    # --resume of the finished search: nothing runs again, and no trial's storage is touched (a stopped trial's
    # checkpoint written after its last report was removed as if the trial would repeat its steps)
    again = _sweep("search", "--preset", "local", "--smoke-test", "--num-samples", "3", "--storage", str(storage),
                   "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "removed checkpoint" not in again.stdout and "trials: " in again.stdout
