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

The printed main table has three rows per arm, one per stopping: R = ⌈d/c⌉, the model's own halting (the paper's
rule) and the oracle best fixed R per depth (of 1…R_max, from the same pass), each with its accuracy by depth and its
G (``G``, ``G_halt``, ``G_best`` in MLflow; ``analysis.aggregate.STOPPINGS``).

Both presets evaluate every rule of :data:`PAPER_RULES` (the paper's, looser and stricter k of n, τ 0.3 and 0.7).
Presets: ``paper`` — Qwen2.5-0.5B, both arms as the paper trains them × 3 seeds (6 trials). ``local`` — the same two
arms × 3 seeds on tiny-qwen2 with experiment 9's recipe (:data:`LOCAL_RECIPE`, the one that learns swap_s5 at this
scale), 2,400 steps — 6 trials, 93 minutes on 2 cores (docs/experiments.md §44).

    python sweeps/halting.py                               # local: 6 trials
    python sweeps/halting.py --dry-run --preset paper      # the trial plan with the planner's memory per GPU
    python sweeps/halting.py --smoke-test --seeds 0
"""

import sys

from par_ray.presets import LOCAL_EVAL_MULTIPLES, LOCAL_LOOP_OPTIONS, LOCAL_PROGRESS_OPTIONS, LOCAL_TRAIN_DEPTH
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
    **LOCAL_LOOP_OPTIONS, **LOCAL_PROGRESS_OPTIONS,
    "train.steps": 2400, "train.eval_every": 1200,
    # the coarse 1×, 2×, 4×, 8× depths, not the local preset's fine grid: halting evaluation runs R_max = 96
    # iterations at every depth, so the fine grid's 11 depths between would double this sweep's evaluation (unmeasured)
    "eval.depths": tuple(m * LOCAL_TRAIN_DEPTH for m in LOCAL_EVAL_MULTIPLES), "eval.num_sequences_fine": 0,
    "eval.batch_size": 256,
}
"""The local preset's recipe options (on top of its halting recipes) and budget; tests at 1×–8× the local d_train
(6 … 48, R_max 96), where experiment 9 measured this recipe at 0.97 / 0.47 / 0.004 / 0.004 with oracle stopping.
(Experiment 14 ran it with tests 6/12/24 only, R_max 48.)"""

SPEC = SweepSpec(
    name="halting",
    description=__doc__.splitlines()[0],
    recipes=("par_halt", "par_halt_posthoc"),
    # both presets: the two arms as the paper trains them (joint, weight 0.5; post-hoc, last 10 % of the steps) × seeds
    cells=tuple({"recipe": r} for r in ("par_halt", "par_halt_posthoc")),
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
