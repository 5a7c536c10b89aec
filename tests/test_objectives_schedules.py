"""PAR targets z_min(ck, d), final-answer targets, and per-step schedules that are pure functions of (seed, step)."""

import math

import pytest
import torch

from par_ray.config import RecipeConfig, TaskConfig
from par_ray.objectives import par_loss, target_indices
from par_ray.schedules import plan_step


def test_progress_targets_are_min_ck_d():
    # c = 1, d = 5: iterations 1..7 -> states 1,2,3,4,5,5,5 (0-based 0..4,4,4): hold keeps z_d
    assert target_indices([1, 2, 3, 4, 5, 6, 7], 5, 1, "progress") == [0, 1, 2, 3, 4, 4, 4]
    # c = 2, d = 5: z_2, z_4, z_5
    assert target_indices([1, 2, 3], 5, 2, "progress") == [1, 3, 4]
    assert target_indices([1, 2, 3], 5, 2, "final") == [4, 4, 4]
    with pytest.raises(ValueError, match="recipe.targets"):
        target_indices([1], 5, 1, "nope")


def test_par_loss_matches_manual_cross_entropy():
    torch.manual_seed(0)
    K, B, Q, V, D = 3, 4, 5, 7, 3
    logits = torch.randn(K, B, Q, V, requires_grad=True)
    states = torch.randint(0, V, (B, D, Q))
    out = par_loss(logits, [1, 2, 3], states, 1, "progress")
    manual = torch.stack([
        torch.nn.functional.cross_entropy(logits[k].reshape(-1, V), states[:, k].reshape(-1)) for k in range(K)
    ])
    assert torch.allclose(out.per_iteration_K, manual.detach())
    assert torch.allclose(out.loss, manual.mean())
    out.loss.backward()
    assert logits.grad is not None
    perfect = torch.nn.functional.one_hot(states.permute(1, 0, 2), V).float() * 50
    assert par_loss(perfect, [1, 2, 3], states, 1, "progress").correct_KBQ.all()


def test_forced_schedule_is_pure_function_of_seed_and_step():
    task, recipe = TaskConfig(train_depth=8), RecipeConfig()
    plans = [plan_step(task, recipe, seed=3, step=s) for s in range(200)]
    assert plans == [plan_step(task, recipe, seed=3, step=s) for s in range(200)]
    assert all(1 <= p.depth <= 8 and p.R == p.depth and p.stretch == 1.0 for p in plans)
    assert {p.depth for p in plans} == set(range(1, 9))
    assert plans != [plan_step(task, recipe, seed=4, step=s) for s in range(200)]


def test_hold_schedule_and_stretch():
    task = TaskConfig(train_depth=8)
    recipe = RecipeConfig(depth_schedule="hold", hold_lambda=8.0, max_iterations=20, stretch_max=4.0,
                          ops_per_iteration=2)
    plans = [plan_step(task, recipe, seed=0, step=s) for s in range(500)]
    Rs = [p.R for p in plans]
    assert min(Rs) >= 1 and max(Rs) <= 20
    assert abs(sum(Rs) / len(Rs) - 9.0) < 0.6  # 1 + Poisson(8)
    assert any(p.R > math.ceil(p.depth / 2) for p in plans)  # iterations past d/c exist (they keep z_d)
    assert all(1.0 <= p.stretch <= 4.0 for p in plans) and len({p.stretch for p in plans}) > 100
