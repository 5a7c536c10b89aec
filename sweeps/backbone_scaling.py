"""Backbone scaling: PAR across backbones × seeds (paper §5, Table 2: on S5).

Presets: ``paper`` — S5 as the paper's Table 2, the seven Qwen2.5 / Qwen3 sizes, d_train 16, evaluated to 16×
(256), DDP / FSDP / DeepSpeed by size; ``local`` — swap-S5 (:data:`LOCAL_TASK`), tiny-qwen2 and tiny-qwen3 × 3
seeds on the best from-scratch recipe that fits 45 minutes on 2 cores (:data:`LOCAL_RECIPE`: the length curriculum
6 → 11 → 16, 1,500 steps, every other window iteration read out; 40 min measured), evaluated on the fine grid to 8× the train length: at CPU scale the tiny models stay near
chance on S5 (docs/experiments.md §11, §15), so the local preset keeps the task they learn; ``auto`` (default) —
paper on a GPU cluster, else local.

    python sweeps/backbone_scaling.py --smoke-test          # seconds per trial, CPU
    python sweeps/backbone_scaling.py --dry-run --preset paper --model-dir /shared/models
    python sweeps/backbone_scaling.py --resume              # continue an interrupted sweep
"""

import sys

from par_ray.presets import LOCAL_CURRICULUM, LOCAL_LOOP_OPTIONS, LOCAL_PROGRESS_OPTIONS
from par_ray.sweep import SweepSpec, main

PAPER_TASK = "s5"
LOCAL_TASK = "swap_s5"
"""The local preset's task: the tiny models learn it on a CPU budget, which they do not on S5."""
LOCAL_RECIPE = {**LOCAL_LOOP_OPTIONS, **LOCAL_PROGRESS_OPTIONS, **LOCAL_CURRICULUM}
"""The local preset's recipe: the best from-scratch recipe at half the steps of the one that reaches G ≥ 4 — experiment
9's loop and progress options on the length curriculum 6 → 11 → 16 with state noise (docs/experiments.md §21, "c16
noise"), 1,500 steps, tests on the fine grid 16 … 128, layers compiled (``train.compile``), every other iteration of the
gradient window read out (``recipe.read_every=2``). The sweep took 40 min 19 s on 2 cores (§26: 6 trials of 13 min,
two at a time; G tiny-qwen2 1.19 ± 0.17, tiny-qwen3 1.35 ± 0.31); reading every iteration with eager layers it took
64.5 min (§23; G 1.29 ± 0.10 and 1.90 ± 0.54), which ``--set recipe.read_every=1`` restores (compiled ~10 % less)."""

SPEC = SweepSpec(
    name="backbone_scaling",
    description=__doc__.splitlines()[0],
    recipes=("par",),
    tasks=(PAPER_TASK, LOCAL_TASK),
    cells={"paper": ({"task.name": PAPER_TASK},), "local": ({"task.name": LOCAL_TASK},)},
    seeds=(0, 1, 2),
    preset_overrides={"local": LOCAL_RECIPE},
)

if __name__ == "__main__":
    sys.exit(main(SPEC))
