"""Shared test helpers."""

from __future__ import annotations

import pytest
import torch

from par_ray import tracking


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


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests: on the shared 2-core machine two spinning OpenMP threads make the tiny
    steps ~10x slower, and the planner measurements' allocations are the same. Restores the count afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
