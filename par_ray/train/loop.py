"""The training loop: one function for one rank or many, for a local run or a Ray cluster.

``train_loop_per_worker`` is what ``ray.train.torch.TorchTrainer`` runs on every worker (Ray Train V2). The
single-process trainer (``python -m par_ray.train``) runs the *same* function through Ray Train's local mode
(``ScalingConfig(num_workers=0)``), so there is exactly one loop (nanoGPT: "runs unchanged under python or torchrun").

Per step: plan (d, R, s) from (seed, step), checked equal on every rank (:func:`check_lockstep`) → the rank's shard of
the global batch → :func:`train_step` → a non-finite loss ends the trial at once (:class:`NonFiniteLossError`). Every
``report_every`` steps: metrics; every ``eval_every``: accuracy by depth, d50, G and the per-iteration probe
(``loss_k{k}``, ``rms_k{k}``: :func:`probe_metrics`), under the training step's precision (:func:`eval_metrics`), timed
(``eval_seconds``, and ``eval_seconds_total`` over the trial beside ``train_seconds``) and counted (``flops_eval``: the
FLOPs they did, ``par_ray.cost.eval_flops_done``); every ``checkpoint_every``: a checkpoint with the report. The last
report always carries a checkpoint (but in Ray Train's local mode, which keeps none), and ``Result.metrics`` holds the
final metrics.
A trial is a list of stages (``par_ray.stages``): global step → (stage, step in stage) is pure, so the stage's recipe,
frozen parts and stretch ramp follow from the step alone, on a fresh run and on one resumed mid-stage.
Marked ``# ray`` lines are the only Ray calls.

Resuming: a checkpoint holds the model, optimizer and scheduler (the strategy's format) plus ``extra.json``: the
step, the training time, the last evaluation (so the first report after a resume carries ``acc_d*``/``G`` as the
uninterrupted run's would) and the flat config that wrote it. A checkpoint written under another config is refused
(:func:`resume_mismatch`), except for the fields in :data:`RESUME_FREE_FIELDS` that do not change what is trained.

Reports between the last checkpoint and a fault are sent again when the restarted worker group replays those steps
(Ray Train V2 delivers reports at least once). Consumers keep one report per step: ``build_trainer`` forwards a
report to its callbacks only when its step is past the last one forwarded, and the MLflow tracker logs a step only
once (``par_ray.tracking``).
"""

from __future__ import annotations

import math
import os
import tempfile
import time

import ray.train  # ray
import ray.train.torch  # ray: get_device, on workers and in local mode alike
import torch

from par_ray.config import TrialConfig, to_flat
from par_ray.cost import eval_flops_done, trial_shape
from par_ray.cot import CotTask, cot_accuracy_by_depth, cot_tokens, trial_cot_tokens
from par_ray.evaluation import (BEST_R_MULTIPLES, EvalProgress, accuracy_by_depth, extrapolation_from_counts,
                                extrapolation_metrics, halt_max_iterations, halting_by_depth, halting_metrics,
                                rank_chunks, stopping_extrapolation, wilson_interval)
from par_ray.halting import halt_tokens
from par_ray.prompts import render
from par_ray.weights import parent_tokenizer, resolved_backbone
from par_ray.objectives import par_loss
from par_ray.schedules import iterations_at, plan_step
from par_ray.tasks import build_task
from par_ray.tracking_schema import (FLOPS_EVAL, GPU_SECONDS_EVAL, GPU_SECONDS_TRAIN, depth_metric,
                                     gpu_seconds_stage, is_gpu_seconds_metric, iteration_metric)
from par_ray.schedules import stretch_cap
from par_ray.stages import frozen_parameters, stage_at
from par_ray.train.checkpoint import export_model, read_extra
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, cpu_bf16_notes, prepare, set_matmul_precision
from par_ray.trial import VocabLayout, resolve

RESUME_FREE_FIELDS = frozenset({"train.num_workers", "train.accelerator_type", "train.threads_per_worker",
                                "train.fail_at_step", "train.collective_timeout_s", "train.compile"})
"""Flat config fields a checkpoint may be resumed under with another value: where the run is placed (ddp and fsdp
checkpoints load on any world size, on any GPU type; checkpoints written before ``train.accelerator_type`` existed
lack it), fault injection, the collective timeout and ``train.compile`` (same math and state-dict keys; checkpoints
written before it existed lack it). Every other field changes what is trained (a learning rate, the step count that
shapes the LR schedule, the data), so a resume must match it."""


TIMING_METRICS = frozenset({"step_time_s", "tokens_per_s", "peak_memory_mb", "train_seconds", "eval_seconds",
                            "eval_seconds_total"})
"""Reported metrics that measure the machine, not the model, besides the device-seconds (:func:`is_timing_metric`)."""


def is_timing_metric(name: str) -> bool:
    """Whether reported metric ``name`` measures the machine or the work done, not the model (:data:`TIMING_METRICS`,
    the device-seconds, ``par_ray.tracking_schema.is_gpu_seconds_metric``, and the evaluations' FLOPs,
    :data:`~par_ray.tracking_schema.FLOPS_EVAL`, which count the evaluations run, ``train.eval_every``): it differs
    between runs of the same trial (world size, load) or with the evaluation schedule, so parity tests compare every
    other metric."""
    return name in TIMING_METRICS or name == FLOPS_EVAL or is_gpu_seconds_metric(name)


class NonFiniteLossError(FloatingPointError):
    """The training loss of a step is inf or NaN: the trial has diverged and stops at once, naming step and loss."""


class LockstepError(RuntimeError):
    """Ranks disagree on what a step runs (its depth d or iteration count R): their collectives would not match."""


def resume_mismatch(stored: dict, current: dict) -> list[str]:
    """``"field: stored → current"`` for every flat config field that differs and may not (``RESUME_FREE_FIELDS``).

    ``stored`` and ``current`` are :func:`par_ray.config.to_flat` dicts; values are compared as strings, so a config
    read back from JSON compares equal to the one that wrote it. A field missing on one side counts as different.
    """
    def shown(flat: dict, key: str) -> str:
        return str(flat[key]) if key in flat else "(absent)"

    keys = sorted((set(stored) | set(current)) - RESUME_FREE_FIELDS)
    return [f"{k}: {shown(stored, k)} → {shown(current, k)}" for k in keys if shown(stored, k) != shown(current, k)]


def check_lockstep(engine, step: int, depth: int, R: int) -> None:
    """Raise :class:`LockstepError` on every rank unless all ranks plan the same (step, d, R) for this step.

    One all-reduce of a (world size × 3) table in which each rank fills its own row: every rank then sees every
    rank's plan and raises the same error naming the ranks, before a mismatched forward could hang a collective or
    silently train different iteration counts (DDP's gradient all-reduce matches in count whatever R is).
    """
    world = engine.world
    table = torch.zeros(world.size, 3, dtype=torch.float64, device=engine.device)
    table[world.rank] = torch.tensor([step, depth, R], dtype=torch.float64, device=engine.device)
    rows = engine.all_reduce_sum(table).tolist()
    if any(row != rows[0] for row in rows):
        plans = ", ".join(f"rank {i}: step {int(s)} d={int(d)} R={int(r)}" for i, (s, d, r) in enumerate(rows))
        raise LockstepError(f"ranks disagree on the plan of step {step + 1} ({plans}); the per-step schedule must be "
                            f"a pure function of (seed, step) on every rank (par_ray.schedules.plan_step)")


class _Printer:
    """Rank-0 progress lines; other ranks get :class:`_Silent` (a null object, no scattered rank checks)."""

    def __call__(self, msg: str) -> None:
        print(msg, flush=True)


class _Silent:
    def __call__(self, msg: str) -> None:
        pass


@torch.no_grad()
def probe_metrics(engine, task, cfg: TrialConfig) -> dict[str, float]:
    """Per-iteration loss ``loss_k{k}`` and state RMS ``rms_k{k}``, k = 1..R, from one fixed probe batch.

    The probe: ``min(eval.num_sequences, eval.batch_size)`` sequences (at least one per rank) at depth d_train (seed ``eval.seed + 1``, the
    same at every evaluation), run for R = ceil(d_train / c) iterations with every iteration read out. ``loss_k`` is
    the recipe's own cross-entropy at iteration k (progress or final-answer targets, ``par_ray.objectives``), averaged
    over batch and queries; ``rms_k`` the mean RMS of the state after iteration k over batch and tokens. Every value
    of one evaluation comes from this one forward pass, so a curve over k compares like with like; training steps
    draw their own R, so their per-iteration numbers are not reported. Memory: each iteration's (B, Q, V) read-out is
    reduced to its loss as soon as it exists (``LoopedLM.iterate``'s ``reduce``), so the probe holds one iteration's
    logits at a time, not R of them.
    """
    world, c = engine.world, cfg.recipe.ops_per_iteration
    depth = cfg.task.train_depth
    n = max(min(cfg.eval.num_sequences, cfg.eval.batch_size), world.size)  # at least one row per rank
    ep = task.sample(depth, n, seed=cfg.eval.seed + 1, step=0)
    # this rank's rows in one chunk (one forward call on every rank)
    [(ids_BT, states_BDQ)] = rank_chunks(n, n, world.rank, world.size, ep.input_ids, ep.states)
    ids_BT, states_BDQ = ids_BT.to(engine.device), states_BDQ.to(engine.device)
    R = iterations_at(depth, c, cfg.recipe.fixed_iterations)

    def loss_at(k: int, logits_BQV: torch.Tensor) -> torch.Tensor:  # iteration k's loss, (1,): streamed over k
        return par_loss(logits_BQV[None], [k], states_BDQ, c, cfg.recipe.targets).per_iteration_K

    with engine.autocast():
        out = engine.model(ids_BT, ep.read_positions.to(engine.device), R, None, 1.0, "all", reduce=loss_at)
    rows = float(ids_BT.shape[0])  # ranks may hold one row more or less: weight each rank's means by its rows
    sums = torch.cat([torch.tensor([rows], dtype=torch.float64, device=engine.device),
                      out.reduced_K[:, 0].double() * rows, out.state_rms_R.double() * rows])
    sums = engine.all_reduce_sum(sums)
    means = (sums[1:] / sums[0].clamp_min(1)).tolist()
    return {**{iteration_metric("loss", k): v for k, v in zip(out.iterations, means[:R])},
            **{iteration_metric("rms", k): v for k, v in enumerate(means[R:], start=1)}}


def eval_metrics(engine, task, cfg: TrialConfig, recipe=None, halt=None,
                 vocab: VocabLayout | None = None, cot=None, say=None) -> dict[str, float]:
    """Accuracy at every test depth (``acc_d{D}``, ``acc_query_d{D}``, the 95 % Wilson interval of ``acc_d{D}``
    over its test sequences, ``acc_lo_d{D}`` / ``acc_hi_d{D}``, and those sequences, ``sequences_d{D}``: more at the
    depths around the crossing under adaptive sampling, ``eval.bracket_max_sequences``), ``chance``, ``d50``, ``G``,
    ``G_censored``, the interpolated ``d50_interp`` / ``G_interp`` (``par_ray.evaluation.extrapolation``), their 95 %
    bootstrap intervals with ``eval.bootstrap_resamples`` (``G_lo``, ``G_hi``, ``G_interp_lo``, ``G_interp_hi``,
    ``G_hi_censored``, ``d50_lo``, …: ``par_ray.evaluation.extrapolation_metrics``), the per-iteration probe
    (:func:`probe_metrics`) and ``eval_seconds``, the wall time of this evaluation (s, rank 0's; every rank runs the
    same forward calls). R per depth follows ``recipe.fixed_iterations``; the
    chain-of-thought baseline (``recipe.cot``) is decoded greedily instead and adds ``cot_tokens_d{D}``, the mean
    generated tokens per sequence (``par_ray.cot``).

    Precision: evaluation runs under the training step's precision, whatever the strategy — inside
    ``engine.autocast()``, the context :func:`par_ray.train.step.train_step` runs its forward in (on GPU: bf16
    autocast over fp32 parameters for ddp, over FSDP2's bf16-gathered parameters for fsdp; DeepSpeed's own bf16
    module; on CPU: float32). So a backbone table never mixes an fp32-evaluated trial with a bf16-evaluated one.

    ``recipe``: the current stage's recipe (default ``cfg.recipe``); when it trains halting (and ``halt`` holds the
    halting tokens), also the halting-vs-oracle metrics of :func:`par_ray.evaluation.halting_metrics` and d50 and G
    of the model's own stopping and of the oracle best fixed R per depth (``G_halt``, ``G_halt_interp``,
    ``G_halt_censored``, ``G_best``, … and their intervals, ``G_halt_lo``, …, from the first pass's sequences:
    :func:`par_ray.evaluation.stopping_extrapolation`; ``G`` stays R = ⌈d/c⌉'s),
    and, for a model trained with ``recipe.dense_targets`` and ``recipe.dense_pending`` (``cfg.recipe``: the
    vocabulary's pending class), those of the last operation's pending signal, ``halt_acc_d{D}_pending``,
    ``G_halt_pending`` and the rest (a par_ray signal, not the paper's read-out; docs/experiments.md §14).
    ``vocab``: the trial's vocabulary layout (default ``par_ray.trial.resolve(cfg).vocab``): the CoT trace's ids and
    the pending class. ``say``: prints a line (the worker's rank-0 printer); an evaluation running past 30 s gets
    progress lines with an ETA (:class:`par_ray.evaluation.EvalProgress`).
    """
    t0 = time.perf_counter()
    with engine.autocast():  # the training step's precision (docstring)
        out = _eval_metrics(engine, task, cfg, recipe, halt, vocab or resolve(cfg).vocab, cot, say)
    out["eval_seconds"] = time.perf_counter() - t0
    return out


def _eval_metrics(engine, task, cfg: TrialConfig, recipe, halt, vocab: VocabLayout, cot=None,
                  say=None) -> dict[str, float]:
    world = engine.world
    recipe = recipe or cfg.recipe
    c = recipe.ops_per_iteration

    def progress(what: str, iterations):
        return (EvalProgress(say, what, cfg.eval.depths, iterations, sequences=cfg.eval.sequences_at)
                if say is not None else None)

    if cfg.recipe.cot:  # chain-of-thought: greedy decoding of the trace, cost in generated tokens (par_ray.cot)
        tokens = cot or cot_tokens(vocab.cot_offset)  # a pretrained parent's: its words (par_ray.cot)
        acc = cot_accuracy_by_depth(engine.model, task, cfg.eval, tokens, engine.device, world.rank, world.size,
                                    engine.all_reduce_sum, progress("chain-of-thought decoding", lambda d: d))
    else:
        best_r = BEST_R_MULTIPLES if cfg.eval.best_r else ()
        acc = accuracy_by_depth(engine.model, task, cfg.eval, c, engine.device,
                                world.rank, world.size, engine.all_reduce_sum, recipe.fixed_iterations, best_r,
                                progress("accuracy", lambda d: max(best_r or (1,)) * iterations_at(
                                    d, c, recipe.fixed_iterations)))
    ex = extrapolation_from_counts({d: (v["right"], v["n"]) for d, v in acc.items()}, task.full_state_chance,
                                   cfg.task.train_depth, cfg.eval.bootstrap_resamples, cfg.eval.seed)
    out = {"chance": task.full_state_chance, **extrapolation_metrics(ex)}
    for d, v in acc.items():
        out[depth_metric("acc", d)] = v["acc"]
        out[depth_metric("sequences", d)] = v["n"]
        lo, hi = wilson_interval(v["acc"], round(v["n"]))
        out[depth_metric("acc_lo", d)], out[depth_metric("acc_hi", d)] = lo, hi
        out[depth_metric("acc_query", d)] = v["acc_query"]
        if "tokens" in v:
            out[depth_metric("cot_tokens", d)] = v["tokens"]
        if "R" in v:  # eval.best_r: acc_d{D} is the best R's, best_R_d{D} which R it was
            out[depth_metric("best_R", d)] = float(v["R"])
    if recipe.halting and halt is not None:
        R_max = halt_max_iterations(cfg.eval, c)
        res = halting_by_depth(engine.model, task, cfg.eval, c, halt, engine.device,
                               world.rank, world.size, engine.all_reduce_sum, pending_id=vocab.pending_id,
                               progress=progress("halting", lambda d: R_max))
        out.update(halting_metrics(res, recipe.ops_per_iteration))
        for stopping, hex_ in stopping_extrapolation(res, task.full_state_chance, cfg.task.train_depth,
                                                     cfg.eval.bootstrap_resamples, cfg.eval.seed).items():
            out.update(extrapolation_metrics(hex_, stopping))  # G_halt, G_best, [G_halt_pending], …
    out.update(probe_metrics(engine, CotTask(task, tokens) if cfg.recipe.cot else task, cfg))
    return out


def assigned_cpus() -> int:
    """CPUs Ray reserved for this worker process (floored, at least 1), or 0 outside a Ray worker (local mode, the
    driver), where torch's default thread count stands.

    Ray exports ``OMP_NUM_THREADS`` = the worker's CPUs, but only once the process runs; torch may already have read
    its thread count by then (the trial's pickled function imports it first), and Ray Train v2 runs the loop in a
    thread of its own. A 1-CPU worker then runs 2 OpenMP threads, and two such trials side by side on 2 cores spin
    against each other: measured 0.5-1 step/s instead of ~5 (docs/experiments.md, machine notes).

    Never starts Ray: ``ray.get_runtime_context()`` auto-initialises a local Ray instance when none is connected
    (Ray Train's local mode runs without one), which cost ~8 s and left a stray instance behind."""
    if not ray.is_initialized():
        return 0
    ctx = ray.get_runtime_context()
    if ctx.worker.mode != ray.WORKER_MODE:
        return 0
    cpus = ctx.get_assigned_resources().get("CPU")
    return max(1, int(cpus)) if cpus else 0


def train_loop_per_worker(loop_config: dict) -> None:
    """Ray Train worker function. ``loop_config = {"trial": TrialConfig, "export_dir": str | None, "checkpoints":
    bool}``.

    ``export_dir``: also export the final model there: its weights only, ``model.safetensors`` + ``extra.json``
    (``par_ray.train.checkpoint.export_model``; optimizer state stays in the resumable checkpoints).
    ``checkpoints`` (default true): report the resumable checkpoints (the last step's and every
    ``train.checkpoint_every``); false in Ray Train's local mode, which keeps none: there a checkpoint would be
    written (model and optimizer state: ~6 GB at Qwen2.5-0.5B) only to be deleted.
    """
    # Here, not at the top: Ray Train's controller imports this module to unpickle this function, and a Tune trial
    # driver to build the trainer; only workers build a model, and transformers' model code takes seconds to import.
    from par_ray.model.looped import build_looped

    cfg: TrialConfig = loop_config["trial"]
    export_dir = loop_config.get("export_dir")
    checkpoints = loop_config.get("checkpoints", True)
    tc = cfg.train
    ctx = ray.train.get_context()  # ray
    world = World(rank=ctx.get_world_rank(), size=ctx.get_world_size(),
                  device=ray.train.torch.get_device() if tc.use_gpu else torch.device("cpu"))  # ray
    threads = tc.threads_per_worker or (0 if tc.use_gpu else assigned_cpus())
    if threads:
        torch.set_num_threads(threads)
    set_matmul_precision(tc, world.device)  # before the first matmul: oneDNN's cache (strategies)
    log = _Printer() if world.rank == 0 else _Silent()
    for note in cpu_bf16_notes(tc, cfg.backbone.attn_implementation):
        log(note)

    trial = resolve(cfg)  # stages, halting / EMA flags, vocabulary layout: once per worker (par_ray.trial)
    stages, vocab = trial.stages, trial.vocab
    # A pretrained parent reads the task as words of its tokenizer (par_ray.prompts); random-init: compact ids.
    tokenizer = parent_tokenizer(cfg.backbone)  # None for a random-init backbone; read offline (par_ray.weights)
    task = render(build_task(cfg.task), tokenizer)  # evaluation prompts
    # the same, or with TaskConfig.train_filler separators
    train_task = render(build_task(cfg.task, train=True), tokenizer)
    cot = (cot_tokens(vocab.cot_offset) if tokenizer is None else trial_cot_tokens(task, tokenizer)
           ) if cfg.recipe.cot else None
    if cfg.recipe.cot:  # chain-of-thought baseline: train on prompt + trace (par_ray.cot)
        train_task = CotTask(train_task, cot)
    # a stage trains halting: the vocabulary has the halting tokens from the start (par_ray.halting)
    halt = halt_tokens(task, tokenizer) if trial.halting else None
    torch.manual_seed(tc.seed)  # identical init on every rank
    # built on the worker's device: a pretrained parent goes from its files straight there (backbones.load_checkpoint)
    model = build_looped(resolved_backbone(cfg.backbone), cfg.recipe, vocab_size=vocab.size,  # task | halting | CoT | dense classes
                         device=world.device)
    engine = prepare(model, tc, world, ema=trial.ema)  # the PSD EMA teacher, if a stage distills from one

    flat = to_flat(cfg)
    acc_train = depth_metric("acc", cfg.task.train_depth)  # in the progress line
    start, train_seconds, eval_seconds, last_eval = 0, 0.0, 0.0, {}
    # the evaluations' FLOPs as they ran (par_ray.cost.eval_flops_done): the actual side of the plan's evaluation
    # FLOPs, which counts adaptive sampling at its worst case; None after resuming a checkpoint that predates it
    eval_flops, shape = 0.0, trial_shape(cfg)
    stage_seconds = [0.0] * len(stages)  # training seconds per stage, carried across resumes
    checkpoint = ray.train.get_checkpoint()  # ray
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            stored = read_checkpoint_config(d)
            differ = resume_mismatch(stored, flat) if stored is not None else []
            if differ:  # before loading anything: the stored state belongs to another experiment
                raise ValueError("the checkpoint to resume was written under another config (use another run name "
                                 "or --out, or the same settings):\n  - " + "\n  - ".join(differ))
            extra = engine.load(d)
        start, train_seconds, last_eval = extra["step"], extra["train_seconds"], extra.get("last_eval", {})
        eval_seconds = extra.get("eval_seconds_total", 0.0)  # absent in checkpoints that predate it
        eval_flops = extra.get("eval_flops_total")
        stage_seconds = extra.get("stage_seconds", stage_seconds)
        log(f"resumed from step {start}")

    window = {"loss": 0.0, "seconds": 0.0, "tokens": 0, "n": 0}
    stage, frozen = None, []
    for step in range(start, tc.steps):
        if step == tc.fail_at_step and checkpoint is None:
            _kill_rank_zero(engine)  # fault injection, once: the restarted group resumes from a checkpoint
        now, in_stage = stage_at(stages, step)
        if now is not stage:  # the stage's loss terms and frozen parts, built once per stage
            stage, frozen = now, frozen_parameters(engine.raw, now.frozen)
            loss_fn = build_step_loss(stage.recipe, train_task, halt=halt, dense_offset=vocab.dense_offset,
                                      op_order=cfg.task.op_order)
            if len(stages) > 1:
                log(f"stage {stage.index}: steps {stage.start}..{stage.end}, recipe {stage.recipe.name}, "
                    f"frozen {stage.frozen}")
        s_max = stretch_cap(stage.recipe.stretch_max, in_stage, stage.steps) if stage.recipe.stretch_ramp else None
        if world.is_distributed:
            plan = plan_step(cfg.task, stage.recipe, tc.seed, step, stretch_max=s_max)
            check_lockstep(engine, step, plan.depth, plan.R)
        res = train_step(engine, train_task, cfg.task, loss_fn, tc.seed, step, tc.batch_size, world.rank,
                         world.size, stretch_max=s_max, frozen=frozen)
        if not math.isfinite(res.loss):
            # This rank's loss: non-finite parameters make every rank's loss non-finite at the same step; a rank
            # that alone sees it raises, and Ray Train stops the whole worker group.
            raise NonFiniteLossError(
                f"training diverged at step {step + 1}: loss {res.loss} (rank {world.rank}, lr {engine.lr:g}, "
                f"gradient norm {res.grad_norm}); lower train.lr or raise train.warmup_steps")
        train_seconds += res.seconds
        stage_seconds[stage.index] += res.seconds
        window["loss"] += res.loss
        window["seconds"] += res.seconds
        window["tokens"] += res.tokens
        window["n"] += 1
        done = step + 1
        is_last = done == tc.steps
        if done % tc.eval_every == 0 or is_last:
            last_eval = eval_metrics(engine, task, cfg, stage.recipe, halt, vocab, cot, say=log)
            eval_seconds += last_eval["eval_seconds"]
            if eval_flops is not None:
                eval_flops += eval_flops_done(cfg, stage.recipe, shape, last_eval, world.size)
        want_ckpt = checkpoints and (is_last or (tc.checkpoint_every and done % tc.checkpoint_every == 0))
        if done % tc.report_every == 0 or is_last or want_ckpt:
            n = max(window["n"], 1)
            # Losses and accuracy are means over this rank's rows; average them over ranks (equal shards) so the
            # report is the global batch's, whatever the world size. Per-iteration numbers come from the
            # evaluation's probe (last_eval), not from this step, whose R is a random draw.
            window_loss, last_loss, train_acc = _mean_over_ranks(engine, [window["loss"], res.loss, res.accuracy])
            halt_train = {}
            if res.halt_loss is not None:  # the same stage on every rank, so every rank joins this all-reduce
                halt_loss, halt_acc = _mean_over_ranks(engine, [res.halt_loss, res.halt_accuracy])
                halt_train = {"halt_loss": halt_loss, "halt_train_acc": halt_acc}
            metrics = {
                "step": done,
                "loss": window_loss / n,
                "loss_last_step": last_loss,
                "train_acc": train_acc,
                "depth": res.plan.depth,
                "R": res.plan.R,
                "lr": engine.lr,
                "grad_norm": res.grad_norm,
                "step_time_s": window["seconds"] / n,
                "tokens_per_s": window["tokens"] * world.size / max(window["seconds"], 1e-9),
                "peak_memory_mb": _peak_memory_mb(world.device),
                "train_seconds": train_seconds,
                "eval_seconds_total": eval_seconds,
                **gpu_seconds(train_seconds, eval_seconds, stage_seconds, world.size),
                **({FLOPS_EVAL: eval_flops} if eval_flops is not None else {}),
                "stage": stage.index,
                **halt_train,
                **last_eval,
            }
            log(f"step {done:>6}/{tc.steps}  loss {metrics['loss']:.4f}  "
                f"{n / max(window['seconds'], 1e-9):.2f} steps/s"
                + (f"  {acc_train} {last_eval.get(acc_train, float('nan')):.3f}"
                   f"  G {last_eval['G']:.2f}" if last_eval else ""))
            window = {"loss": 0.0, "seconds": 0.0, "tokens": 0, "n": 0}
            if want_ckpt or is_last:
                extra = {"step": done, "train_seconds": train_seconds, "eval_seconds_total": eval_seconds,
                         "eval_flops_total": eval_flops, "stage_seconds": stage_seconds, "last_eval": last_eval,
                         "config": flat, "report": metrics}
            if want_ckpt:
                _report_with_checkpoint(engine, metrics, extra)
            else:
                ray.train.report(metrics)  # ray
            if is_last and export_dir:
                export_model(engine, export_dir, extra)
    if start >= tc.steps and "report" in extra:
        # Resumed a finished run (the same config rerun): nothing to train. Report its final metrics again, with
        # its state, so the caller's Result and the export hold them as after the first run.
        _report_with_checkpoint(engine, extra["report"], extra)
        if export_dir:
            export_model(engine, export_dir, extra)


def gpu_seconds(train_seconds: float, eval_seconds: float, stage_seconds: list[float],
                world_size: int) -> dict[str, float]:
    """Device-seconds the trial has used so far (this rank's wall seconds × ranks, one device each; CPU workers count
    as devices): ``gpu_seconds_train`` (the training steps), ``gpu_seconds_stage{i}`` (per stage) and
    ``gpu_seconds_eval`` (the evaluations). The actual side of ``par_ray.cost``'s plan (``python -m analysis``'s
    plan-vs-actual table)."""
    return {GPU_SECONDS_TRAIN: train_seconds * world_size, GPU_SECONDS_EVAL: eval_seconds * world_size,
            **{gpu_seconds_stage(i): s * world_size for i, s in enumerate(stage_seconds)}}


def _report_with_checkpoint(engine, metrics: dict, extra: dict) -> None:
    """Save the engine's state with ``extra`` and report it with ``metrics``. The final model's export, outside Ray's
    storage (weights only), follows the last report: ``export_model`` on every rank (sharded strategies gather to
    rank 0)."""
    with tempfile.TemporaryDirectory() as d:
        engine.save(d, extra)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))  # ray


def read_checkpoint_config(directory: str) -> dict | None:
    """The flat config stored in a checkpoint's ``extra.json`` (``None`` for checkpoints that predate it)."""
    return read_extra(directory).get("config")


def _mean_over_ranks(engine, values: list[float]) -> list[float]:
    """Element-wise mean of ``values`` over ranks (one all-reduce; every rank calls it at the same step)."""
    t = torch.tensor(values, dtype=torch.float64, device=engine.device)
    return (engine.all_reduce_sum(t) / engine.world.size).tolist()


def _kill_rank_zero(engine) -> None:
    """Fault injection (``train.fail_at_step``): worker rank 0 dies with ``os._exit(1)``, like a lost node.

    A worker hands each report to Ray Train's controller through a one-slot queue that the controller polls every
    health-check interval (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s by default). A worker that dies right after
    reporting a checkpoint can take that report with it, unregistered; the restarted group then resumes from an
    older checkpoint, or from none and dies again. So every rank first waits until its queue is empty (the poll has
    taken the report), then one more interval for that poll's reply to reach the controller, and all ranks meet at
    a barrier before rank 0 exits. The other ranks carry on into the next step's collectives and are stopped by Ray.
    ``build_trainer`` refuses fault injection in local mode and unless a checkpoint precedes the fault step.
    """
    from ray.train.v2._internal.constants import (  # ray: no public "report consumed" API
        DEFAULT_HEALTH_CHECK_INTERVAL_S, HEALTH_CHECK_INTERVAL_S_ENV_VAR)
    from ray.train.v2._internal.execution.context import get_train_context  # ray

    get_train_context().get_result_queue().join()  # ray: returns once the controller's poll took our last report
    time.sleep(float(os.environ.get(HEALTH_CHECK_INTERVAL_S_ENV_VAR, DEFAULT_HEALTH_CHECK_INTERVAL_S)))
    engine.all_reduce_sum(torch.zeros(1, device=engine.device))  # barrier
    if engine.world.rank == 0:
        os._exit(1)


def _peak_memory_mb(device: torch.device) -> float:
    """Peak allocated memory on CUDA; peak resident set size of this process on CPU (MB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
