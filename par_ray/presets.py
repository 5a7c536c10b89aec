"""Presets: the base trial configs the CLI and the sweeps start from.

``local``: tiny Qwen2/Qwen3 shapes that learn on a 2-core CPU (issue "PAR core"), d_train 6, evaluated to 8× the train
length.
``paper``: the paper's protocol on real Qwen sizes at each task's paper depths (``par_ray.tasks.PAPER_DEPTHS``;
the permutation tasks: d_train 32, evaluation to 16×), bf16 on GPUs.
"""

from __future__ import annotations

from par_ray.config import BackboneConfig, EvalConfig, RecipeConfig, TaskConfig, TrainConfig, TrialConfig

LOCAL_BACKBONES = ("tiny-qwen2", "tiny-qwen3")
PAPER_BACKBONES = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b")


LOCAL_TRAIN_DEPTH = 6
LOCAL_EVAL_MULTIPLES = (1, 2, 4, 8)
"""The local preset tests at 1×, 2×, 4× and 8× d_train (the CLI scales these to ``--train-depth``)."""


def local_trial(backbone: str = "tiny-qwen2", task: str = "swap_s5", seed: int = 0) -> TrialConfig:
    """The CPU default: d_train 6, tests at 6/12/24/48 (8×), AdamW 1e-3, batch 64, 3,000 steps, one process, float32.

    Sized so the local sweep's 6 trials fit its 45-minute budget on 2 cores (two 1-thread trials side by side):
    with d_train 8 a sweep trial ran ~3.2 steps/s and the sweep would take ~50 minutes; d_train 6 makes a step ~30 %
    cheaper (R·T ∝ d(d+7)). The PAR-core bar (≥ 95 % at d = 8) is the same recipe with ``--train-depth 8 --steps
    4000`` (docs/experiments.md, experiment 3). Evaluates every 1,000 steps: the deepest test costs ~20 steps.
    """
    return TrialConfig(
        task=TaskConfig(name=task, train_depth=LOCAL_TRAIN_DEPTH),
        backbone=BackboneConfig(name=backbone),
        recipe=RecipeConfig(grad_window=8),
        train=TrainConfig(steps=3000, batch_size=64, lr=1e-3, warmup_steps=100, seed=seed, eval_every=1000,
                          report_every=50, checkpoint_every=500),
        eval=EvalConfig(depths=tuple(m * LOCAL_TRAIN_DEPTH for m in LOCAL_EVAL_MULTIPLES), num_sequences=256,
                        batch_size=256),
    )


def _hub_name(backbone: str) -> str | None:
    from par_ray.model.backbones import BACKBONES

    return BACKBONES[backbone].hub_name if backbone in BACKBONES else None


def paper_trial(backbone: str = "qwen2.5-0.5b", task: str = "swap_s5", seed: int = 0) -> TrialConfig:
    """The paper's protocol: the task's paper depths (``par_ray.tasks.PAPER_DEPTHS``: for the permutation tasks
    d_train 32, tests 32…512, i.e. 16×), 1,024 sequences per depth, bf16 on GPUs. Raises ``ValueError`` for an
    unknown task."""
    from par_ray.tasks import PAPER_DEPTHS, get_task

    get_task(task)  # the registry's error names the known tasks
    depths = PAPER_DEPTHS[task]
    return TrialConfig(
        task=TaskConfig(name=task, train_depth=depths.train_depth, min_train_depth=depths.min_train_depth),
        # PAR retrofits the *pretrained* parent: the paper preset loads the hub checkpoint (a cluster node with hub
        # access or a local mirror; override with backbone.pretrained=PATH).
        backbone=BackboneConfig(name=backbone, pretrained=_hub_name(backbone)),
        recipe=RecipeConfig(grad_window=8, max_iterations=64),
        train=TrainConfig(steps=5000, batch_size=64, lr=1e-4, warmup_steps=200, seed=seed, use_gpu=True,
                          num_workers=1, eval_every=1000, report_every=50, checkpoint_every=500),
        eval=EvalConfig(depths=depths.test_depths, num_sequences=1024, batch_size=128),
    )


# --------------------------------------------------------------------------------------------------------------------
# Sweep presets (par_ray.sweep): one base trial per (preset, backbone, task, seed), parallelism chosen by size.

PRESETS = {"local": local_trial, "paper": paper_trial}
"""Preset name → base-trial function ``(backbone, task, seed) -> TrialConfig``."""
PRESET_BACKBONES = {"local": LOCAL_BACKBONES, "paper": PAPER_BACKBONES}
"""Backbones a sweep runs by default under each preset."""

PAPER_GPU_MEMORY_GB = 80.0
"""The GPU the paper preset plans for (A100/H100 80 GB)."""
PAPER_HEADROOM = 0.9
"""Plan to 90 % of the card: the planner is within ~1 % of measurement on CPU, but unmeasured on GPU (allocator
fragmentation, CUDA context, NCCL buffers)."""
PAPER_PARALLELISM_CANDIDATES = (
    # (strategy, GPUs per trial, ZeRO stage), cheapest first: plain DDP on as few GPUs as fit, then sharded params.
    ("ddp", 1, 2), ("ddp", 2, 2), ("fsdp", 2, 2), ("fsdp", 4, 2), ("deepspeed", 4, 3), ("fsdp", 8, 2),
    ("deepspeed", 8, 3),
)


def paper_parallelism(backbone: str, task: str = "swap_s5", ema: bool = False) -> dict[str, object]:
    """Flat ``train.*`` overrides (strategy, workers, ZeRO stage) for ``backbone`` under the paper preset of ``task``.

    The first of :data:`PAPER_PARALLELISM_CANDIDATES` whose per-GPU peak (``par_ray.planner.plan``, bf16, the paper
    trial's R, gradient window, global batch split over the GPUs, the task's prompt length and read positions at
    d_train, the checkpoint's vocabulary; ``ema``: plus a prefix self-distillation EMA teacher) fits in
    :data:`PAPER_HEADROOM` × :data:`PAPER_GPU_MEMORY_GB`. Raises ``ValueError`` if none fits.
    """
    from par_ray.planner import plan
    from par_ray.tasks import get_task

    cfg = paper_trial(backbone, task)
    t, r, tr = cfg.task, cfg.recipe, cfg.train
    episode = get_task(task).sample(t.train_depth, 1, seed=0)
    seq_len, reads = episode.input_ids.shape[1], episode.read_positions.numel()
    R = min(-(-t.train_depth // r.ops_per_iteration), r.max_iterations)
    for strategy, n, stage in PAPER_PARALLELISM_CANDIDATES:
        need = plan(backbone, strategy, n, R=R, grad_window=r.grad_window, micro_batch=tr.batch_size // n,
                    seq_len=seq_len, read_positions=reads, zero_stage=stage, dtype="bf16", ema=ema)
        if need.fits(PAPER_GPU_MEMORY_GB * PAPER_HEADROOM):
            return {"train.strategy": strategy, "train.num_workers": n, "train.zero_stage": stage}
    raise ValueError(f"backbone.name: {backbone!r} fits none of {PAPER_PARALLELISM_CANDIDATES} on "
                     f"{PAPER_GPU_MEMORY_GB:g} GB GPUs (python -m par_ray.planner --table)")


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
    return from_flat(paper_parallelism(backbone, task), base=cfg) if preset == "paper" else cfg


def smoke_overrides(cfg: TrialConfig) -> dict[str, object]:
    """Flat overrides that turn a preset trial into a smoke test: 4 steps of 8 sequences, the first two test depths
    with 16 sequences each, evaluation, report and checkpoint every 2 steps (so every report carries G)."""
    return {
        "train.steps": 4, "train.batch_size": 8, "train.warmup_steps": 1, "train.eval_every": 2,
        "train.report_every": 2, "train.checkpoint_every": 2,
        "eval.depths": ",".join(str(d) for d in cfg.eval.depths[:2]), "eval.num_sequences": 16, "eval.batch_size": 16,
    }
