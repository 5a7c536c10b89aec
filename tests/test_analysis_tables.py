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
    assert t.frame.columns == ["task", "recipe", "backbone", "1×", "2×", "4×", "8×", "G", tables.COT_COLUMN]
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
                               tables.COT_COLUMN]
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
    assert t.frame.columns == ["recipe", "backbone", "test depth", "halting (%)", "oracle (%)",
                               "oracle − halting (pts)", "iterations", "never halted (%)", "R − ⌈d/c⌉",
                               "spread of R"]
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
    assert _row(t.frame, config="eval.halt_k=4")["never halted (%)"] == "10.0 (1)"
    # a run that logged only the first halting metrics (no never_halted / R − ⌈d/c⌉): those cells are "–"
    old = [_record(0, "par_halt", "swap_s5", 0, 4, {**_acc(SWAP, (1, 1, 1, 1)), "halt_acc_d8": 0.5,
                                                    "oracle_acc_d8": 0.75, "halt_iter_d8": 9.0})]
    r = tables.halting_results(_summary(old)).frame.row(0, named=True)
    assert (r["oracle − halting (pts)"], r["never halted (%)"], r["R − ⌈d/c⌉"], r["spread of R"]) == (
        "25.0 (1)", "–", "–", "–")


@pytest.mark.parametrize("kind", load.DEPTH_KINDS)
def test_every_depth_metric_kind_is_read_into_the_long_frame(kind):
    frames = load.frames_from_trials(load.trials_frame([_record(0, "par", "swap_s5", 0, 4, {f"{kind}_d16": 0.25})]))
    assert _row(frames.acc, depth=16)[kind] == 0.25
