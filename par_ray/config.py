"""Typed, frozen configuration of one PAR trial.

A trial is fully described by a :class:`TrialConfig`: the task, the backbone, the recipe (the PAR method and its
ablations), the optimisation and the evaluation protocol. Every component receives only its own sub-config.

:func:`config_errors` lists every problem of the fields themselves (types, ranges, combinations) as ``"field:
message"`` strings; :func:`par_ray.trial.validate` adds the checks against the registries (backbones, tasks, recipes,
GPU types, pretrained directories) and raises them all as one ``ValueError`` that names each field and its allowed
values (litgpt ``validate_args``; torchtitan ``Trainer.Config.__post_init__``). Flattening to a ``{"section.field":
value}`` dict happens only here, at the Tune / MLflow boundary (:func:`to_flat`, :func:`from_flat`).

This is the bottom layer: it imports nothing from par_ray (an import-linter contract in pyproject.toml holds it).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field, fields, replace

TASK_NAMES = ("swap_s5", "s5", "a5", "rule_table", "object_tracking", "parity", "addition", "reachability")
TARGETS = ("progress", "final", "done")
DEPTH_SCHEDULES = ("forced", "hold")
STRATEGIES = ("ddp", "fsdp", "deepspeed")
ZERO_STAGES = (1, 2, 3)
FLOAT32_MATMUL_PRECISIONS = ("", "highest", "high", "medium")
"""``TrainConfig.float32_matmul_precision``: ``""`` = the device's default, else torch's own names
(``torch.set_float32_matmul_precision``)."""
POSITION_SCHEMES = ("rope", "none", "conv")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
OP_ORDERS = ("forward", "recent_first")
SUPERVISE = ("window", "last")
DISTILL_MODES = ("none", "ema", "live")
"""Prefix self-distillation teacher (``RecipeConfig.distill``): none, an EMA of the student, the live student."""
FROZEN_PARTS = ("none", "all_but_coda")
"""What a stage may freeze (``par_ray.stages.FROZEN_PREFIXES`` says which parameters each leaves trainable)."""


@dataclass(frozen=True)
class TaskConfig:
    """Which state-tracking task, and the depths trained on (paper §4, task suite)."""

    name: str = "swap_s5"
    """Task family, one of ``TASK_NAMES``."""
    train_depth: int = 8
    """d_train: the largest depth (number of operations in the prompt) trained on."""
    min_train_depth: int = 1
    """Smallest depth sampled during training."""
    op_order: str = "forward"
    """Prompt serialisation: ``forward`` (op_1 first, the paper's) or ``recent_first`` (op_d first); see
    ``par_ray.tasks.common.RecentFirst``."""
    train_filler: int = 0
    """Training prompts only: 0..train_filler extra separator tokens (drawn per batch) between the operations and the
    queries, so the distance from the queries to operation k carries no information; test prompts have none. A
    par_ray option, not the paper's (``par_ray.tasks.common.Filler``; docs/experiments.md, experiment 7)."""
    given_prefix: int = 0
    """Training prompts only: the first m ~ U{0..given_prefix} operations are given solved, as state tokens, and the
    model computes the next d, so the operations it learns to compute lie anywhere in 1..d + given_prefix (it can
    no longer key its update on the position). Needs ``recipe.dense_targets``. A par_ray option for random-init
    models, not the paper's (``par_ray.tasks.common.GivenPrefix``; docs/experiments.md, experiment 9)."""
    curriculum: tuple[int, ...] = ()
    """Length curriculum (a par_ray option; the published from-scratch results train 4 → 8 → 16 → 32): the largest
    training depth of each phase before the last, strictly increasing, each in [min_train_depth, train_depth). Phase
    i (0-based) covers training steps [i · curriculum_steps, (i + 1) · curriculum_steps) and samples d ~
    U{min_train_depth .. curriculum[i]}; from step len(curriculum) · curriculum_steps on, d ~ U{min_train_depth ..
    train_depth}. A pure function of the step (``par_ray.schedules.curriculum_depth``), so a resumed run replays it.
    ``()`` = off (the paper's). d_train of G is ``train_depth``, the last phase's."""
    curriculum_steps: int = 0
    """Steps per phase of ``curriculum`` (>= 1 when ``curriculum`` is set; ignored without one)."""


@dataclass(frozen=True)
class BackboneConfig:
    """The parent decoder and how its layers are split into prelude / core / coda (paper §3.1)."""

    name: str = "tiny-qwen2"
    """A key of ``par_ray.model.registry.BACKBONES`` (checked by ``par_ray.trial.validate``)."""
    pretrained: str | None = None
    """``None``: random init from the config. Otherwise a local directory or a hub name for ``from_pretrained``, told
    apart by ``par_ray.trial.pretrained_kind``: a path (absolute, or starting with ``.`` or ``~``, or with more than
    one ``/``) or an existing directory is a local checkpoint and must hold ``config.json``; anything else must be a
    hub id (``name`` or ``org/name``)."""
    split: tuple[int, int, int] | None = None
    """(prelude, core, coda) layer counts summing to the parent's layer count; ``None`` = thirds."""
    position_scheme: str = "rope"
    """``rope``: the parent's rotary embedding. ``none``: no positional encoding (NoPE), random-init shapes only.
    ``conv``: NoPE plus a causal depthwise state convolution of width 4 in every iteration (``LoopedLM``), random-init
    shapes only (a par_ray option; docs/experiments.md, experiment 8)."""
    adapter_alpha: float = 0.0
    """Adapter init ``W = [α·I | I]``: α = 0 is the paper's ``[0 | I]`` (R = 1 reproduces the parent); α > 0 keeps the
    input injection e alive from step 0, for random-init parents that have nothing to preserve (Fan et al. 2024;
    docs/experiments.md, experiment 8). A par_ray option, not the paper's."""
    attention_window: int = 0
    """0: full causal attention (the parent's). w > 0: prelude and core layers attend to the last w tokens only (the
    coda keeps full attention), so each iteration moves information a bounded number of positions and only a
    length-independent local rule can be learned; random-init shapes (a par_ray option; docs/experiments.md,
    experiment 8)."""
    coda_window: int = 0
    """The same for the coda (0 = full causal attention): the read-out sees the last w tokens only, so the answer is
    read at a fixed offset from the last operation whatever the prompt length; the queries can then not reach a
    distant frontier, so pair it with ``recipe.targets=done`` (a par_ray option; docs/experiments.md, experiment 9)."""
    attn_implementation: str = "sdpa"
    """transformers attention: ``sdpa`` (fused, faster) or ``eager`` (explicit softmax; equal to float32 round-off)."""


@dataclass(frozen=True)
class RecipeConfig:
    """The PAR method and the knobs its ablations turn (paper §3). Named presets live in ``par_ray.recipes``."""

    name: str = "par"
    """Label of the recipe this config came from (a tag for analysis; behaviour comes from the fields below)."""
    targets: str = "progress"
    """``progress``: iteration k predicts z_min(ck, d) (PAR, Eq. 3). ``final``: every iteration predicts z_d.
    ``done``: only iterations with c·k >= d are supervised at the queries, on z_d — with ``dense_targets`` the progress
    alignment lives on the operation tokens, and the queries read the finished state (a par_ray option)."""
    anchoring: bool = True
    """RMS norm anchoring: rescale each token's state to its first-iteration RMS after every iteration (§3.3)."""
    tied: bool = True
    """Weight-tied core (looped). ``False``: R distinct copies of the core (the deeper-model baseline)."""
    ops_per_iteration: int = 1
    """c: operations consumed per iteration, so R = ceil(d / c)."""
    depth_schedule: str = "forced"
    """``forced``: R = ceil(d / c). ``hold``: R = 1 + Poisson(hold_lambda); iterations past d / c keep z_d."""
    hold_lambda: float = 8.0
    """lambda of the hold schedule's Poisson draw."""
    grad_window: int = 8
    """Gradient window: only the last ``grad_window`` iterations are run with autograd and supervised."""
    max_iterations: int = 64
    """Cap on R during training (the hold schedule's tail, untied copies)."""
    stretch_max: float = 1.0
    """Positional stretch: position ids are multiplied by s ~ U[1, stretch_max] per step (1.0 = off)."""
    dense_targets: bool = False
    """Dense progress targets: besides the queries, the readout at operation position j after iteration k is trained
    on the whole state z_j (one class per state) when j <= c·k, nothing when j > c·k; needs a task with
    ``num_states`` > 0 and a random-init parent (the classes extend its vocabulary). A par_ray option for
    from-scratch models, not the paper's (``objectives.dense_progress_loss``; docs/experiments.md, experiment 8)."""
    dense_pending: bool = False
    """With ``dense_targets``: operation positions past the frontier (j > c·k) are trained on one extra "pending"
    class instead of left unsupervised, so every token's state is defined at every iteration and a waiting token must
    stay waiting however many iterations pass (a par_ray option; docs/experiments.md, experiment 8)."""
    extra_iterations: int = 0
    """Slack loop count under the ``forced`` schedule: R = ceil(d / c) + U{0 .. extra_iterations} per step, iterations
    past d / c keep z_d; 0 = the paper's R = ceil(d / c) (docs/experiments.md, experiment 8)."""
    fixed_point_weight: float = 0.0
    """With ``dense_targets``: weight λ of the fixed-point loss, the mean relative state change ||s_k - s_{k-1}||² /
    ||s_1||² of every operation token whose dense target does not change at iteration k (done before it, or still
    pending after it). Tokens that wait or hold then sit at fixed points, so their state cannot count iterations, and
    the frontier's update sees the same inputs at every iteration (path independence, Anil et al. 2022). 0 = off; a
    par_ray option (``objectives.fixed_point_loss``; docs/experiments.md, experiment 9)."""
    halting: bool = False
    """Learned halting (§3, "Learned Halting"): the readout at an appended halting query position is also trained
    to answer Yes when c·k >= d, No otherwise (``par_ray.halting``; loss in ``par_ray.objectives.halting_loss``)."""
    halt_weight: float = 0.5
    """Weight of the class-balanced halting cross-entropy in the joint loss: PAR + halt_weight × halting."""
    stretch_ramp: bool = False
    """Ramp the stretch cap linearly from 1 (first step of the stage) to ``stretch_max`` (last step of the stage)
    instead of drawing s ~ U[1, stretch_max] from the start (the paper's stretch fine-tuning stage, §3.4)."""
    fixed_iterations: int = 0
    """0: R follows the depth (R = ceil(d / c) under the forced schedule, and at every test depth). n >= 1: every
    training step and every test depth runs exactly R = n iterations, whatever d (the baselines ``fixed_depth``: 1,
    ``more_iterations``: 2 ceil(d_train / c), ``untied``: 4; ``par_ray.recipes``)."""
    supervise: str = "window"
    """Which read-out iterations the answer loss covers, one of ``SUPERVISE``: ``window`` (every iteration in the
    gradient window, PAR) or ``last`` (only iteration R: the answer after the last iteration, as the fixed-depth,
    more-iterations, RLT and untied baselines are trained)."""
    cot: bool = False
    """Explicit chain-of-thought baseline (``par_ray.cot``): train next-token prediction on the prompt followed by the
    intermediate states written out as tokens, with R = 1; evaluate by greedy decoding with a KV cache, accuracy on
    the final state and the generated tokens per test depth (``cot_tokens_d{D}``)."""
    distill: str = "none"
    """Prefix self-distillation (§3, "Prefix Self-Distillation"), one of ``DISTILL_MODES``: only final answers are
    labelled (iterations with c·k >= d, cross-entropy on z_d); an earlier iteration k is trained towards a teacher
    that reads the prompt truncated after c·k operations at its final iteration (``par_ray.distill``). ``ema``: the
    teacher is an exponential moving average of the student (``ema_decay``); ``live``: the student itself under
    ``torch.no_grad``. ``none``: off. Needs ``targets="final"`` and a task with a serial prompt layout."""
    ema_decay: float = 0.999
    """EMA teacher update after every optimizer step: ema = ema_decay · ema + (1 - ema_decay) · student; in [0, 1)."""
    distill_temperature: float = 1.0
    """Temperature T of the distillation KL (both distributions softened by T, the KL scaled by T²); > 0."""
    progressive_loss: bool = False
    """Progressive loss (Bansal et al. 2022, "End-to-end algorithm synthesis with recurrent networks"): when a step's
    R exceeds ``grad_window`` w, it runs n ~ U{0 .. R − w} iterations without autograd and then w with it, and stops
    there (R' = n + w), so the supervised iterations start from the state after a random number of iterations instead
    of always ending at R; steps with R <= w are unchanged. Targets stay progress-aligned (iteration k is trained on
    z_min(ck, d)). A par_ray option for long training problems (``task.curriculum``), off by default."""
    state_noise: float = 0.0
    """σ of state-noise injection in training: before every iteration after the first, each token's carried state gets
    Gaussian noise of standard deviation σ × its first-iteration RMS (``LoopedLM.iterate``), a contraction pressure
    on the core (our hypothesis for the drift of waiting tokens, docs/experiments.md §9). Evaluation never adds
    noise. 0 = off; a par_ray option."""
    position_offset: int = 0
    """Random position offsets in training (as Abacus embeddings, McLeish et al. 2024): every position id of a step
    is shifted by o ~ U{0 .. position_offset}, one draw per step, so training sees the rotary phases of longer test
    prompts. Evaluation uses o = 0. 0 = off; a par_ray option."""
    read_every: int = 1
    """Read out (and supervise) every n-th iteration of the gradient window, counted from the iteration the step's
    problem finishes at, ⌈d/c⌉ (the one evaluation reads; ``par_ray.schedules.supervised_iterations``), so that one
    is supervised at every step and the slack iterations past it at every n-th. Each read-out runs the coda on every
    token, about as much work as a core iteration, so n = 2 takes about half the read-out's forward and backward off
    a step. Iterations keep their progress-aligned targets z_min(ck, d). 1 = every iteration of the window (the
    paper's); at most ``grad_window``; a par_ray option (docs/experiments.md §26)."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, parallelism and bookkeeping of one trial."""

    steps: int = 3000
    """Optimizer steps."""
    batch_size: int = 64
    """Global batch size (sequences per step, summed over workers)."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 100
    """Linear warm-up steps, then cosine decay to 10 % of ``lr``."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 = off)."""
    seed: int = 0
    """Seeds the model init, the data streams and the per-step schedule."""
    strategy: str = "ddp"
    """Data-parallel wrapping, one of ``STRATEGIES``."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage (``strategy="deepspeed"`` only)."""
    zero_offload: bool = False
    """DeepSpeed ZeRO-Offload of optimizer state to CPU."""
    num_workers: int = 1
    """Ray Train workers (one process per GPU on a GPU cluster)."""
    use_gpu: bool = False
    """Run workers on GPUs (bf16 autocast, NCCL); ``False``: CPU, float32, gloo."""
    accelerator_type: str = ""
    """GPU type every worker of the trial requires, a key of ``par_ray.accelerators.GPU_MEMORY_GB`` (Ray's name, e.g.
    ``"L40S"``, ``"H100"``; Ray Train's ``ScalingConfig(accelerator_type=...)``); ``""`` = any GPU. Needs
    ``use_gpu``."""
    threads_per_worker: int = 0
    """torch intra-op threads per worker (0 = leave torch's default)."""
    eval_every: int = 500
    """Evaluate accuracy by depth every this many steps (and at the end)."""
    report_every: int = 50
    """Report training metrics every this many steps."""
    checkpoint_every: int = 500
    """Checkpoint every this many steps (and at the end); 0 = only at the end."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk per run (Ray ``CheckpointConfig.num_to_keep``): the latest N, or in a search the N
    best by the search metric; Ray always keeps the latest too (resume needs it). Older ones are deleted."""
    fail_at_step: int = -1
    """Fault injection for tests: worker rank 0 dies once when reaching this step (-1 = off)."""
    collective_timeout_s: float = 300.0
    """Seconds a gloo/NCCL collective may wait for the other ranks before the run fails (Ray Train's
    ``TorchConfig.timeout_s``, whose default is 30 minutes). It must cover the slowest wait between ranks in a step:
    a training step, an evaluation pass or a checkpoint write; a rank mismatch then fails in this bounded time."""
    compile: bool = False
    """``torch.compile`` every decoder layer (prelude, core, coda, untied copies) before the strategy wraps the model,
    as torchtitan compiles each transformer block (``par_ray.train.strategies.compile_layers``): the elementwise ops
    around the matmuls (RMSNorm, rotary, SwiGLU, residual adds) are fused. Costs a one-time compile per process, on
    the first steps and the first evaluation (about a minute of CPU for the tiny shape with a cold inductor cache);
    state-dict keys and checkpoints are unchanged, so a run may resume with it on or off. Not with ``recipe.cot``:
    its KV-cache decoding recompiles."""
    float32_matmul_precision: str = ""
    """Internal precision of the float32 matmuls on every worker, as ``torch.set_float32_matmul_precision`` names
    it (one of ``FLOAT32_MATMUL_PRECISIONS``; ``par_ray.train.strategies.matmul_precision``): ``highest`` (IEEE
    float32), ``high`` (TF32 where the device has it), ``medium`` (also bfloat16 products with float32 accumulation:
    on CPUs with AMX-BF16, oneDNN's bf16 GEMM for every float32 matmul, forward and backward,
    training and evaluation). ``""`` = the device's default: ``high`` on GPU (TF32 for the fp32 matmuls autocast
    leaves), ``highest`` on CPU. Parameters, activations, optimizer state and checkpoints stay float32 either way;
    only the matmul products are rounded. On a CPU without AMX ``medium`` keeps float32 accuracy (an AVX512-BF16 AMD
    EPYC ran other float32 kernels, docs/experiments.md §35).
    On CPU pair ``medium`` with ``backbone.attn_implementation='eager'``: torch's CPU flash-attention kernel (SDPA)
    runs its small per-block GEMMs ~10x slower under bf16 products (docs/experiments.md §34)."""
    cpu_bf16_autocast: bool = False
    """Run CPU workers' forward passes (training, teachers, evaluation) under ``torch.autocast("cpu", bfloat16)``,
    as GPU workers always do (``torch.autocast("cuda", ...)``): matmul and attention outputs in bf16 over float32
    parameters, gradients and optimizer state; checkpoints stay float32. On a CPU with bf16 dot products
    (AVX512-BF16 or AMX) a small-shape GEMM runs ~2x float32's rate, the local recipe's compiled step 46 % and a
    trial's training 37 % faster (an AMD EPYC, docs/experiments.md §38); without them bf16 is emulated and slower.
    Pair it with ``backbone.attn_implementation='eager'``: torch's CPU flash-attention kernel (SDPA) is no faster
    under bf16. CPU only (GPU workers autocast anyway) and not with ``train.strategy='deepspeed'``, whose bf16 mode
    is a GPU feature. Opt-in: the local presets train in float32, whose recipe reaches interpolated G >= 4 on 9 of
    10 models (seeds 0-4 x both tiny shapes); under this option, with the state between iterations in float32 as
    ``LoopedLM.iterate`` keeps it, 7 of 10 do, and the main job takes 94 instead of ~140 min on the AMD EPYC
    (docs/experiments.md §39, §40)."""


@dataclass(frozen=True)
class EvalConfig:
    """Extrapolation protocol: accuracy at each test depth with R = ceil(d / c) (paper §4.2)."""

    depths: tuple[int, ...] = (8, 16, 32, 64)
    """Test depths; every one must be >= the train depth."""
    num_sequences: int = 256
    """Sequences per test depth (the paper uses 1,024)."""
    num_sequences_fine: int = 0
    """Sequences at the in-between depths of a fine grid (``par_ray.presets.fine_depths``): every test depth that is
    not the first one times a power of two (a fine grid starts at d_train: every depth but d_train × 2^k); 0 =
    ``num_sequences``. Fewer
    sequences there cost less and widen accuracy's 95 % interval (``acc_lo_d{D}`` / ``acc_hi_d{D}``)."""
    batch_size: int = 256
    """Sequences per evaluation forward pass."""
    seed: int = 10_000
    """Seed of the test sets (disjoint from training streams, which use the trial seed); a non-negative int."""
    halt_k: int = 6
    """Halting rule "k of n": stop at the first R with P(Yes) > tau such that >= halt_k of R … R+n-1 exceed tau."""
    halt_n: int = 8
    """Window length n of the halting rule (iterations R … R+n-1)."""
    halt_tau: float = 0.5
    """Threshold tau on P(Yes), in (0, 1)."""
    halt_rules: tuple[tuple[int, int, float], ...] = ()
    """Extra stopping rules (k, n, tau), each read from the same halting pass as the primary rule above (no extra
    forward cost) and logged under metric names that encode it (``par_ray.evaluation.halting_metrics``); each with k
    in [1, n] and tau in (0, 1), none repeating another or the primary. Flat form ``"4/8/0.5,8/8/0.5"``, ``"none"``
    for no extra rule."""
    halt_max_iterations: int = 0
    """R_max: iteration cap of halting evaluation (never halted → answered at R_max); 0 = 2 × max(depths) / c."""
    best_r: bool = False
    """The paper's RLT row, "best R per depth": read out each test depth at every R_m = round(m · ⌈d/c⌉) for m in
    ``par_ray.evaluation.BEST_R_MULTIPLES`` (one forward to the largest) and report the best R_m's accuracy as
    ``acc_d{D}``, with ``best_R_d{D}`` (the ``rlt`` recipe sets it)."""
    bracket_max_sequences: int = 0
    """Adaptive sampling's cap: the sequences a depth bracketing the midpoint crossing may reach, first pass included
    (``par_ray.evaluation.next_bracket_depth``); 0 = off."""
    bracket_min_sequences: int = 0
    """Sequences each bracketing depth gets even where its 95 % interval already excludes the midpoint; 0 = none."""
    bracket_block: int = 128
    """Sequences per added block; block j >= 1 at depth d is ``task.sample(d, bracket_block, eval.seed, step=j)``."""
    bootstrap_resamples: int = 1000
    """Bootstrap resamples of the 95 % intervals of d50 and G (``par_ray.evaluation.extrapolation_interval``); 0 =
    none."""

    def coarse_depths(self) -> tuple[int, ...]:
        """The test depths that are ``depths[0]`` × 2^k (a fine grid's d_train × 1, 2, 4, 8 …; every depth of a
        grid of doublings)."""
        def coarse(d: int) -> bool:
            m, r = divmod(d, self.depths[0])
            return r == 0 and m >= 1 and m & (m - 1) == 0

        return tuple(d for d in self.depths if coarse(d)) if self.depths else ()

    def sequences_at(self, depth: int) -> int:
        """Sequences in the test set at ``depth``: ``num_sequences_fine`` (when set) at a depth not in
        :meth:`coarse_depths`, else ``num_sequences``."""
        if not self.num_sequences_fine or depth in self.coarse_depths():
            return self.num_sequences
        return self.num_sequences_fine


@dataclass(frozen=True)
class StageConfig:
    """One stage of a trial: a run of optimizer steps with its own recipe and frozen parts (``par_ray.stages``).

    The paper trains PAR, then fine-tunes in a short stage (positional stretch; the post-hoc halting read-out).
    """

    steps: int = 0
    """Optimizer steps of this stage; 0 = ``share`` of ``train.steps``, or with ``share`` 0 the rest of ``train.steps``
    (at most one stage may be the rest)."""
    recipe: str = ""
    """A key of ``par_ray.recipes.RECIPES``: the stage trains with that recipe applied to the trial's config (only
    its ``recipe`` section is used); ``""`` = the trial's own recipe."""
    frozen: str = "none"
    """Parameters that get no update in this stage, one of ``FROZEN_PARTS`` (``all_but_coda``: only the coda
    layers and the final norm train)."""
    share: float = 0.0
    """With ``steps`` 0: this fraction of ``train.steps`` (rounded, at least 1 step), so a recipe's fine-tuning stage
    follows a ``train.steps`` set after the recipe (``--steps``); 0 = not used."""


@dataclass(frozen=True)
class TrialConfig:
    """One trial: everything needed to train and evaluate one looped model."""

    task: TaskConfig = field(default_factory=TaskConfig)
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    stages: tuple[StageConfig, ...] = (StageConfig(),)
    """The trial's stages, run in order by the same loop; their steps add up to ``train.steps`` (the LR schedule,
    reports and checkpoints count global steps). Default: one stage, the trial's recipe, nothing frozen.

    Validate with ``par_ray.trial.validate(cfg)``: the field checks of :func:`config_errors` and the registry checks
    in one error."""


MAX_SEED = 2**63 - 1
"""Seeds are non-negative ints below 2**63 (``numpy.random.SeedSequence`` refuses negatives; torch takes 64 bits)."""



def _type_ok(value: typing.Any, hint: typing.Any) -> bool:
    """``value`` has the declared type ``hint`` (bool is not an int here; an int is a float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_type_ok(v, args[0]) for v in value)
        return len(value) == len(args) and all(_type_ok(v, a) for v, a in zip(value, args))
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint: typing.Any) -> str:
    if typing.get_origin(hint) is None and hasattr(hint, "__name__"):
        return hint.__name__
    return str(hint).replace("typing.", "")


def type_errors(cfg: TrialConfig) -> tuple[list[str], set[str]]:
    """Fields whose value is not of the declared type, or a non-finite float: (messages, ``"section.field"`` names).

    Every numeric field of every section rejects ``inf`` and ``nan`` here, whatever its own range check says.
    """
    errs, bad = [], set()
    for section in fields(cfg):
        sub = getattr(cfg, section.name)
        if section.name == "stages":  # a tuple of StageConfig: check each (halting_and_stage_errors checks the tuple)
            parts = [(f"stages[{i}]", s) for i, s in enumerate(sub) if dataclasses.is_dataclass(s)] \
                if isinstance(sub, tuple) else []
        else:
            parts = [(section.name, sub)]
        for prefix, obj in parts:
            hints = typing.get_type_hints(type(obj))
            for f in fields(obj):
                name, value, hint = f"{prefix}.{f.name}", getattr(obj, f.name), hints[f.name]
                if not _type_ok(value, hint):
                    errs.append(f"{name}: expected {_type_name(hint)}, got {value!r} ({type(value).__name__})")
                    bad.update({name, section.name})
                elif isinstance(value, float) and not math.isfinite(value):
                    errs.append(f"{name}: must be a finite number, got {value}")
                    bad.update({name, section.name})
    return errs, bad


def config_errors(cfg: TrialConfig) -> list[str]:
    """Every problem of ``cfg``'s fields as ``"field: message"`` strings (empty when valid), without the registries.

    First the declared type of every field (and finiteness of every float), then each field's domain; a field of
    the wrong type is reported once, by the type check, and skipped by the range checks that would read it. The
    checks that need a registry (backbone names and layer counts, what a task can serve, stage recipes, GPU types,
    pretrained directories) are ``par_ray.trial.registry_errors``; ``par_ray.trial.validate`` runs both.
    """
    t, b, r, tr, ev = cfg.task, cfg.backbone, cfg.recipe, cfg.train, cfg.eval
    errs, bad = type_errors(cfg)

    def check(names: str, ok: typing.Callable[[], bool], msg: typing.Callable[[], str] | str) -> None:
        """Report ``names.split()[0]: msg`` unless ``ok()``; skipped when any field in ``names`` has a bad type."""
        fs = names.split()
        if any(n in bad for n in fs) or ok():
            return
        errs.append(f"{fs[0]}: {msg() if callable(msg) else msg}")

    def value_of(name: str) -> typing.Any:
        section, _, f = name.partition(".")
        return getattr(getattr(cfg, section), f)

    def at_least(name: str, low: float, note: str = "") -> None:
        value = value_of(name)
        check(name, lambda: value >= low, f"must be >= {low}{note}, got {value}")

    def one_of(name: str, allowed) -> None:
        value = value_of(name)
        check(name, lambda: value in allowed, f"{value!r} is not one of {list(allowed)}")

    def seed(name: str) -> None:
        value = value_of(name)
        check(name, lambda: 0 <= value <= MAX_SEED, f"must be a non-negative int below 2**63, got {value}")

    one_of("task.name", TASK_NAMES)
    one_of("task.op_order", OP_ORDERS)
    at_least("task.train_filler", 0)
    at_least("task.given_prefix", 0)
    check("task.given_prefix recipe.dense_targets", lambda: not t.given_prefix or r.dense_targets is True,
          "needs recipe.dense_targets=true (the given operations are read in as dense state tokens)")
    at_least("task.train_depth", 1)
    check("task.min_train_depth task.train_depth", lambda: 1 <= t.min_train_depth <= max(t.train_depth, 1),
          lambda: f"must be in [1, task.train_depth={t.train_depth}], got {t.min_train_depth}")
    if "task.curriculum" not in bad and t.curriculum:
        check("task.curriculum task.min_train_depth task.train_depth",
              lambda: (list(t.curriculum) == sorted(set(t.curriculum))
                       and all(t.min_train_depth <= d < t.train_depth for d in t.curriculum)),
              lambda: (f"must be strictly increasing depths, each in [task.min_train_depth={t.min_train_depth}, "
                       f"task.train_depth={t.train_depth}), got {list(t.curriculum)}"))
        check("task.curriculum_steps", lambda: t.curriculum_steps >= 1,
              lambda: f"must be >= 1 with task.curriculum={list(t.curriculum)} (steps per phase), got "
                      f"{t.curriculum_steps}")
        check("task.curriculum task.curriculum_steps train.steps",
              lambda: (t.curriculum_steps < 1 or tr.steps < 1  # each out of range: reported on its own below
                       or len(t.curriculum) * t.curriculum_steps < tr.steps),
              lambda: (f"its {len(t.curriculum)} phase(s) of task.curriculum_steps={t.curriculum_steps} end at step "
                       f"{len(t.curriculum) * t.curriculum_steps}, not before train.steps={tr.steps}: the trial would "
                       f"never train at task.train_depth={t.train_depth}, the d_train its G is measured against; "
                       f"lower task.curriculum_steps or raise train.steps"))
    at_least("task.curriculum_steps", 0)

    one_of("backbone.position_scheme", POSITION_SCHEMES)

    check("recipe.name", lambda: r.name.strip() != "", "must be a non-empty label")
    one_of("recipe.targets", TARGETS)
    one_of("recipe.depth_schedule", DEPTH_SCHEDULES)
    at_least("recipe.ops_per_iteration", 1)
    at_least("recipe.grad_window", 1)
    at_least("recipe.hold_lambda", 0)
    at_least("recipe.stretch_max", 1.0, " (1.0 = off)")
    at_least("recipe.fixed_iterations", 0, " (0 = R follows the depth)")
    fixed = "recipe.fixed_iterations" not in bad and r.fixed_iterations > 0
    if fixed:  # R = fixed_iterations at every step: the cap must let it through
        check("recipe.max_iterations recipe.fixed_iterations", lambda: r.max_iterations >= r.fixed_iterations,
              f"must be >= recipe.fixed_iterations={r.fixed_iterations}, got {r.max_iterations}")
    else:
        check("recipe.max_iterations task.train_depth recipe.ops_per_iteration",
              lambda: r.max_iterations >= -(-t.train_depth // max(r.ops_per_iteration, 1)),
              lambda: (f"must be >= ceil(task.train_depth / recipe.ops_per_iteration) = "
                       f"{-(-t.train_depth // max(r.ops_per_iteration, 1))}, got {r.max_iterations}"))
    one_of("recipe.supervise", SUPERVISE)
    at_least("recipe.read_every", 1, " (1 = every iteration of the gradient window)")
    if "recipe.read_every" not in bad and r.read_every > 1:
        check("recipe.read_every recipe.supervise", lambda: r.supervise == "window",
              f"reads every n-th iteration of the gradient window: needs recipe.supervise='window', got "
              f"{r.supervise!r}")
        if "recipe.grad_window" not in bad:
            check("recipe.read_every recipe.grad_window", lambda: r.read_every <= r.grad_window,
                  f"reads every n-th iteration of the gradient window: must be <= recipe.grad_window="
                  f"{r.grad_window}, got {r.read_every}")
    if fixed:
        check("recipe.depth_schedule", lambda: r.depth_schedule == "forced",
              f"recipe.fixed_iterations={r.fixed_iterations} runs the same R at every step; use 'forced' "
              f"(the 'hold' schedule draws R), got {r.depth_schedule!r}")
        check("recipe.extra_iterations", lambda: r.extra_iterations == 0,
              f"must be 0 with recipe.fixed_iterations={r.fixed_iterations} (R is fixed), got {r.extra_iterations}")
        check("recipe.halting", lambda: r.halting is not True,
              "learned halting needs R to follow the depth; it cannot be trained with recipe.fixed_iterations > 0")
    if r.cot is True:  # the chain-of-thought baseline: R = 1, the trace is the target (par_ray.cot)
        check("recipe.fixed_iterations", lambda: r.fixed_iterations == 1,
              f"recipe.cot needs recipe.fixed_iterations=1 (no recurrence), got {r.fixed_iterations}")
        check("recipe.supervise", lambda: r.supervise == "last",
              f"recipe.cot needs recipe.supervise='last', got {r.supervise!r}")
        check("recipe.halting", lambda: r.halting is not True, "cannot be combined with recipe.cot")
        check("recipe.dense_targets", lambda: r.dense_targets is not True, "cannot be combined with recipe.cot")
        check("backbone.position_scheme", lambda: b.position_scheme in ("rope", "none"),
              f"recipe.cot decodes with a KV cache: 'rope' or 'none', got {b.position_scheme!r}")
        check("backbone.attention_window", lambda: b.attention_window == 0,
              f"recipe.cot decodes with a KV cache over the whole sequence: must be 0, got {b.attention_window}")
        check("backbone.coda_window", lambda: b.coda_window == 0,
              f"recipe.cot decodes with a KV cache over the whole sequence: must be 0, got {b.coda_window}")
        check("task.given_prefix", lambda: t.given_prefix == 0, "cannot be combined with recipe.cot")

    for name in ("train.steps", "train.batch_size", "train.num_workers", "train.eval_every", "train.report_every"):
        at_least(name, 1)
    check("train.batch_size train.num_workers", lambda: tr.batch_size % max(tr.num_workers, 1) == 0,
          f"{tr.batch_size} must be divisible by train.num_workers={tr.num_workers}")
    check("train.lr", lambda: tr.lr > 0, f"must be > 0, got {tr.lr}")
    for name in ("train.weight_decay", "train.warmup_steps", "train.grad_clip", "train.threads_per_worker",
                 "train.checkpoint_every"):
        at_least(name, 0)
    seed("train.seed")
    one_of("train.strategy", STRATEGIES)
    check("train.strategy recipe.tied", lambda: tr.strategy != "deepspeed" or r.tied,
          "'deepspeed' cannot train the untied baseline (recipe.tied=False): use 'ddp' or 'fsdp' (docs/distributed.md)")
    one_of("train.zero_stage", ZERO_STAGES)
    one_of("train.float32_matmul_precision", FLOAT32_MATMUL_PRECISIONS)
    check("train.cpu_bf16_autocast train.use_gpu", lambda: not (tr.cpu_bf16_autocast and tr.use_gpu),
          "is for CPU workers: GPU workers (train.use_gpu=true) always run bf16 autocast; set it false")
    check("train.cpu_bf16_autocast train.strategy", lambda: not (tr.cpu_bf16_autocast and tr.strategy == "deepspeed"),
          "must be false with train.strategy='deepspeed' (DeepSpeed's bf16 mode is a GPU feature): use 'ddp' or "
          "'fsdp'")
    if tr.accelerator_type and "train.accelerator_type" not in bad:  # its name: par_ray.trial.registry_errors
        check("train.accelerator_type train.use_gpu", lambda: tr.use_gpu is True,
              f"{tr.accelerator_type!r} selects GPU nodes, so it needs train.use_gpu=true (or '' on CPU)")
    at_least("train.fail_at_step", -1, " (-1 = off)")
    check("train.collective_timeout_s", lambda: tr.collective_timeout_s >= 1,
          f"must be >= 1 second, got {tr.collective_timeout_s}")
    check("train.compile recipe.cot", lambda: not (tr.compile and r.cot),
          "must be false with recipe.cot: its greedy decoding hands transformers' KV cache to every layer, and a "
          "compiled layer recompiles for each cache state until torch._dynamo's recompile_limit, then runs eagerly")

    if "eval.depths" not in bad:
        if not ev.depths or any(d < 1 for d in ev.depths):
            errs.append(f"eval.depths: must be a non-empty list of positive integers, got {ev.depths!r}")
        else:
            low = [d for d in ev.depths if "task.train_depth" not in bad and d < t.train_depth]
            check("eval.depths", lambda: not low,
                  f"{low} are below task.train_depth={t.train_depth}; test depths must be >= it")
            check("eval.depths", lambda: list(ev.depths) == sorted(set(ev.depths)),
                  f"must be strictly increasing, got {list(ev.depths)}")
    at_least("eval.num_sequences", 1)
    at_least("eval.num_sequences_fine", 0, " (0 = eval.num_sequences)")
    at_least("eval.batch_size", 1)
    seed("eval.seed")
    at_least("eval.bracket_max_sequences", 0, " (0 = no adaptive sampling)")
    at_least("eval.bracket_min_sequences", 0, " (0 = no minimum)")
    check("eval.bracket_min_sequences eval.bracket_max_sequences",
          lambda: ev.bracket_min_sequences <= ev.bracket_max_sequences,
          lambda: f"must be <= eval.bracket_max_sequences={ev.bracket_max_sequences} (the cap; 0 turns adaptive "
                  f"sampling off), got {ev.bracket_min_sequences}")
    at_least("eval.bracket_block", 1)
    check("eval.bootstrap_resamples", lambda: ev.bootstrap_resamples == 0 or ev.bootstrap_resamples >= 100,
          lambda: f"must be 0 (no interval) or >= 100, got {ev.bootstrap_resamples}")
    one_of("backbone.attn_implementation", ATTN_IMPLEMENTATIONS)
    at_least("backbone.attention_window", 0, " (0 = full causal attention)")
    at_least("backbone.coda_window", 0, " (0 = full causal attention)")
    at_least("backbone.adapter_alpha", 0, " (0 = the paper's [0 | I])")
    at_least("recipe.extra_iterations", 0)
    at_least("recipe.fixed_point_weight", 0, " (0 = off)")
    at_least("recipe.state_noise", 0, " (0 = off)")
    at_least("recipe.position_offset", 0, " (0 = off)")
    check("recipe.position_offset backbone.position_scheme",
          lambda: r.position_offset == 0 or b.position_scheme == "rope",
          lambda: (f"shifts rotary position ids, which backbone.position_scheme={b.position_scheme!r} does not use; "
                   f"needs 'rope' (or recipe.position_offset=0)"))
    if fixed:
        check("recipe.progressive_loss", lambda: r.progressive_loss is not True,
              f"must be false with recipe.fixed_iterations={r.fixed_iterations} (R is fixed)")
    check("recipe.fixed_point_weight recipe.dense_targets", lambda: not r.fixed_point_weight or r.dense_targets is True,
          "needs recipe.dense_targets=true (which tokens hold is read from the dense targets' frontier)")
    check("recipe.dense_pending recipe.dense_targets", lambda: r.dense_targets or not r.dense_pending,
          "needs recipe.dense_targets=true")
    if r.dense_targets is True:  # which tasks define a whole-task state: par_ray.trial.registry_errors
        check("recipe.dense_targets backbone.pretrained", lambda: b.pretrained is None,
              "needs a random-init backbone (backbone.pretrained=None): the state classes extend the vocabulary")
    at_least("train.keep_checkpoints", 1)
    one_of("recipe.distill", DISTILL_MODES)
    check("recipe.ema_decay", lambda: 0.0 <= r.ema_decay < 1.0, f"must be in [0, 1), got {r.ema_decay}")
    check("recipe.distill_temperature", lambda: r.distill_temperature > 0,
          f"must be > 0, got {r.distill_temperature}")
    if r.distill in DISTILL_MODES[1:]:
        check("recipe.targets recipe.distill", lambda: r.targets == "final",
              f"{r.targets!r} with recipe.distill={r.distill!r}: prefix self-distillation labels only final answers, "
              f"so it needs 'final' (iterations before c·k >= d get the teacher's KL instead)")
        check("recipe.dense_targets recipe.distill", lambda: not r.dense_targets,
              "must be false with recipe.distill (dense targets label every prefix; PSD labels final answers only)")
    if not bad & HALTING_AND_STAGE_FIELDS:  # its checks compare values, so they need the right types
        errs += halting_and_stage_errors(cfg)
    return errs



def stage_steps(stage: StageConfig, total_steps: int) -> int:
    """Steps of ``stage`` out of ``total_steps`` = ``train.steps``: ``steps``, else ``share`` × total (rounded, >= 1),
    else 0 (the rest, resolved by ``par_ray.stages.resolve_stages``)."""
    if stage.steps:
        return stage.steps
    return max(1, round(stage.share * total_steps)) if stage.share > 0 else 0


HALTING_AND_STAGE_FIELDS = frozenset({
    "recipe.halt_weight", "recipe.ops_per_iteration", "eval.halt_k", "eval.halt_n", "eval.halt_tau", "eval.halt_rules",
    "eval.halt_max_iterations", "eval.depths", "train.steps", "train.strategy", "stages"})
"""Fields :func:`halting_and_stage_errors` compares by value: it runs only when none of them has a bad type."""


def halting_and_stage_errors(cfg: TrialConfig) -> list[str]:
    """Problems of the halting fields (recipe, eval) and of ``cfg.stages``, as ``"field: message"`` strings. What a
    stage's named recipe changes is checked against ``par_ray.recipes.RECIPES`` by ``par_ray.trial``."""
    r, ev, tr = cfg.recipe, cfg.eval, cfg.train
    errs: list[str] = []

    def check(ok: bool, name: str, msg: str) -> None:
        if not ok:
            errs.append(f"{name}: {msg}")

    check(r.halt_weight > 0, "recipe.halt_weight", f"must be > 0, got {r.halt_weight}")
    check(ev.halt_n >= 1, "eval.halt_n", f"must be >= 1, got {ev.halt_n}")
    check(ev.halt_n < 1 or 1 <= ev.halt_k <= ev.halt_n, "eval.halt_k",
          f"must be in [1, eval.halt_n={ev.halt_n}] (k of n), got {ev.halt_k}")
    check(0.0 < ev.halt_tau < 1.0, "eval.halt_tau", f"must be in the open interval (0, 1), got {ev.halt_tau}")
    errs += halt_rules_errors(ev.halt_rules, (ev.halt_k, ev.halt_n, ev.halt_tau))
    if ev.depths and all(isinstance(d, int) for d in ev.depths):
        need = -(-max(ev.depths) // max(r.ops_per_iteration, 1))
        check(ev.halt_max_iterations == 0 or ev.halt_max_iterations >= need, "eval.halt_max_iterations",
              f"must be 0 (= 2 × max(eval.depths) / c) or >= ceil(max(eval.depths) / c) = {need} so oracle "
              f"stopping is reachable, got {ev.halt_max_iterations}")

    stages = cfg.stages
    if not isinstance(stages, tuple) or not stages or not all(isinstance(s, StageConfig) for s in stages):
        errs.append(f"stages: must be a non-empty tuple of StageConfig, got {stages!r}")
        return errs
    open_ended = [i for i, s in enumerate(stages) if s.steps == 0 and s.share == 0]
    # else the sum checks below add noise (a train.steps < 1 has its own error)
    sizes_ok = tr.steps >= 1 and all(s.steps >= 0 and 0.0 <= s.share < 1.0 for s in stages)
    fixed = sum(stage_steps(s, tr.steps) for s in stages)
    for i, s in enumerate(stages):
        check(s.steps >= 0, f"stages[{i}].steps", f"must be >= 0 (0 = share or the rest of train.steps), got {s.steps}")
        check(0.0 <= s.share < 1.0 and (s.share == 0 or s.steps == 0), f"stages[{i}].share",
              f"must be in [0, 1) and only used with steps=0, got share={s.share} with steps={s.steps}")
        check(s.frozen in FROZEN_PARTS, f"stages[{i}].frozen", f"{s.frozen!r} is not one of {list(FROZEN_PARTS)}")
        check(s.frozen == "none" or tr.strategy != "deepspeed", f"stages[{i}].frozen",
              f"{s.frozen!r} needs train.strategy 'ddp' or 'fsdp' (DeepSpeed owns its gradients, so frozen parts "
              "cannot be left out of its step)")
    check(len(open_ended) <= 1, "stages", f"at most one stage may have steps=0 (the rest), got stages {open_ended}")
    if sizes_ok and open_ended:
        check(fixed < tr.steps, "stages",
              f"the stages' fixed steps ({fixed}) must leave at least one step of train.steps={tr.steps} for the "
              f"stage with steps=0")
    elif sizes_ok:
        check(fixed == tr.steps, "stages", f"the stages' steps must add up to train.steps={tr.steps}, got {fixed}")
    return errs


def halt_rules_errors(rules: tuple[tuple[int, int, float], ...], primary: tuple[int, int, float]) -> list[str]:
    """Problems of ``eval.halt_rules`` as at most one ``"eval.halt_rules: ..."`` string (empty when valid).

    Each rule (k, n, tau) needs n >= 1, k in [1, n] and tau in the open interval (0, 1), as the primary rule
    ``primary`` = (eval.halt_k, eval.halt_n, eval.halt_tau) does; no rule may repeat another or the primary (their
    metrics would share one name). Expects the declared types (the type check runs first).
    """
    bad = []
    for i, (k, n, tau) in enumerate(rules):
        why = []
        if not 1 <= k <= n:
            why.append(f"k={k} not in [1, n={n}]")
        if not 0.0 < tau < 1.0:
            why.append(f"tau={tau} not in (0, 1)")
        if (k, n, tau) == tuple(primary):
            why.append("repeats the primary rule eval.halt_k/halt_n/halt_tau")
        elif (k, n, tau) in rules[:i]:
            why.append("listed twice")
        if why:
            bad.append(f"{format_halt_rules(((k, n, tau),))} ({', '.join(why)})")
    if not bad:
        return []
    return [f"eval.halt_rules: every rule k/n/tau needs k in [1, n] and tau in the open interval (0, 1), once each "
            f"and not the primary rule {format_halt_rules((tuple(primary),))}; bad: {'; '.join(bad)}"]



# --------------------------------------------------------------------------------------------------------------------
# Flat dict boundary (Ray Tune param_space, MLflow params)

_SECTIONS = {f.name: f.type for f in fields(TrialConfig) if f.name != "stages"}
STAGES_KEY = "stages"
"""Flat key of ``TrialConfig.stages``: ``"steps:recipe:frozen:share"`` per stage, comma-separated
(``"0::none:0.0"``)."""


def format_stages(stages: tuple[StageConfig, ...]) -> str:
    """``(StageConfig(), StageConfig(recipe="stretch_ramp", share=0.1))`` -> ``"0::none:0.0,0:stretch_ramp:none:0.1"``
    (``steps:recipe:frozen:share`` per stage)."""
    return ",".join(f"{s.steps}:{s.recipe}:{s.frozen}:{s.share!r}" for s in stages)


def parse_stages(text: str) -> tuple[StageConfig, ...]:
    """Inverse of :func:`format_stages`; ``ValueError`` for an item that is not ``steps:recipe:frozen:share``."""
    out = []
    for item in str(text).split(","):
        parts = item.strip().split(":")
        if len(parts) != 4:
            raise ValueError(f"stage {item!r} is not 'steps:recipe:frozen:share'")
        out.append(StageConfig(steps=int(parts[0]), recipe=parts[1].strip(), frozen=parts[2].strip(),
                               share=float(parts[3])))
    return tuple(out)


NO_RULES = "none"
"""Flat text of an empty list of tuples (``eval.halt_rules`` with no extra rule): MLflow has refused empty param
values in some versions (mlflow/mlflow#6027, #6253)."""


def format_halt_rules(rules: typing.Iterable[typing.Iterable[typing.Any]]) -> str:
    """``((4, 8, 0.5), (8, 8, 0.5))`` -> ``"4/8/0.5,8/8/0.5"`` (``k/n/tau`` per rule, comma-separated); ``()`` ->
    ``"none"`` (:data:`NO_RULES`). The flat form of every tuple of tuples (``eval.halt_rules``)."""
    text = ",".join("/".join(str(x) for x in rule) for rule in rules)
    return text or NO_RULES


def flat_value(value: typing.Any) -> typing.Any:
    """One config value in its flat form: a tuple of tuples as :func:`format_halt_rules` writes it, any other tuple
    joined by commas (``"8,16,32,64"``), a scalar unchanged. An empty tuple gives ``""``: only the field's type says
    whether it is a list of rules (:func:`to_flat` writes those ``"none"``), and :func:`from_flat` reads ``""`` as an
    empty list of rules too."""
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) for v in value):
        return format_halt_rules(value)
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return value


def _nested(hint: typing.Any) -> bool:
    """``hint`` is a variable-length tuple of tuples, e.g. ``tuple[tuple[int, int, float], ...]``."""
    args = typing.get_args(hint)
    return (typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis
            and typing.get_origin(args[0]) is tuple)


def to_flat(cfg: TrialConfig) -> dict[str, typing.Any]:
    """``{"task.name": "swap_s5", ..., "eval.depths": "8,16,32,64", "eval.halt_rules": "4/8/0.5,8/8/0.5"}``:
    scalars only, tuples joined by commas, tuples of tuples as ``a/b/c`` items; an empty tuple is ``"none"``."""
    flat: dict[str, typing.Any] = {}
    for section in fields(cfg):
        sub = getattr(cfg, section.name)
        if section.name == "stages":
            flat[STAGES_KEY] = format_stages(sub)
            continue
        hints = typing.get_type_hints(type(sub))
        for f in fields(sub):
            value = getattr(sub, f.name)
            if isinstance(value, tuple) and (_nested(hints[f.name]) or not value):  # () is "none" too
                value = format_halt_rules(value)
            flat[f"{section.name}.{f.name}"] = flat_value(value)
    return flat


def from_flat(flat: typing.Mapping[str, typing.Any], base: TrialConfig | None = None) -> TrialConfig:
    """Inverse of :func:`to_flat`, applied as overrides on ``base`` (default: ``TrialConfig()``).

    Values may be strings (as MLflow returns them); they are converted to each field's declared type.
    Raises ``ValueError`` naming unknown keys or values that do not convert; does *not* validate ranges
    (call ``par_ray.trial.validate``).
    """
    cfg = base or TrialConfig()
    updates: dict[str, dict[str, typing.Any]] = {}
    errs: list[str] = []
    stages = cfg.stages
    for key, raw in flat.items():
        if key == STAGES_KEY:
            try:
                stages = raw if isinstance(raw, tuple) else parse_stages(raw)
            except ValueError as e:
                errs.append(f"{key}: cannot read {raw!r} ({e})")
            continue
        section, _, name = key.partition(".")
        sub = getattr(cfg, section, None) if section in _SECTIONS else None
        hints = typing.get_type_hints(type(sub)) if sub is not None else {}
        if name not in hints:
            errs.append(f"{key}: unknown config field (sections: {list(_SECTIONS)})")
            continue
        if isinstance(raw, str) and not raw.strip() and _optional(hints[name]):
            # "" could mean None or a value left out by mistake (``--set backbone.pretrained=`` with an unset shell
            # variable would train a random-init parent without a word): None is spelled out
            errs.append(f"{key}: empty; write {key}=None for none, or give a value")
            continue
        try:
            updates.setdefault(section, {})[name] = _convert(raw, hints[name])
        except (TypeError, ValueError) as e:
            hint = hints[name]
            errs.append(f"{key}: cannot read {raw!r} as {hint.__name__ if isinstance(hint, type) else hint} ({e})")
    if errs:
        raise ValueError("invalid trial config:\n  - " + "\n  - ".join(errs))
    return replace(cfg, **{s: replace(getattr(cfg, s), **u) for s, u in updates.items()}, stages=stages)


def _optional(hint: typing.Any) -> bool:
    """Whether a field's type hint is ``X | None``."""
    return (typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", None))
            and type(None) in typing.get_args(hint))


def _convert(raw: typing.Any, hint: typing.Any) -> typing.Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):  # X | None
        if raw is None or raw == "None" or raw == "":
            return None
        return _convert(raw, next(a for a in args if a is not type(None)))
    if origin is tuple and _nested(hint):  # "4/8/0.5,8/8/0.5" or "none" (format_halt_rules)
        if isinstance(raw, str):
            if raw.strip().lower() in (NO_RULES, ""):
                return ()
            raw = [x.strip() for x in raw.split(",")]
        return tuple(_convert_fixed(x, args[0]) for x in raw)
    if origin is tuple:
        elem = args[0]
        if isinstance(raw, str):
            if raw.strip().lower() in (NO_RULES, ""):  # an empty list (task.curriculum's default)
                return ()
            items = [x.strip() for x in raw.split(",")]
            if any(x == "" for x in items):
                raise ValueError("empty element in comma-separated list")
        else:
            items = list(raw)
        return tuple(_convert(x, elem) for x in items)
    if hint is bool:
        if isinstance(raw, str):
            if raw.lower() in ("true", "1", "yes"):
                return True
            if raw.lower() in ("false", "0", "no"):
                return False
            raise ValueError("expected true/false")
        return bool(raw)
    if hint is int:
        if isinstance(raw, float) and not raw.is_integer():
            raise ValueError("expected an integer")
        if isinstance(raw, str):
            return int(raw.strip())
        return int(raw)
    if hint is float:
        return float(raw)
    if hint is str:
        return str(raw)
    raise TypeError(f"unsupported field type {hint}")


def _convert_fixed(raw: typing.Any, hint: typing.Any) -> tuple:
    """One item of a tuple of tuples: ``"4/8/0.5"`` (or a sequence) as ``hint``, e.g. ``tuple[int, int, float]``."""
    args = typing.get_args(hint)
    items = [x.strip() for x in raw.split("/")] if isinstance(raw, str) else list(raw)
    if len(items) != len(args):
        raise ValueError(f"item {raw!r} is not {len(args)} values separated by '/' (e.g. '4/8/0.5')")
    return tuple(_convert(x, a) for x, a in zip(items, args))


def parse_overrides(items: typing.Iterable[str], flag: str = "--set") -> dict[str, str]:
    """``SECTION.FIELD=VALUE`` strings (a CLI's repeatable ``--set``) → flat overrides, values as text for
    :func:`from_flat` to convert; a later item wins. Raises ``ValueError`` naming ``flag`` for an item without ``=``
    or without a key."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag}: expected SECTION.FIELD=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def with_overrides(cfg: TrialConfig, **sections: dict[str, typing.Any]) -> TrialConfig:
    """``with_overrides(cfg, recipe={"anchoring": False})``: a copy with fields of named sections replaced."""
    return replace(cfg, **{s: dataclasses.replace(getattr(cfg, s), **u) for s, u in sections.items()})
