"""Per-step schedules: depth d, iterations R and positional stretch s for each training step.

Every draw is a pure function of (seed, step): all ranks agree (lockstep) without communication, and a resumed run
replays exactly the schedule it would have seen. Streams are separated with ``numpy.random.SeedSequence``.

- forced depth (paper §3.2): d ~ U{min_depth .. d_train}, R = ceil(d / c) (+ U{0 .. m} slack iterations with
  ``recipe.extra_iterations = m``, a par_ray option: iterations past d / c keep z_d); with
  ``recipe.fixed_iterations = n > 0`` (the fixed-R baselines), R = n whatever d.
- hold: d as above, R = 1 + Poisson(λ) capped at ``max_iterations``; iterations past d / c keep z_d (the objective's
  min(c·k, d) does this).
- length curriculum (``task.curriculum``, a par_ray option): the largest d of the step's phase
  (:func:`curriculum_depth`) replaces d_train in the draw of d.
- progressive loss (``recipe.progressive_loss``, Bansal et al. 2022): when R > grad_window w, R' = n + w with
  n ~ U{0 .. R − w}: the step's iterations 1..n run without autograd, n + 1..n + w with it, and it stops there.
- random position offsets (``recipe.position_offset`` = M): o ~ U{0 .. M} added to every position id of the step.
- positional stretch (§3.4): s ~ U[1, s_max] per step (s_max = 1 disables it); in the paper's stretch stage s_max
  itself is ramped linearly from 1 to ``stretch_max`` over the stage (:func:`stretch_cap`).
- supervised iterations (:func:`supervised_iterations`): which of a step's R iterations are read out and trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_SCHEDULE_STREAM = 0x5C4ED  # separates schedule draws from data draws that share (seed, step)
_NOISE_STREAM = 0x5701E  # the state noise's generator (recipe.state_noise)


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
    position_offset: int = 0
    """o added to every position id (``recipe.position_offset``; 0 = off)."""


def stretch_cap(stretch_max: float, step_in_stage: int, stage_steps: int) -> float:
    """s_max of step ``step_in_stage`` (0-based) of a ramped stretch stage of ``stage_steps`` steps: linear from 1.0
    at the stage's first step to ``stretch_max`` at its last (a one-step stage runs at ``stretch_max``)."""
    if stage_steps <= 1:
        return float(stretch_max)
    return 1.0 + (float(stretch_max) - 1.0) * min(max(step_in_stage, 0), stage_steps - 1) / (stage_steps - 1)


def iterations_at(depth: int, ops_per_iteration: int, fixed_iterations: int = 0) -> int:
    """R for ``depth`` operations: ceil(d / c), or ``fixed_iterations`` when that is > 0 (the fixed-depth,
    more-iterations and untied baselines run the same R at every depth, in training and at test)."""
    return fixed_iterations if fixed_iterations > 0 else math.ceil(depth / ops_per_iteration)


def curriculum_phases(task_cfg) -> list[tuple[int, int | None, int]]:
    """The length curriculum as ``[(first step, end step or None, largest training depth)]``: phase i of
    ``task.curriculum`` covers steps [i · curriculum_steps, (i + 1) · curriculum_steps), and the last phase, at
    ``task.train_depth``, runs from the end of those to the end of training (``None``). Without a curriculum:
    ``[(0, None, train_depth)]``."""
    phases = tuple(getattr(task_cfg, "curriculum", ()) or ())
    n = task_cfg.curriculum_steps if phases else 0
    return [(i * n, (i + 1) * n, d) for i, d in enumerate(phases)] + [(len(phases) * n, None, task_cfg.train_depth)]


def curriculum_depth(task_cfg, step: int) -> int:
    """Largest training depth at step ``step`` (0-based): that of the :func:`curriculum_phases` phase holding it."""
    return next(d for _, end, d in curriculum_phases(task_cfg) if end is None or step < end)


def noise_seed(seed: int, step: int) -> int:
    """Seed of step ``step``'s state-noise generator (``recipe.state_noise``): a pure function of (seed, step)."""
    return int(np.random.SeedSequence([_NOISE_STREAM, seed, step]).generate_state(1, dtype=np.uint64)[0] >> 1)


def supervised_iterations(recipe_cfg, R: int, depth: int) -> tuple[int, ...]:
    """The iterations (1-based, ascending) a training step of ``R`` iterations on depth-``depth`` problems reads out
    and supervises.

    ``recipe.supervise="window"``: the iterations k of the gradient window (R − min(grad_window, R) + 1 … R) with
    k ≡ ⌈d/c⌉ (mod ``read_every``), counted from the iteration the problem finishes at, ⌈d/c⌉ (or R if that is
    smaller): the one evaluation reads, so it is supervised at every step whatever the slack. ``read_every`` = 1 is
    the paper's whole window. ``"last"``: (R,).
    """
    if recipe_cfg.supervise == "last":
        return (R,)
    first = R - min(recipe_cfg.grad_window, R) + 1
    done = min(iterations_at(depth, recipe_cfg.ops_per_iteration, recipe_cfg.fixed_iterations), R)
    return tuple(k for k in range(first, R + 1) if (k - done) % recipe_cfg.read_every == 0)


def plan_step(task_cfg, recipe_cfg, seed: int, step: int, stretch_max: float | None = None) -> StepPlan:
    """The (d, R, s) of training step ``step`` of a trial seeded ``seed``.

    Args:
        task_cfg: ``TaskConfig`` (train_depth, min_train_depth, curriculum, curriculum_steps).
        recipe_cfg: ``RecipeConfig`` (ops_per_iteration, depth_schedule, hold_lambda, max_iterations, stretch_max,
            extra_iterations, grad_window, progressive_loss, position_offset).
        stretch_max: s_max of this step in place of ``recipe_cfg.stretch_max`` (the ramp of :func:`stretch_cap`).
    """
    rng = np.random.default_rng(np.random.SeedSequence([_SCHEDULE_STREAM, seed, step]))
    depth = int(rng.integers(task_cfg.min_train_depth, curriculum_depth(task_cfg, step) + 1))
    if recipe_cfg.depth_schedule == "forced":
        R = iterations_at(depth, recipe_cfg.ops_per_iteration, getattr(recipe_cfg, "fixed_iterations", 0))
        if recipe_cfg.extra_iterations:  # drawn only when on, so the paper's schedule keeps its random stream
            R += int(rng.integers(0, recipe_cfg.extra_iterations + 1))
    elif recipe_cfg.depth_schedule == "hold":
        R = 1 + int(rng.poisson(recipe_cfg.hold_lambda))
    else:
        raise ValueError(f"recipe.depth_schedule: {recipe_cfg.depth_schedule!r} is not one of ['forced', 'hold']")
    R = min(R, recipe_cfg.max_iterations)
    s_max = recipe_cfg.stretch_max if stretch_max is None else stretch_max
    stretch = float(rng.uniform(1.0, s_max)) if s_max > 1.0 else 1.0
    # par_ray options, drawn only when on so that every earlier draw keeps its stream
    window = recipe_cfg.grad_window
    if getattr(recipe_cfg, "progressive_loss", False) and R > window:
        R = int(rng.integers(0, R - window + 1)) + window
    offset_max = getattr(recipe_cfg, "position_offset", 0)
    offset = int(rng.integers(0, offset_max + 1)) if offset_max else 0
    return StepPlan(step=step, depth=depth, R=R, stretch=stretch, position_offset=offset)
