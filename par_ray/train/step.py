"""The PAR training step, shared by every way of running a trial (single process, Ray Train, any strategy).

One step: sample the step's episode batch (d, R, s from :func:`par_ray.schedules.plan_step`), run the looped model
with the gradient window, apply the PAR (or final-answer) loss to every iteration in the window (plus the dense
progress loss at the operation positions when ``recipe.dense_targets``), backward, and let the strategy's engine
step the optimizer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from par_ray.objectives import dense_progress_loss, par_loss
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


def train_step(engine, task, task_cfg, recipe_cfg, seed: int, step: int, global_batch: int, rank: int = 0,
               world_size: int = 1) -> StepResult:
    """Run training step ``step`` on this rank's shard of the global batch.

    The global batch of step ``step`` is a pure function of (task, d, seed, step); rank r takes rows r::world_size,
    so any world size sees the same global batch as a single process. ``engine`` is a
    :class:`par_ray.train.strategies.Engine`.
    """
    t0 = time.perf_counter()
    plan = plan_step(task_cfg, recipe_cfg, seed, step)
    ep = task.sample(plan.depth, global_batch, seed=seed, step=step)
    device = engine.device
    ids_BT = ep.input_ids[rank::world_size].to(device)
    states_BDQ = ep.states[rank::world_size].to(device)
    reads_Q = ep.read_positions.to(device)
    Q = reads_Q.shape[0]
    if recipe_cfg.dense_targets:  # one readout over the operation positions and the queries
        reads_Q = torch.cat([reads_Q, ep.op_positions.to(device)])
    with engine.autocast():
        out = engine.model(ids_BT, reads_Q, plan.R, recipe_cfg.grad_window, plan.stretch, "window")
        lo = par_loss(out.logits_KBQV[:, :, :Q], out.iterations, states_BDQ, recipe_cfg.ops_per_iteration,
                      recipe_cfg.targets)
        loss = lo.loss
        if recipe_cfg.dense_targets:
            dense = dense_progress_loss(out.logits_KBQV[:, :, Q:], out.iterations,
                                        ep.progress_ids[rank::world_size].to(device), recipe_cfg.ops_per_iteration,
                                        task.vocab_size,
                                        task.vocab_size + task.num_states if recipe_cfg.dense_pending else None)
            loss = loss + dense.loss
    engine.backward(loss)
    grad_norm = engine.step()
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
    )
