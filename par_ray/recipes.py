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
| stretch       | PAR, then a stretch stage (last 10 % of steps): s ~ U[1, s_max], s_max 1 → 8 (§3.4) |
| par_halt      | par_hold + learned halting, joint loss PAR + 0.5 × balanced halting CE (§3)      |
| par_halt_posthoc | par_hold, then a halting read-out stage (last 10 %), all but the coda frozen   |
| stretch_ramp  | stage recipe: the current recipe with s ~ U[1, s_max], s_max ramped 1 → 8        |
| halt_readout  | stage recipe: the current recipe with the halting loss switched on               |
| psd_ema       | prefix self-distillation, final answers only, EMA teacher (decay 0.999) (§3)     |
| psd_live      | prefix self-distillation, final answers only, the live student as teacher (§3)   |

Stage recipes change only the ``recipe`` section and keep the rest of the trial's recipe, so a stage that names one
continues the trial's method with one thing added (``par_ray.stages``). Halting recipes train on the hold schedule:
the k-of-n rule reads P(Yes) at iterations past ⌈d/c⌉, which forced-depth steps never reach (they would only ever
see Yes at k = ⌈d/c⌉).
PSD recipes (``par_ray.distill``) label only z_d: iterations with c·k >= d get cross-entropy on it, earlier ones the
KL to a teacher reading the prompt truncated after c·k operations; ``final_answer`` is their comparison with the same
labels and no teacher.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from par_ray.config import RecipeConfig, StageConfig, TrialConfig, with_overrides


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


FINE_TUNE_SHARE = 0.1
"""A fine-tuning stage takes this share of ``train.steps`` (at least 1 step), from the trial's budget."""


def stretch_ramp(cfg: TrialConfig) -> TrialConfig:
    return with_overrides(cfg, recipe=dict(name="stretch_ramp", stretch_max=8.0, stretch_ramp=True))


def halt_readout(cfg: TrialConfig) -> TrialConfig:
    return with_overrides(cfg, recipe=dict(name="halt_readout", halting=True))


def par_halt(cfg: TrialConfig) -> TrialConfig:
    return with_overrides(par_hold(cfg), recipe=dict(name="par_halt", halting=True))


def par_halt_posthoc(cfg: TrialConfig) -> TrialConfig:
    cfg = with_overrides(par_hold(cfg), recipe=dict(name="par_halt_posthoc"))
    return dataclasses.replace(cfg, stages=(StageConfig(), StageConfig(share=FINE_TUNE_SHARE, recipe="halt_readout",
                                                                       frozen="all_but_coda")))


def stretch(cfg: TrialConfig) -> TrialConfig:
    cfg = with_overrides(par(cfg), recipe=dict(name="stretch"))
    return dataclasses.replace(cfg, stages=(StageConfig(), StageConfig(share=FINE_TUNE_SHARE,
                                                                       recipe="stretch_ramp")))


def psd_ema(cfg: TrialConfig) -> TrialConfig:
    return with_overrides(par(cfg), recipe=dict(name="psd_ema", targets="final", distill="ema"))


def psd_live(cfg: TrialConfig) -> TrialConfig:
    return with_overrides(par(cfg), recipe=dict(name="psd_live", targets="final", distill="live"))


RECIPES: dict[str, Callable[[TrialConfig], TrialConfig]] = {
    f.__name__: f for f in (par, par_hold, final_answer, no_anchor, untied, stretch, par_halt, par_halt_posthoc,
                            stretch_ramp, halt_readout, psd_ema, psd_live)
}


def stage_recipe(cfg: TrialConfig, stage: StageConfig) -> RecipeConfig:
    """The recipe section stage ``stage`` trains with: ``cfg.recipe`` when ``stage.recipe`` is ``""``, else the
    ``recipe`` section of that named recipe applied to ``cfg``. ``ValueError`` naming an unknown recipe."""
    if not stage.recipe:
        return cfg.recipe
    return apply_recipe(cfg, stage.recipe).recipe


def apply_recipe(cfg: TrialConfig, name: str) -> TrialConfig:
    """``cfg`` with recipe ``name`` applied. Raises ``ValueError`` naming ``recipe`` and the allowed values."""
    if name not in RECIPES:
        raise ValueError(f"recipe: {name!r} is not one of {list(RECIPES)}")
    return RECIPES[name](cfg)
