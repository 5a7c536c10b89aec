"""Hyperparameter search: Optuna proposes lr, gradient window, hold λ and the layer split; ASHA stops weak trials.

Optimizes G (default) or the accuracy at the longest test depth (``--metric acc_longest``), with the hold schedule
(``par_hold``) on the preset's first backbone and seed.

    python sweeps/search.py --smoke-test --num-samples 3
"""

import sys

from ray import tune

from par_ray.config import TrialConfig
from par_ray.model.registry import BACKBONES
from par_ray.sweep import Search, SweepSpec, main


def space(cfg: TrialConfig) -> dict:
    """lr, gradient window, hold λ, and (prelude, core, coda) splits of the backbone's layers with 1, n/6, n/3 in the
    prelude and the coda."""
    n = BACKBONES[cfg.backbone.name].num_hidden_layers
    splits = list(dict.fromkeys(f"{p},{n - 2 * p},{p}" for p in (1, max(1, n // 6), max(1, n // 3)) if n - 2 * p >= 1))
    return {
        "train.lr": tune.loguniform(1e-4, 3e-3),
        "recipe.grad_window": tune.choice([2, 4, 8]),
        "recipe.hold_lambda": tune.uniform(2.0, 16.0),
        "backbone.split": tune.choice(splits),
    }


SPEC = SweepSpec(
    name="search",
    description=__doc__.splitlines()[0],
    recipes=("par_hold",),
    tasks=("swap_s5",),
    backbones={"local": ("tiny-qwen2",), "paper": ("qwen2.5-0.5b",)},
    seeds=(0,),
    # ASHA compares trials at every report, so every report must carry G: evaluate at every report.
    overrides={"train.report_every": 250, "train.eval_every": 250, "train.checkpoint_every": 500},
    search=Search(
        space=space,
        metric="G",
        num_samples=12,
    ),
)

if __name__ == "__main__":
    sys.exit(main(SPEC))
