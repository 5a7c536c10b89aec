"""analysis tables of issues 11 and 12 on synthetic runs (no MLflow): the main-results table across tasks with their
own train depths and the CoT cost column, and the halting table's oracle-stopping, never-halted and R − ⌈d/c⌉
columns, including one row per stopping rule of sweeps/halting.py."""

from __future__ import annotations

import polars as pl
import pytest

from analysis import aggregate, load, tables


def _record(i: int, recipe: str, task: str, seed: int, train_depth: int, metrics: dict, params: dict | None = None,
            status: str = "FINISHED", chance: float = 1 / 120) -> dict:
    return {
        "run_id": f"r{i}", "status": status, "start_ms": 1_000 * i, "end_ms": 1_000 * i + 500,
        "tags": {"par_ray.recipe": recipe, "par_ray.task": task, "par_ray.backbone": "tiny-qwen2",
                 "par_ray.seed": str(seed), "par_ray.trial_id": f"t{i}"},
        "params": {"task.train_depth": str(train_depth), "train.seed": str(seed), **(params or {})},
        "metrics": {"chance": chance, **metrics},
    }


def _summary(records: list[dict]) -> aggregate.Summary:
    return aggregate.summarize(load.frames_from_trials(load.trials_frame(records)), n_boot=10)


def _row(frame: pl.DataFrame, **keys) -> dict:
    rows = frame.filter(**keys).to_dicts()
    assert len(rows) == 1, (keys, rows)
    return rows[0]


def _acc(depths, accs) -> dict:
    return {f"acc_d{d}": a for d, a in zip(depths, accs)}


SWAP = (4, 8, 16, 32)  # d_train 4: 1×, 2×, 4×, 8×
REACH = (8, 16, 32, 64)  # d_train 8: 1×, 2×, 4×, 8×


def _main_records() -> list[dict]:
    return [
        _record(0, "par", "swap_s5", 0, 4, _acc(SWAP, (1.0, 0.9, 0.8, 0.6))),
        _record(1, "par", "swap_s5", 1, 4, _acc(SWAP, (1.0, 0.7, 0.6, 0.4))),
        _record(2, "cot", "swap_s5", 0, 4, {**_acc(SWAP, (1.0, 0.5, 0.1, 0.0)),
                                            **{f"cot_tokens_d{d}": 2 * d + 1 for d in SWAP}}),
        _record(3, "cot", "swap_s5", 1, 4, {**_acc(SWAP, (1.0, 0.3, 0.1, 0.0)),
                                            **{f"cot_tokens_d{d}": 2 * d + 3 for d in SWAP}}),
        _record(4, "untied", "swap_s5", 0, 4, _acc(SWAP, (1.0, 0.2, 0.0, 0.0))),
        _record(5, "par", "reachability", 0, 8, _acc(REACH, (0.9, 0.6, 0.5, 0.5)), chance=0.5),
    ]


def test_main_results_rows_are_recipes_columns_are_multiples_when_tasks_differ_in_d_train():
    t = tables.main_results(_summary(_main_records()))
    assert t.frame.columns == ["task", "recipe", "backbone", "1×", "2×", "4×", "8×", "G", tables.G_INTERP,
                               tables.COT_COLUMN]
    assert t.frame.select("task", "recipe").rows() == [("reachability", "par"), ("swap_s5", "par"),
                                                       ("swap_s5", "cot"), ("swap_s5", "untied")]
    par = _row(t.frame, task="swap_s5", recipe="par")
    assert (par["2×"], par["8×"], par[tables.COT_COLUMN]) == ("80.0 ± 14.1 (2)", "50.0 ± 14.1 (2)", "–")
    cot = _row(t.frame, recipe="cot")
    assert (cot["2×"], cot[tables.COT_COLUMN]) == ("40.0 ± 14.1 (2)", "10 / 18 / 34 / 66")  # mean of 2d+1, 2d+3
    assert _row(t.frame, task="reachability")["1×"] == "90.0 (1)"
    assert any("multiples of each row's own d_train" in n for n in t.notes)
    assert any(n.startswith(tables.COT_COLUMN) and "grows with d" in n for n in t.notes)


def test_main_results_keeps_depth_labels_for_one_train_depth_and_hides_cot_when_absent():
    records = [r for r in _main_records() if r["tags"]["par_ray.task"] == "swap_s5"]
    t = tables.main_results(_summary(records))
    assert t.frame.columns == ["recipe", "backbone", "4 (1×)", "8 (2×)", "16 (4×)", "32 (8×)", "G",
                               tables.G_INTERP, tables.COT_COLUMN]
    no_cot = tables.main_results(_summary([r for r in records if r["tags"]["par_ray.recipe"] != "cot"]))
    assert tables.COT_COLUMN not in no_cot.frame.columns
    assert not any(n.startswith(tables.COT_COLUMN) for n in no_cot.notes)


def _halting_metrics(d: int, halt: float, oracle: float, never: float, dR: float, spread: float) -> dict:
    return {f"halt_acc_d{d}": halt, f"oracle_acc_d{d}": oracle, f"halt_iter_d{d}": d + dR,
            f"never_halted_d{d}": never, f"halt_dR_mean_d{d}": dR, f"halt_dR_std_d{d}": spread}


def test_halting_table_shows_oracle_stopping_never_halted_and_R_minus_oracle():
    records = [
        _record(0, "par_halt", "swap_s5", 0, 4, {**_acc(SWAP, (1, 1, 1, 1)),
                                                 **_halting_metrics(8, 0.9, 1.0, 0.0, 1.0, 0.5),
                                                 **_halting_metrics(32, 0.4, 0.6, 0.25, 3.0, 2.0)}),
        _record(1, "par_halt", "swap_s5", 1, 4, {**_acc(SWAP, (1, 1, 1, 1)),
                                                 **_halting_metrics(8, 0.7, 1.0, 0.0, 3.0, 1.5),
                                                 **_halting_metrics(32, 0.6, 0.6, 0.75, 5.0, 4.0)}),
    ]
    t = tables.halting_results(_summary(records))
    assert t.frame.columns == ["recipe", "backbone", "rule", "test depth", "halting (%)", "oracle (%)",
                               "oracle − halting (pts)", "iterations", "never halted (%)", "R − ⌈d/c⌉",
                               "spread of R"]
    assert set(t.frame.get_column("rule")) == {tables.MISSING}  # no eval.halt_* params logged: rule unknown
    r = _row(t.frame, **{"test depth": "32 (8×)"})
    assert (r["halting (%)"], r["oracle (%)"], r["oracle − halting (pts)"]) == (
        "50.0 ± 14.1 (2)", "60.0 ± 0.0 (2)", "10.0 ± 14.1 (2)")
    assert (r["iterations"], r["never halted (%)"], r["R − ⌈d/c⌉"], r["spread of R"]) == (
        "36.0", "50.0 ± 35.4 (2)", "4.0 ± 1.4 (2)", "3.0")
    assert _row(t.frame, **{"test depth": "8 (2×)"})["never halted (%)"] == "0.0 ± 0.0 (2)"
    note = t.notes[0]
    assert "oracle stopping R = ⌈d/c⌉" in note and "best iteration" not in note


def test_halting_table_has_one_row_per_stopping_rule_and_tolerates_older_runs():
    rules = [(6, 8, 0.5), (4, 8, 0.5)]
    records = [
        _record(i, "par_halt", "swap_s5", 0, 4,
                {**_acc(SWAP, (1, 1, 1, 1)), **_halting_metrics(8, 0.9 - 0.1 * i, 1.0, 0.1 * i, 1.0, 0.5)},
                params={"eval.halt_k": str(k), "eval.halt_n": str(n), "eval.halt_tau": str(tau)})
        for i, (k, n, tau) in enumerate(rules)
    ]
    t = tables.halting_results(_summary(records))
    assert t.frame.get_column("config").to_list() == ["eval.halt_k=4", "eval.halt_k=6"]
    assert t.frame.get_column("rule").to_list() == ["4 of 8, τ 0.5", "6 of 8, τ 0.5"]
    assert _row(t.frame, config="eval.halt_k=4")["never halted (%)"] == "10.0 (1)"
    # a run that logged only the first halting metrics (no never_halted / R − ⌈d/c⌉): those cells are "–"
    old = [_record(0, "par_halt", "swap_s5", 0, 4, {**_acc(SWAP, (1, 1, 1, 1)), "halt_acc_d8": 0.5,
                                                    "oracle_acc_d8": 0.75, "halt_iter_d8": 9.0})]
    r = tables.halting_results(_summary(old)).frame.row(0, named=True)
    assert (r["oracle − halting (pts)"], r["never halted (%)"], r["R − ⌈d/c⌉"], r["spread of R"]) == (
        "25.0 (1)", "–", "–", "–")


RULES_PARAMS = {"eval.halt_k": "6", "eval.halt_n": "8", "eval.halt_tau": "0.5", "eval.halt_rules": "4/8/0.5,6/8/0.3"}


def _two_rule_metrics(d: int, seed: int) -> dict:
    """One pass with the primary rule 6 of 8, τ 0.5 and the extras 4 of 8, τ 0.5 and 6 of 8, τ 0.3 (as
    ``par_ray.evaluation.halting_metrics`` names them): the looser rules stop earlier and lose accuracy."""
    out = _halting_metrics(d, 0.8 - 0.1 * seed, 0.9, 0.1, 1.0, 0.5)
    for suffix, halt, never, dR in (("k4n8t0.5", 0.6 - 0.1 * seed, 0.0, -1.0), ("k6n8t0.3", 0.5, 0.0, -2.0)):
        out |= {f"halt_acc_d{d}_{suffix}": halt, f"halt_gap_d{d}_{suffix}": 100 * (0.9 - halt),
                f"halt_iter_d{d}_{suffix}": d + dR, f"never_halted_d{d}_{suffix}": never,
                f"halt_dR_mean_d{d}_{suffix}": dR, f"halt_dR_std_d{d}_{suffix}": 0.25}
    return out


def _two_rule_records() -> list[dict]:
    return [_record(i, "par_halt", "swap_s5", seed, 4,
                    {**_acc(SWAP, (1, 1, 0.9, 0.8)), **_two_rule_metrics(8, seed), **_two_rule_metrics(32, seed)},
                    params={**RULES_PARAMS, "train.seed": str(seed)})
            for i, seed in enumerate((0, 1))]


def test_halting_table_has_one_row_per_rule_of_one_run_and_depth():
    records = _two_rule_records()
    frames = load.frames_from_trials(load.trials_frame(records))
    assert frames.acc.columns == [*load._ID_COLUMNS, "depth", *load.DEPTH_KINDS]  # the accuracy frame is unchanged
    assert frames.acc.height == 2 * len(SWAP) and frames.acc.get_column("halt_acc").drop_nulls().len() == 4
    h = frames.halting
    assert h.height == 2 * 3 * 2  # runs × rules × depths
    assert set(h.get_column("rule")) == {"6 of 8, τ 0.5", "4 of 8, τ 0.5", "6 of 8, τ 0.3"}
    assert _row(h, run_id="r1", rule="6 of 8, τ 0.3", depth=32)["oracle_acc"] == 0.9  # the run's oracle stopping
    assert _row(h, run_id="r0", rule="6 of 8, τ 0.5", depth=8)["primary"]
    assert not _row(h, run_id="r0", rule="4 of 8, τ 0.5", depth=8)["primary"]

    t = tables.halting_results(_summary(records))
    assert t.frame.columns[:3] == ["recipe", "backbone", "rule"]  # no config column: both seeds share the params
    assert t.frame.select("rule", "test depth").rows() == [
        ("4 of 8, τ 0.5", "8 (2×)"), ("4 of 8, τ 0.5", "32 (8×)"), ("6 of 8, τ 0.3", "8 (2×)"),
        ("6 of 8, τ 0.3", "32 (8×)"), ("6 of 8, τ 0.5", "8 (2×)"), ("6 of 8, τ 0.5", "32 (8×)")]
    loose = _row(t.frame, rule="4 of 8, τ 0.5", **{"test depth": "32 (8×)"})
    assert (loose["halting (%)"], loose["oracle (%)"], loose["oracle − halting (pts)"]) == (
        "55.0 ± 7.1 (2)", "90.0 ± 0.0 (2)", "35.0 ± 7.1 (2)")
    assert (loose["iterations"], loose["never halted (%)"], loose["R − ⌈d/c⌉"], loose["spread of R"]) == (
        "31.0", "0.0 ± 0.0 (2)", "-1.0 ± 0.0 (2)", "0.2")
    paper = _row(t.frame, rule="6 of 8, τ 0.5", **{"test depth": "32 (8×)"})
    assert (paper["halting (%)"], paper["never halted (%)"]) == ("75.0 ± 7.1 (2)", "10.0 ± 0.0 (2)")
    assert "k of n, τ" in t.notes[0]
    # the main table reads only the accuracy frame: R = ⌈d/c⌉ and the primary rule's own halting (no row per extra
    # rule; no best-R row, as these runs logged no best_acc_d{D})
    main = tables.main_results(_summary(records)).frame
    assert main.get_column("stopping").to_list() == ["R = ⌈d/c⌉", "own halting"]
    assert _row(main, stopping="own halting")["32 (8×)"] == "75.0 ± 7.1 (2)"


def test_halting_rule_labels_survive_an_mlflow_style_string_round_trip_of_tau():
    records = _two_rule_records()
    records[0]["metrics"] |= {"halt_acc_d8_k6n8t1e-05": 0.1, "halt_acc_d8_k2n4t0.25": 0.2}
    h = load.frames_from_trials(load.trials_frame(records)).halting
    assert _row(h, rule="6 of 8, τ 0.00001", depth=8)["halt_tau"] == 1e-05
    assert _row(h, rule="2 of 4, τ 0.25", depth=8)["halt_acc"] == 0.2


@pytest.mark.parametrize("kind", load.DEPTH_KINDS)
def test_every_depth_metric_kind_is_read_into_the_long_frame(kind):
    frames = load.frames_from_trials(load.trials_frame([_record(0, "par", "swap_s5", 0, 4, {f"{kind}_d16": 0.25})]))
    assert _row(frames.acc, depth=16)[kind] == 0.25


def _pending_metrics(d: int, seed: int) -> dict:
    """The last operation's pending signal for the rules of :func:`_two_rule_metrics`, named as
    ``par_ray.evaluation.halting_metrics`` names them (``_pending`` last): it stops at ⌈d/c⌉ under the primary rule."""
    out = {}
    for tail, halt, never, dR in (("", 0.85 - 0.1 * seed, 0.0, 0.0), ("_k4n8t0.5", 0.7, 0.05, -0.5),
                                  ("_k6n8t0.3", 0.6, 0.0, -1.0)):
        t = f"_d{d}{tail}_pending"
        out |= {f"halt_acc{t}": halt, f"halt_gap{t}": 100 * (0.9 - halt), f"halt_iter{t}": d + dR,
                f"never_halted{t}": never, f"halt_dR_mean{t}": dR, f"halt_dR_std{t}": 0.1}
    return out


def test_halting_table_shows_the_pending_signal_as_more_rows_only_when_logged():
    records = _two_rule_records()
    for r in records:
        r["metrics"] |= _pending_metrics(8, int(r["params"]["train.seed"])) | _pending_metrics(
            32, int(r["params"]["train.seed"]))
    frames = load.frames_from_trials(load.trials_frame(records))
    assert frames.acc.columns == [*load._ID_COLUMNS, "depth", *load.DEPTH_KINDS]
    assert frames.acc.height == 2 * len(SWAP) and frames.acc.get_column("halt_acc").drop_nulls().len() == 4
    h = frames.halting
    assert h.height == 2 * 2 * 3 * 2  # runs × signals × rules × depths
    assert h.filter(run_id="r0").get_column("signal").to_list() == ["query"] * 6 + ["pending"] * 6
    pend = _row(h, run_id="r1", signal="pending", rule="6 of 8, τ 0.5", depth=8)
    assert pend["primary"] and pend["halt_acc"] == pytest.approx(0.75) and pend["oracle_acc"] == 0.9
    loose = _row(h, run_id="r0", signal="pending", rule="4 of 8, τ 0.5", depth=32)
    assert not loose["primary"] and (loose["halt_k"], loose["halt_n"], loose["halt_tau"]) == (4, 8, 0.5)
    assert (loose["halt_acc"], loose["never_halted"], loose["halt_dR_mean"], loose["oracle_acc"]) == (
        0.7, 0.05, -0.5, 0.9)
    assert _row(h, run_id="r0", signal="query", rule="6 of 8, τ 0.5", depth=8)["halt_acc"] == 0.8  # unchanged

    summary = _summary(records)
    g = _row(summary.halting, signal="pending", rule="6 of 8, τ 0.5", depth=32)
    assert (g["n"], g["halt_mean"], g["gap_mean"]) == (2, pytest.approx(0.8), pytest.approx(0.1))
    t = tables.halting_results(summary)
    assert t.frame.columns == ["recipe", "backbone", "signal", "rule", "test depth", "halting (%)", "oracle (%)",
                               "oracle − halting (pts)", "iterations", "never halted (%)", "R − ⌈d/c⌉",
                               "spread of R"]
    by_rule = [("4 of 8, τ 0.5", "8 (2×)"), ("4 of 8, τ 0.5", "32 (8×)"), ("6 of 8, τ 0.3", "8 (2×)"),
               ("6 of 8, τ 0.3", "32 (8×)"), ("6 of 8, τ 0.5", "8 (2×)"), ("6 of 8, τ 0.5", "32 (8×)")]
    assert t.frame.select("signal", "rule", "test depth").rows() == (
        [("query", *r) for r in by_rule] + [("pending", *r) for r in by_rule])
    paper = _row(t.frame, signal="pending", rule="6 of 8, τ 0.5", **{"test depth": "32 (8×)"})
    assert (paper["halting (%)"], paper["oracle (%)"], paper["oracle − halting (pts)"]) == (
        "80.0 ± 7.1 (2)", "90.0 ± 0.0 (2)", "10.0 ± 7.1 (2)")
    assert (paper["iterations"], paper["never halted (%)"], paper["R − ⌈d/c⌉"], paper["spread of R"]) == (
        "32.0", "0.0 ± 0.0 (2)", "0.0 ± 0.0 (2)", "0.1")
    query = _row(t.frame, signal="query", rule="6 of 8, τ 0.5", **{"test depth": "32 (8×)"})
    assert query["halting (%)"] == "75.0 ± 7.1 (2)"  # as in the table without the pending signal
    assert any("pending" in n and "§14" in n for n in t.notes)

    # without pending metrics: no signal column, no pending note, every row the query signal's
    plain_summary = _summary(_two_rule_records())
    assert set(plain_summary.halting.get_column("signal")) == {"query"}
    plain = tables.halting_results(plain_summary)
    assert "signal" not in plain.frame.columns and not any("pending" in n for n in plain.notes)
    assert plain.frame.rows() == t.frame.filter(signal="query").drop("signal").rows()


def test_fine_grid_main_table_shows_the_power_of_two_columns_and_the_interpolated_G():
    from par_ray.presets import fine_depths

    grid = fine_depths(4, 32)  # 4, 5, …, 8, 10, 11, 13, 16, 19, 23, 27, 32

    def curve(acc_11: float, acc_after: float) -> dict:
        """1.0 below 11, ``acc_11`` at 11 (above the midpoint), ``acc_after`` from 13 on (below it): d50 = 13."""
        return _acc(grid, [1.0 if d < 11 else acc_11 if d == 11 else acc_after for d in grid])

    records = [_record(0, "par", "swap_s5", 0, 4, curve(0.9, 0.1)), _record(1, "par", "swap_s5", 1, 4, curve(0.6, 0.2))]
    summary = _summary(records)
    per_seed = summary.per_seed.sort("seed")
    mid = (1 / 120 + 1) / 2
    want = [11 + 2 * (0.9 - mid) / 0.8, 11 + 2 * (0.6 - mid) / 0.4]
    assert per_seed.get_column("d50").to_list() == [13, 13]
    assert per_seed.get_column("d50_interp").to_list() == pytest.approx(want)
    t = tables.main_results(summary)
    assert t.frame.columns == ["recipe", "backbone", "4 (1×)", "8 (2×)", "16 (4×)", "32 (8×)", "G", tables.G_INTERP]
    r = t.frame.row(0, named=True)
    assert r["G"] == "3.25 ± 0.00 (2)"
    mean = sum(want) / 2 / 4
    assert r[tables.G_INTERP].startswith(f"{mean:.2f} ± ")
    assert any(n.startswith(tables.G_INTERP) for n in t.notes) and any("Fine grid" in n for n in t.notes)


def _interval_metrics(lo, hi, ilo, ihi, hi_censored=False, stopping="") -> dict:
    infix = f"_{stopping}" if stopping else ""
    out = {f"G{infix}_lo": lo, f"G{infix}_hi": hi, f"G{infix}_interp_lo": ilo, f"G{infix}_interp_hi": ihi,
           f"G{infix}_hi_censored": float(hi_censored), f"d50{infix}_lo": lo * 4}
    return out


def test_g_intervals_table_shows_each_trial_beside_the_seed_spread():
    """Issue 37: each trial's G and interpolated G with the 95 % intervals it logged, then the configuration's seed
    spread (mean ± std) beside the intervals' mean width; a trial without an interval is left out of it."""
    records = [
        _record(0, "par", "swap_s5", 0, 4, {**_acc(SWAP, (1.0, 0.9, 0.4, 0.1)), **_interval_metrics(1.5, 2.0, 1.6, 1.9)}),
        _record(1, "par", "swap_s5", 1, 4, {**_acc(SWAP, (1.0, 0.9, 0.8, 0.6)),
                                            **_interval_metrics(4.0, 8.0, 6.5, 8.0, hi_censored=True)}),
        _record(2, "untied", "swap_s5", 0, 4, _acc(SWAP, (1.0, 0.2, 0.0, 0.0))),  # logged no interval
    ]
    summary = _summary(records)
    per_trial = summary.intervals
    assert per_trial.get_column("run_id").to_list() == ["r0", "r1"]
    r1 = _row(per_trial, run_id="r1")
    assert r1["censored"] and r1["G"] == 8.0 and r1["G_hi_censored"] and not r1["G_lo_censored"]
    spread = _row(summary.interval_spread, recipe="par")
    assert spread["n"] == 2 and spread["G_mean"] == pytest.approx((4.0 + 8.0) / 2)  # G recomputed: 16/4, ≥ 32/4
    assert spread["G_width_mean"] == pytest.approx((0.5 + 4.0) / 2) and spread["lower_bound"]
    t = tables.interval_results(summary)
    assert t.frame.columns == ["recipe", "backbone", "seed", "G", tables.G_INTERVAL, tables.G_INTERP,
                               tables.G_INTERP_INTERVAL]
    assert t.frame.drop("recipe", "backbone").rows() == [
        ("0", "4.00", "[1.50, 2.00]", f"{_row(per_trial, run_id='r0')['G_interp']:.2f}", "[1.60, 1.90]"),
        ("1", "≥ 8.00", "[4.00, ≥ 8.00]", "≥ 8.00", "[6.50, ≥ 8.00]"),
        (tables.SEEDS_ROW, "≥ 6.00 ± 2.83 (2)", "width ≥ 2.25", t.frame.item(2, 5), "width ≥ 0.90"),
    ]
    assert "G_intervals" in [x.name for x in tables.build_tables(summary)]
    # no interval logged anywhere: no table
    assert tables.interval_results(_summary(records[2:])) is None


def test_g_intervals_of_a_halting_trial_have_a_row_per_stopping():
    m = {**_acc(SWAP, (1.0, 0.9, 0.4, 0.1)), **_interval_metrics(1.5, 2.0, 1.6, 1.9),
         **{f"halt_acc_d{d}": a for d, a in zip(SWAP, (1.0, 0.8, 0.3, 0.0))},
         **{f"best_acc_d{d}": a for d, a in zip(SWAP, (1.0, 0.95, 0.6, 0.2))},
         **_interval_metrics(1.0, 2.0, 1.2, 1.8, stopping="halt"), **_interval_metrics(2.0, 4.0, 2.5, 3.5,
                                                                                       stopping="best")}
    summary = _summary([_record(0, "par_halt", "swap_s5", 0, 4, m)])
    assert summary.intervals.get_column("stopping").to_list() == list(aggregate.STOPPINGS)
    t = tables.interval_results(summary)
    assert "stopping" in t.frame.columns and t.frame.height == 6  # a trial row and a seeds row per stopping
    assert _row(t.frame, stopping=aggregate.BEST_R, seed="0")[tables.G_INTERVAL] == "[2.00, 4.00]"


def _label_free_records() -> list[dict]:
    """sweeps/label_free.py's four recipes on swap_s5 at d_train 4 (par with two seeds), as its trials log them."""
    runs = [("par", "progress", "none", 0, (1.0, 0.9, 0.6, 0.3)),  # d50 32: G 8
            ("par", "progress", "none", 1, (1.0, 0.8, 0.4, 0.1)),  # d50 16: G 4
            ("final_answer", "final", "none", 0, (1.0, 0.3, 0.0, 0.0)),  # G 2
            ("psd_live", "final", "live", 0, (0.95, 0.4, 0.1, 0.0)),  # G 2
            ("psd_ema", "final", "ema", 0, (0.9, 0.6, 0.3, 0.0))]  # G 4
    return [_record(i, recipe, "swap_s5", seed, 4, _acc(SWAP, accs),
                    {"recipe.targets": targets, "recipe.distill": distill, "recipe.anchoring": "True"})
            for i, (recipe, targets, distill, seed, accs) in enumerate(runs)]


def test_label_free_table_names_each_recipes_labels_and_teacher():
    """Paper Table 5's layout: labels (every prefix / final answer only) and the PSD teacher per recipe, accuracy in
    distribution and at the largest multiple, G; labelled first, then the teachers, then no teacher."""
    summary = _summary(_label_free_records())
    t = tables.label_free_results(summary)
    assert t.name == "label_free" and t.title == "Label-free learning (swap_s5)"
    assert t.frame.columns == ["backbone", "recipe", "labels", "teacher", "accuracy at d_train (%)",
                               "accuracy at 8× (%)", "G", tables.G_INTERP]
    assert t.frame.drop("backbone", tables.G_INTERP).rows() == [
        ("par", "every prefix", "–", "100.0 ± 0.0 (2)", "20.0 ± 14.1 (2)", "6.00 ± 2.83 (2)"),
        ("psd_ema", "final answer only", "EMA of the student", "90.0 (1)", "0.0 (1)", "4.00 (1)"),
        ("psd_live", "final answer only", "live student", "95.0 (1)", "0.0 (1)", "2.00 (1)"),
        ("final_answer", "final answer only", "–", "100.0 (1)", "0.0 (1)", "2.00 (1)")]
    assert "label_free" in [x.name for x in tables.build_tables(summary)]
    assert tables._n_labels(t) == 4 and r"\label{tab:label_free}" in tables.to_latex(t)
    # the ablation table no longer shows psd_* as final_answer twins: its teacher column tells them apart
    ablation = tables.ablation_results(summary)
    assert dict(ablation.frame.select("recipe", "teacher").rows()) == {
        "par": "–", "final_answer": "–", "psd_ema": "EMA of the student", "psd_live": "live student"}


def test_no_label_free_table_without_a_distilling_recipe():
    records = [r for r in _label_free_records() if r["params"]["recipe.distill"] == "none"]
    summary = _summary(records)
    assert tables.label_free_results(summary) is None
    assert "teacher" not in tables.ablation_results(summary).frame.columns
    assert tables.label_free_results(_summary(_main_records())) is None  # runs without recipe.targets
