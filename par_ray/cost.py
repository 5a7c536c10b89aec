"""Compute, time and money of a trial: FLOPs → GPU-hours → dollars, planned before anything runs.

Beside the memory planner (``par_ray.planner``: bytes per GPU), this module answers "how many GPU-hours and how much
money is this sweep?" from the trial configs alone. Shapes come from the planner's :func:`~par_ray.planner.model_shape`
(the LoopedLM built on the meta device), sequence lengths from the task itself (``Task.sample`` at each depth), devices,
peaks and prices from :mod:`par_ray.hardware`.

FLOPs are matmul FLOPs, 2·m·n·k per (m×k)·(k×n) product, the quantity ``torch.utils.flop_counter.FlopCounterMode``
counts (``tests/test_cost.py`` holds this model to it within 5 %): elementwise work (norms, rotary, softmax, AdamW) is
left out, as in the usual 6·N·D accounting. For one sequence of T tokens, with h hidden, I the MLP width, a = n_q ·
d_head and g = n_kv · d_head, one decoder layer's forward is

    layer(T)          = T · (4h·a + 4h·g + 6h·I)  +  4·T²·a           q, k, v, o; gate, up, down; QKᵀ and P·V
    layer at Q rows   = Q · (4h·a + 4h·g + 6h·I)  +  T·4h·g  +  4·Q·T·a
                        (the readout's last coda layer: queries at the read rows, keys/values again at all T,
                        ``backbones.AllPositionsKeys``)

and one pass of ``LoopedLM.iterate`` with R iterations, n of them read out at Q rows:

    prelude  = n_pre · layer(T)                                            once
    core     = 2T·2h·h (adapter)  +  n_core · layer(T)  [+ 2T·h·4 conv]    R times
    readout  = (n_coda − 1) · layer(T) + layer at Q rows + 2Q·h·V          n times (V: the model's vocabulary)

A training step (``par_ray.train.step``) runs that forward; backward costs twice the forward of everything that ran
with autograd: the prelude, the K = min(grad_window, R) iterations of the gradient window and every readout
(iterations before the window ran under ``no_grad``). ``supervise="window"`` reads the K window iterations (every
``read_every``-th of them, counted from ⌈d/c⌉), ``"last"`` only iteration R. Prefix self-distillation adds the
teacher's no-grad forward, for every read iteration k with c·k < d, of the prompt truncated after c·k operations,
R = k, one readout (``par_ray.distill``; an EMA and a live teacher cost the same). Learned halting appends one
token and one read position; dense targets read the d operation positions too; chain-of-thought trains on prompt +
trace (``par_ray.cot``). Per step, the FLOPs are the expectation over the step's draws
(``par_ray.schedules.plan_step``): d ~ U{min_train_depth .. d_train}, and R = ⌈d/c⌉ (+ U{0..extra_iterations}), or
``fixed_iterations``, or 1 + Poisson(λ) under the hold schedule, capped at ``max_iterations``; each stage with its
own recipe and steps.

Evaluation (``par_ray.train.loop.eval_metrics``), at every ``eval_every`` steps and at the end: every test depth's
``num_sequences`` sequences with R = ⌈d/c⌉ (or ``fixed_iterations``), one readout, plus the blocks adaptive sampling
adds near the crossing (``eval.bracket_*``), planned at their worst case (:func:`bracket_worst_case`: 2 × the cap,
at the costliest depths; a real evaluation adds less); a halting stage also runs
R_max = ``evaluation.halt_max_iterations`` iterations read out at every one of them; the probe reads all
⌈d_train/c⌉ iterations of min(num_sequences, batch) sequences; chain-of-thought decodes greedily with a KV cache
(prefill, then L(d) − 1 one-token steps against a growing cache; the prefill's lm_head runs at every prompt token).

Time and money: GPU-seconds = FLOPs ÷ (peak × MFU), with separate MFUs for training and evaluation
(``par_ray.hardware``: assumed, or measured), plus each of the trial's GPUs held through its start-up (worker group,
model, MLflow run, checkpoints: ``hardware.DEFAULT_STARTUP_S``, or measured); a trial's wall time = GPU-seconds ÷
its GPUs; dollars = GPU-hours ×
the price per GPU-hour of the node type that holds the trial (on-demand and spot). A CPU trial (local preset) is
costed the same way with the fp32 peak of one core per thread with every core busy
(``par_ray.hardware.measure_cpu_peak``), at no price.

Checkpoint bytes written (:func:`checkpoint_bytes_written`): every ``checkpoint_every`` steps and at the end, the
strategy's format (model, AdamW state, the EMA teacher), summed over the trial. The export a single run leaves in
``final/`` (:func:`export_bytes`) is the model's float32 weights only, 4 B per parameter.
"""

from __future__ import annotations

import functools
import math
import typing
from dataclasses import dataclass

from par_ray.hardware import Table, load_table
from par_ray.planner import ModelShape, model_shape
from par_ray.schedules import curriculum_phases, iterations_at, supervised_iterations
from par_ray.tracking_schema import cost_param, depth_metric

if typing.TYPE_CHECKING:
    from par_ray.config import RecipeConfig, TrialConfig

CONV_WIDTH = 4
"""``LoopedLM``'s state convolution width (``par_ray.model.looped.CONV_WIDTH``, restated to keep torch out)."""
TRAIN_LENGTH_SAMPLES = 8
"""Batches sampled per depth when training prompts vary in length (``task.train_filler``, ``task.given_prefix``)."""


# ----------------------------------------------------------------------------------------------------------------------
# FLOPs of the model's passes (per sequence)

def layer_flops(shape: ModelShape, T: int, rows: int | None = None) -> int:
    """Forward matmul FLOPs of one decoder layer on one sequence of ``T`` tokens; ``rows``: output at that many rows
    only (queries at the rows, keys/values at all T: the readout's last coda layer)."""
    h, I = shape.hidden, shape.intermediate
    a, g = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    per_token = 4 * h * a + 4 * h * g + 6 * h * I
    if rows is None:
        return T * per_token + 4 * T * T * a
    return rows * per_token + T * 4 * h * g + 4 * rows * T * a


def core_flops(shape: ModelShape, T: int, conv: bool = False) -> int:
    """One core iteration on one sequence: adapter W·[e; s], the core layers, the state convolution if any."""
    h = shape.hidden
    return 2 * T * 2 * h * h + shape.split[1] * layer_flops(shape, T) + (2 * T * h * CONV_WIDTH if conv else 0)


def readout_flops(shape: ModelShape, T: int, Q: int) -> int:
    """One readout (coda → norm → lm_head at Q rows) on one sequence (``LoopedLM.readout``)."""
    n_coda = shape.split[2]
    head = 2 * Q * shape.hidden * shape.vocab
    if n_coda == 0:
        return head
    return (n_coda - 1) * layer_flops(shape, T) + layer_flops(shape, T, rows=Q) + head


def forward_flops(shape: ModelShape, T: int, Q: int, R: int, reads: int, conv: bool = False) -> int:
    """``LoopedLM.iterate`` on one sequence: prelude once, R core iterations, ``reads`` readouts at Q rows."""
    return (shape.split[0] * layer_flops(shape, T) + R * core_flops(shape, T, conv)
            + reads * readout_flops(shape, T, Q))


def train_flops(shape: ModelShape, T: int, Q: int, R: int, window: int, reads: int, conv: bool = False) -> int:
    """Forward + backward of one training sequence: backward = 2 × the forward that ran with autograd (all but the
    R − K iterations before the gradient window, K = min(window, R))."""
    fwd = forward_flops(shape, T, Q, R, reads, conv)
    return fwd + 2 * (fwd - (R - min(window, R)) * core_flops(shape, T, conv))


def decode_flops(shape: ModelShape, T: int, new_tokens: int) -> int:
    """Greedy decoding of one sequence with a KV cache (``par_ray.cot.greedy_decode``, ``LoopedLM.decode``): the
    prefill over T prompt tokens (lm_head at all T), then ``new_tokens`` − 1 one-token steps, step i attending to
    T + i cached positions."""
    h, V = shape.hidden, shape.vocab
    n_layers = sum(shape.split)
    a = shape.heads * shape.head_dim
    prefill = n_layers * layer_flops(shape, T) + 2 * T * 2 * h * h + 2 * T * h * V
    steps = max(new_tokens - 1, 0)
    per_token = layer_flops(shape, 1) - 4 * a  # the linear layers of one token (attention below)
    keys = sum(T + i for i in range(1, steps + 1))  # cached positions each step attends to
    return prefill + steps * (n_layers * per_token + 2 * 2 * h * h + 2 * h * V) + n_layers * 4 * a * keys


# ----------------------------------------------------------------------------------------------------------------------
# A trial's FLOPs

@dataclass(frozen=True)
class TrialFlops:
    """Planned FLOPs of one trial (totals over its steps and evaluations, all ranks together)."""

    train: float
    eval: float
    stages: tuple[float, ...]
    """Training FLOPs per stage."""
    step_mean: tuple[float, ...]
    """Mean FLOPs of one training step (global batch) per stage."""
    eval_once: tuple[float, ...]
    """FLOPs of each evaluation, in order."""
    checkpoint_bytes: int

    @property
    def total(self) -> float:
        return self.train + self.eval


def _schedule(task_cfg, rc: RecipeConfig, max_depth: int | None = None) -> list[tuple[int, dict[int, float]]]:
    """[(d, {R: probability})] for every depth d of the step's draw (uniform up to ``max_depth``, default d_train:
    a ``task.curriculum`` phase's cap), as ``schedules.plan_step`` draws, with ``recipe.progressive_loss``'s cut of R
    to n + grad_window, n ~ U{0 .. R − grad_window}."""
    cap = rc.max_iterations
    out = []
    for d in range(task_cfg.min_train_depth, (max_depth or task_cfg.train_depth) + 1):
        pmf: dict[int, float] = {}
        if rc.depth_schedule == "hold":
            lam = rc.hold_lambda
            for n in range(0, cap):  # R = 1 + n, capped: the tail lands on cap
                p = math.exp(-lam + n * math.log(lam) - math.lgamma(n + 1)) if lam > 0 else float(n == 0)
                pmf[min(1 + n, cap)] = pmf.get(min(1 + n, cap), 0.0) + p
            pmf[cap] = pmf.get(cap, 0.0) + max(0.0, 1.0 - sum(pmf.values()))
        else:
            base = iterations_at(d, rc.ops_per_iteration, rc.fixed_iterations)
            for extra in range(rc.extra_iterations + 1):
                R = min(base + extra, cap)
                pmf[R] = pmf.get(R, 0.0) + 1.0 / (rc.extra_iterations + 1)
        w = rc.grad_window
        if getattr(rc, "progressive_loss", False) and any(R > w for R in pmf):
            cut: dict[int, float] = {}
            for R, p in pmf.items():
                for R_run in (range(w, R + 1) if R > w else (R,)):
                    cut[R_run] = cut.get(R_run, 0.0) + p / (R - w + 1 if R > w else 1)
            pmf = cut
        out.append((d, pmf))
    return out


@functools.lru_cache(maxsize=4096)
def _lengths(task_cfg, cot: bool, depth: int, seed: int, samples: int) -> tuple[tuple[int, int, int], ...]:
    """(T, Q, operation positions) of ``samples`` training batches at ``depth`` (the train task, CoT-wrapped)."""
    from par_ray.cot import CotTask, cot_tokens
    from par_ray.tasks import build_task

    task = build_task(task_cfg, train=True)
    if cot:
        task = CotTask(task, cot_tokens(task.vocab_size))
    out = []
    for step in range(samples):
        ep = task.sample(depth, 1, seed=seed, step=step)
        ops = 0 if ep.op_positions is None else int(ep.op_positions.numel())
        out.append((int(ep.input_ids.shape[1]), int(ep.read_positions.numel()), ops))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _eval_lengths(task_cfg, depth: int, cot: bool = False) -> tuple[int, int]:
    """(T, Q) of the test prompts at ``depth`` (every test row of one depth has the same length); ``cot``: with the
    teacher-forced trace appended (the CoT baseline's probe)."""
    from par_ray.cot import CotTask, cot_tokens
    from par_ray.tasks import build_task

    task = build_task(task_cfg)
    if cot:
        task = CotTask(task, cot_tokens(task.vocab_size))
    ep = task.sample(depth, 1, seed=0)
    return int(ep.input_ids.shape[1]), int(ep.read_positions.numel())


def step_flops(cfg: TrialConfig, rc: RecipeConfig, shape: ModelShape, depth: int, R: int,
               lengths: tuple[int, int, int], op_width: int | None) -> float:
    """FLOPs of one training step at (d, R) for the global batch, recipe ``rc`` (a stage's), prompt ``lengths`` (T,
    Q, operation positions), with the PSD teacher's forwards."""
    T, Q, ops = lengths
    halt = int(rc.halting)
    T, Q = T + halt, Q + halt
    reads = Q + (ops if rc.dense_targets else 0)
    conv = cfg.backbone.position_scheme == "conv"
    read_iterations = supervised_iterations(rc, R, depth)
    per_seq = train_flops(shape, T, reads, R, rc.grad_window, len(read_iterations), conv)
    if rc.distill != "none":
        w = op_width or 0
        for k in read_iterations:
            if rc.ops_per_iteration * k < depth:  # distilled: the teacher reads the prompt cut after c·k operations
                per_seq += forward_flops(shape, T - (depth - rc.ops_per_iteration * k) * w, Q - halt, k, 1, conv)
    return per_seq * cfg.train.batch_size


def bracket_worst_case(eval_cfg, per_sequence: typing.Mapping[int, float]) -> dict[int, int]:
    """Sequences that adaptive sampling near the crossing (``eval.bracket_*``, ``par_ray.evaluation
    .next_bracket_depth``) adds at each test depth in the costliest evaluation it allows: blocks of
    ``bracket_block``, a depth's first pass plus its blocks at most ``bracket_max_sequences``, at most 2 ×
    ``bracket_max_sequences`` added in all (so ⌊2 · cap / block⌋ blocks), given to the depths whose sequences cost
    most (``per_sequence``: d → FLOPs of one test sequence) first. Where the crossing falls is unknown before the run:
    this bound holds wherever it falls and however often it moves. Empty when adaptive sampling is off."""
    cap, block = eval_cfg.bracket_max_sequences, eval_cfg.bracket_block
    if not cap:
        return {}
    budget, out = 2 * cap // block, {}
    for d in sorted(eval_cfg.depths, key=lambda d: (-per_sequence[d], -d)):
        take = min(budget, max(0, (cap - eval_cfg.sequences_at(d)) // block))
        if take:
            out[d] = take * block
            budget -= take
    return out


def eval_flops(cfg: TrialConfig, rc: RecipeConfig, shape: ModelShape, world: int = 1,
               added: typing.Mapping[int, int] | None = None) -> float:
    """FLOPs of one evaluation (``train.loop.eval_metrics``) under stage recipe ``rc``: accuracy by depth (or CoT
    decoding), halting evaluation when ``rc.halting``, the per-iteration probe.

    ``added``: test depth → sequences adaptive sampling added there (a run's ``sequences_d{D}`` minus
    ``eval.sequences_at(d)``): the FLOPs of that evaluation; ``None`` (the plan): the worst case,
    :func:`bracket_worst_case` (first pass + the cap's worth at the costliest depths)."""
    from par_ray.cot import trace_length
    from par_ray.evaluation import halt_max_iterations

    ev, c = cfg.eval, rc.ops_per_iteration
    conv = cfg.backbone.position_scheme == "conv"
    per_sequence = {}  # d -> FLOPs of one test sequence of the accuracy (or CoT) pass
    for d in ev.depths:
        T, Q = _eval_lengths(cfg.task, d)
        if cfg.recipe.cot:
            per_sequence[d] = decode_flops(shape, T, trace_length(d, Q))
        else:
            per_sequence[d] = forward_flops(shape, T, Q, iterations_at(d, c, rc.fixed_iterations), 1, conv)
    added = bracket_worst_case(ev, per_sequence) if added is None else added
    total = 0.0
    for d in ev.depths:
        T, Q = _eval_lengths(cfg.task, d)
        n = ev.sequences_at(d)  # eval.num_sequences, or eval.num_sequences_fine between a fine grid's 2^k depths
        total += (n + added.get(d, 0)) * per_sequence[d]  # halting and the probe read the first pass only
        if rc.halting:
            R_max = halt_max_iterations(ev, c)
            pending = int(cfg.recipe.dense_targets and cfg.recipe.dense_pending)
            total += n * forward_flops(shape, T + 1, Q + 1 + pending, R_max, R_max, conv)
    n_probe = max(min(ev.num_sequences, ev.batch_size), world)
    d = cfg.task.train_depth
    T, Q = _eval_lengths(cfg.task, d, bool(cfg.recipe.cot))
    R = iterations_at(d, cfg.recipe.ops_per_iteration, cfg.recipe.fixed_iterations)
    return total + n_probe * forward_flops(shape, T, Q, R, R, conv)


def eval_flops_done(cfg: TrialConfig, rc: RecipeConfig, shape: ModelShape, metrics: typing.Mapping[str, float],
                    world: int = 1) -> float:
    """FLOPs of an evaluation that ran (:func:`eval_flops`), its ``metrics`` (``train.loop.eval_metrics``) saying how
    many test sequences each depth got (``sequences_d{D}``; a depth without one: ``eval.sequences_at(d)``, none
    added). The actual side of the plan's evaluation FLOPs, which counts adaptive sampling at its worst case."""
    ev = cfg.eval
    added = {d: max(0, round(metrics.get(depth_metric("sequences", d), ev.sequences_at(d))) - ev.sequences_at(d))
             for d in ev.depths}
    return eval_flops(cfg, rc, shape, world, added=added)


def model_vocab(cfg: TrialConfig) -> int | None:
    """The vocabulary the trial's model is built with (``par_ray.trial.VocabLayout``): ``None`` for a pretrained
    checkpoint (its own), else task | halting | CoT | dense classes."""
    if cfg.backbone.pretrained:
        return None
    from par_ray.trial import resolve

    return resolve(cfg).vocab.size


def trial_shape(cfg: TrialConfig) -> ModelShape:
    """The planner's :class:`~par_ray.planner.ModelShape` of the trial's model (its split and vocabulary)."""
    return model_shape(cfg.backbone.name, cfg.backbone.split, vocab_size=model_vocab(cfg))


def _num_params(cfg: TrialConfig) -> int:
    """Ψ of the trial's model (the planner's count: tied weights once, adapter, untied core copies)."""
    return model_shape(cfg.backbone.name, cfg.backbone.split, tied=cfg.recipe.tied,
                       untied_copies=cfg.recipe.max_iterations, vocab_size=model_vocab(cfg)).total_params


EXPORT_BYTES_PER_PARAM = 4
"""The export's bytes per parameter: float32 master weights (``par_ray.train.checkpoint.export_model``)."""


def export_bytes(cfg: TrialConfig, num_params: int | None = None) -> int:
    """Bytes of the trial's export (``python -m par_ray.train``'s ``final/``: ``model.safetensors``, weights only,
    float32, tied weights once): 4 B × Ψ, plus a header of a few kB that is not counted. ``num_params`` default:
    the planner's count of the trial's model."""
    return EXPORT_BYTES_PER_PARAM * (num_params if num_params is not None else _num_params(cfg))


def checkpoint_bytes_written(cfg: TrialConfig, num_params: int | None = None) -> int:
    """Bytes all checkpoints of the trial write, summed: every ``train.checkpoint_every`` steps and at the end, each
    the strategy's format (``par_ray.train.strategies``): ddp/fsdp fp32 model + AdamW m, v (16 B per parameter);
    DeepSpeed in bf16 the bf16 module + fp32 master, m, v (14 B), in fp32 12 B; the EMA teacher, fp32, 4 B more.
    ``num_params`` default: the planner's count of the trial's model."""
    from par_ray.trial import resolve

    tr = cfg.train
    psi = num_params if num_params is not None else _num_params(cfg)
    per_param = 16 if tr.strategy != "deepspeed" else (14 if tr.use_gpu else 12)
    per_param += 4 if resolve(cfg).ema else 0
    every = tr.checkpoint_every
    count = 1 if not every else tr.steps // every + (1 if tr.steps % every else 0)
    return count * per_param * psi


def _depth_caps(task_cfg, start: int, end: int) -> list[tuple[int, int]]:
    """[(largest training depth, steps)] of global steps [start, end), one per ``task.curriculum`` phase they overlap
    (``schedules.curriculum_phases``); [(d_train, end − start)] without a curriculum."""
    spans = [(d, min(hi if hi is not None else end, end) - max(lo, start))
             for lo, hi, d in curriculum_phases(task_cfg)]
    return [(d, n) for d, n in spans if n > 0]


def trial_flops(cfg: TrialConfig) -> TrialFlops:
    """Planned training and evaluation FLOPs of ``cfg`` (validated), all stages and evaluations, all ranks."""
    from par_ray.stages import resolve_stages, stage_at
    from par_ray.tasks import build_task

    shape = trial_shape(cfg)
    op_width = build_task(cfg.task, train=True).op_width
    samples = TRAIN_LENGTH_SAMPLES if (cfg.task.train_filler or cfg.task.given_prefix) else 1
    stages = resolve_stages(cfg)
    per_stage, means = [], []
    for stage in stages:
        rc = stage.recipe
        total = 0.0
        for max_depth, steps in _depth_caps(cfg.task, stage.start, stage.end):  # one cap without a curriculum
            mean = 0.0
            schedule = _schedule(cfg.task, rc, max_depth)
            for d, pmf in schedule:
                lengths = _lengths(cfg.task, bool(cfg.recipe.cot), d, cfg.train.seed, samples)
                for R, p in pmf.items():
                    if p > 0:
                        mean += p * sum(step_flops(cfg, rc, shape, d, R, ln, op_width) for ln in lengths) / len(lengths)
            total += steps * mean / len(schedule)
        means.append(total / max(stage.steps, 1))
        per_stage.append(total)
    tr = cfg.train
    evals = [s for s in range(1, tr.steps + 1) if s % tr.eval_every == 0 or s == tr.steps]
    eval_once = tuple(eval_flops(cfg, stage_at(stages, s - 1)[0].recipe, shape, tr.num_workers) for s in evals)
    return TrialFlops(train=sum(per_stage), eval=sum(eval_once), stages=tuple(per_stage), step_mean=tuple(means),
                      eval_once=eval_once, checkpoint_bytes=checkpoint_bytes_written(cfg))


# ----------------------------------------------------------------------------------------------------------------------
# Time and money

@dataclass(frozen=True)
class TrialCost:
    """A trial's planned FLOPs, GPU-hours, wall time and dollars."""

    flops: TrialFlops
    device: str
    """Device type costed (Ray accelerator type, or ``CPU``)."""
    count: int
    """Devices (GPUs, or CPU workers) the trial holds."""
    peak_flops: float
    """FLOP/s of one device (a CPU worker: one core per thread)."""
    mfu_train: float
    mfu_eval: float
    train_gpu_hours: float
    eval_gpu_hours: float
    startup_hours: float
    """Hours the trial holds its devices outside its steps and evaluations (``Table.startup_s_of``), wall time."""
    node: str | None
    """Node type the price is from (``None``: unpriced)."""
    usd_per_gpu_hour: float | None
    usd_spot_per_gpu_hour: float | None

    @property
    def gpu_hours(self) -> float:
        """Device-hours: training, evaluation, and the start-up on each of the trial's devices."""
        return self.train_gpu_hours + self.eval_gpu_hours + self.startup_hours * self.count

    @property
    def wall_hours(self) -> float:
        """The trial's planned duration: its device-hours spread over its devices (start-up included once)."""
        return self.gpu_hours / self.count

    @property
    def usd(self) -> float | None:
        return None if self.usd_per_gpu_hour is None else self.gpu_hours * self.usd_per_gpu_hour

    @property
    def usd_spot(self) -> float | None:
        return None if self.usd_spot_per_gpu_hour is None else self.gpu_hours * self.usd_spot_per_gpu_hour

    def params(self) -> dict[str, str]:
        """MLflow params of the plan (``cost.<field>``, ``par_ray.tracking_schema.cost_param``), logged on the
        trial's child run."""
        def num(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.6g}"

        fields = {"planned_flops": num(self.flops.total), "planned_train_flops": num(self.flops.train),
                  "planned_eval_flops": num(self.flops.eval), "device": self.device, "devices": str(self.count),
                  "planned_gpu_hours": num(self.gpu_hours), "planned_train_gpu_hours": num(self.train_gpu_hours),
                  "planned_eval_gpu_hours": num(self.eval_gpu_hours), "planned_wall_hours": num(self.wall_hours),
                  "planned_startup_hours": num(self.startup_hours),
                  "planned_usd": num(self.usd), "planned_usd_spot": num(self.usd_spot),
                  "mfu_train": num(self.mfu_train), "mfu_eval": num(self.mfu_eval),
                  "peak_flops": num(self.peak_flops), "node": self.node or "n/a",
                  "checkpoint_bytes": str(self.flops.checkpoint_bytes)}
        return {cost_param(k): v for k, v in fields.items()}


def trial_cost(cfg: TrialConfig, table: Table | None = None) -> TrialCost:
    """Plan ``cfg``'s cost on the device it runs on (``train.accelerator_type``; ``CPU`` without GPUs).

    Raises ``ValueError`` naming ``train.accelerator_type`` for a device missing from the table or without a peak.
    """
    table = table or load_table()
    tr = cfg.train
    name, dev = table.device(tr.accelerator_type, tr.use_gpu)
    if not dev.peak_tflops:
        raise ValueError(f"train.accelerator_type: {name!r} has no peak in the device table; add peak_tflops with "
                         f"--prices")
    threads = 1 if tr.use_gpu else max(1, tr.threads_per_worker)
    peak = dev.peak_tflops * 1e12 * threads
    medium = tr.float32_matmul_precision == "medium"  # bf16 products ("" is the device default, never medium)
    bf16 = tr.cpu_bf16_autocast  # CPU only (validated); GPU kinds have no _bf16 MFUs: theirs are bf16 already
    mfu_t = table.mfu_of(name, "train", compiled=tr.compile, medium=medium, bf16=bf16)
    mfu_e = table.mfu_of(name, "eval", medium=medium, bf16=bf16)
    fl = trial_flops(cfg)
    node = dev.price(tr.num_workers)
    if name == "CPU" and node is None:  # this machine's cores (the local preset): no bill unless priced
        where, on_demand, spot = "local", 0.0, 0.0
    elif node is None:
        where, on_demand, spot = None, None, None
    else:
        where, on_demand, spot = node.node, node.on_demand / node.gpus, node.spot / node.gpus
    return TrialCost(flops=fl, device=name, count=tr.num_workers, peak_flops=peak, mfu_train=mfu_t, mfu_eval=mfu_e,
                     train_gpu_hours=fl.train / (peak * mfu_t) / 3600, eval_gpu_hours=fl.eval / (peak * mfu_e) / 3600,
                     startup_hours=table.startup_s_of(name) / 3600, node=where, usd_per_gpu_hour=on_demand,
                     usd_spot_per_gpu_hour=spot)


def sweep_wall_hours(durations: typing.Sequence[float], concurrency: int) -> float:
    """Wall time of trials of ``durations`` hours run in order, at most ``concurrency`` at once (each starts when a
    slot frees, as Tune's FIFO scheduler with ``max_concurrent_trials`` starts them)."""
    slots = [0.0] * max(1, min(concurrency, len(durations) or 1))
    for d in durations:
        i = min(range(len(slots)), key=slots.__getitem__)
        slots[i] += d
    return max(slots) if durations else 0.0


# ----------------------------------------------------------------------------------------------------------------------
# Text

def si(x: float, unit: str = "") -> str:
    """``3.2e15`` → ``"3.20 P"`` (k, M, G, T, P, E)."""
    for p, s in ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if abs(x) >= 10 ** p:
            return f"{x / 10 ** p:.2f} {s}{unit}"
    return f"{x:.0f} {unit}".rstrip()


def usd(x: float | None) -> str:
    return "n/a" if x is None else (f"${x:,.0f}" if x >= 100 else f"${x:,.2f}")


def hours(h: float) -> str:
    """A duration given in hours, in the unit that shows it: seconds under a minute, minutes under an hour."""
    return f"{h * 3600:.0f} s" if h < 1 / 60 else f"{h * 60:.1f} min" if h < 1 else f"{h:.1f} h"


def assumptions(costs: typing.Iterable[TrialCost], table: Table) -> list[str]:
    """One line per device used: peak, MFUs (measured or assumed) and the price's node, date and source."""
    lines, seen = [], set()
    for c in costs:
        if c.device in seen:
            continue
        seen.add(c.device)
        dev = table.devices[c.device]
        measured = ((f" (measured: {dev.mfu_source})" if dev.mfu_source else " (measured)") if dev.mfu_train
                    or dev.mfu_eval else " (assumed)")
        peak = (f"{c.peak_flops / 1e9:.0f} GFLOP/s fp32 per worker ({dev.peak_source})" if c.device == "CPU"
                else f"{dev.peak_tflops:g} TFLOP/s bf16 ({dev.peak_source})")
        node = dev.price(c.count)
        price = ("this machine, no price" if c.device == "CPU" and node is None else "no price" if node is None else
                 f"{node.node} ({node.cloud} {node.region}, {node.gpus} GPU/node) ${node.on_demand:g}/h on-demand, "
                 f"${node.spot:g}/h spot, list price of {node.date} ({node.source})")
        startup = (f"start-up {c.startup_hours * 3600:.0f} s per trial "
                   f"({'measured' if dev.startup_s is not None else 'assumed'})")
        lines.append(f"{c.device}: peak {peak}; MFU train {c.mfu_train:.2f}, eval {c.mfu_eval:.2f}{measured}; "
                     f"{startup}; {price}")
    return lines
