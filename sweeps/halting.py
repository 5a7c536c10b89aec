"""Learned halting (paper §3, Table 4): joint vs post-hoc halting read-out × the k-of-n stopping rule, on swap_s5.

Recipes ``par_halt`` (the halting read-out trained jointly with PAR: loss PAR + 0.5 × class-balanced halting CE) and
``par_halt_posthoc`` (PAR, then a halting read-out stage on the last 10 % of the steps with all but the coda frozen),
each evaluated by a stopping rule "k of n, τ": the answer is read at the first iteration R with P(Yes) > τ such that
at least k of R … R+n−1 exceed τ (R_max: ``eval.halt_max_iterations``), against oracle stopping R = ⌈d/c⌉. The rule
is an evaluation setting: one halting pass runs R_max iterations and computes P(Yes) at every one, so every rule is
read from that pass. One trial per (recipe, seed) therefore evaluates the paper's rule (``eval.halt_k``,
``eval.halt_n``, ``eval.halt_tau``, metrics ``halt_acc_d{D}`` …) and the other rules of
:data:`PAPER_RULES` beside it (``eval.halt_rules``, metrics ``halt_acc_d{D}_k{k}n{n}t{τ}`` …); the halting table has a
row per rule (``analysis``).

Both presets evaluate every rule of :data:`PAPER_RULES` (the paper's, looser and stricter k of n, τ 0.3 and 0.7).
Presets: ``paper`` — Qwen2.5-0.5B, both arms as the paper trains them × 3 seeds (6 trials). ``local`` — tiny-qwen2
on experiment 9's recipe (:data:`LOCAL_RECIPE`, the one that learns swap_s5 at this scale), 2,400 steps, with the two
arms adapted to what it showed (docs/experiments.md §14): ``par_halt_posthoc_long`` (a halting stage of 25 % of the
steps) × 3 seeds and ``par_halt_light`` (joint, halting weight 0.1) on seed 0 — 4 trials, about an hour on 2 cores.

    python sweeps/halting.py                               # local: 4 trials
    python sweeps/halting.py --dry-run --preset paper      # the trial plan with the planner's memory per GPU
    python sweeps/halting.py --smoke-test --seeds 0
"""

import dataclasses
import sys

from par_ray.config import with_overrides
from par_ray.recipes import par_halt, par_halt_posthoc
from par_ray.sweep import SweepSpec, main

PAPER_RULE = (6, 8, 0.5)
"""(k, n, τ) of the paper's halting rule: 6 of 8 iterations with P(Yes) > 0.5."""
PAPER_RULES = (PAPER_RULE, (4, 8, 0.5), (8, 8, 0.5), (1, 1, 0.5), (6, 8, 0.3), (6, 8, 0.7))
"""The rules the paper preset compares: the paper's, looser (4 of 8) and stricter (8 of 8) windows, the first
crossing (1 of 1), and τ 0.3 / 0.7 with the paper's window."""

LOCAL_RECIPE = {
    # experiment 9's arm "s7 fp cw8" (docs/experiments.md §9): the recipe that learns swap_s5 to ≥ 97 % at d_train 6
    # in 2,000 steps on this machine, where plain par_hold + halting reached 33 % in 3,000 (§13). Forced schedule with
    # up to 3 slack iterations (the halting read-out sees completed iterations at every step), dense progress targets
    # with a pending class, operations given solved up to 12, prelude/core attention window 2, coda window 8 (the
    # halting query sits inside it), fixed-point loss (states stop moving once done, so P(Yes) stays put past R).
    "recipe.depth_schedule": "forced", "recipe.extra_iterations": 3, "recipe.dense_targets": True,
    "recipe.dense_pending": True, "recipe.fixed_point_weight": 1.0, "recipe.targets": "done",
    "task.given_prefix": 12, "backbone.adapter_alpha": 0.1, "backbone.attention_window": 2, "backbone.coda_window": 8,
    "train.steps": 2400, "train.eval_every": 1200,
}
"""The local preset's recipe options (on top of its halting recipes) and budget; tests at the local preset's 1×–8×
(6 … 48, R_max 96), where experiment 9 measured this recipe at 0.97 / 0.47 / 0.004 / 0.004 with oracle stopping.
(Experiment 14 ran it with tests 6/12/24 only, R_max 48.)"""

LOCAL_HALT_WEIGHT = 0.1
"""Joint arm of the local preset: the halting loss weight. At the paper's 0.5 this recipe did not learn swap_s5 at
all in 2,000 steps (experiments §9 s8 and §14: 0 % at d_train), the halting loss dominating the early gradient."""
LOCAL_POSTHOC_SHARE = 0.25
"""Post-hoc arm of the local preset: the halting stage's share of the steps. With the paper's short stage (10 %,
200 steps at the tail of the LR schedule) the read-out learned a clock, "Yes from iteration 4–5" whatever the depth
(experiments §14)."""


def par_halt_light(cfg):
    """``par_halt`` with halting loss weight :data:`LOCAL_HALT_WEIGHT` instead of 0.5 (joint arm, local preset)."""
    return with_overrides(par_halt(cfg), recipe=dict(name="par_halt_light", halt_weight=LOCAL_HALT_WEIGHT))


def par_halt_posthoc_long(cfg):
    """``par_halt_posthoc`` with a halting stage of :data:`LOCAL_POSTHOC_SHARE` of the steps (post-hoc arm, local)."""
    cfg = with_overrides(par_halt_posthoc(cfg), recipe=dict(name="par_halt_posthoc_long"))
    first, halt = cfg.stages
    return dataclasses.replace(cfg, stages=(first, dataclasses.replace(halt, share=LOCAL_POSTHOC_SHARE)))

SPEC = SweepSpec(
    name="halting",
    description=__doc__.splitlines()[0],
    recipes=("par_halt", "par_halt_posthoc", "par_halt_light", "par_halt_posthoc_long"),
    extra_recipes={"par_halt_light": par_halt_light, "par_halt_posthoc_long": par_halt_posthoc_long},
    # paper: both arms as the paper trains them × seeds; local: the post-hoc arm with a longer stage × 3 seeds, and
    # the lighter joint arm on seed 0 (what fits ~1 h on 2 cores)
    cells={"paper": tuple({"recipe": r} for r in ("par_halt", "par_halt_posthoc")),
           "local": tuple({"recipe": "par_halt_posthoc_long", "train.seed": s} for s in (0, 1, 2))
           + ({"recipe": "par_halt_light", "train.seed": 0},)},
    tasks=("swap_s5",),
    backbones={"local": ("tiny-qwen2",), "paper": ("qwen2.5-0.5b",)},
    seeds=(0, 1, 2),
    # the paper's rule is the primary one; the other rules are read from the same halting pass (no extra forwards)
    overrides={**dict(zip(("eval.halt_k", "eval.halt_n", "eval.halt_tau"), PAPER_RULE)),
               "eval.halt_rules": tuple(r for r in PAPER_RULES if r != PAPER_RULE)},
    preset_overrides={"local": LOCAL_RECIPE},
)

if __name__ == "__main__":
    sys.exit(main(SPEC))
