"""Per-step schedules: depth d, iterations R and positional stretch s for each training step.

Every draw is a pure function of (seed, step): all ranks agree (lockstep) without communication, and a resumed run
replays exactly the schedule it would have seen. Streams are separated with ``numpy.random.SeedSequence``.

- forced depth (paper §3.2): d ~ U{min_depth .. d_train}, R = ceil(d / c) (+ U{0 .. m} slack iterations with
  ``recipe.extra_iterations = m``, a par_ray option: iterations past d / c keep z_d).
- hold: d as above, R = 1 + Poisson(λ) capped at ``max_iterations``; iterations past d / c keep z_d (the objective's
  min(c·k, d) does this).
- positional stretch (§3.4): s ~ U[1, s_max] per step (s_max = 1 disables it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_SCHEDULE_STREAM = 0x5C4ED  # separates schedule draws from data draws that share (seed, step)


@dataclass(frozen=True)
class StepPlan:
    """What one training step runs."""

    step: int
    depth: int
    """d: operations in this step's prompts."""
    R: int
    """Core iterations."""
    stretch: float
    """Positional stretch factor s."""


def plan_step(task_cfg, recipe_cfg, seed: int, step: int) -> StepPlan:
    """The (d, R, s) of training step ``step`` of a trial seeded ``seed``.

    Args:
        task_cfg: ``TaskConfig`` (train_depth, min_train_depth).
        recipe_cfg: ``RecipeConfig`` (ops_per_iteration, depth_schedule, hold_lambda, max_iterations, stretch_max).
    """
    rng = np.random.default_rng(np.random.SeedSequence([_SCHEDULE_STREAM, seed, step]))
    depth = int(rng.integers(task_cfg.min_train_depth, task_cfg.train_depth + 1))
    if recipe_cfg.depth_schedule == "forced":
        R = math.ceil(depth / recipe_cfg.ops_per_iteration)
        if recipe_cfg.extra_iterations:  # drawn only when on, so the paper's schedule keeps its random stream
            R += int(rng.integers(0, recipe_cfg.extra_iterations + 1))
    elif recipe_cfg.depth_schedule == "hold":
        R = 1 + int(rng.poisson(recipe_cfg.hold_lambda))
    else:
        raise ValueError(f"recipe.depth_schedule: {recipe_cfg.depth_schedule!r} is not one of ['forced', 'hold']")
    R = min(R, recipe_cfg.max_iterations)
    stretch = float(rng.uniform(1.0, recipe_cfg.stretch_max)) if recipe_cfg.stretch_max > 1.0 else 1.0
    return StepPlan(step=step, depth=depth, R=R, stretch=stretch)
