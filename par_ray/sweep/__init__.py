"""Tune plumbing shared by every sweep: grid or search, resources, restore, MLflow (STYLE rule 12: only here).

A sweep is declared as a :class:`SweepSpec` and run by :func:`main` (common CLI flags) or :func:`run_sweep`:

1. :mod:`~par_ray.sweep.spec` resolves every trial's config and validates all of them before Ray starts.
2. :mod:`~par_ray.sweep.resources` connects to Ray (``RAY_ADDRESS``, a running local cluster, or a new local one;
   preset ``auto``: paper if the cluster has a GPU, else local) and sets ``max_concurrent_trials`` from the
   cluster's resources; ``--dry-run`` prints each trial's reservation (its GPU count and, with ``--gpu-types``, GPU
   type) and the planner's memory per GPU.
3. :mod:`~par_ray.sweep.run` runs Tune over Train V2 with ``FailureConfig`` at both levels, MLflow parent/child
   runs from a Tune callback, ``--resume`` through ``Tuner.restore``, and ``analysis.analyze`` at the end.
4. :mod:`~par_ray.sweep.cli` parses the common flags.
"""

from par_ray.sweep.cli import main, parse_args
from par_ray.sweep.resources import (DRIVER_RESOURCES, autoscaler_limits_unknown, cluster_capacity, joined,
                                     max_concurrent_trials, print_plan, ray_address, trial_resources)
from par_ray.sweep.run import print_summary, run_sweep, sweep_status, trial_outcome
from par_ray.sweep.spec import (CELL_KEY, DEFAULT_STORAGE, GPU_TYPES_KEY, GRID_DIMS, METRIC_ALIASES, MODEL_DIR_KEY,
                                PRESET_CHOICES, TRAIN_MAX_FAILURES, TUNE_MAX_FAILURES, Options, Plan, Recipe, Search,
                                SweepConfigError, SweepSpec, build_plan, cell_errors, cells_of, count_trials,
                                default_seeds, fixed_overrides, missing_weights, resolve, trial_label)

__all__ = [
    "CELL_KEY", "DEFAULT_STORAGE", "DRIVER_RESOURCES", "GPU_TYPES_KEY", "GRID_DIMS", "METRIC_ALIASES", "MODEL_DIR_KEY",
    "PRESET_CHOICES", "missing_weights",
    "TRAIN_MAX_FAILURES", "TUNE_MAX_FAILURES", "Options", "Plan", "Recipe", "Search", "SweepConfigError", "SweepSpec",
    "autoscaler_limits_unknown", "build_plan", "cell_errors", "cells_of", "cluster_capacity", "count_trials",
    "default_seeds", "fixed_overrides", "joined", "main", "max_concurrent_trials", "parse_args", "print_plan",
    "print_summary", "ray_address", "resolve", "run_sweep", "sweep_status", "trial_label", "trial_outcome",
    "trial_resources",
]
