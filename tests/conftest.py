"""Shared test helpers."""

from __future__ import annotations

import os

import pytest
import torch

from par_ray import tracking


FULL = os.environ.get("PAR_RAY_FULL") == "1"
"""Run the full forms: every ``full_only`` case and the multi-node autoscaling tests (~45 minutes on 2 cores)."""


def pytest_collection_modifyitems(config, items):
    """Skip ``full_only`` cases unless ``PAR_RAY_FULL=1``. The Ray integration tests cost 30-300 s each on 2 cores
    (worker start-up, not training), ~95 % of the suite's time; CI (30 minutes with the install) runs one
    representative per mechanism — each strategy's 2-worker match, a killed-worker resume, one fault offset, a
    collective timeout, a divergence, the smoke sweep end to end — and the full form covers every ZeRO stage, every
    fault offset, the sweep resume and the Optuna + ASHA search."""
    if FULL:
        return
    skip = pytest.mark.skip(reason="full form only: set PAR_RAY_FULL=1 (CI runs the short form)")
    for item in items:
        if "full_only" in item.keywords:
            item.add_marker(skip)


def _sweep_runs(uri: str, sweep: str):
    """(parent run, child runs) of ``par_ray/<sweep>`` read with ``mlflow.search_runs``: asserts exactly one parent
    run and that every other run is a child of it (no stray or duplicated runs)."""
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        runs = mlflow.search_runs(experiment_names=[tracking.experiment_name(sweep)], output_format="list")
    finally:
        mlflow.set_tracking_uri(previous)
    parents = [r for r in runs if r.data.tags.get("par_ray.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("par_ray.role") == "trial"]
    assert len(parents) == 1, [p.info.run_id for p in parents]
    assert len(runs) == 1 + len(children), [r.data.tags for r in runs]
    assert all(c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for c in children)
    return parents[0], children


@pytest.fixture
def sweep_runs():
    """The MLflow parent/child runs of a sweep: ``sweep_runs(tracking_uri, sweep_name) -> (parent, children)``."""
    return _sweep_runs


def _local_reports(cfg, storage_path: str) -> list[dict]:
    """Every report's metrics, in order, of ``cfg`` trained by the real worker function in Ray Train's local mode
    (this process, no workers, no Ray instance). Local mode runs no Ray Train callbacks, so the reports are read off
    ``ray.train.report`` itself. The loop sets this process's torch threads; they are restored afterwards."""
    from par_ray.train import loop
    from par_ray.train.trainer import build_trainer

    reports = []
    report = loop.ray.train.report

    def spy(metrics, checkpoint=None):
        reports.append(dict(metrics))
        report(metrics, checkpoint=checkpoint)

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop.ray.train, "report", spy)
        build_trainer(cfg, "reference", storage_path, local=True).fit()
    torch.set_num_threads(threads)
    return reports


@pytest.fixture(scope="session")
def local_reports():
    """``local_reports(trial_config, storage_path) -> [metrics per report]``: the single-process reference run that
    the 2-worker strategy tests compare against."""
    return _local_reports


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests: on the shared 2-core machine two spinning OpenMP threads make the tiny
    steps ~10x slower, and the planner measurements' allocations are the same. Restores the count afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", autouse=True)
def no_stray_ray():
    """Fail the module that leaves a Ray instance running (and shut it down), rather than the next module whose
    ``ray.init`` would then fail with "called ray.init twice". Ray auto-initialises on many calls
    (``ray.get_runtime_context()``, ``ray.get``), so a stray instance is easy to start by accident."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()
        pytest.fail("this module left a Ray instance running (something auto-initialised Ray, or a test did not "
                    "shut its instance down)")
