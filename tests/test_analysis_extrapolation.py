"""The vectorised d50 / G of analysis.aggregate agrees with par_ray.evaluation.extrapolation, curve by curve.

Random curves cover: unsorted and uneven depth sets, NaN accuracies (count as below the midpoint), values exactly at
the midpoint (not below), curves that never cross (censored) and several chance levels and train depths.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from analysis import aggregate, load


def _random_curves(n_runs: int, seed: int) -> tuple[list[dict], pl.DataFrame]:
    rng = np.random.default_rng(seed)
    curves, rows = [], []
    for i in range(n_runs):
        chance = float(rng.choice([1 / 120, 1 / 60, 0.0, 0.25]))
        midpoint = (chance + 1.0) / 2.0
        train_depth = int(rng.choice([4, 8, 16]))
        depths = rng.choice(np.arange(train_depth, 40 * train_depth), size=int(rng.integers(1, 8)), replace=False)
        kind = rng.integers(0, 4)
        if kind == 0:  # stays above the midpoint: censored
            accs = rng.uniform(midpoint, 1.0, depths.size)
        else:
            accs = rng.uniform(0.0, 1.0, depths.size)
        accs[rng.random(depths.size) < 0.1] = midpoint  # exactly at the midpoint: not below
        accs[rng.random(depths.size) < 0.05] = np.nan
        curve = {int(d): float(a) for d, a in zip(depths, accs)}
        curves.append({"run_id": f"r{i}", "curve": curve, "chance": chance, "train_depth": train_depth})
        rows += [{"run_id": f"r{i}", "status": "FINISHED", "task": "t", "backbone": "b", "recipe": "r", "seed": i,
                  "train_depth": train_depth, "chance": chance, "depth": d, "acc": a}
                 for d, a in curve.items()]
    acc = pl.from_dicts(rows, schema={**{c: load.TRIAL_SCHEMA[c] for c in
                                         ("run_id", "status", "task", "backbone", "recipe", "seed", "train_depth",
                                          "chance")}, "depth": pl.Int64, "acc": pl.Float64})
    return curves, acc


def test_matches_par_ray_evaluation_on_random_curves():
    from par_ray.evaluation import extrapolation  # imports torch: only here

    curves, acc = _random_curves(400, seed=0)
    got = {r["run_id"]: r for r in aggregate.extrapolation_per_seed(acc).iter_rows(named=True)}
    n_censored = 0
    for c in curves:
        want = extrapolation(c["curve"], c["chance"], c["train_depth"])
        row = got[c["run_id"]]
        assert (row["d50"], row["censored"]) == (want.d50, want.censored), c
        assert row["G"] == want.G and row["midpoint"] == want.midpoint, c
        assert row["d50_interp"] == (None if want.d50_interp is None else pytest.approx(want.d50_interp)), c
        assert row["G_interp"] == pytest.approx(want.G_interp), c
        n_censored += want.censored
    assert 50 < n_censored < 350  # both branches exercised
