"""Presets: the base trial configs the CLI and the sweeps start from.

``local``: tiny Qwen2/Qwen3 shapes that learn on a 2-core CPU (issue "PAR core"), d_train 6, evaluated on the fine grid
(:func:`fine_depths`) to 8× the train length.
``paper``: the paper's protocol on real Qwen sizes at each task's paper depths (``par_ray.tasks.PAPER_DEPTHS``;
S5 / A5: d_train 16, evaluation to 256 = 16×), bf16 on GPUs, its strategy and GPU count chosen by the memory
planner per GPU type (``--gpu-types``: the cheapest type the trial fits; default :data:`PAPER_GPU_TYPE`, 80 GB), and
the trial asks Ray for that type.
"""

from __future__ import annotations

import math
import typing

from par_ray.accelerators import GPU_MEMORY_GB
from par_ray.config import BackboneConfig, EvalConfig, RecipeConfig, TaskConfig, TrainConfig, TrialConfig

LOCAL_BACKBONES = ("tiny-qwen2", "tiny-qwen3")
PAPER_BACKBONES = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b")


LOCAL_TRAIN_DEPTH = 6
LOCAL_EVAL_MULTIPLES = (1, 2, 4, 8)
"""The coarse multiples of d_train (1×, 2×, 4×, 8×); the local preset tests on the fine grid up to the last of them,
which contains them all (:func:`fine_depths`)."""
LOCAL_LOOP_OPTIONS = {
    "recipe.depth_schedule": "forced", "recipe.extra_iterations": 3, "backbone.adapter_alpha": 0.1,
    "backbone.attention_window": 2, "backbone.coda_window": 8,
}
"""Flat options of experiment 9's from-scratch recipe (docs/experiments.md §9, arm "s7 fp cw8") that every recipe of a
local comparison shares: up to 3 slack iterations, input injection alive from step 0 (adapter α 0.1), prelude/core
attention window 2, coda window 8 (par_ray options for random-init models, not the paper's)."""
LOCAL_PROGRESS_OPTIONS = {
    "recipe.dense_targets": True, "recipe.dense_pending": True, "recipe.fixed_point_weight": 1.0,
    "recipe.targets": "done", "task.given_prefix": 12,
}
"""The progress-aligned part of experiment 9's recipe: dense progress targets on every operation token with a pending
class, the fixed-point loss, queries supervised once done, operations given solved up to 12. With
:data:`LOCAL_LOOP_OPTIONS` it learns swap-S5 to 0.97 / 0.47 at 1× / 2× (tiny-qwen3, d_train 6, 2,000 steps)."""
LOCAL_FINAL_OPTIONS = {
    "recipe.dense_targets": False, "recipe.dense_pending": False, "recipe.fixed_point_weight": 0.0,
    "recipe.targets": "final", "task.given_prefix": 0,
}
"""The same keys for final-answer training: no per-operation (progress) supervision, no given prefix (it reads the
dense state classes), every iteration supervised with z_d."""
FINE_GRID_RATIO = 1.25
"""Largest ratio between neighbouring depths of the geometric part of :func:`fine_depths`."""


def fine_depths(train_depth: int, top: int, ratio: float = FINE_GRID_RATIO) -> tuple[int, ...]:
    """The fine evaluation grid (issue 22): every depth from d_train to 2·d_train, then, doubling by doubling
    (2·d_train → 4·d_train → … → ``top``, the last step possibly shorter), the fewest geometric steps whose rounded
    integer depths keep every neighbour ratio ≤ ``ratio``; deduplicated, ending exactly at ``top``.

    ``fine_depths(6, 48)`` = 6, 7, …, 12, 14, 17, 20, 24, 29, 34, 40, 48 (15 depths; neighbour ratios ≤ 1.22). The
    doubling anchors keep the coarse multiples (1×, 2×, 4×, 8× d_train, when ``top`` is a power-of-two multiple) in
    the grid, so its curve reads the old 1/2/4/8× columns too. Integers cannot keep the ratio below depth 4 (3/2,
    4/3): there every depth is tested. G on this grid is a multiple of 1/d_train up to 2×, and within a ratio of
    ``ratio`` above.

    Args:
        train_depth: d_train (``task.train_depth``), >= 1.
        top: the largest test depth (``max(eval.depths)``), >= d_train.
        ratio: the geometric part's largest neighbour ratio, > 1.
    Raises:
        ValueError: naming ``task.train_depth``, ``eval.depths`` (the top) or ``ratio``.
    """
    errs = []
    if not isinstance(train_depth, int) or train_depth < 1:
        errs.append(f"task.train_depth: must be an integer >= 1, got {train_depth!r}")
    elif not isinstance(top, int) or top < train_depth:
        errs.append(f"eval.depths: the fine grid's top depth must be an integer >= task.train_depth={train_depth}, "
                    f"got {top!r}")
    if not ratio > 1.0:
        errs.append(f"ratio: must be > 1, got {ratio!r}")
    if errs:
        raise ValueError("; ".join(errs))
    depths = list(range(train_depth, min(2 * train_depth, top) + 1))
    low = depths[-1]
    while low < top:
        high = min(2 * low, top)
        n = max(1, math.ceil(math.log(high / low) / math.log(ratio)))
        while True:  # rounding can push a step past the ratio: one more step until none does (or every integer)
            steps = sorted({round(low * (high / low) ** (i / n)) for i in range(1, n + 1)} - {low})
            seq = [low, *steps]
            if n >= high - low or all(b <= ratio * a for a, b in zip(seq, seq[1:])):
                break
            n += 1
        depths += steps
        low = high
    return tuple(depths)


def scaled_depths(depths: typing.Sequence[int], train_depth: int, new_train_depth: int) -> tuple[int, ...]:
    """A preset's test ``depths`` at d_train = ``train_depth``, moved to ``new_train_depth`` (the CLI's
    ``--train-depth``): a fine grid (``depths == fine_depths(train_depth, max(depths))``) is rebuilt to the same top
    multiple, ``fine_depths(new, new · max(depths) // train_depth)``; any other list keeps each depth's multiple,
    ``m · new`` for ``m = d // train_depth``."""
    top_multiple = max(depths) // train_depth
    if tuple(depths) == fine_depths(train_depth, max(depths)) and max(depths) % train_depth == 0:
        return fine_depths(new_train_depth, top_multiple * new_train_depth)
    return tuple(d // train_depth * new_train_depth for d in depths)


LOCAL_CURRICULUM_DEPTH = 16
"""d_train of :data:`LOCAL_CURRICULUM`: the length the curriculum ramps to."""
LOCAL_CURRICULUM = {
    "task.train_depth": LOCAL_CURRICULUM_DEPTH, "task.curriculum": (6, 11), "task.curriculum_steps": 1000,
    "recipe.state_noise": 0.1,
    "train.steps": 3000, "train.eval_every": 3000, "train.checkpoint_every": 1000,
    "eval.depths": fine_depths(LOCAL_CURRICULUM_DEPTH, 8 * LOCAL_CURRICULUM_DEPTH),
    "eval.num_sequences": 128, "eval.num_sequences_fine": 32, "eval.batch_size": 128,
    "eval.bracket_max_sequences": 1024, "eval.bracket_min_sequences": 512, "eval.bracket_block": 128,
    "train.compile": True, "recipe.read_every": 1,
}
"""The length curriculum that extrapolates at CPU scale (docs/experiments.md §28): d_train ramps 6 → 11 → 16 over
3,000 steps (1,000 per phase; the iterations before the gradient window run without autograd), state noise σ 0.1,
every iteration of the gradient window read out (``recipe.read_every`` 1: reading every other one cut G to 1.9–3.0 on
seeds 3 and 4, §28), decoder layers compiled (``train.compile``: a step ~20 % faster after a one-time compile of ~1
min per trial, the same math up to float round-off, §25). Tests once, at the end, on the fine grid to 8× (16 … 128:
every depth to 32, then ratio ≤ 1.25; 128 sequences at 16 / 32 / 64 / 128 and 32 at the 21 depths between), then
blocks of 128 at the two depths that bracket the midpoint crossing until each has >= 512 and its 95 % interval
excludes the midpoint, or 1,024 (``eval.bracket_*``). A trial trains ~28 min on one core of the reference machine.
Over seeds 0-4 nine of ten models reach interpolated G >= 4; the exception (tiny-qwen3 seed 4, 2.79) reaches >= 8
with a longer last phase, ``train.steps`` 4,500 (~45 min of training a trial), which lifts all ten to interpolated
G >= 4, nine of them >= 8 (docs/experiments.md §29, §32, §33, §35)."""
LOCAL_CURRICULUM_SHORT = {**LOCAL_CURRICULUM, "task.curriculum_steps": 500, "train.steps": 1500,
                          "train.eval_every": 1500, "train.checkpoint_every": 500, "recipe.read_every": 2,
                          "eval.bracket_max_sequences": 512, "eval.bracket_min_sequences": 256}
""":data:`LOCAL_CURRICULUM` at half the steps (500 per phase) and every other iteration of the gradient window read
out, in phase with ⌈d/c⌉ (``recipe.read_every`` 2, ~20 % off a step), brackets of 256 to 512 sequences: the budget of
the local ablations sweep (9 trials in ~1 h on 2 cores; docs/experiments.md §26). It does not extrapolate far (the
main job on it read G 1.19 ± 0.17 / 1.35 ± 0.31 over 3 seeds, §26); it compares recipes at equal cost."""


def local_trial(backbone: str = "tiny-qwen2", task: str = "swap_s5", seed: int = 0) -> TrialConfig:
    """The CPU default: d_train 6, tests on the fine grid to 48 (8×: every depth 6…12, then ratio ≤ 1.25,
    :func:`fine_depths`), AdamW 1e-3, batch 64, 3,000 steps, one process, float32.

    Sized so the local sweep's 6 trials fit its 45-minute budget on 2 cores (two 1-thread trials side by side):
    with d_train 8 a sweep trial ran ~3.2 steps/s and the sweep would take ~50 minutes; d_train 6 makes a step ~30 %
    cheaper (R·T ∝ d(d+7)). The PAR-core bar (≥ 95 % at d = 8) is the same recipe with ``--train-depth 8 --steps
    4000`` (docs/experiments.md, experiment 3). Evaluates every 1,000 steps on the fine grid: 256 sequences at
    6/12/24/48 and 128 at the 11 depths between, in batches of 128 (on one CPU thread a batch of 256 costs ~2.7× one
    of 128 at d = 48), so evaluation stays under 15 % of a trial (docs/experiments.md §19: the whole grid at 256 in
    batches of 256 took 17 %); then blocks of 128 at the two depths that bracket the midpoint crossing, until each
    has >= 256 sequences and its 95 % interval excludes the midpoint, or 512 (``eval.bracket_*``; G's 95 % interval
    from a bootstrap over the test sequences, ``eval.bootstrap_resamples``).
    """
    return TrialConfig(
        task=TaskConfig(name=task, train_depth=LOCAL_TRAIN_DEPTH),
        backbone=BackboneConfig(name=backbone),
        recipe=RecipeConfig(grad_window=8),
        train=TrainConfig(steps=3000, batch_size=64, lr=1e-3, warmup_steps=100, seed=seed, eval_every=1000,
                          report_every=50, checkpoint_every=500),
        eval=EvalConfig(depths=fine_depths(LOCAL_TRAIN_DEPTH, LOCAL_EVAL_MULTIPLES[-1] * LOCAL_TRAIN_DEPTH),
                        num_sequences=256, num_sequences_fine=128, batch_size=128, bracket_max_sequences=512,
                        bracket_min_sequences=256, bracket_block=128),
    )


def _hub_name(backbone: str) -> str | None:
    from par_ray.model.registry import BACKBONES

    return BACKBONES[backbone].hub_name if backbone in BACKBONES else None


def paper_trial(backbone: str = "qwen2.5-0.5b", task: str = "swap_s5", seed: int = 0) -> TrialConfig:
    """The paper's protocol: the task's paper depths (``par_ray.tasks.PAPER_DEPTHS``: S5 / A5 d_train 16, tests
    16…256; swap-S5 32…512; 16× either way), 1,024 sequences per depth, bf16 on GPUs; then blocks of 1,024 at the
    depths that bracket the midpoint crossing until each one's 95 % interval excludes the midpoint, or 4,096
    (``eval.bracket_*``, a par_ray addition: the paper reads G off 1,024). Raises ``ValueError`` for an unknown
    task."""
    from par_ray.tasks import PAPER_DEPTHS, get_task

    get_task(task)  # the registry's error names the known tasks
    depths = PAPER_DEPTHS[task]
    return TrialConfig(
        task=TaskConfig(name=task, train_depth=depths.train_depth, min_train_depth=depths.min_train_depth),
        # PAR retrofits the *pretrained* parent: the hub id, resolved offline to a local checkpoint (--model-dir or
        # the hub cache, par_ray.weights; override with backbone.pretrained=PATH).
        backbone=BackboneConfig(name=backbone, pretrained=_hub_name(backbone)),
        recipe=RecipeConfig(grad_window=8, max_iterations=64),
        train=TrainConfig(steps=5000, batch_size=64, lr=1e-4, warmup_steps=200, seed=seed, use_gpu=True,
                          num_workers=1, eval_every=1000, report_every=50, checkpoint_every=500),
        eval=EvalConfig(depths=depths.test_depths, num_sequences=1024, batch_size=128, bracket_max_sequences=4096,
                        bracket_block=1024),
    )


# --------------------------------------------------------------------------------------------------------------------
# Sweep presets (par_ray.sweep): one base trial per (preset, backbone, task, seed), parallelism chosen by size.

PRESETS = {"local": local_trial, "paper": paper_trial}
"""Preset name → base-trial function ``(backbone, task, seed) -> TrialConfig``."""
PRESET_BACKBONES = {"local": LOCAL_BACKBONES, "paper": PAPER_BACKBONES}
"""Backbones a sweep runs by default under each preset."""

PAPER_GPU_TYPE = "H100"
"""The GPU type the paper preset plans for when no GPU types are given (80 GB); the trial then asks Ray for that type
(``train.accelerator_type``), not for any GPU: a trial sized for 80 GB must not land on a 24 GB L4 or a 48 GB L40S
of the same cluster. Another 80 GB type: ``--gpu-types A100-80G``."""
PAPER_GPU_MEMORY_GB = GPU_MEMORY_GB[PAPER_GPU_TYPE]
"""Memory of :data:`PAPER_GPU_TYPE`, GB (``par_ray.accelerators.GPU_MEMORY_GB``)."""
PAPER_HEADROOM = 0.9
"""Plan to 90 % of the card: the planner is within ~1 % of measurement on CPU, but unmeasured on GPU (allocator
fragmentation, CUDA context, NCCL buffers)."""
PAPER_PARALLELISM_CANDIDATES = (
    # (strategy, GPUs per trial, ZeRO stage), cheapest first: plain DDP on as few GPUs as fit, then sharded params.
    ("ddp", 1, 2), ("ddp", 2, 2), ("fsdp", 2, 2), ("fsdp", 4, 2), ("deepspeed", 4, 3), ("fsdp", 8, 2),
    ("deepspeed", 8, 3),
)


def gpu_targets(gpu_types: typing.Sequence[str]) -> list[tuple[str, float, int | None]]:
    """``gpu_types`` (``"TYPE"`` or ``"TYPE:N"``, cheapest first) as (Ray accelerator type, GB per GPU, most GPUs
    per trial or ``None``).

    ``TYPE`` is a key of ``par_ray.accelerators.GPU_MEMORY_GB``; ``:N`` caps a trial on that type at N GPUs (the GPUs of
    the cluster's largest node of that type), so its workers share one node. Without it a trial may take as many
    GPUs as the largest of :data:`PAPER_PARALLELISM_CANDIDATES` (8), and Ray places them on several nodes when no
    node has that many (Ray Train's placement strategy PACK): FSDP / ZeRO then run their collectives between nodes.
    Raises ``ValueError`` naming ``--gpu-types`` and the known types for an unknown type, a malformed or
    non-positive cap, or a type named twice.
    """

    targets, errs = [], []
    for item in gpu_types:
        name, _, cap = str(item).strip().partition(":")
        if name not in GPU_MEMORY_GB:
            errs.append(f"GPU type {name!r} is not one of {list(GPU_MEMORY_GB)}")
        elif cap and not (cap.isdigit() and int(cap) >= 1):
            errs.append(f"{item!r}: the GPU cap after ':' must be an integer >= 1 (GPUs per node), got {cap!r}")
        elif name in [t for t, _, _ in targets]:
            errs.append(f"{name!r} is named twice")
        else:
            targets.append((name, float(GPU_MEMORY_GB[name]), int(cap) if cap else None))
    if errs:
        raise ValueError(f"--gpu-types: {'; '.join(errs)}")
    return targets


def fit_parallelism(cfg: TrialConfig, gpu_types: typing.Sequence[str] = ()) -> dict[str, object]:
    """Flat ``train.*`` overrides (strategy, workers, ZeRO stage; with ``gpu_types`` also the accelerator type) under
    which ``cfg`` trains within :data:`PAPER_HEADROOM` of a GPU's memory.

    Memory per GPU is ``par_ray.planner.plan_trial`` of ``cfg`` with each candidate's parallelism, so the trial's
    recipe counts (chain-of-thought traces, untied copies, an EMA teacher, a halting query) and its batch, R and
    window as configured. ``gpu_types`` (:func:`gpu_targets`, cheapest first, e.g. ``("L40S:4", "H100")``): the
    first GPU type, then within it the first of :data:`PAPER_PARALLELISM_CANDIDATES` (up to the type's GPU cap), that
    fits ``PAPER_HEADROOM`` × that type's memory, with ``"train.accelerator_type": type``. Empty: the first candidate
    that fits ``PAPER_HEADROOM`` × :data:`PAPER_GPU_MEMORY_GB` on :data:`PAPER_GPU_TYPE`, with that accelerator type.
    DeepSpeed candidates are skipped for an untied core (``recipe.tied=False``), which it cannot train.
    Raises ``ValueError`` naming ``backbone.name`` and the GPU types if nothing fits, or :func:`gpu_targets`'s error.
    """
    from par_ray.config import with_overrides
    from par_ray.planner import plan_trial
    from par_ray.trial import resolve

    trial = resolve(cfg)  # the candidates change only train.*, which the stages and vocabulary do not read
    targets = gpu_targets(gpu_types or (PAPER_GPU_TYPE,))
    for gpu, gb, most in targets:
        for strategy, n, stage in PAPER_PARALLELISM_CANDIDATES:
            if (most is not None and n > most) or (strategy == "deepspeed" and not cfg.recipe.tied):
                continue
            candidate = with_overrides(cfg, train={"strategy": strategy, "num_workers": n, "zero_stage": stage})
            if plan_trial(candidate, trial).fits(gb * PAPER_HEADROOM):
                return {"train.strategy": strategy, "train.num_workers": n, "train.zero_stage": stage,
                        "train.accelerator_type": gpu}
    on = f"GPU types {list(gpu_types or (PAPER_GPU_TYPE,))}"
    raise ValueError(f"backbone.name: {cfg.backbone.name!r} (recipe {cfg.recipe.name!r}, task {cfg.task.name!r}) "
                     f"fits none of {PAPER_PARALLELISM_CANDIDATES} on {on} (python -m par_ray.planner --table)")


def paper_parallelism(backbone: str, task: str = "swap_s5", gpu_types: typing.Sequence[str] = ()) -> dict[str, object]:
    """Flat ``train.*`` overrides (strategy, workers, ZeRO stage; with ``gpu_types`` the accelerator type) for
    ``backbone`` under the paper preset of ``task``: :func:`fit_parallelism` of the paper trial (recipe ``par``; a
    sweep chooses again for the recipe a trial runs, ``par_ray.sweep.resolve``).

    Per-GPU peak: ``par_ray.planner.plan_trial`` (bf16, the paper trial's R, gradient window, global batch split over
    the GPUs, the task's prompt length and read positions at d_train, the checkpoint's vocabulary). Without
    ``gpu_types``: the first of :data:`PAPER_PARALLELISM_CANDIDATES` that fits :data:`PAPER_HEADROOM` ×
    :data:`PAPER_GPU_MEMORY_GB`, on :data:`PAPER_GPU_TYPE`. With ``gpu_types`` (cheapest first, e.g. ``("L40S:4",
    "H100")``, :func:`gpu_targets`): the first type, then the first candidate, that fits that type's memory. Raises
    ``ValueError`` naming the backbone (and the types) if none fits, or naming ``--gpu-types`` for an unknown type.
    """
    return fit_parallelism(paper_trial(backbone, task), gpu_types)


def preset_trial(preset: str, backbone: str, task: str = "swap_s5", seed: int = 0,
                 gpu_types: typing.Sequence[str] = (), parallelism: bool = True) -> TrialConfig:
    """The base trial of ``preset`` (``local`` or ``paper``) for one backbone, task and seed; ``gpu_types``: the
    paper preset's GPU types, cheapest first (:func:`paper_parallelism`). ``parallelism=False``: leave the paper
    trial's ``train.*`` parallelism unplanned, for a caller that plans the config it finally runs
    (``par_ray.sweep.resolve``), so the planner runs once per trial.

    Raises ``ValueError`` naming ``preset``, ``backbone.name`` or ``--gpu-types`` (given to a preset other than
    ``paper``, or unknown).
    """
    from par_ray.config import from_flat
    from par_ray.model.registry import BACKBONES

    if preset not in PRESETS:
        raise ValueError(f"preset: {preset!r} is not one of {list(PRESETS)}")
    if backbone not in BACKBONES:
        raise ValueError(f"backbone.name: {backbone!r} is not one of {sorted(BACKBONES)}")
    if gpu_types and preset != "paper":
        raise ValueError(f"--gpu-types: only the paper preset plans per GPU type; preset {preset!r} runs on CPUs")
    cfg = PRESETS[preset](backbone, task, seed)
    if preset == "paper" and parallelism:
        cfg = from_flat(fit_parallelism(cfg, gpu_types), base=cfg)
    return cfg


def smoke_overrides(cfg: TrialConfig) -> dict[str, object]:
    """Flat overrides that turn a preset trial into a smoke test: 4 steps of 8 sequences, the first two test depths
    of the doublings d_train × 1, 2, 4 … (``EvalConfig.coarse_depths``: a fine grid's 1× and 2×) with 16 sequences
    each, evaluation, report and checkpoint every 2 steps (so every report carries G), at most one block of 16 more
    at each depth that brackets the crossing (adaptive sampling runs, cheaply), eager layers (4 steps never repay a
    compile), and a length curriculum's phases shortened to fit the 4 steps."""
    coarse = cfg.eval.coarse_depths()
    depths = (coarse if len(coarse) >= 2 else cfg.eval.depths)[:2]
    steps = 4
    curriculum = {"task.curriculum_steps": max(1, steps // (len(cfg.task.curriculum) + 1))} if cfg.task.curriculum \
        else {}  # every phase within the 4 steps, the last (d_train) included
    return {
        "train.steps": steps, "train.batch_size": 8, "train.warmup_steps": 1, "train.eval_every": 2,
        "train.report_every": 2, "train.checkpoint_every": 2,
        "eval.depths": ",".join(str(d) for d in depths), "eval.num_sequences": 16, "eval.batch_size": 16,
        "eval.num_sequences_fine": 0, "eval.bracket_max_sequences": 32, "eval.bracket_min_sequences": 0,
        "eval.bracket_block": 16, "train.compile": False, **curriculum,
    }
