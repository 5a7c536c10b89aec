"""Label-free learning (paper §3 "Prefix Self-Distillation", Table 5): PAR with labels vs final answers only.

Recipes ``par`` (every prefix labelled: progress-aligned targets z_min(ck, d)), ``psd_ema`` and ``psd_live`` (only
z_d labelled; earlier iterations distil from a teacher reading the prompt truncated after c·k operations: an EMA of
the student, or the student itself under no_grad) and ``final_answer`` (only z_d, at every iteration, no teacher),
on S5, across the preset's backbones × seeds. The same budget (steps, batch) for every recipe.

    python sweeps/label_free.py --dry-run --preset paper
    python sweeps/label_free.py --smoke-test --backbones tiny-qwen2 --seeds 0
"""

import sys

from par_ray.sweep import SweepSpec, main

SPEC = SweepSpec(
    name="label_free",
    description=__doc__.splitlines()[0],
    recipes=("par", "psd_ema", "psd_live", "final_answer"),
    tasks=("s5",),
    seeds=(0, 1, 2),
)

if __name__ == "__main__":
    sys.exit(main(SPEC))
