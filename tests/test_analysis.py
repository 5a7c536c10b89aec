"""analysis/: a hand-built MLflow store (sqlite in tmp) → frames, aggregates, tables, figures, CLI.

The store holds one sweep of swap_s5 (chance 1/120, midpoint 121/240 ≈ 0.50417, d_train 8, test depths 8–64):
2 recipes × 2 backbones with 3 or 2 seeds, one seed that never crosses the midpoint (censored G), a FAILED and a
RUNNING trial (kept in ``trials``, excluded from aggregates), a one-seed ``no_anchor`` ablation, halting metrics
(own halting 0.1 below R = ⌈d/c⌉ past d_train, the best fixed R 0.2 above it, capped at 1) and per-iteration RMS /
halting probability on par × tiny-qwen2. Every expected number below is computed by hand;
std is the sample std (ddof = 1).
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import polars as pl
import pytest

from analysis import aggregate, load, plots, tables
from analysis.__main__ import main
from analysis.report import analyze

EXPERIMENT = "par_ray/test_sweep"
CHANCE = 1 / 120
DEPTHS = (8, 16, 32, 64)
# (recipe, backbone, seed, status, acc at DEPTHS, anchoring, targets)
TRIALS = [
    ("par", "tiny-qwen2", 0, "FINISHED", (1.0, 0.9, 0.7, 0.6), "True", "progress"),  # never crosses: censored
    ("par", "tiny-qwen2", 1, "FINISHED", (1.0, 0.8, 0.6, 0.3), "True", "progress"),  # d50 = 64
    ("par", "tiny-qwen2", 2, "FINISHED", (1.0, 0.7, 0.4, 0.1), "True", "progress"),  # d50 = 32
    ("par", "tiny-qwen2", 3, "FAILED", (0.2,), "True", "progress"),
    ("par", "tiny-qwen3", 0, "FINISHED", (0.95, 0.85, 0.55, 0.45), "True", "progress"),  # d50 = 64
    ("par", "tiny-qwen3", 1, "FINISHED", (0.9, 0.5, 0.2, 0.1), "True", "progress"),  # 0.5 < midpoint: d50 = 16
    ("final_answer", "tiny-qwen2", 0, "FINISHED", (0.9, 0.3, 0.05, 0.01), "True", "final"),  # d50 = 16
    ("final_answer", "tiny-qwen2", 1, "FINISHED", (0.8, 0.2, 0.02, 0.0), "True", "final"),  # d50 = 16
    ("final_answer", "tiny-qwen3", 0, "FINISHED", (0.5, 0.1, 0.0, 0.0), "True", "final"),  # d50 = 8
    ("final_answer", "tiny-qwen3", 1, "FINISHED", (0.6, 0.2, 0.01, 0.0), "True", "final"),  # d50 = 16
    ("final_answer", "tiny-qwen3", 2, "FINISHED", (0.7, 0.3, 0.0, 0.0), "True", "final"),  # d50 = 16
    ("final_answer", "tiny-qwen3", 3, "RUNNING", (0.7, 0.3), "True", "final"),
    ("no_anchor", "tiny-qwen2", 0, "FINISHED", (0.9, 0.4, 0.1, 0.0), "False", "progress"),  # d50 = 16
]
R = 4  # iterations with rms_k / halt_prob_k on par × tiny-qwen2


def _log_store(uri: str, artifact_root: Path) -> tuple[str, str]:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(uri)
    exp_id = client.create_experiment(EXPERIMENT, artifact_location=artifact_root.as_uri())
    parent = client.create_run(exp_id, tags={"par_ray.role": "sweep", "par_ray.sweep": "test_sweep"},
                               run_name="test_sweep").info.run_id
    for i, (recipe, backbone, seed, status, accs, anchoring, targets) in enumerate(TRIALS):
        tags = {"mlflow.parentRunId": parent, "par_ray.role": "trial", "par_ray.trial_id": f"trial_{i:05d}",
                "par_ray.recipe": recipe, "par_ray.backbone": backbone, "par_ray.task": "swap_s5",
                "par_ray.seed": str(seed), "par_ray.git_commit": "abc123"}
        run_id = client.create_run(exp_id, tags=tags, run_name=f"trial_{i:05d}").info.run_id
        params = {"task.train_depth": "8", "eval.depths": "8,16,32,64", "recipe.anchoring": anchoring,
                  "recipe.targets": targets, "train.seed": str(seed)}
        metrics = {"chance": CHANCE, "loss": 0.1 * (i + 1), "G": 99.0}  # a logged G is never trusted
        for d, a in zip(DEPTHS, accs):
            metrics[f"acc_d{d}"] = a
            metrics[f"acc_query_d{d}"] = min(1.0, a + 0.05)
        if (recipe, backbone) == ("par", "tiny-qwen2") and status == "FINISHED":
            for d, a in zip(DEPTHS, accs):
                metrics[f"oracle_acc_d{d}"] = a
                metrics[f"halt_acc_d{d}"] = a if d == 8 else a - 0.1
                metrics[f"halt_iter_d{d}"] = d + seed
                metrics[f"best_acc_d{d}"] = min(1.0, a + 0.2)  # the oracle best fixed R
                metrics[f"best_iter_d{d}"] = d + 1
            for k in range(1, R + 1):
                metrics[f"rms_k{k}"] = 1.0 + 0.1 * k * seed
                metrics[f"halt_prob_k{k}"] = k / R
        client.log_batch(run_id, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
                         params=[Param(k, v) for k, v in params.items()])
        if status != "RUNNING":
            client.set_terminated(run_id, status)
    client.set_terminated(parent, "FINISHED")
    return exp_id, parent


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    exp_id, parent = _log_store(uri, root / "artifacts")
    return {"uri": uri, "exp_id": exp_id, "parent": parent, "root": root}


@pytest.fixture(scope="module")
def frames(store) -> load.SweepFrames:
    return load.load_sweep(EXPERIMENT, tracking_uri=store["uri"])


@pytest.fixture(scope="module")
def summary(frames) -> aggregate.Summary:
    return aggregate.summarize(frames, n_boot=2000, seed=0)


def _row(frame: pl.DataFrame, **keys) -> dict:
    rows = frame.filter(**keys).to_dicts()
    assert len(rows) == 1, (keys, rows)
    return rows[0]


def _mean_std(xs) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


# ---------------------------------------------------------------------------------------------------------------------
# load


def test_trials_keep_every_status(frames):
    t = frames.trials
    assert t.height == len(TRIALS)
    counts = dict(t.group_by("status").agg(pl.len()).iter_rows())
    assert counts == {"FINISHED": 11, "FAILED": 1, "RUNNING": 1}
    assert t.schema["seed"] == pl.Int64 and t.schema["train_depth"] == pl.Int64
    failed = _row(t, status="FAILED")
    assert (failed["recipe"], failed["backbone"], failed["seed"], failed["acc_d8"]) == ("par", "tiny-qwen2", 3, 0.2)
    running = _row(t, status="RUNNING")
    assert running["end_time"] is None and running["duration_s"] is None
    assert t.filter(pl.col("status") == "FINISHED").get_column("duration_s").min() >= 0
    assert set(t.get_column("trial_id")) == {f"trial_{i:05d}" for i in range(len(TRIALS))}
    assert t.get_column("chance").unique().to_list() == [CHANCE]


def test_long_frames(frames):
    acc = frames.acc
    assert acc.height == sum(len(accs) for _, _, _, _, accs, _, _ in TRIALS)
    r = _row(acc, recipe="par", backbone="tiny-qwen2", seed=2, depth=32)
    assert (r["acc"], r["acc_query"], r["halt_acc"], r["oracle_acc"], r["halt_iter"]) == \
        (0.4, pytest.approx(0.45), pytest.approx(0.3), 0.4, 34.0)
    assert _row(acc, recipe="final_answer", backbone="tiny-qwen2", seed=0, depth=8)["halt_acc"] is None
    it = frames.by_iteration
    assert it.height == 3 * R and sorted(it.get_column("k").unique()) == list(range(1, R + 1))
    assert _row(it, seed=2, k=3)["rms"] == pytest.approx(1.6)


# ---------------------------------------------------------------------------------------------------------------------
# aggregates


def test_accuracy_stats_by_hand(summary):
    a = summary.accuracy
    # par × tiny-qwen2, FINISHED seeds 0, 1, 2 (the FAILED seed 3 with acc_d8 = 0.2 is excluded)
    for depth, xs in {8: (1.0, 1.0, 1.0), 16: (0.9, 0.8, 0.7), 32: (0.7, 0.6, 0.4), 64: (0.6, 0.3, 0.1)}.items():
        r = _row(a, recipe="par", backbone="tiny-qwen2", depth=depth)
        m, s = _mean_std(xs)
        assert r["n"] == 3 and r["mean"] == pytest.approx(m) and r["std"] == pytest.approx(s, abs=1e-12)
        assert r["ci_lo"] <= r["mean"] + 1e-12 and r["mean"] <= r["ci_hi"] + 1e-12
        assert min(xs) - 1e-12 <= r["ci_lo"] and r["ci_hi"] <= max(xs) + 1e-12
        assert (r["min"], r["max"]) == (min(xs), max(xs)) and r["multiple"] == depth / 8
    r = _row(a, recipe="par", backbone="tiny-qwen2", depth=32)
    assert (r["mean"], r["std"]) == (pytest.approx(0.5666666667), pytest.approx(0.1527525232))
    assert r["ci_lo"] < r["ci_hi"]
    # uneven seed counts: 2 seeds; the RUNNING seed 3 of final_answer × tiny-qwen3 is excluded
    r = _row(a, recipe="final_answer", backbone="tiny-qwen2", depth=8)
    assert (r["n"], r["mean"], r["std"]) == (2, pytest.approx(0.85), pytest.approx(0.0707106781))
    r = _row(a, recipe="final_answer", backbone="tiny-qwen3", depth=16)
    assert (r["n"], r["mean"], r["std"]) == (3, pytest.approx(0.2), pytest.approx(0.1))
    # one seed: no std, no CI
    r = _row(a, recipe="no_anchor", backbone="tiny-qwen2", depth=8)
    assert (r["n"], r["mean"], r["std"], r["ci_lo"], r["ci_hi"]) == (1, 0.9, None, None, None)


def test_bootstrap_is_seeded_and_two_seed_interval_is_exact(frames):
    a1 = aggregate.accuracy_stats(frames.acc, n_boot=500, seed=7)
    a2 = aggregate.accuracy_stats(frames.acc, n_boot=500, seed=7)
    assert a1.equals(a2)
    # n = 2: resampled means are x1, (x1 + x2) / 2, x2 with probabilities 1/4, 1/2, 1/4 → 95% interval = [min, max]
    r = _row(a1, recipe="par", backbone="tiny-qwen3", depth=32)
    assert (r["ci_lo"], r["ci_hi"]) == (pytest.approx(0.2), pytest.approx(0.55))


def test_d50_and_G_per_seed_by_hand(summary):
    p = summary.per_seed
    expected = {  # (recipe, backbone, seed): (d50, G, censored)
        ("par", "tiny-qwen2", 0): (None, 8.0, True),
        ("par", "tiny-qwen2", 1): (64, 8.0, False),
        ("par", "tiny-qwen2", 2): (32, 4.0, False),
        ("par", "tiny-qwen3", 0): (64, 8.0, False),
        ("par", "tiny-qwen3", 1): (16, 2.0, False),
        ("final_answer", "tiny-qwen2", 0): (16, 2.0, False),
        ("final_answer", "tiny-qwen2", 1): (16, 2.0, False),
        ("final_answer", "tiny-qwen3", 0): (8, 1.0, False),
        ("final_answer", "tiny-qwen3", 1): (16, 2.0, False),
        ("final_answer", "tiny-qwen3", 2): (16, 2.0, False),
        ("no_anchor", "tiny-qwen2", 0): (16, 2.0, False),
    }
    for (recipe, backbone, seed), (d50, G, censored) in expected.items():
        r = _row(p, recipe=recipe, backbone=backbone, seed=seed, status="FINISHED")
        assert (r["d50"], r["G"], r["censored"]) == (d50, G, censored), (recipe, backbone, seed)
        assert r["midpoint"] == pytest.approx(121 / 240)
    # failed / running trials get a G too, marked by status (the FAILED one only reached depth 8)
    assert _row(p, status="FAILED")["G"] == 1.0


def test_G_summary_by_hand(summary):
    g = summary.G
    r = _row(g, recipe="par", backbone="tiny-qwen2")
    m, s = _mean_std((8.0, 8.0, 4.0))
    assert (r["n"], r["n_censored"], r["lower_bound"], r["n_excluded"]) == (3, 1, True, 1)
    assert (r["G_mean"], r["G_std"]) == (pytest.approx(m), pytest.approx(s))
    assert (r["anchoring"], r["targets"]) == ("True", "progress")
    r = _row(g, recipe="par", backbone="tiny-qwen3")
    assert (r["n"], r["n_censored"], r["lower_bound"], r["G_mean"], r["G_std"]) == \
        (2, 0, False, 5.0, pytest.approx(math.sqrt(18)))
    r = _row(g, recipe="final_answer", backbone="tiny-qwen3")
    assert (r["n"], r["n_excluded"], r["G_mean"], r["G_std"]) == \
        (3, 1, pytest.approx(5 / 3), pytest.approx(math.sqrt(1 / 3)))
    assert _row(g, recipe="final_answer", backbone="tiny-qwen2")["G_std"] == 0.0


def test_excluded_and_warnings(summary):
    assert dict(summary.excluded.iter_rows()) == {"FAILED": 1, "RUNNING": 1}
    assert summary.warnings == ()


def test_halting_gap_by_hand(summary):
    h = summary.halting
    assert set(h.select("recipe", "backbone").unique().iter_rows()) == {("par", "tiny-qwen2")}
    r = _row(h, depth=8)
    assert (r["n"], r["gap_mean"], r["gap_std"]) == (3, 0.0, 0.0)
    r = _row(h, depth=32)
    assert r["halt_mean"] == pytest.approx(0.5666666667 - 0.1) and r["gap_mean"] == pytest.approx(0.1)
    assert r["halt_iter_mean"] == pytest.approx(33.0)


def test_G_per_stopping_by_hand(summary, frames):
    """Halting trials: G of R = ⌈d/c⌉, of the model's own halting and of the best fixed R per depth, each as
    ``par_ray.evaluation.extrapolation`` gives it on that curve, then mean ± std over seeds."""
    from par_ray.evaluation import extrapolation

    g = summary.stopping_G
    assert set(g.select("recipe", "backbone").unique().iter_rows()) == {("par", "tiny-qwen2")}
    assert g.get_column("stopping").to_list() == [aggregate.CEIL, aggregate.OWN_HALTING, aggregate.BEST_R]
    seeds = [accs for recipe, backbone, _, status, accs, _, _ in TRIALS
             if (recipe, backbone, status) == ("par", "tiny-qwen2", "FINISHED")]
    curves = {aggregate.CEIL: lambda d, a: a, aggregate.OWN_HALTING: lambda d, a: a if d == 8 else a - 0.1,
              aggregate.BEST_R: lambda d, a: min(1.0, a + 0.2)}
    for stopping, curve in curves.items():
        ex = [extrapolation({d: curve(d, a) for d, a in zip(DEPTHS, accs)}, CHANCE, 8) for accs in seeds]
        r = _row(g, stopping=stopping)
        m, sd = _mean_std([e.G for e in ex])
        mi, sdi = _mean_std([e.G_interp for e in ex])
        assert (r["n"], r["n_censored"], r["lower_bound"]) == (3, sum(e.censored for e in ex),
                                                              any(e.censored for e in ex)), stopping
        assert (r["G_mean"], r["G_std"]) == (pytest.approx(m), pytest.approx(sd, abs=1e-12)), stopping
        assert (r["G_interp_mean"], r["G_interp_std"]) == (pytest.approx(mi), pytest.approx(sdi, abs=1e-12))
    # by hand: own halting crosses at 64, 32, 32 (G 8, 4, 4); the best R never crosses on seed 0 (≥ 8), 64 on the others
    assert _row(g, stopping=aggregate.OWN_HALTING)["G_mean"] == pytest.approx(16 / 3)
    assert (_row(g, stopping=aggregate.BEST_R)["G_mean"], _row(g, stopping=aggregate.BEST_R)["lower_bound"]) == \
        (8.0, True)
    ceil = _row(summary.G, recipe="par", backbone="tiny-qwen2")
    assert _row(g, stopping=aggregate.CEIL)["G_mean"] == ceil["G_mean"]  # the same trials, the same curve
    a = summary.stopping_accuracy
    assert _row(a, stopping=aggregate.OWN_HALTING, depth=32)["mean"] == pytest.approx(0.5666666667 - 0.1)
    assert _row(a, stopping=aggregate.BEST_R, depth=64)["mean"] == pytest.approx(0.5333333333)
    assert _row(a, stopping=aggregate.OWN_HALTING, depth=32)["query_mean"] is None  # measured at R = ⌈d/c⌉ only
    # runs that predate best_acc_d{D}: no best-R row, the rest unchanged
    old = aggregate.stopping_g(frames.acc.drop("best_acc", "best_iter"), frames.trials)
    assert old.get_column("stopping").to_list() == [aggregate.CEIL, aggregate.OWN_HALTING]
    assert old.drop("stopping").equals(g.filter(pl.col("stopping") != aggregate.BEST_R).drop("stopping"))
    # no halting trial: empty
    plain = frames.acc.with_columns(pl.lit(None, pl.Float64).alias("halt_acc"))
    assert aggregate.stopping_g(plain, frames.trials).is_empty()
    assert aggregate.stopping_accuracy(plain, n_boot=10).is_empty()


def test_main_table_has_a_row_per_stopping_for_halting_trials(summary):
    t = tables.main_results(summary)
    rows = t.frame.filter(recipe="par", backbone="tiny-qwen2")
    assert rows.get_column("stopping").to_list() == ["R = ⌈d/c⌉", "own halting", "best R"]
    own, best = rows.row(1, named=True), rows.row(2, named=True)
    assert (own["32 (4×)"], own["G"]) == ("46.7 ± 15.3 (3)", "5.33 ± 2.31 (3)")
    assert (best["64 (8×)"], best["G"]) == ("53.3 ± 25.2 (3)", "≥ 8.00 ± 0.00 (3)")
    assert set(t.frame.filter(pl.col("recipe") != "par").get_column("stopping")) == {"R = ⌈d/c⌉"}
    assert any(n.startswith("Stopping:") for n in t.notes) and tables._n_labels(t) == 3
    # without halting trials the table is as before: no stopping column, no note
    plain = dataclasses.replace(summary, stopping_accuracy=summary.stopping_accuracy.clear(),
                                stopping_G=summary.stopping_G.clear())
    p = tables.main_results(plain)
    assert "stopping" not in p.frame.columns and p.frame.height == 5
    assert not any(n.startswith("Stopping:") for n in p.notes)


def test_the_curve_is_own_halting_where_a_configuration_has_it(summary):
    curves = aggregate.curve_stats(summary.accuracy, summary.stopping_accuracy)
    assert curves.height == summary.accuracy.height  # one curve per configuration
    halting = curves.filter(recipe="par", backbone="tiny-qwen2")
    assert set(halting.get_column("stopping")) == {aggregate.OWN_HALTING}
    assert halting.get_column("mean").to_list() == pytest.approx([1.0, 0.7, 0.4666666667, 0.2333333333])
    rest = curves.filter((pl.col("recipe") != "par") | (pl.col("backbone") != "tiny-qwen2"))
    assert set(rest.get_column("stopping")) == {aggregate.CEIL}
    assert rest.drop("stopping").sort("recipe", "backbone", "depth").equals(
        summary.accuracy.join(rest.select(aggregate.GROUP).unique(), on=aggregate.GROUP, how="semi",
                              nulls_equal=True).sort("recipe", "backbone", "depth"))
    none = aggregate.curve_stats(summary.accuracy, summary.stopping_accuracy.clear())
    assert set(none.get_column("stopping")) == {aggregate.CEIL} and none.height == summary.accuracy.height
    assert plots.curve_label("par", aggregate.OWN_HALTING) == "par (own halting)"
    assert plots.curve_label("par", aggregate.CEIL) == plots.curve_label("par", None) == "par"


def test_the_depth_axis_labels_the_multiples_and_thins_a_fine_grid():
    """The accuracy figure labels 1×, 2×, 4×, 8× of d_train and enough other depths that no two labels sit closer
    than MIN_LABEL_OCTAVES on its log2 axis (the main job's 25-depth grid overprinted when every depth was labelled)."""
    grid = [*range(16, 33), 38, 45, 54, 64, 76, 91, 108, 128]
    labelled = plots.labelled_depths(grid, 16)
    assert {16, 32, 64, 128} <= set(labelled) and set(labelled) <= set(grid)
    gaps = [math.log2(b / a) for a, b in zip(labelled, labelled[1:])]
    assert min(gaps) >= plots.MIN_LABEL_OCTAVES and len(labelled) == 7
    assert plots.labelled_depths([8, 16, 32, 64], 8) == [8, 16, 32, 64]  # a coarse grid keeps every label
    assert plots.labelled_depths(grid, None)[0] == 16 and len(plots.labelled_depths(grid, None)) == 7


def test_iteration_stats(summary):
    it = summary.iterations
    r = _row(it, k=2)
    assert (r["rms_n"], r["rms_mean"], r["rms_min"], r["rms_max"]) == \
        (3, pytest.approx(1.2), pytest.approx(1.0), pytest.approx(1.4))
    assert r["halt_prob_mean"] == pytest.approx(0.5) and r["halt_prob_std"] == 0.0


def test_duplicate_seeds_are_flagged(frames):
    doubled = pl.concat([frames.trials, frames.trials.head(1).with_columns(pl.lit("dup").alias("run_id"))])
    warns = aggregate.consistency_warnings(doubled)
    assert len(warns) == 1 and "seed 0 appears in 2 FINISHED trials" in warns[0] and "--parent-run" in warns[0]


def test_all_failed_configuration_keeps_a_row(frames):
    t = frames.trials.with_columns(
        pl.when(pl.col("recipe") == "no_anchor").then(pl.lit("FAILED")).otherwise("status").alias("status"))
    f = load.frames_from_trials(t)
    g = aggregate.g_summary(aggregate.extrapolation_per_seed(f.acc), f.trials)
    r = _row(g, recipe="no_anchor")
    assert (r["n"], r["n_excluded"], r["G_mean"]) == (0, 1, None)
    assert "no_anchor | tiny-qwen2 | R = ⌈d/c⌉ | – | – | – | – | –" in tables.to_markdown(
        tables.main_results(aggregate.summarize(f, n_boot=10)))


# ---------------------------------------------------------------------------------------------------------------------
# tables


def test_main_table_cells(summary):
    t = tables.main_results(summary)
    assert t.frame.columns == ["recipe", "backbone", "stopping", "8 (1×)", "16 (2×)", "32 (4×)", "64 (8×)", "G",
                               tables.G_INTERP]
    assert t.frame.get_column("recipe").to_list()[:4] == ["par"] * 4  # the method first
    r = _row(t.frame, recipe="par", backbone="tiny-qwen2", stopping="R = ⌈d/c⌉")
    assert r["8 (1×)"] == "100.0 ± 0.0 (3)"
    assert r["32 (4×)"] == "56.7 ± 15.3 (3)"
    assert r["64 (8×)"] == "33.3 ± 25.2 (3)"
    assert r["G"] == "≥ 6.67 ± 2.31 (3)"
    assert _row(t.frame, recipe="par", backbone="tiny-qwen3")["G"] == "5.00 ± 4.24 (2)"
    assert _row(t.frame, recipe="final_answer", backbone="tiny-qwen3")["G"] == "1.67 ± 0.58 (3)"
    assert _row(t.frame, recipe="no_anchor", backbone="tiny-qwen2")["8 (1×)"] == "90.0 (1)"
    assert any("1 FAILED, 1 RUNNING" in n for n in t.notes)
    md = tables.to_markdown(t)
    assert "| par | tiny-qwen2 | R = ⌈d/c⌉ | 100.0 ± 0.0 (3) | 80.0 ± 10.0 (3) | 56.7 ± 15.3 (3) | 33.3 ± 25.2 (3) | " \
           "≥ 6.67 ± 2.31 (3) |" in md
    tex = tables.to_latex(t)
    assert r"56.7 $\pm$ 15.3 (3)" in tex and r"$\geq$ 6.67" in tex and r"32 (4$\times$)" in tex
    assert r"final\_answer" in tex and r"\toprule" in tex
    csv = pl.read_csv(tables.to_csv(t).encode())
    assert csv.columns == t.frame.columns and csv.height == 7  # 5 configurations, the halting one 3 times


def test_other_layouts(summary):
    scale = tables.scale_results(summary)  # 16× not tested: the largest tested multiple, 8×
    assert scale.title == "Backbones at the largest tested multiple, 8× the train length (swap_s5)"
    r = _row(scale.frame, recipe="par", backbone="tiny-qwen3")
    assert (r["test depth"], r["accuracy (%)"], r["G"]) == ("64 (8×)", "27.5 ± 24.7 (2)", "5.00 ± 4.24 (2)")
    assert scale.frame.get_column("backbone").to_list() == ["tiny-qwen2"] * 3 + ["tiny-qwen3"] * 2
    assert _row(tables.scale_results(summary, multiple=2).frame, recipe="par", backbone="tiny-qwen2")[
        "test depth"] == "16 (2×)"
    halting = tables.halting_results(summary)
    r = _row(halting.frame, **{"test depth": "32 (4×)"})
    assert (r["halting (%)"], r["oracle (%)"], r["oracle − halting (pts)"], r["iterations"]) == \
        ("46.7 ± 15.3 (3)", "56.7 ± 15.3 (3)", "10.0 ± 0.0 (3)", "33.0")
    ablation = tables.ablation_results(summary)
    assert ablation.frame.columns == ["backbone", "anchoring", "targets", "recipe", "accuracy at 8× (%)", "G",
                                      tables.G_INTERP]
    r = _row(ablation.frame, recipe="no_anchor")
    assert (r["anchoring"], r["targets"], r["accuracy at 8× (%)"], r["G"]) == ("False", "progress", "0.0 (1)",
                                                                            "2.00 (1)")
    assert [t.name for t in tables.build_tables(summary)] == ["main_results", "scale", "halting", "ablation"]
    # Nothing ablated (one anchoring × targets pair, e.g. a backbone-scaling sweep of par only): no ablation table.
    par_only = dataclasses.replace(summary, G=summary.G.filter(pl.col("recipe") == "par"))
    assert tables.ablation_results(par_only) is None


# ---------------------------------------------------------------------------------------------------------------------
# figures


def _assert_png(path: Path) -> None:
    assert path.exists() and path.stat().st_size > 5_000
    img = matplotlib.image.imread(path)
    assert img.shape[:2] == (480, 640)
    assert img[..., :3].std() > 0.05  # not blank


def test_figures(summary, tmp_path):
    paths = plots.plot_all(summary, tmp_path)
    assert sorted(p.name for p in paths) == sorted([
        "accuracy_swap_s5_tiny-qwen2.png", "accuracy_swap_s5_tiny-qwen3.png", "G_swap_s5.png",
        "rms_swap_s5.png", "halt_prob_swap_s5.png"])
    for p in paths:
        _assert_png(p)


# ---------------------------------------------------------------------------------------------------------------------
# end to end


def test_cli_end_to_end_logs_to_parent(store, tmp_path, capsys):
    from mlflow import MlflowClient

    out = tmp_path / "out"
    assert main(["--experiment", EXPERIMENT, "--tracking-uri", store["uri"], "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| par | tiny-qwen2 | R = ⌈d/c⌉ | 100.0 ± 0.0 (3) |" in printed and store["parent"] in printed
    assert "| par | tiny-qwen2 | own halting | 100.0 ± 0.0 (3) |" in printed  # the halting sweep's three G's
    assert "| par | tiny-qwen2 | best R | 100.0 ± 0.0 (3) |" in printed
    for name in ("main_results", "scale", "halting", "ablation"):
        for ext in ("md", "csv", "tex"):
            assert (out / f"{name}.{ext}").stat().st_size > 0
    assert "≥ 6.67 ± 2.31 (3)" in (out / "main_results.csv").read_text(encoding="utf-8")
    trials_csv = pl.read_csv(out / "trials.csv")
    assert trials_csv.height == len(TRIALS) and set(trials_csv.get_column("status")) == {"FINISHED", "FAILED",
                                                                                         "RUNNING"}
    _assert_png(out / "G_swap_s5.png")
    logged = {Path(f.path).name for f in MlflowClient(store["uri"]).list_artifacts(store["parent"], "analysis")}
    assert {"main_results.md", "main_results.tex", "G_swap_s5.png", "summary.md", "trials.csv"} <= logged
    assert logged == {p.name for p in out.iterdir()}


def test_no_log_says_so_and_empty_data_frames_write_no_file(store, tmp_path, capsys):
    from types import SimpleNamespace

    from analysis.report import _write_data

    assert main(["--experiment", EXPERIMENT, "--tracking-uri", store["uri"], "--out", str(tmp_path / "a"),
                 "--no-log"]) == 0
    assert "not logged to MLflow (--no-log)" in capsys.readouterr().out
    full = analyze(EXPERIMENT, store["parent"], store["uri"], tmp_path / "b", log_artifacts=False, n_boot=20)
    summary = full["summary"]
    no_halting = SimpleNamespace(**{k: getattr(summary, k) for k in ("accuracy", "per_seed", "G", "iterations",
                                                                     "intervals", "interval_spread")},
                                 **{k: getattr(summary, k).clear() for k in ("halting", "stopping_accuracy",
                                                                             "stopping_G")})
    names = {p.name for p in _write_data(full["frames"], no_halting, tmp_path)}
    assert not names & {"halting.csv", "accuracy_by_stopping.csv", "G_by_stopping.csv"}
    assert {"trials.csv", "accuracy.csv"} <= names
    assert ("per_seed_intervals.csv" in names) == (summary.intervals.height > 0)  # written only when logged
    assert not (tmp_path / "halting.csv").exists()
    assert {"halting.csv", "accuracy_by_stopping.csv", "G_by_stopping.csv"} <= {p.name for p in full["data"]}


def test_analyze_with_parent_run(store, tmp_path):
    result = analyze(EXPERIMENT, store["parent"], store["uri"], tmp_path, log_artifacts=False, n_boot=50)
    assert result["parent_run_id"] is None  # not logged
    assert (result["n_trials"], result["n_finished"], result["excluded"]) == (13, 11, {"FAILED": 1, "RUNNING": 1})
    assert "≥ 6.67 ± 2.31 (3)" in result["main_table"]


def test_bad_input_names_the_flag(store, tmp_path):
    with pytest.raises(load.AnalysisError, match="--experiment: no MLflow experiment named 'nope'"):
        load.load_sweep("nope", tracking_uri=store["uri"])
    with pytest.raises(load.AnalysisError, match="--parent-run: no MLflow run with id 'deadbeef'"):
        load.load_sweep(EXPERIMENT, "deadbeef", tracking_uri=store["uri"])
    trial_id = load.load_sweep(EXPERIMENT, tracking_uri=store["uri"]).trials.item(0, "run_id")
    with pytest.raises(load.AnalysisError, match="--parent-run: no trial runs"):
        load.load_sweep(EXPERIMENT, trial_id, tracking_uri=store["uri"])
    from mlflow import MlflowClient

    MlflowClient(store["uri"]).create_experiment("par_ray/empty", artifact_location=(tmp_path / "a").as_uri())
    with pytest.raises(load.AnalysisError, match="--experiment: no trial runs"):
        load.load_sweep("par_ray/empty", tracking_uri=store["uri"])
    proc = subprocess.run([sys.executable, "-m", "analysis", "--experiment", "nope", "--tracking-uri", store["uri"],
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "error: --experiment: no MLflow experiment named 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr
    missing = tmp_path / "typo" / "mlflow.db"  # a mistyped store: refused, and nothing is created there
    with pytest.raises(SystemExit) as e:
        main(["--experiment", EXPERIMENT, "--tracking-uri", f"sqlite:///{missing}", "--out", str(tmp_path / "o2")])
    assert e.value.code == 2 and not (tmp_path / "typo").exists()


def test_a_tracking_uri_or_out_folder_that_cannot_work_is_one_line_naming_the_flag(store, tmp_path, capsys):
    """A plain path for --tracking-uri (MLflow's retired file store: a traceback), a server that does not answer (four
    silent minutes of MLflow's retries, then a traceback), an --out that is a file or lies under one (a
    FileExistsError traceback after the analysis ran): one ``error:`` line each, exit 2, nothing written."""
    import socket

    (tmp_path / "afile").write_text("x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    db = store["uri"][len("sqlite:///"):]
    for args, words in (
            (["--tracking-uri", db], f"--tracking-uri: {db} is a path, not a tracking URI"),
            (["--tracking-uri", f"http://127.0.0.1:{closed}"], "--tracking-uri: no MLflow server answers at"),
            (["--tracking-uri", store["uri"], "--out", str(tmp_path / "afile")], "--out: "),
            (["--tracking-uri", store["uri"], "--out", str(tmp_path / "afile" / "x")], "--out: ")):
        with pytest.raises(SystemExit) as e:
            main(["--experiment", EXPERIMENT, "--out", str(tmp_path / "o"), *args, "--no-log"])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert e.value.code == 2 and words in err, err
    assert "afile is a file, not a folder" in err and not (tmp_path / "o").exists()


def test_bootstrap_ci_equals_plain_percentile_bootstrap():
    rng = np.random.default_rng(3)
    frame = pl.DataFrame({"g": np.repeat(np.arange(40), 5)[:-3], "x": rng.random(197)})  # the last group has 2 rows
    got = aggregate.bootstrap_ci(frame, ["g"], "x", n_boot=300, ci=0.9, seed=11).sort("g")
    for g, xs in frame.group_by("g", maintain_order=True).agg("x").iter_rows():
        n = len(xs)
        counts = np.random.default_rng([11, n]).multinomial(n, np.full(n, 1 / n), size=300)
        lo, hi = np.quantile(np.asarray(xs) @ (counts / n).T, [0.05, 0.95])
        r = _row(got, g=g)
        assert (r["ci_lo"], r["ci_hi"]) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12))


def test_help_is_plain_text(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--experiment" in out and "example:" in out
    assert ":func:" not in out and "``" not in out
