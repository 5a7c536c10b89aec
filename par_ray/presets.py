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


# --------------------------------------------------------------------------------------------------------------------
# Sweep presets (par_ray.sweep): one base trial per (preset, backbone, task, seed), parallelism chosen by size.

PRESETS = {"local": local_trial, "paper": paper_trial}
"""Preset name → base-trial function ``(backbone, task, seed) -> TrialConfig``."""
PRESET_BACKBONES = {"local": LOCAL_BACKBONES, "paper": PAPER_BACKBONES}
"""Backbones a sweep runs by default under each preset."""

PAPER_PARALLELISM = (
    # (largest size in billions of parameters, strategy, GPUs per trial, ZeRO stage). Full fine-tuning in bf16 autocast
    # with fp32 AdamW holds ~16 bytes per parameter before activations: 1.7B ≈ 27 GB fits one 80 GB GPU; 3B-4B
    # (48-64 GB) leave too little room for the loop's activations, so FSDP shards them over 2 GPUs; 7B (≈ 112 GB)
    # needs ZeRO-3 over 4 GPUs. par_ray.planner gives the detailed estimate (``--dry-run``).
    (2.0, "ddp", 1, 2),
    (5.0, "fsdp", 2, 2),
    (float("inf"), "deepspeed", 4, 3),
)


def paper_parallelism(backbone: str) -> dict[str, object]:
    """Flat ``train.*`` overrides (strategy, workers, ZeRO stage) for ``backbone`` under the paper preset."""
    from par_ray.model.backbones import BACKBONES

    size = BACKBONES[backbone].reported_params or 0.0
    for limit, strategy, workers, stage in PAPER_PARALLELISM:
        if size <= limit:
            return {"train.strategy": strategy, "train.num_workers": workers, "train.zero_stage": stage}
    raise AssertionError("PAPER_PARALLELISM ends with an unbounded row")


def preset_trial(preset: str, backbone: str, task: str = "swap_s5", seed: int = 0) -> TrialConfig:
    """The base trial of ``preset`` (``local`` or ``paper``) for one backbone, task and seed.

    Raises ``ValueError`` naming ``preset`` or ``backbone.name`` when unknown.
    """
    from par_ray.config import from_flat
    from par_ray.model.backbones import BACKBONES

    if preset not in PRESETS:
        raise ValueError(f"preset: {preset!r} is not one of {list(PRESETS)}")
    if backbone not in BACKBONES:
        raise ValueError(f"backbone.name: {backbone!r} is not one of {sorted(BACKBONES)}")
    cfg = PRESETS[preset](backbone, task, seed)
    return from_flat(paper_parallelism(backbone), base=cfg) if preset == "paper" else cfg


def smoke_overrides(cfg: TrialConfig) -> dict[str, object]:
    """Flat overrides that turn a preset trial into a smoke test: 4 steps of 8 sequences, the first two test depths
    with 16 sequences each, evaluation, report and checkpoint every 2 steps (so every report carries G)."""
    return {
        "train.steps": 4, "train.batch_size": 8, "train.warmup_steps": 1, "train.eval_every": 2,
        "train.report_every": 2, "train.checkpoint_every": 2,
        "eval.depths": ",".join(str(d) for d in cfg.eval.depths[:2]), "eval.num_sequences": 16, "eval.batch_size": 16,
    }
