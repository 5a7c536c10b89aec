"""Build the Ray Train ``TorchTrainer`` that runs one trial: the only place that sets Train's scaling and run config.

``num_workers=0`` is Ray Train's local mode: the loop runs in this process with ``ray.train.report`` working as
usual and no Ray cluster started, which is how ``python -m par_ray.train`` trains on a laptop.
"""

from __future__ import annotations

import ray.train
from ray.train.torch import TorchConfig, TorchTrainer

from par_ray.config import TrialConfig
from par_ray.train.loop import train_loop_per_worker


def build_trainer(cfg: TrialConfig, name: str, storage_path: str, local: bool = False,
                  max_failures: int = 0, callbacks: list | None = None) -> TorchTrainer:
    """A ``TorchTrainer`` for ``cfg``; validates ``cfg`` first (before any cluster resource is claimed).

    Args:
        name: deterministic run name (a re-submitted job with the same name resumes from its latest checkpoint).
        storage_path: local directory or ``s3://`` / ``gs://`` URI for checkpoints and results.
        local: run in Ray Train's local mode (this process, one worker), regardless of ``train.num_workers``.
        max_failures: worker-group restarts from the latest checkpoint (``FailureConfig``).
    """
    cfg.validate()
    tc = cfg.train
    scaling = ray.train.ScalingConfig(
        num_workers=0 if local else tc.num_workers,
        use_gpu=tc.use_gpu,
        resources_per_worker=None if tc.use_gpu else {"CPU": max(1, tc.threads_per_worker)},
    )
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"trial": cfg},
        torch_config=TorchConfig(backend="nccl" if tc.use_gpu else "gloo"),
        scaling_config=scaling,
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=storage_path,
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            callbacks=callbacks,
        ),
    )
