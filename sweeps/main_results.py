"""Main results (paper Tables 1, 2 and 6): PAR against its baselines on swap_s5, and PAR on every other task.

Cells: every recipe of :data:`RECIPES` on swap_s5 (``par`` and the baselines ``fixed_depth``: the parent, R = 1;
``more_iterations``: a fixed, larger loop count, final answer only; ``rlt``: RLT-style recurrence; ``untied``: a
deeper untied core; ``cot``: explicit chain-of-thought on the same backbone, whose generated tokens per test depth are
logged as ``cot_tokens_d{D}`` and shown in the table's CoT cost column), plus one ``par`` row on each task of
:data:`OTHER_TASKS` (S5, A5, rule-table chains, object tracking, and graph reachability, the negative control);
× the preset's backbones × seeds. The table (``analysis``): rows = recipe or baseline (per task), columns = test
multiples of d_train, cells mean ± std (n) over seeds.

Presets: ``local`` — tiny-qwen2 × 2 seeds (22 trials), d_train 3, tests on the fine grid to 8× (3, 4, …, 6, then
steps of ≤ 1.25× to 24: ``par_ray.presets.fine_depths``), 1,500 steps, sized for
under an hour on a 2-core CPU (two trials at a time); ``paper`` — Qwen2.5-0.5B × 3 seeds at each task's paper
depths (``par_ray.tasks.PAPER_DEPTHS``), GPUs per trial chosen by the planner (``--dry-run`` lists them).

    python sweeps/main_results.py
    python sweeps/main_results.py --dry-run --preset paper
    python sweeps/main_results.py --smoke-test --seeds 0
"""

import sys

from par_ray.presets import fine_depths
from par_ray.sweep import SweepSpec, main

RECIPES = ("par", "fixed_depth", "more_iterations", "rlt", "untied", "cot")
"""The method, then its baselines (``par_ray.recipes``), each run on :data:`MAIN_TASK`."""
MAIN_TASK = "swap_s5"
OTHER_TASKS = ("s5", "a5", "rule_table", "object_tracking", "reachability")
"""Tasks with one ``par`` row each."""
LOCAL_TRAIN_DEPTH = 3
"""The local preset's d_train: 22 trials must fit an hour on 2 cores, and a step's cost grows as R·T ∝ d(d + 7), so a
step at d = 3 costs 0.68 of one at d = 4 (which took ~2 h for the 22 trials, docs/experiments.md §11) and 0.38 of one
at the local default d = 6; tests on the fine grid to 8×."""


def make_spec(recipes: tuple[str, ...] = RECIPES) -> SweepSpec:
    """The sweep over ``recipes`` on :data:`MAIN_TASK`, plus ``par`` on each of :data:`OTHER_TASKS` when ``par`` is
    one of ``recipes`` (tests pass the recipes a branch has)."""
    cells = [{"recipe": r, "task.name": MAIN_TASK} for r in recipes]
    cells += [{"recipe": "par", "task.name": t} for t in OTHER_TASKS if "par" in recipes]
    d = LOCAL_TRAIN_DEPTH
    return SweepSpec(
        name="main_results",
        description=__doc__.splitlines()[0],
        recipes=tuple(recipes),
        tasks=(MAIN_TASK, *OTHER_TASKS),
        cells=tuple(cells),
        backbones={"local": ("tiny-qwen2",), "paper": ("qwen2.5-0.5b",)},
        seeds={"local": (0, 1), "paper": (0, 1, 2)},
        preset_overrides={"local": {"task.train_depth": d, "eval.depths": fine_depths(d, 8 * d),
                                    "train.steps": 1500, "train.eval_every": 750, "train.checkpoint_every": 750}},
    )


SPEC = make_spec()

if __name__ == "__main__":
    sys.exit(main(SPEC))
