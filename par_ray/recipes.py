"""Named recipes: the ablation vocabulary of the sweeps, each a function that overrides fields of a base config.

A recipe is a plain function ``TrialConfig -> TrialConfig`` (torchtitan derives configs from configs the same way);
:data:`RECIPES` is a plain dict. Sweeps name recipes; analysis groups by the ``recipe.name`` they set.

| recipe        | what changes (paper section)                                                     |
|---------------|----------------------------------------------------------------------------------|
| par           | progress-aligned targets, RMS anchoring, tied core, forced depth (§3)           |
| par_hold      | PAR with the hold schedule: R = 1 + Poisson(λ), iterations past d/c keep z_d     |
| final_answer  | every iteration supervised with the final answer z_d (baseline, §5 ablation)     |
| no_anchor     | PAR without RMS norm anchoring (§3.3 ablation)                                   |
| untied        | 4× core: 4 distinct core copies run once each (R = 4 at every d), z_d after the 4th |
| stretch       | PAR, then a stretch stage (last 10 % of steps): s ~ U[1, s_max], s_max 1 → 8 (§3.4) |
| par_halt      | par_hold + learned halting, joint loss PAR + 0.5 × balanced halting CE (§3)      |
| par_halt_posthoc | par_hold, then a halting read-out stage (last 10 %), all but the coda frozen   |
| stretch_ramp  | stage recipe: the current recipe with s ~ U[1, s_max], s_max ramped 1 → 8        |
| halt_readout  | stage recipe: the current recipe with the halting loss switched on               |
| fixed_depth   | the parent itself: R = 1 at every step and test depth, final answer (baseline)   |
| more_iterations | tied core, R = 2⌈d_train/c⌉ at every step and test depth, only z_d after R     |
| rlt           | tied core, R = ⌈d/c⌉ (grows with d), only z_d after R (Fan et al. 2024); tested at the best R per depth |
| cot           | explicit chain-of-thought: next-token training on the state trace, R = 1, greedy decoding |
| psd_ema       | prefix self-distillation, final answers only, EMA teacher (decay 0.999) (§3)     |
| psd_live      | prefix self-distillation, final answers only, the live student as teacher (§3)   |

Baselines (the rows of the paper's comparison tables). Each keeps PAR's architecture (adapter, RMS anchoring, gradient
window) and changes what R is and which iteration is supervised (``recipe.fixed_iterations``, ``recipe.supervise``):

- ``fixed_depth``: R = 1 is the parent's own forward pass (prelude → core → coda once; the adapter at R = 1 is a
  linear map of e initialised to the identity, ``LoopedLM``), fine-tuned on the final answer and tested with R = 1 at
  every depth.
- ``more_iterations`` ("simply add loops"): the same R = 2⌈d_train/c⌉ at every training step and every test depth,
  whatever d; only the answer after the last iteration is supervised. Its compute does not grow with d.
- ``rlt`` (RLT-style recurrence, as the looped transformers of Fan et al. 2024, "Looped Transformers for Length
  Generalization", arXiv 2409.15647: the loop count is set by the input, only the output after the last loop is
  trained): R = ⌈d/c⌉ per step and per test depth, as PAR, but only iteration R is supervised, with z_d — no target
  ties iteration k to the state after k operations. It differs from ``more_iterations`` in R (it grows with d, so
  deeper tests get more iterations) and from ``final_answer`` in supervising only the last iteration rather than
  every iteration in the window. Tested as the paper's RLT row, "best R per depth" (``eval.best_r``): each test
  depth is read out at R = round(m · ⌈d/c⌉) for m in ``par_ray.evaluation.BEST_R_MULTIPLES`` and reports the best
  (``acc_d{D}``) and which R (``best_R_d{D}``).
- ``untied``: the paper's deeper model with a 4× core: the core's layers followed by 3 independent copies (all
  initialised from the parent's core), run once each — a 4×-deep feed-forward core, R = 4 at every depth — trained
  on the final answer after the 4th copy. Before issue 12 it was one copy per trained iteration (⌈d_train/c⌉ copies,
  R = ⌈d/c⌉, PAR targets, deeper tests reusing the last copy): a recurrent model with untied weights, not the
  paper's fixed-depth deeper model. Refused under DeepSpeed (``train.strategy``: ZeRO's handling of parameters
  without gradients, ``par_ray.train.strategies.deepspeed``); ddp and fsdp train it.
- ``cot``: explicit chain-of-thought on the same backbone (``par_ray.cot``): prompt + ``z_1 STEP … z_d END``,
  next-token loss on the trace with R = 1, greedy decoding with a KV cache at test; ``cot_tokens_d{D}`` reports the
  generated tokens per sequence.

Reachability has no intermediate state (its ``states`` repeat the answer), so there every baseline trains on the
final answer, as every recipe does, and ``cot``'s trace is the answer written d times (``par_ray.tasks.graphs``).

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


# Baselines (issue 12) ------------------------------------------------------------------------------------------------
MORE_ITERATIONS_FACTOR = 2
"""``more_iterations`` runs R = this × ⌈d_train / c⌉ iterations at every step and test depth."""
UNTIED_CORE_MULTIPLE = 4
"""``untied``: the deeper model's core is this many copies of the parent's core (the paper's "4× core")."""


def _final_after_last(cfg: TrialConfig, name: str, fixed_iterations: int, **recipe) -> TrialConfig:
    """PAR's architecture, the final answer supervised after the last iteration only, R fixed (0 = ⌈d/c⌉)."""
    return with_overrides(par(cfg), recipe=dict(name=name, targets="final", supervise="last",
                                                fixed_iterations=fixed_iterations, **recipe))


def fixed_depth(cfg: TrialConfig) -> TrialConfig:
    return _final_after_last(cfg, "fixed_depth", 1)


def more_iterations(cfg: TrialConfig) -> TrialConfig:
    n = MORE_ITERATIONS_FACTOR * -(-cfg.task.train_depth // cfg.recipe.ops_per_iteration)
    return _final_after_last(cfg, "more_iterations", n, max_iterations=max(n, cfg.recipe.max_iterations))


def rlt(cfg: TrialConfig) -> TrialConfig:
    # evaluated as the paper's RLT row: the best R per test depth (eval.best_r, par_ray.evaluation.BEST_R_MULTIPLES)
    return with_overrides(_final_after_last(cfg, "rlt", 0), eval={"best_r": True})


def untied(cfg: TrialConfig) -> TrialConfig:
    # max_iterations is the number of core copies LoopedLM builds (build_looped): exactly the 4 that run, all inside
    # the gradient window, so every copy trains at every step.
    return _final_after_last(cfg, "untied", UNTIED_CORE_MULTIPLE, tied=False, max_iterations=UNTIED_CORE_MULTIPLE,
                             grad_window=max(cfg.recipe.grad_window, UNTIED_CORE_MULTIPLE))


def cot(cfg: TrialConfig) -> TrialConfig:
    return _final_after_last(cfg, "cot", 1, cot=True)


RECIPES: dict[str, Callable[[TrialConfig], TrialConfig]] = {
    f.__name__: f for f in (par, par_hold, final_answer, no_anchor, untied, stretch, par_halt, par_halt_posthoc,
                            stretch_ramp, halt_readout,
                            fixed_depth, more_iterations, rlt, cot, psd_ema, psd_live)
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
