"""Backbone scaling: PAR on swap_s5 across backbones × seeds (paper §5, scale table).

Presets: ``local`` — tiny-qwen2 and tiny-qwen3 × 3 seeds, the CPU trial, evaluated to 8× the train length;
``paper`` — the seven Qwen2.5 / Qwen3 sizes, d_train 32, evaluated to 16×, DDP / FSDP / DeepSpeed by size;
``auto`` (default) — paper on a GPU cluster, else local.

    python sweeps/backbone_scaling.py --smoke-test          # seconds per trial, CPU
    python sweeps/backbone_scaling.py --dry-run --preset paper
    python sweeps/backbone_scaling.py --resume              # continue an interrupted sweep
"""

import sys

from par_ray.sweep import SweepSpec, main

SPEC = SweepSpec(
    name="backbone_scaling",
    description=__doc__.splitlines()[0],
    recipes=("par",),
    tasks=("swap_s5",),
    seeds=(0, 1, 2),
)

if __name__ == "__main__":
    sys.exit(main(SPEC))
