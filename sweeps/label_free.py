"""Label-free learning (paper §3 "Prefix Self-Distillation", Table 5): PAR with labels vs final answers only.

Recipes ``par`` (every prefix labelled: progress-aligned targets z_min(ck, d)), ``psd_ema`` and ``psd_live`` (only
z_d labelled; earlier iterations distil from a teacher reading the prompt truncated after c·k operations: an EMA of
the student, or the student itself under no_grad) and ``final_answer`` (only z_d, at every iteration, no teacher),
across the preset's backbones × seeds. The same budget (steps, batch) for every recipe.

Presets: ``paper`` — on S5, as the paper's Table 5, the paper preset's backbones × 3 seeds. ``local`` — on
swap-S5 (:data:`LOCAL_TASK`), tiny-qwen2 × 3 seeds (12 trials), d_train 3, tests on the fine grid 3 … 24, 1,500 steps (the main
results' local budget): at CPU scale the tiny model stays at chance on S5 (27.7 % at d = 3 after 1,500 steps, chance
20 %; docs/experiments.md §11, §15), so a comparison there could not separate the recipes, while it learns swap-S5
in that budget.

    python sweeps/label_free.py
    python sweeps/label_free.py --dry-run --preset paper
    python sweeps/label_free.py --smoke-test --backbones tiny-qwen2 --seeds 0
"""

import sys

from par_ray import presets
from par_ray.sweep import SweepSpec, main

RECIPES = ("par", "psd_ema", "psd_live", "final_answer")
PAPER_TASK = "s5"
LOCAL_TASK = "swap_s5"
"""The local preset's task: the tiny model learns it in the local budget, which it does not on S5."""
LOCAL_TRAIN_DEPTH = 3

SPEC = SweepSpec(
    name="label_free",
    description=__doc__.splitlines()[0],
    recipes=RECIPES,
    tasks=(PAPER_TASK, LOCAL_TASK),
    cells={"paper": tuple({"recipe": r, "task.name": PAPER_TASK} for r in RECIPES),
           "local": tuple({"recipe": r, "task.name": LOCAL_TASK} for r in RECIPES)},
    backbones={**presets.PRESET_BACKBONES, "local": ("tiny-qwen2",)},
    seeds=(0, 1, 2),
    preset_overrides={"local": {"task.train_depth": LOCAL_TRAIN_DEPTH,
                                "eval.depths": presets.fine_depths(LOCAL_TRAIN_DEPTH, 8 * LOCAL_TRAIN_DEPTH),
                                "train.steps": 1500, "train.eval_every": 750, "train.checkpoint_every": 750}},
)

if __name__ == "__main__":
    sys.exit(main(SPEC))
