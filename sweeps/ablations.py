"""Ablations (paper §5, Table 7: on S5): norm anchoring × target type, and PAR followed by the positional-stretch stage.

Recipes ``par`` (anchoring on, progress targets), ``no_anchor`` (anchoring off), ``final_answer`` (final-answer
targets), ``final_no_anchor`` (anchoring off and final-answer targets) and ``stretch`` (PAR, then a stretch
fine-tuning stage on the last 10 % of the steps: position ids × s, s ~ U[1, s_max], s_max ramped 1 → 8, §3.4), each
across the preset's backbones × seeds. Task: S5 under the ``paper`` preset (the paper's Table 7).

The ``local`` preset asks the question a laptop can answer — do the method's progress alignment and anchoring move
G? — on the recipe that extrapolates at CPU scale: ``par``, ``no_anchor`` and ``final_answer`` on swap-S5 (the tiny
CPU models stay near chance on S5, docs/experiments.md §11, §15), tiny-qwen3 × 3 seeds, 9 trials of 1,500 steps on the
length curriculum 6 → 11 → 16 with state noise σ 0.1 (``presets.LOCAL_CURRICULUM_SHORT``: the main job's curriculum at
half its steps), tested on the fine grid 16 … 128.
All three share experiment 9's loop options (``presets.LOCAL_LOOP_OPTIONS``: slack iterations, adapter α, attention
windows); ``par`` and ``no_anchor`` add its progress-aligned part without the fixed-point loss
(:data:`ABLATION_PROGRESS_OPTIONS`), ``final_answer`` trains z_d at every iteration instead
(``presets.LOCAL_FINAL_OPTIONS``). The fixed-point loss is par_ray's addition, not the paper's, and it does anchoring's
job: with it on, ``no_anchor`` reads the same G as ``par`` (docs/experiments.md §22); with it off anchoring decides
whether the state survives past d_train (§23, 3 seeds: 0.36–0.59 against 0.00–0.02 at 2×). Without the curriculum
every recipe falls off at 2× (§9, §15) and reads the same G. Every recipe reads out every other iteration of the
gradient window, in phase with ⌈d/c⌉ (``recipe.read_every=2``, §26). Measured end to end on a 2-core machine with
compiled layers (§26): 59 min 45 s, 13–15 min per par / no_anchor trial and 8–10 per final_answer trial, two at a
time (``--dry-run`` plans 1.6 h: it assumes a lower CPU MFU than these tiny models reach); G: par 1.50 ± 0.23,
no_anchor 1.29 ± 0.10, final_answer 1.00 (reading every iteration, §25: 70.5 min; 1.42 ± 0.13, 1.19 ± 0.06, 1.00).

    python sweeps/ablations.py                                  # local: 9 trials, ~60 minutes on 2 cores
    python sweeps/ablations.py --smoke-test --seeds 0
"""

import sys

from par_ray import presets
from par_ray.config import TrialConfig, with_overrides
from par_ray.presets import LOCAL_CURRICULUM_SHORT, LOCAL_FINAL_OPTIONS, LOCAL_LOOP_OPTIONS, LOCAL_PROGRESS_OPTIONS
from par_ray.recipes import final_answer
from par_ray.sweep import SweepSpec, main


def final_no_anchor(cfg: TrialConfig) -> TrialConfig:
    """Both ablations at once: final-answer targets and no RMS norm anchoring."""
    return with_overrides(final_answer(cfg), recipe=dict(name="final_no_anchor", anchoring=False))


RECIPES = ("par", "no_anchor", "final_answer", "final_no_anchor", "stretch")
PAPER_TASK = "s5"
LOCAL_TASK = "swap_s5"
"""The local preset's task: the tiny models learn it on a CPU budget, which they do not on S5."""
ABLATION_PROGRESS_OPTIONS = {**LOCAL_PROGRESS_OPTIONS, "recipe.fixed_point_weight": 0.0}
"""The progress-aligned options of the local comparison: experiment 9's (``presets.LOCAL_PROGRESS_OPTIONS``) without
the fixed-point loss, so that ``par`` is the paper's method on the local loop and ``no_anchor`` removes the one thing
that keeps states bounded past d_train (docs/experiments.md §23)."""
LOCAL_CELLS = tuple({"recipe": r, "task.name": LOCAL_TASK, **options} for r, options in (
    ("par", ABLATION_PROGRESS_OPTIONS), ("no_anchor", ABLATION_PROGRESS_OPTIONS),
    ("final_answer", LOCAL_FINAL_OPTIONS)))
"""The local comparison (module docstring): PAR against its two ablations that the paper reports as lowering G."""
LOCAL_BUDGET = {**LOCAL_LOOP_OPTIONS, **LOCAL_CURRICULUM_SHORT}
"""The local loop (``presets.LOCAL_LOOP_OPTIONS``) on the length curriculum 6 → 11 → 16 with state noise σ 0.1
(``presets.LOCAL_CURRICULUM_SHORT``: 1,500 steps, every other window iteration read out, one evaluation at the end on
the fine grid 16 … 128)."""

SPEC = SweepSpec(
    name="ablations",
    description=__doc__.splitlines()[0],
    recipes=RECIPES,
    extra_recipes={"final_no_anchor": final_no_anchor},
    tasks=(PAPER_TASK, LOCAL_TASK),
    cells={"paper": tuple({"recipe": r, "task.name": PAPER_TASK} for r in RECIPES),
           "local": LOCAL_CELLS},
    backbones={"local": ("tiny-qwen3",), "paper": presets.PAPER_BACKBONES},
    seeds=(0, 1, 2),
    preset_overrides={"local": LOCAL_BUDGET},
)

if __name__ == "__main__":
    sys.exit(main(SPEC))
