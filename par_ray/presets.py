"""Presets: the base trial configs the CLI and the sweeps start from.

``local``: tiny Qwen2/Qwen3 shapes that learn on a 2-core CPU (issue "PAR core"), evaluated to 8× the train length.
``paper``: the paper's protocol on real Qwen sizes (d_train 32, evaluation to 16×, bf16 on GPUs).
"""

from __future__ import annotations

from par_ray.config import BackboneConfig, EvalConfig, RecipeConfig, TaskConfig, TrainConfig, TrialConfig

LOCAL_BACKBONES = ("tiny-qwen2", "tiny-qwen3")
PAPER_BACKBONES = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b")


def local_trial(backbone: str = "tiny-qwen2", task: str = "swap_s5", seed: int = 0) -> TrialConfig:
    """The CPU default: d_train 8, tests at 8/16/32/64, AdamW 1e-3, batch 64, one process, float32."""
    return TrialConfig(
        task=TaskConfig(name=task, train_depth=8),
        backbone=BackboneConfig(name=backbone),
        recipe=RecipeConfig(grad_window=8),
        train=TrainConfig(steps=3000, batch_size=64, lr=1e-3, warmup_steps=100, seed=seed, eval_every=500,
                          report_every=50, checkpoint_every=500),
        eval=EvalConfig(depths=(8, 16, 32, 64), num_sequences=256, batch_size=256),
    )


def paper_trial(backbone: str = "qwen2.5-0.5b", task: str = "swap_s5", seed: int = 0) -> TrialConfig:
    """The paper's protocol: d_train 32, tests 32…512 (16×), 1,024 sequences per depth, bf16 on GPUs."""
    return TrialConfig(
        task=TaskConfig(name=task, train_depth=32),
        backbone=BackboneConfig(name=backbone, pretrained=None),
        recipe=RecipeConfig(grad_window=8, max_iterations=64),
        train=TrainConfig(steps=5000, batch_size=64, lr=1e-4, warmup_steps=200, seed=seed, use_gpu=True,
                          num_workers=1, eval_every=1000, report_every=50, checkpoint_every=500),
        eval=EvalConfig(depths=(32, 64, 128, 256, 512), num_sequences=1024, batch_size=128),
    )
