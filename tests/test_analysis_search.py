"""analysis/ after a hyperparameter search: trials of different sampled configurations are never pooled as seeds.

Records are built by hand (no MLflow): one search on swap_s5 × tiny-qwen2 × par_hold (chance 1/120, midpoint
≈ 0.504, d_train 8, test depths 8–64) with three sampled configurations — A (lr 1e-3, window 4; seeds 0, 1), B (lr 3e-4,
window 8; seed 0), C (lr 0.000423817, window 4; seeds 0, 1) — every trial at seed 0 or 1 as an Optuna search with
seeds would give. Expected numbers are computed by hand.
"""

from __future__ import annotations

import polars as pl
import pytest

from analysis import aggregate, load, plots, tables

CHANCE = 1 / 120
DEPTHS = (8, 16, 32, 64)
COMMON = {"task.train_depth": "8", "eval.depths": "8,16,32,64", "recipe.anchoring": "True",
          "recipe.targets": "progress", "recipe.hold_lambda": "8.0", "backbone.split": "None"}
# (config name, lr, window, seed, accuracies at DEPTHS)
SEARCH = [
    ("A", "0.001", "4", 0, (0.9, 0.3, 0.1, 0.0)),  # d50 16 → G 2
    ("A", "0.001", "4", 1, (0.8, 0.2, 0.0, 0.0)),  # G 2
    ("B", "0.0003", "8", 0, (1.0, 0.9, 0.8, 0.2)),  # d50 64 → G 8
    ("C", "0.000423817", "4", 0, (1.0, 0.8, 0.3, 0.1)),  # d50 32 → G 4
    ("C", "0.000423817", "4", 1, (1.0, 0.9, 0.2, 0.0)),  # G 4
]


def _record(i: int, recipe: str, backbone: str, seed: int, accs, params: dict) -> dict:
    metrics = {"chance": CHANCE, **{f"acc_d{d}": a for d, a in zip(DEPTHS, accs)}}
    return {"run_id": f"r{i}", "status": "FINISHED", "start_ms": 1000 * i, "end_ms": 1000 * i + 500,
            "tags": {"par_ray.trial_id": f"t{i}", "par_ray.recipe": recipe, "par_ray.backbone": backbone,
                     "par_ray.task": "swap_s5", "par_ray.seed": str(seed)},
            "params": {**COMMON, "train.seed": str(seed), **params}, "metrics": metrics}


@pytest.fixture(scope="module")
def search_records() -> list[dict]:
    return [_record(i, "par_hold", "tiny-qwen2", seed, accs, {"train.lr": lr, "recipe.grad_window": window})
            for i, (_, lr, window, seed, accs) in enumerate(SEARCH)]


@pytest.fixture(scope="module")
def search_summary(search_records) -> aggregate.Summary:
    return aggregate.summarize(load.frames_from_trials(load.trials_frame(search_records)), n_boot=200)


def test_config_labels_hold_the_varying_params_except_the_seed(search_records):
    labels = load.config_labels(search_records)
    assert labels == ["recipe.grad_window=4, train.lr=0.001"] * 2 + ["recipe.grad_window=8, train.lr=0.0003"] + \
        ["recipe.grad_window=4, train.lr=0.000423817"] * 2


def test_grid_sweep_has_empty_config():
    """Backbone sizes differ between backbones and anchoring between recipes, but those are fixed by the tags."""
    records = [_record(i, recipe, backbone, seed, (1.0, 0.5, 0.0, 0.0),
                       {"backbone.hidden": "64" if backbone == "tiny-qwen2" else "96",
                        "recipe.anchoring": "True" if recipe == "par" else "False"})
               for i, (recipe, backbone, seed) in enumerate(
                   (r, b, s) for r in ("par", "no_anchor") for b in ("tiny-qwen2", "tiny-qwen3") for s in (0, 1))]
    assert load.config_labels(records) == [""] * len(records)
    summary = aggregate.summarize(load.frames_from_trials(load.trials_frame(records)), n_boot=50)
    assert summary.G.height == 4 and summary.G.get_column("n").to_list() == [2, 2, 2, 2]
    assert "config" not in tables.main_results(summary).frame.columns


def test_the_cost_plan_is_not_part_of_a_config():
    """The plan's ``cost.*`` params are predictions from the config (they can differ between seeds of one
    configuration, e.g. through the prompt lengths the plan samples with the trial's seed); they never split seeds
    into separate rows."""
    records = [_record(i, "par", backbone, seed, (1.0, 0.5, 0.0, 0.0),
                       {"cost.planned_flops": f"5.{i}e+13", "cost.planned_wall_hours": f"0.4{i}"})
               for i, (backbone, seed) in enumerate((b, s) for b in ("tiny-qwen2", "tiny-qwen3") for s in (0, 1, 2))]
    assert load.config_labels(records) == [""] * len(records)
    summary = aggregate.summarize(load.frames_from_trials(load.trials_frame(records)), n_boot=50)
    assert summary.G.get_column("n").to_list() == [3, 3]


def test_each_searched_configuration_is_its_own_group(search_summary):
    g = search_summary.G
    assert g.height == 3
    by_config = {r["config"]: r for r in g.iter_rows(named=True)}
    a = by_config["recipe.grad_window=4, train.lr=0.001"]
    b = by_config["recipe.grad_window=8, train.lr=0.0003"]
    c = by_config["recipe.grad_window=4, train.lr=0.000423817"]
    assert (a["n"], a["G_mean"], a["G_std"]) == (2, 2.0, 0.0)
    assert (b["n"], b["G_mean"], b["G_std"]) == (1, 8.0, None)
    assert (c["n"], c["G_mean"], c["G_std"]) == (2, 4.0, 0.0)
    acc = search_summary.accuracy.filter(pl.col("depth") == 16)
    assert sorted(acc.get_column("mean").to_list()) == pytest.approx([0.25, 0.85, 0.9])
    assert search_summary.warnings == ()  # no "seed 0 appears in 3 FINISHED trials"


def test_search_table_lists_configurations_best_first(search_summary):
    t = tables.main_results(search_summary)
    assert t.frame.columns[:3] == ["recipe", "backbone", "config"]  # one task: in the title
    rows = t.frame.rows(named=True)
    assert [r["config"] for r in rows] == ["recipe.grad_window=8, train.lr=0.0003",
                                           "recipe.grad_window=4, train.lr=0.000424",  # shortened for display
                                           "recipe.grad_window=4, train.lr=0.001"]
    assert [r["G"] for r in rows] == ["8.00 (1)", "4.00 ± 0.00 (2)", "2.00 ± 0.00 (2)"]
    assert rows[1]["16 (2×)"] == "85.0 ± 7.1 (2)"
    assert any("config" in n for n in t.notes)
    scale = tables.scale_results(search_summary)
    assert [r["G"] for r in scale.frame.rows(named=True)] == ["8.00 (1)", "4.00 ± 0.00 (2)", "2.00 ± 0.00 (2)"]
    assert "config" in tables.to_markdown(t) and "config" in tables.to_latex(t)


def test_ties_in_G_are_broken_by_the_longest_depth():
    records = [_record(0, "par", "tiny-qwen2", 0, (1.0, 0.9, 0.9, 0.1), {"train.lr": "0.001"}),
               _record(1, "par", "tiny-qwen2", 0, (1.0, 0.9, 0.9, 0.3), {"train.lr": "0.002"})]
    summary = aggregate.summarize(load.frames_from_trials(load.trials_frame(records)), n_boot=50)
    assert tables.main_results(summary).frame.get_column("config").to_list() == ["train.lr=0.002", "train.lr=0.001"]


def test_config_label_shortens_long_decimals_only():
    assert tables.config_label("") == ""
    assert tables.config_label("backbone.split=1,4,1, recipe.hold_lambda=7.123456, train.lr=1.5e-05, x=8.0") == \
        "backbone.split=1,4,1, recipe.hold_lambda=7.12, train.lr=1.5e-05, x=8.0"


def test_search_figures_have_one_series_per_configuration(search_summary, tmp_path):
    rows = plots.with_series(search_summary.G)
    assert sorted(rows.get_column("series").to_list()) == [
        "par_hold · recipe.grad_window=4, train.lr=0.000424", "par_hold · recipe.grad_window=4, train.lr=0.001",
        "par_hold · recipe.grad_window=8, train.lr=0.0003"]
    paths = plots.plot_all(search_summary, tmp_path)
    assert {p.name for p in paths} == {"accuracy_swap_s5_tiny-qwen2.png", "G_swap_s5.png"}


def test_a_trial_asha_stopped_is_kept_apart_from_the_aggregates_and_named_so(search_records):
    """ASHA stopped a fourth configuration at its first rung: its run is FINISHED with the tag
    ``par_ray.stopped_early`` (as Ray's MLflow callback ends such a trial; KILLED read as a crash in the UI). Its
    metrics are from step 2, so no seed of the aggregates (its configuration counts it excluded), and the note names
    it as stopped early, not KILLED."""
    stopped = _record(9, "par_hold", "tiny-qwen2", 0, (1.0, 1.0, 1.0, 1.0), {"train.lr": "0.01",
                                                                             "recipe.grad_window": "4"})
    stopped["tags"]["par_ray.stopped_early"] = "step 2 of 4"
    trials = load.trials_frame([*search_records, stopped])
    assert trials.filter(pl.col("run_id") == "r9").select("status", "stopped_early").row(0) == (
        load.STOPPED_EARLY, "step 2 of 4")
    assert set(trials.filter(pl.col("run_id") != "r9").get_column("status")) == {"FINISHED"}
    summary = aggregate.summarize(load.frames_from_trials(trials), n_boot=50)
    g = {r["config"]: r for r in summary.G.iter_rows(named=True)}
    assert [(r["n"], r["n_excluded"]) for c, r in g.items() if "train.lr=0.01" in c] == [(0, 1)]
    assert sorted(r["G_mean"] for c, r in g.items() if "train.lr=0.01" not in c) == [2.0, 4.0, 8.0]
    assert dict(summary.excluded.iter_rows()) == {load.STOPPED_EARLY: 1}
    t = tables.main_results(summary)
    assert "Excluded from the aggregates (kept in trials.csv): 1 stopped early (ASHA) trial(s)." in t.notes
