"""The PAR training step, shared by every way of running a trial (single process, Ray Train, any strategy).

One step: sample the step's episode batch (d, R, s from :func:`par_ray.schedules.plan_step`), run the looped model
with the gradient window, apply the PAR (or final-answer) loss to every iteration in the window (plus the dense
progress loss at the operation positions when ``recipe.dense_targets``), backward, and let the strategy's engine
step the optimizer.

With ``recipe_cfg.halting`` the prompts get the halting query token appended (``par_ray.halting``) and the loss is the
joint PAR + ``halt_weight`` × class-balanced halting cross-entropy. A stage's frozen parameters have their gradients
dropped before the optimizer step (``par_ray.stages``).

With ``recipe_cfg.distill`` (prefix self-distillation, ``par_ray.distill``) only the final answers are labelled:
iterations with c·k >= d get cross-entropy on z_d, earlier ones the KL to the teacher reading the prompt truncated
after c·k operations; the engine's EMA teacher (if any) is updated after the optimizer step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from par_ray.distill import psd_loss, teacher_logits
from par_ray.halting import HaltTokens, with_halt_query, yes_no_logits
from par_ray.objectives import dense_progress_loss, fixed_point_loss, halting_loss, par_loss
from par_ray.schedules import StepPlan, plan_step


@dataclass
class StepResult:
    plan: StepPlan
    loss: float
    per_iteration: list[float]
    """Loss of each supervised iteration (oldest first)."""
    iterations: list[int]
    accuracy: float
    """Full-state accuracy of the last iteration on this step's (local) batch."""
    state_rms: list[float]
    """Mean state RMS after each iteration 1..R."""
    grad_norm: float
    seconds: float
    tokens: int
    """Tokens processed by this rank (B_local × T × R)."""
    halt_loss: float | None = None
    """Class-balanced halting cross-entropy (unweighted), when the step's recipe trains halting."""
    halt_accuracy: float | None = None
    """Fraction of (iteration, row) halting decisions (P(Yes) > 0.5) equal to the target, when halting."""


def train_step(engine, task, task_cfg, recipe_cfg, seed: int, step: int, global_batch: int, rank: int = 0,
               world_size: int = 1, *, halt: HaltTokens | None = None, stretch_max: float | None = None,
               frozen: list[torch.nn.Parameter] | tuple = (), dense_offset: int | None = None,
               op_order: str = "forward") -> StepResult:
    """Run training step ``step`` on this rank's shard of the global batch.

    The global batch of step ``step`` is a pure function of (task, d, seed, step); rank r takes rows r::world_size,
    so any world size sees the same global batch as a single process. ``engine`` is a
    :class:`par_ray.train.strategies.Engine`.

    Args:
        halt: the halting token ids; required when ``recipe_cfg.halting``.
        stretch_max: this step's stretch cap (a ramped stretch stage), passed to :func:`plan_step`.
        frozen: parameters whose gradients are dropped before the optimizer step (a stage's frozen parts).
        dense_offset: token id of dense state class 0 (``recipe.dense_targets``): the model vocabulary without the
            dense classes; ``None`` = ``task.vocab_size`` (no halting tokens).
        op_order: ``TaskConfig.op_order`` of ``task``'s prompts, read by the distillation teacher's truncated prompt
            (``recipe_cfg.distill``; the teacher is ``engine.teacher(recipe_cfg.distill)``).
    Raises:
        ValueError: ``recipe_cfg.halting`` without ``halt`` tokens.
    """
    t0 = time.perf_counter()
    halting = getattr(recipe_cfg, "halting", False)
    if halting and halt is None:
        raise ValueError("recipe.halting: train_step needs the halting token ids (halt=HaltTokens)")
    plan = plan_step(task_cfg, recipe_cfg, seed, step, stretch_max=stretch_max)
    ep = task.sample(plan.depth, global_batch, seed=seed, step=step)
    if halting:
        ep = with_halt_query(ep, halt.query)
    device = engine.device
    offset = task.vocab_size if dense_offset is None else dense_offset  # dense state class 0
    ids_BT = ep.input_ids[rank::world_size].to(device)
    if ep.given:  # task.given_prefix: operations 1..m are read in as the state tokens of z_1..z_m
        ids_BT = ids_BT.clone()
        ids_BT[:, ep.op_positions[:ep.given]] = offset + ep.progress_ids[rank::world_size, :ep.given].to(device)
    states_BDQ = ep.states[rank::world_size].to(device)
    reads_Q = ep.read_positions.to(device)
    n_read = reads_Q.shape[0]
    if recipe_cfg.dense_targets:  # one readout over the operation positions and the queries
        reads_Q = torch.cat([reads_Q, ep.op_positions.to(device)])
    distill = getattr(recipe_cfg, "distill", "none")
    if distill != "none":  # the teacher's targets, without gradient, before the student's forward (par_ray.distill)
        window = range(plan.R - min(recipe_cfg.grad_window, plan.R) + 1, plan.R + 1)  # what "window" reads out
        targets_BQV = teacher_logits(engine.teacher(distill), ids_BT, reads_Q[:n_read - int(halting)], window,
                                     plan.depth, recipe_cfg.ops_per_iteration, task.op_width, op_order, plan.stretch)
    with engine.autocast():
        fixed_point = recipe_cfg.dense_targets and recipe_cfg.fixed_point_weight > 0
        # ``supervise``: every iteration of the gradient window (PAR) or only the last (the final-answer baselines)
        out = engine.model(ids_BT, reads_Q, plan.R, recipe_cfg.grad_window, plan.stretch, recipe_cfg.supervise,
                           fixed_point)
        read_logits = out.logits_KBQV[:, :, :n_read]  # the answers (+ the halting query, last)
        answer_logits = read_logits[:, :, :-1] if halting else read_logits
        if distill != "none":
            lo = psd_loss(answer_logits, out.iterations, targets_BQV, states_BDQ, recipe_cfg.ops_per_iteration,
                          recipe_cfg.distill_temperature)
        else:
            lo = par_loss(answer_logits, out.iterations, states_BDQ, recipe_cfg.ops_per_iteration,
                          recipe_cfg.targets, ep.given)
        loss, ho = lo.loss, None
        if halting:
            ho = halting_loss(yes_no_logits(read_logits[:, :, -1], halt), out.iterations, plan.depth,
                              recipe_cfg.ops_per_iteration)
            loss = loss + recipe_cfg.halt_weight * ho.loss
        if recipe_cfg.dense_targets:
            dense = dense_progress_loss(out.logits_KBQV[:, :, n_read:], out.iterations,
                                        ep.progress_ids[rank::world_size].to(device), recipe_cfg.ops_per_iteration,
                                        offset, offset + task.num_states if recipe_cfg.dense_pending else None,
                                        ep.given)
            loss = loss + dense.loss
            if fixed_point:
                change_KBD = out.state_change_KBT[:, :, ep.op_positions.to(device)]
                loss = loss + recipe_cfg.fixed_point_weight * fixed_point_loss(
                    change_KBD, out.iterations, recipe_cfg.ops_per_iteration, ep.given)
    engine.backward(loss)
    for p in frozen:  # AdamW skips parameters without a gradient: no update, no momentum, no weight decay
        p.grad = None
    grad_norm = engine.step()
    engine.update_ema(getattr(recipe_cfg, "ema_decay", 0.0))  # a no-op unless the engine keeps an EMA teacher
    return StepResult(
        plan=plan,
        loss=loss.item(),
        per_iteration=lo.per_iteration_K.tolist(),
        iterations=out.iterations,
        accuracy=lo.correct_KBQ[-1].all(-1).float().mean().item(),
        state_rms=out.state_rms_R.tolist(),
        grad_norm=float(grad_norm),
        seconds=time.perf_counter() - t0,
        tokens=ids_BT.numel() * plan.R,
        halt_loss=None if ho is None else ho.loss.item(),
        halt_accuracy=None if ho is None else ho.correct_KB.float().mean().item(),
    )
