"""Prior looped-transformer benchmarks (Fan et al. 2024): PAR and final-answer training on parity and addition.

Recipes ``par`` (progress-aligned targets: the running parity / the partial sum after k operations) and
``final_answer`` (only the final answer supervised at every iteration, close to Fan et al.'s output-only loss), on
``parity`` (depth = n bits) and ``addition`` (depth = n + 1 for n-digit binary operands), × backbones × seeds.

Presets: ``local`` — tiny-qwen2 × 3 seeds, d_train 6, tests to 8×; ``paper`` — Qwen2.5-0.5B × 3 seeds at Fan et al.'s
length conventions (``par_ray.tasks.looped_benchmarks.PAPER_DEPTHS``: trained on n ≤ 20, tested at n = 20 … 50 for
parity and 20 … 40 for addition).

    python sweeps/prior_benchmarks.py
    python sweeps/prior_benchmarks.py --dry-run --preset paper
    python sweeps/prior_benchmarks.py --smoke-test --seeds 0
"""

import sys

from par_ray.sweep import SweepSpec, main

SPEC = SweepSpec(
    name="prior_benchmarks",
    description=__doc__.splitlines()[0],
    recipes=("par", "final_answer"),
    tasks=("parity", "addition"),
    backbones={"local": ("tiny-qwen2",), "paper": ("qwen2.5-0.5b",)},
    seeds=(0, 1, 2),
)

if __name__ == "__main__":
    sys.exit(main(SPEC))
