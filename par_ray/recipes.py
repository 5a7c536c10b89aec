"""Named recipes: the ablation vocabulary of the sweeps, each a function that overrides fields of a base config.

A recipe is a plain function ``TrialConfig -> TrialConfig`` (torchtitan derives configs from configs the same way);
:data:`RECIPES` is a plain dict. Sweeps name recipes; analysis groups by the ``recipe.name`` they set.

| recipe        | what changes (paper section)                                                     |
|---------------|----------------------------------------------------------------------------------|
| par           | progress-aligned targets, RMS anchoring, tied core, forced depth (§3)           |
| par_hold      | PAR with the hold schedule: R = 1 + Poisson(λ), iterations past d/c keep z_d     |
| final_answer  | every iteration supervised with the final answer z_d (baseline, §5 ablation)     |
| no_anchor     | PAR without RMS norm anchoring (§3.3 ablation)                                   |
| untied        | core weights not shared across iterations: the deeper-model baseline             |
| stretch       | PAR with positional stretch s ~ U[1, 8] (§3.4)                                   |
"""

from __future__ import annotations

from typing import Callable

from par_ray.config import TrialConfig, with_overrides


def par(cfg: TrialConfig) -> TrialConfig:
    return with_overrides(cfg, recipe=dict(name="par", targets="progress", anchoring=True, tied=True,
                                           depth_schedule="forced"))


def par_hold(cfg: TrialConfig) -> TrialConfig:
    cfg = par(cfg)
    return with_overrides(cfg, recipe=dict(name="par_hold", depth_schedule="hold",
                                           hold_lambda=float(cfg.task.train_depth)))


def final_answer(cfg: TrialConfig) -> TrialConfig:
    return with_overrides(par(cfg), recipe=dict(name="final_answer", targets="final"))


def no_anchor(cfg: TrialConfig) -> TrialConfig:
    return with_overrides(par(cfg), recipe=dict(name="no_anchor", anchoring=False))


def untied(cfg: TrialConfig) -> TrialConfig:
    # One core copy per trained iteration; deeper test depths reuse the last copy.
    n = -(-cfg.task.train_depth // cfg.recipe.ops_per_iteration)
    return with_overrides(par(cfg), recipe=dict(name="untied", tied=False, max_iterations=n))


def stretch(cfg: TrialConfig) -> TrialConfig:
    return with_overrides(par(cfg), recipe=dict(name="stretch", stretch_max=8.0))


RECIPES: dict[str, Callable[[TrialConfig], TrialConfig]] = {
    f.__name__: f for f in (par, par_hold, final_answer, no_anchor, untied, stretch)
}


def apply_recipe(cfg: TrialConfig, name: str) -> TrialConfig:
    """``cfg`` with recipe ``name`` applied. Raises ``ValueError`` naming ``recipe`` and the allowed values."""
    if name not in RECIPES:
        raise ValueError(f"recipe: {name!r} is not one of {list(RECIPES)}")
    return RECIPES[name](cfg)
