"""Ablations (paper §5, Table 7: on S5): norm anchoring × target type, and PAR followed by the positional-stretch stage.

Recipes ``par`` (anchoring on, progress targets), ``no_anchor`` (anchoring off), ``final_answer`` (final-answer
targets), ``final_no_anchor`` (anchoring off and final-answer targets) and ``stretch`` (PAR, then a stretch
fine-tuning stage on the last 10 % of the steps: position ids × s, s ~ U[1, s_max], s_max ramped 1 → 8, §3.4), each
across the preset's backbones × seeds. Task: S5 under the ``paper`` preset (the paper's Table 7); swap-S5 under
``local``, since the tiny CPU models stay near chance on S5 (docs/experiments.md §11, §15).

    python sweeps/ablations.py --smoke-test --backbones tiny-qwen2 --seeds 0
"""

import sys

from par_ray.config import TrialConfig, with_overrides
from par_ray.recipes import final_answer
from par_ray.sweep import SweepSpec, main


def final_no_anchor(cfg: TrialConfig) -> TrialConfig:
    """Both ablations at once: final-answer targets and no RMS norm anchoring."""
    return with_overrides(final_answer(cfg), recipe=dict(name="final_no_anchor", anchoring=False))


RECIPES = ("par", "no_anchor", "final_answer", "final_no_anchor", "stretch")
PAPER_TASK = "s5"
LOCAL_TASK = "swap_s5"
"""The local preset's task: the tiny models learn it on a CPU budget, which they do not on S5."""

SPEC = SweepSpec(
    name="ablations",
    description=__doc__.splitlines()[0],
    recipes=RECIPES,
    extra_recipes={"final_no_anchor": final_no_anchor},
    tasks=(PAPER_TASK, LOCAL_TASK),
    cells={"paper": tuple({"recipe": r, "task.name": PAPER_TASK} for r in RECIPES),
           "local": tuple({"recipe": r, "task.name": LOCAL_TASK} for r in RECIPES)},
    seeds=(0, 1, 2),
)

if __name__ == "__main__":
    sys.exit(main(SPEC))
