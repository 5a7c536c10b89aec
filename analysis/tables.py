"""Paper-layout tables from a :class:`analysis.aggregate.Summary`, rendered as Markdown, CSV and LaTeX (booktabs).

Layouts (PAR paper, §5):

- ``main_results``: rows recipe (the method or a baseline) × backbone, one column per test depth labelled with its
  multiple of the train length ("32 (4×)"; "4×" when the rows' train depths differ, e.g. tasks at their paper
  depths), then G and the interpolated G, then — when the ``cot`` baseline logged ``cot_tokens_d{D}`` — its CoT
  cost: mean generated tokens per sequence at each test depth. A configuration with a halting read-out has a row
  per stopping (``stopping``: R = ⌈d/c⌉, own halting, best R; ``analysis.aggregate.STOPPINGS``), so the halting
  sweep's printed table shows the three G's. A fine grid (more than :data:`MAX_DEPTH_COLUMNS`
  test depths, ``par_ray.presets.fine_depths``) shows its d_train × 2^k depths only; every depth is in
  ``accuracy.csv``.
- ``scale``: each backbone × recipe at 16× the train length (or, where 16× was not tested, the largest tested
  multiple), then G and the interpolated G.
- ``halting``: halting-rule accuracy, oracle-stopping accuracy (R = ⌈d/c⌉), their gap, the iterations run, the
  never-halted fraction and R − ⌈d/c⌉ (mean and spread), per stopping rule ("6 of 8, τ 0.5": the primary
  ``eval.halt_k/n/tau`` and each extra rule of ``eval.halt_rules``) and test depth; with a ``signal`` column and the
  last operation's pending signal as more rows when trials logged it (``recipe.dense_pending``).
- ``ablation``: one row per recipe with its anchoring and targets, accuracy at the largest multiple tested by every
  row, G and the interpolated G.
- ``label_free`` (when a recipe distils: ``sweeps/label_free.py``, paper Table 5): one row per recipe with the labels
  it trains on (every prefix, or the final answer only) and its prefix self-distillation teacher (EMA, live, none),
  accuracy at d_train and at the largest multiple tested by every row, G and the interpolated G.
- ``G_intervals`` (when trials logged them, issue 37): one row per trial (× stopping for halting trials) with G and
  the interpolated G, each beside its 95 % interval (a bootstrap over the trial's test sequences,
  ``par_ray.evaluation.extrapolation_interval``), then per configuration a row "seeds" with the seed spread (mean ±
  std) beside the intervals' mean width.

When the trials differ in more than task, backbone and recipe (an Optuna search: ``config`` holds the sampled knobs,
see ``analysis.load.config_labels``), every table gains a ``config`` column, one row per configuration with its own
seeds, and within a (task, recipe, backbone) the configurations are listed best first: highest mean G, then highest
mean accuracy at the longest test depth.

Every cell is "mean ± std (n)" over n seeds (sample std, ddof = 1; "mean (n)" when n = 1; "–" when nothing was
measured). Accuracies are in percent; G carries "≥" when any seed was censored (the mean is then a lower bound).
"G (interpolated)" is d50 linearly interpolated between the last test depth at or above the midpoint and the first
below, over d_train (``analysis.aggregate``): a par_ray addition beside the paper's first-crossing G.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analysis.aggregate import CEIL, GROUP, STOPPINGS, Summary
from analysis.load import STOPPED_EARLY, signal_rank

MISSING = "–"
SCALE_MULTIPLE = 16
"""Multiple of the train length reported by the ``scale`` table when tested."""
COT_COLUMN = "CoT tokens (by depth)"
"""Main-table column of the ``cot`` baseline's test-time cost (mean generated tokens per sequence at each depth)."""
FIRST_RECIPES = ("par",)
"""Recipes listed before the others (the method before its baselines and ablations)."""
MAX_DEPTH_COLUMNS = 8
"""The main table shows every test depth up to this many; a finer grid shows its d_train × 2^k depths only."""
G_INTERP = "G (interpolated)"
"""Column of the interpolated G (d50 linearly interpolated between the test depths around the midpoint)."""
G_NOTE = (f"{G_INTERP}: d50 linearly interpolated between the last test depth at or above the midpoint and the "
          "first below it, / d_train (G is the paper's first crossing on the tested grid).")
STOPPING_NOTE = ("Stopping: R = ⌈d/c⌉ reads the answer after ⌈d/c⌉ iterations; own halting, where the model's "
                 "halting read-out stops it (the primary rule eval.halt_k of eval.halt_n, τ eval.halt_tau, on P(Yes) "
                 "of the halting query; every rule: the halting table); best R, after the one R per depth (of "
                 "1…R_max) with the most test sequences right, an oracle that sees the answers. Each row's G is "
                 "that row's curve's.")


@dataclass(frozen=True)
class Table:
    """One table: string cells as printed, plus a caption and notes (exclusions, units)."""

    name: str
    """File stem, e.g. ``"main_results"``."""
    title: str
    """Caption."""
    frame: pl.DataFrame
    """All-String columns, in display order."""
    notes: tuple[str, ...] = ()
    """Sentences printed under the table."""


# --------------------------------------------------------------------------------------------------------------------
# cells and ordering


def cell(mean: float | None, std: float | None, n: int | None, *, scale: float = 1.0, digits: int = 1,
         lower_bound: bool = False) -> str:
    """``"56.7 ± 15.3 (3)"``; ``"≥ 6.67 ± 2.31 (3)"`` for a lower bound; ``"60.0 (1)"``; ``"–"`` when n is 0."""
    if not n or mean is None:
        return MISSING
    text = f"{mean * scale:.{digits}f}"
    if std is not None and not math.isnan(std):
        text += f" ± {std * scale:.{digits}f}"
    return f"{'≥ ' if lower_bound else ''}{text} ({n})"


def depth_label(depth: int, train_depth: int | None) -> str:
    """``"32 (4×)"``: a test depth with its multiple of the train length (``"32"`` when d_train is unknown)."""
    if not train_depth:
        return str(depth)
    return f"{depth} ({depth / train_depth:g}×)"


def natural_key(name: str | None) -> tuple:
    """Sort key reading the numbers in a name as numbers: qwen2.5-0.5b < qwen2.5-1.5b < qwen2.5-7b (display only)."""
    if name is None:
        return (1,)
    parts = re.split(r"(\d+(?:\.\d+)?)", name)
    return (0, *[(0, float(p), "") if i % 2 else (1, 0.0, p) for i, p in enumerate(parts)])


def display_rank(values: list, first: tuple[str, ...] = ()) -> dict:
    """``{value: position}`` for the distinct ``values``: those in ``first`` first (in that order), then the rest by
    :func:`natural_key`; a null (None) goes last."""
    ordered = sorted(set(values), key=lambda v: (v not in first, first.index(v) if v in first else 0,
                                                 natural_key(v)))
    return {v: i for i, v in enumerate(ordered)}


def ordered(frame: pl.DataFrame, by: list[str], then: tuple[str, ...] = ()) -> pl.DataFrame:
    """``frame`` sorted by ``by`` (task / backbone / recipe columns) in display order: recipes listed in
    ``FIRST_RECIPES`` first, then names in natural order; ties broken by the ``then`` columns as sorted values
    (nulls last)."""
    keys = []
    for col in by:
        rank = display_rank(frame.get_column(col).to_list(), FIRST_RECIPES if col == "recipe" else ())
        keys.append(pl.col(col).replace_strict(rank, default=len(rank), return_dtype=pl.Int64))
    return frame.sort([*keys, *then], nulls_last=True) if keys or then else frame


def config_label(config: str | None) -> str:
    """A ``config`` (``"recipe.grad_window=4, train.lr=0.000423817"``) for display: long decimals to 3 significant
    digits (``"recipe.grad_window=4, train.lr=0.000424"``); ``""`` stays ``""``."""
    def short(pair: str) -> str:
        key, sep, value = pair.partition("=")
        if sep and re.fullmatch(r"-?\d*\.\d{4,}(e[-+]?\d+)?|-?\d+(\.\d+)?e[-+]?\d+", value, re.IGNORECASE):
            value = f"{float(value):.3g}"
        return key + sep + value
    return ", ".join(short(p) for p in config.split(", ")) if config else ""


def best_first(frame: pl.DataFrame, summary: Summary, by: list[str], then: tuple = ()) -> pl.DataFrame:
    """``frame`` (GROUP columns) in display order of ``by``, configurations of one ``by`` group best first: highest
    mean G, then highest mean accuracy at the longest test depth (see the module docstring), then by label, then by
    ``then`` (column names or expressions, e.g. the rows of one configuration)."""
    g = summary.G.select(*GROUP, (-pl.col("G_mean")).alias("_neg_G"))
    acc = summary.accuracy
    longest = (acc.sort("depth").group_by(GROUP, maintain_order=True).last()
               .select(*GROUP, (-pl.col("mean")).alias("_neg_acc")))
    ranked = (frame.join(g, on=GROUP, how="left", nulls_equal=True)
              .join(longest, on=GROUP, how="left", nulls_equal=True))
    return ordered(ranked, by, then=("_neg_G", "_neg_acc", "config", *then)).drop("_neg_G", "_neg_acc")


def _label_columns(frame: pl.DataFrame, labels: list[str]) -> list[str]:
    """``labels`` without ``task`` when there is only one task (it goes in the title instead), and without ``config``
    when every trial has the same (nothing but task, backbone, recipe and seed varies)."""
    return [c for c in labels if not (c in ("task", "config") and frame.get_column(c).n_unique() <= 1)]


def _show_config(frame: pl.DataFrame) -> pl.DataFrame:
    """The ``config`` column shortened for display (:func:`config_label`)."""
    return frame.with_columns(pl.col("config").map_elements(config_label, return_dtype=pl.String))


def _task_title(frame: pl.DataFrame) -> str:
    tasks = frame.get_column("task").unique().drop_nulls().sort().to_list()
    return f" ({', '.join(tasks)})" if len(tasks) == 1 else ""


_STATUS_WORDS = {STOPPED_EARLY: "stopped early (ASHA)"}
"""How the exclusion note names a ``status`` that is not an MLflow status."""


def _exclusion_note(summary: Summary) -> tuple[str, ...]:
    if summary.excluded.is_empty():
        return ()
    parts = ", ".join(f"{r['n']} {_STATUS_WORDS.get(r['status'], r['status'])}"
                      for r in summary.excluded.iter_rows(named=True))
    return (f"Excluded from the aggregates (kept in trials.csv): {parts} trial(s).",)


def _g_cells(g: pl.DataFrame, keys: list[str] = GROUP) -> pl.DataFrame:
    """``keys`` + ``G`` and :data:`G_INTERP` cell strings."""
    def g_cell(mean: str, std: str) -> pl.Expr:
        return pl.struct(mean, std, "n", "lower_bound").map_elements(
            lambda r: cell(r[mean], r[std], r["n"], digits=2, lower_bound=r["lower_bound"]), return_dtype=pl.String)

    return g.select(*keys, g_cell("G_mean", "G_std").alias("G"),
                    g_cell("G_interp_mean", "G_interp_std").alias(G_INTERP))


def _with_stoppings(ceil: pl.DataFrame, stopping: pl.DataFrame) -> pl.DataFrame:
    """``ceil`` (a frame of R = ⌈d/c⌉: ``Summary.accuracy`` or ``Summary.G``) with ``stopping`` = :data:`CEIL`, and
    below it the other stoppings' rows of ``stopping`` (``Summary.stopping_accuracy`` / ``Summary.stopping_G``;
    ``ceil`` has the R = ⌈d/c⌉ rows of every configuration already), in ``ceil``'s columns."""
    ceil = ceil.with_columns(pl.lit(CEIL, pl.String).alias("stopping"))
    if stopping.is_empty():
        return ceil
    others = stopping.filter(pl.col("stopping") != CEIL).select(ceil.columns)
    return pl.concat([ceil, others], how="vertical_relaxed")


def _stopping_rank() -> pl.Expr:
    """Sort key of the ``stopping`` column: :data:`STOPPINGS` order."""
    return pl.col("stopping").replace_strict({s: i for i, s in enumerate(STOPPINGS)}, return_dtype=pl.Int64)


def _acc_cell_expr(prefix: str = "", scale: float = 100.0) -> pl.Expr:
    mean, std = (f"{prefix}mean", f"{prefix}std") if prefix else ("mean", "std")
    return pl.struct(mean, std, "n").map_elements(
        lambda r: cell(r[mean], r[std], r["n"], scale=scale), return_dtype=pl.String)


# --------------------------------------------------------------------------------------------------------------------
# layouts


def main_results(summary: Summary) -> Table:
    """Rows recipe × backbone (× task when several), columns test depths "d (m×)" — or multiples "m×" when the rows'
    train depths differ — then G, then the CoT cost when logged (:data:`COT_COLUMN`); cells in %.

    A configuration with a halting read-out gets one row per stopping (``analysis.aggregate.STOPPINGS``): R = ⌈d/c⌉,
    its own halting and the oracle best fixed R per depth, each with that curve's accuracies and G; a ``stopping``
    column (after the labels) says which, and only shows when some configuration has more than R = ⌈d/c⌉."""
    acc = _with_stoppings(summary.accuracy, summary.stopping_accuracy)
    g = _with_stoppings(summary.G, summary.stopping_G)
    keys = [*GROUP, "stopping"]
    d_train = acc.get_column("train_depth").unique().drop_nulls()
    one_train = d_train.len() <= 1
    if one_train:
        depths = acc.select("depth").unique().sort("depth").get_column("depth").to_list()
        fine = len(depths) > MAX_DEPTH_COLUMNS and d_train.len() == 1
        if fine:  # a fine grid: its d_train × 2^k depths (every depth is in accuracy.csv)
            depths = [d for d in depths if _power_of_two_multiple(d, d_train.item())]
        labels = {d: depth_label(d, d_train.item() if d_train.len() else None) for d in depths}
        column = pl.col("depth")
    else:  # tasks at their own train depths: line the rows up by multiple of d_train
        multiples = acc.select("multiple").drop_nulls().unique().sort("multiple").get_column("multiple").to_list()
        fine = len(multiples) > MAX_DEPTH_COLUMNS
        if fine:
            multiples = [m for m in multiples if float(m).is_integer() and _power_of_two_multiple(int(m), 1)]
        labels = {m: f"{m:g}×" for m in multiples}
        column = pl.col("multiple")
    cells = acc.filter(column.is_in(list(labels))).select(
        *keys,
        column.replace_strict(labels, return_dtype=pl.String).alias("label"),
        _acc_cell_expr().alias("cell"),
    )
    wide = (
        cells.pivot(on="label", on_columns=list(labels.values()), index=keys, values="cell")
        if not cells.is_empty() else pl.DataFrame(schema={c: pl.String for c in keys})
    )
    wide = _g_cells(g, keys).join(wide, on=keys, how="left", nulls_equal=True)
    cot = _cot_cells(summary.accuracy)
    if cot is not None:  # measured at R = ⌈d/c⌉ (the cot baseline has no other stopping)
        wide = wide.join(cot.with_columns(pl.lit(CEIL, pl.String).alias("stopping")), on=keys, how="left",
                         nulls_equal=True)
    wide = best_first(wide, summary, ["task", "recipe", "backbone"], then=(_stopping_rank(),))
    stoppings = (wide.get_column("stopping") != CEIL).any()
    label_cols = _label_columns(wide, ["task", "recipe", "backbone", "config"]) + (["stopping"] if stoppings else [])
    value_cols = [lbl for lbl in labels.values() if lbl in wide.columns]
    extra = [COT_COLUMN] if cot is not None else []
    frame = (_show_config(wide).select(*label_cols, *value_cols, "G", G_INTERP, *extra)
             .with_columns(pl.col(value_cols + extra).fill_null(MISSING)))
    notes = ["Full-state accuracy (%) at each test depth; G = d50 / d_train; mean ± std over seeds (ddof = 1), "
             "(n) seeds; ≥: some seed never fell below the midpoint, so G is a lower bound.", G_NOTE]
    if stoppings:
        notes.append(STOPPING_NOTE)
    if fine:
        notes.append("Fine grid: the columns are the test depths at d_train × 2^k; d50 and G use every tested depth "
                     "(accuracy at each: accuracy.csv).")
    if "config" in label_cols:
        notes.append("config: the parameters that differ between trials besides the seed; each configuration has "
                     "its own seeds, best first (highest mean G, then accuracy at the longest depth).")
    if not one_train:
        notes.append(f"Configurations use different train depths {d_train.sort().to_list()}; columns are test "
                     "depths as multiples of each row's own d_train.")
    if cot is not None:
        notes.append(f"{COT_COLUMN}: the chain-of-thought baseline's test-time cost, mean generated tokens per "
                     "sequence at each of its test depths (in column order), mean over seeds; it grows with d, "
                     "where a looped model runs ⌈d/c⌉ iterations over the prompt.")
    return Table("main_results", f"Extrapolation by test depth{_task_title(wide)}", frame,
                 (*notes, *_exclusion_note(summary)))


def _power_of_two_multiple(depth: int, train_depth: int) -> bool:
    """``depth`` = ``train_depth`` × 2^k for some k >= 0."""
    m, r = divmod(depth, train_depth)
    return r == 0 and m >= 1 and m & (m - 1) == 0


def _cot_cells(acc: pl.DataFrame) -> pl.DataFrame | None:
    """GROUP + :data:`COT_COLUMN` ("13 / 25 / 49 / 97": mean generated tokens at each test depth, ascending) for the
    configurations that logged ``cot_tokens_d{D}``; ``None`` when none did."""
    if "cot_tokens_mean" not in acc.columns:
        return None
    cot = acc.filter(pl.col("cot_tokens_mean").is_not_null())
    if cot.is_empty():
        return None
    return (cot.sort("depth").group_by(GROUP, maintain_order=True).agg(pl.col("cot_tokens_mean"))
            .select(*GROUP, pl.col("cot_tokens_mean")
                    .map_elements(lambda xs: " / ".join(f"{x:.0f}" for x in xs), return_dtype=pl.String)
                    .alias(COT_COLUMN)))


def scale_results(summary: Summary, multiple: float = SCALE_MULTIPLE) -> Table:
    """Rows backbone × recipe (× task): accuracy at ``multiple``× the train length, or the largest tested multiple
    when that was not tested, then G."""
    acc = summary.accuracy.filter(pl.col("multiple").is_not_null())
    pick = (
        acc.with_columns((pl.col("multiple") == multiple).alias("_hit"))
        .sort("_hit", "multiple")
        .group_by(GROUP, maintain_order=True)
        .last()
    )
    rows = pick.select(
        *GROUP,
        pl.struct("depth", "train_depth")
        .map_elements(lambda r: depth_label(r["depth"], r["train_depth"]), return_dtype=pl.String)
        .alias("test depth"),
        _acc_cell_expr().alias("accuracy (%)"),
    )
    wide = best_first(_g_cells(summary.G).join(rows, on=GROUP, how="left", nulls_equal=True), summary,
                      ["task", "backbone", "recipe"])
    label_cols = _label_columns(wide, ["task", "backbone", "recipe", "config"])
    frame = _show_config(wide).select(*label_cols, "test depth", "accuracy (%)", "G", G_INTERP).fill_null(MISSING)
    note = (f"Accuracy at {multiple:g}× the train length, or at the largest tested multiple where {multiple:g}× was "
            "not tested; mean ± std (n) over seeds. " + G_NOTE)
    shown = pick.get_column("multiple").unique()
    at = f"{multiple:g}×" if shown.to_list() == [multiple] or shown.is_empty() else (
        f"the largest tested multiple, {shown.item():g}×" if shown.len() == 1 else f"{multiple:g}× (or less)")
    return Table("scale", f"Backbones at {at} the train length{_task_title(wide)}", frame,
                 (note, *_exclusion_note(summary)))


def halting_results(summary: Summary) -> Table | None:
    """Rows recipe × backbone (× config) × stopping rule × test depth: halting-rule and oracle (R = ⌈d/c⌉) accuracy
    (%), gap (points), iterations run, never-halted fraction (%), R − ⌈d/c⌉ (mean ± std over seeds) and its spread
    over sequences. The ``rule`` column ("6 of 8, τ 0.5"; "–" where a run did not log its ``eval.halt_*`` params)
    lists the primary rule and every extra rule of ``eval.halt_rules``, ordered by n, k, τ. When any trial logged
    the pending signal (``halt_acc_d{D}_pending``: ``recipe.dense_pending``, a par_ray signal, not the paper's
    read-out; docs/experiments.md §14), a ``signal`` column before ``rule`` tells ``query`` (the halting query's
    P(Yes), paper §3) from ``pending`` (1 − P(pending) at the last operation), the pending rows after the query rows
    of each configuration; otherwise the table is the query signal's alone, without that column. ``None`` when no
    trial logged halting metrics."""
    h = summary.halting
    if h.is_empty():
        return None
    rows = h.select(
        *GROUP,
        "signal", "rule", "halt_k", "halt_n", "halt_tau",
        "depth",
        pl.struct("depth", "train_depth")
        .map_elements(lambda r: depth_label(r["depth"], r["train_depth"]), return_dtype=pl.String)
        .alias("test depth"),
        _acc_cell_expr("halt_").alias("halting (%)"),
        _acc_cell_expr("oracle_").alias("oracle (%)"),
        _acc_cell_expr("gap_").alias("oracle − halting (pts)"),
        pl.col("halt_iter_mean").map_elements(lambda v: f"{v:.1f}", return_dtype=pl.String).alias("iterations"),
        _acc_cell_expr("never_halted_").alias("never halted (%)"),
        _acc_cell_expr("dR_", scale=1.0).alias("R − ⌈d/c⌉"),
        pl.col("dR_spread_mean").map_elements(lambda v: f"{v:.1f}", return_dtype=pl.String).alias("spread of R"),
    ).with_columns(signal_rank(pl.col("signal")).alias("_signal"))
    rows = ordered(rows, ["task", "recipe", "backbone"],
                   then=("config", "_signal", "halt_n", "halt_k", "halt_tau", "depth"))
    pending = (rows.get_column("signal") == "pending").any()
    label_cols = _label_columns(rows, ["task", "recipe", "backbone", "config"]) + (["signal"] if pending else [])
    frame = _show_config(rows).select(*label_cols, "rule", "test depth", "halting (%)", "oracle (%)",
                                      "oracle − halting (pts)", "iterations", "never halted (%)", "R − ⌈d/c⌉",
                                      "spread of R").fill_null(MISSING)
    note = ("Rule \"k of n, τ\": answer at the first iteration R with P(Yes) > τ such that at least k of R … R+n−1 "
            "exceed τ; every rule is read from the same run of the model. Halting: answer at the iteration R chosen "
            "by the rule; oracle: oracle stopping R = ⌈d/c⌉ (the same for every rule); gap "
            "in accuracy points; iterations: mean R under the halting rule; never halted: sequences where the rule "
            "never fired, answered at R_max (%); R − ⌈d/c⌉: per seed the mean over sequences, then mean ± std over "
            "seeds; spread of R: the std over sequences of R − ⌈d/c⌉, averaged over seeds. Mean ± std (n) over "
            "seeds.")
    notes = [note]
    if pending:
        notes.append("Signal: query = P(Yes) of the halting query (the paper's read-out, §3); pending = "
                     "1 − P(pending) of the dense read-out at the last operation (recipe.dense_pending: positions past "
                     "the frontier are trained on a \"pending\" class), put through the same rules in place of "
                     "P(Yes), read from the same run of the model, with the same oracle. The pending signal is a "
                     "par_ray signal, not the paper's (docs/experiments.md §14).")
    return Table("halting", f"Halting vs oracle stopping{_task_title(rows)}", frame,
                 (*notes, *_exclusion_note(summary)))


def _accuracy_at_common_multiple(summary: Summary, g: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """(GROUP + a cell column, that column's name): accuracy of each configuration of ``g`` at the largest multiple of
    the train length that every one of them tested (``"accuracy at 8× (%)"``)."""
    acc = summary.accuracy.join(g.select(GROUP), on=GROUP, how="semi", nulls_equal=True)
    common = acc.group_by(GROUP).agg(pl.col("multiple").max()).get_column("multiple").min()
    at = acc.filter(pl.col("multiple") == common) if common is not None else acc.clear()
    column = f"accuracy at {common:g}× (%)" if common is not None else "accuracy (%)"
    return at.select(*GROUP, _acc_cell_expr().alias(column)), column


TEACHERS = {"none": MISSING, "ema": "EMA of the student", "live": "live student"}
"""``teacher`` cells by ``recipe.distill`` (prefix self-distillation, paper §3)."""
LABELS = {"progress": "every prefix", "final": "final answer only", "done": "final answer only (from ⌈d/c⌉)"}
"""``labels`` cells of the label-free table by ``recipe.targets``: which states the training data labels."""


def _distilled(g: pl.DataFrame) -> bool:
    """Any configuration of ``g`` trained by prefix self-distillation (``recipe.distill`` ema or live)."""
    return g.filter(pl.col("distill").is_in([k for k in TEACHERS if k != "none"])).height > 0


def _teacher_expr() -> pl.Expr:
    return pl.col("distill").replace_strict(TEACHERS, default=MISSING, return_dtype=pl.String).alias("teacher")


def ablation_results(summary: Summary) -> Table | None:
    """Rows backbone × (anchoring, targets) × recipe: accuracy at the largest multiple tested by every row, then G; a
    ``teacher`` column when a recipe distils (``psd_ema`` / ``psd_live`` share final-answer targets with
    ``final_answer``). ``None`` when no trial logged ``recipe.anchoring`` / ``recipe.targets``, or all share one
    (anchoring, targets) pair (nothing was ablated, e.g. a backbone-scaling sweep of ``par`` only)."""
    g = summary.G.filter(pl.col("anchoring").is_not_null() | pl.col("targets").is_not_null())
    if g.select("anchoring", "targets").unique().height < 2:
        return None
    rows, column = _accuracy_at_common_multiple(summary, g)
    wide = _g_cells(g).join(g.select(*GROUP, "anchoring", "targets", _teacher_expr()), on=GROUP, nulls_equal=True)
    wide = wide.join(rows, on=GROUP, how="left", nulls_equal=True)
    wide = best_first(wide, summary, ["task", "backbone", "anchoring", "targets", "recipe"])
    teacher = ["teacher"] if _distilled(g) else []
    label_cols = _label_columns(wide, ["task", "backbone", "anchoring", "targets", *teacher, "recipe", "config"])
    frame = _show_config(wide).select(*label_cols, column, "G", G_INTERP).fill_null(MISSING)
    note = ("Anchoring: RMS norm anchoring on/off (recipe.anchoring); targets: progress-aligned or final-answer "
            "supervision (recipe.targets)" + ("; teacher: prefix self-distillation's teacher (recipe.distill)"
                                              if teacher else "") + ". Mean ± std (n) over seeds. " + G_NOTE)
    return Table("ablation", f"Ablation: anchoring × targets{_task_title(wide)}", frame,
                 (note, *_exclusion_note(summary)))


def label_free_results(summary: Summary) -> Table | None:
    """Label-free learning (paper Table 5, §3 "Prefix Self-Distillation"): rows backbone × recipe with the labels it
    trains on (``recipe.targets``: ``every prefix`` for progress-aligned targets z_min(ck, d), ``final answer only``
    for z_d) and its teacher (``recipe.distill``: the EMA of the student, the live student, or none), then accuracy
    at d_train (in distribution), accuracy at the largest multiple tested by every row, G and the interpolated G.
    Order: every-prefix labels first, then final answers with a teacher (EMA, live), then without. ``None`` unless
    some configuration distils (``sweeps/label_free.py``)."""
    g = summary.G.filter(pl.col("targets").is_not_null())
    if not _distilled(g):
        return None
    far, column = _accuracy_at_common_multiple(summary, g)
    at_train = (summary.accuracy.filter(pl.col("multiple") == 1)
                .select(*GROUP, _acc_cell_expr().alias("accuracy at d_train (%)")))
    wide = (_g_cells(g)
            .join(g.select(*GROUP, pl.col("targets").replace_strict(LABELS, default=pl.col("targets"),
                                                                    return_dtype=pl.String).alias("labels"),
                           _teacher_expr(),
                           pl.col("targets").replace_strict({"progress": 0}, default=1, return_dtype=pl.Int64)
                           .alias("_labels"),
                           pl.col("distill").replace_strict({"ema": 0, "live": 1}, default=2, return_dtype=pl.Int64)
                           .alias("_teacher")),
                  on=GROUP, nulls_equal=True)
            .join(at_train, on=GROUP, how="left", nulls_equal=True)
            .join(far, on=GROUP, how="left", nulls_equal=True))
    wide = best_first(wide, summary, ["task", "backbone"], then=()).sort(
        "task", "backbone", "_labels", "_teacher", maintain_order=True, nulls_last=True)
    label_cols = _label_columns(wide, ["task", "backbone", "recipe", "labels", "teacher", "config"])
    frame = _show_config(wide).select(*label_cols, "accuracy at d_train (%)", column, "G", G_INTERP).fill_null(MISSING)
    note = ("Labels: the states the training data labels (every prefix: progress-aligned targets z_min(ck, d); final "
            "answer only: z_d). Teacher: prefix self-distillation, where the earlier iterations learn from a teacher "
            "that reads the prompt truncated after c·k operations (an EMA of the student, or the live student under "
            "no_grad); \"–\": none. Mean ± std (n) over seeds. " + G_NOTE)
    return Table("label_free", f"Label-free learning{_task_title(wide)}", frame, (note, *_exclusion_note(summary)))


G_INTERVAL = "G 95 % interval"
"""Column of G's 95 % interval within a trial (``G_intervals`` table)."""
G_INTERP_INTERVAL = "G (interpolated) 95 % interval"
"""Column of the interpolated G's 95 % interval within a trial."""
SEEDS_ROW = "seeds"
"""``seed`` cell of a configuration's spread row in the ``G_intervals`` table."""


def interval_cell(lo: float | None, hi: float | None, hi_censored: bool, lo_censored: bool = False) -> str:
    """``"[3.50, 4.25]"``; a censored bound with "≥" (``"[3.50, ≥ 8.00]"``); ``"–"`` when not logged."""
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return MISSING
    return f"[{'≥ ' if lo_censored else ''}{lo:.2f}, {'≥ ' if hi_censored else ''}{hi:.2f}]"


def interval_results(summary: Summary) -> Table | None:
    """One row per trial with a logged interval (× stopping for halting trials): G and its 95 % interval, the
    interpolated G and its 95 % interval; after each configuration's trials a row ``seed`` = "seeds": G and the
    interpolated G as mean ± std (n) over its seeds, beside the mean width of their intervals ("width 0.50"). A
    trial's G is recomputed from its curve (as in every table); its interval is the one it logged. ``None`` when no
    trial logged an interval."""
    iv = summary.intervals
    if iv.is_empty():
        return None
    keys = [*GROUP, "stopping"]

    def g_text(r: dict, column: str) -> str:
        return MISSING if r[column] is None else f"{'≥ ' if r['censored'] else ''}{r[column]:.2f}"

    rows = [{**{k: r[k] for k in keys}, "_row": 0, "_seed": r["seed"],
             "seed": MISSING if r["seed"] is None else str(r["seed"]) + ("" if r["status"] == "FINISHED"
                                                                         else f" ({r['status']})"),
             "G": g_text(r, "G"),
             G_INTERVAL: interval_cell(r["G_lo"], r["G_hi"], r["G_hi_censored"], r["G_lo_censored"]),
             G_INTERP: g_text(r, "G_interp"),
             G_INTERP_INTERVAL: interval_cell(r["G_interp_lo"], r["G_interp_hi"], r["G_hi_censored"],
                                              r["G_lo_censored"])}
            for r in iv.iter_rows(named=True)]
    for r in summary.interval_spread.iter_rows(named=True):
        def width(column: str) -> str:
            w = r[column]
            return MISSING if w is None else f"width {'≥ ' if r['any_hi_censored'] else ''}{w:.2f}"

        rows.append({**{k: r[k] for k in keys}, "_row": 1, "_seed": None, "seed": SEEDS_ROW,
                     "G": cell(r["G_mean"], r["G_std"], r["n"], digits=2, lower_bound=r["lower_bound"]),
                     G_INTERVAL: width("G_width_mean"),
                     G_INTERP: cell(r["G_interp_mean"], r["G_interp_std"], r["n"], digits=2,
                                    lower_bound=r["lower_bound"]),
                     G_INTERP_INTERVAL: width("G_interp_width_mean")})
    frame = pl.from_dicts(rows, infer_schema_length=None).with_columns(_stopping_rank().alias("_stopping"))
    frame = best_first(frame, summary, ["task", "recipe", "backbone"], then=("_stopping", "_row", "_seed"))
    stoppings = (frame.get_column("stopping") != CEIL).any()
    label_cols = _label_columns(frame, ["task", "recipe", "backbone", "config"]) + (["stopping"] if stoppings else [])
    title = f"G within each trial, with its 95 % interval{_task_title(frame)}"
    frame = _show_config(frame).select(*label_cols, "seed", "G", G_INTERVAL, G_INTERP, G_INTERP_INTERVAL)
    notes = ["G and its 95 % interval within each trial: a bootstrap over the trial's test sequences (each depth's "
             "per-sequence correctness resampled, d50 recomputed; eval.bootstrap_resamples), after adaptive "
             "sampling added sequences at the depths around the midpoint (eval.bracket_*). G is the paper's first "
             "crossing, the headline; " + G_NOTE,
             f"Row '{SEEDS_ROW}': mean ± std (n) over the configuration's seeds, beside the mean width (hi − lo) "
             "of their intervals: a seed spread much wider than the intervals is training variance, not test-set "
             "sampling. ≥: past the largest test depth (a lower bound)."]
    if stoppings:
        notes.append(STOPPING_NOTE)
    return Table("G_intervals", title, frame, (*notes, *_exclusion_note(summary)))


def build_tables(summary: Summary) -> list[Table]:
    """Every layout that the sweep's metrics support (halting, ablation, label-free and G intervals only when
    logged)."""
    tables = [main_results(summary), scale_results(summary), halting_results(summary), ablation_results(summary),
              label_free_results(summary), interval_results(summary)]
    return [t for t in tables if t is not None]


# --------------------------------------------------------------------------------------------------------------------
# rendering


def to_markdown(table: Table) -> str:
    """GitHub Markdown: bold caption, pipe table, notes as a paragraph."""
    def row(values) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"

    lines = [f"**{table.title}**", "", row(table.frame.columns),
             "| " + " | ".join("---" if i < _n_labels(table) else "---:" for i in range(table.frame.width)) + " |"]
    lines += [row(r) for r in table.frame.iter_rows()]
    if table.notes:
        lines += ["", *table.notes]
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    """The cells as CSV, header = column labels (caption and notes are not part of the CSV)."""
    return table.frame.write_csv()


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "±": r"$\pm$", "≥": r"$\geq$", "×": r"$\times$", "–": "--", "−": "$-$",
                  "τ": r"$\tau$"}
_LATEX_RE = re.compile("|".join(re.escape(k) for k in _LATEX_SPECIAL))


def latex_escape(text: str) -> str:
    """Escape LaTeX specials and map ±, ≥, ×, τ, – and − to math / dashes."""
    return _LATEX_RE.sub(lambda m: _LATEX_SPECIAL[m.group()], text)


def to_latex(table: Table) -> str:
    """A ``table`` float with a booktabs ``tabular`` (needs ``\\usepackage{booktabs}``), caption, label
    ``tab:<name>`` and the notes in footnotesize."""
    n_labels = _n_labels(table)
    spec = "l" * n_labels + "r" * (table.frame.width - n_labels)
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{latex_escape(table.title)}}}",
             rf"\label{{tab:{table.name}}}", rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(latex_escape(c) for c in table.frame.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_escape(str(v)) for v in r) + r" \\" for r in table.frame.iter_rows()]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if table.notes:
        lines += [r"\par\smallskip", r"{\footnotesize " + latex_escape(" ".join(table.notes)) + "}"]
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def _n_labels(table: Table) -> int:
    """Leading label (left-aligned) columns: the key columns before the first value column."""
    keys = {"task", "backbone", "recipe", "config", "anchoring", "targets", "teacher", "labels", "stopping", "signal",
            "rule", "test depth", "seed"}
    n = 0
    for c in table.frame.columns:
        if c not in keys:
            break
        n += 1
    return n


def write_tables(tables: list[Table], out_dir: str | Path) -> dict[str, dict[str, Path]]:
    """Write ``<name>.md``, ``<name>.csv`` and ``<name>.tex`` per table into ``out_dir`` (created).

    Returns ``{name: {"md": path, "csv": path, "tex": path}}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, dict[str, Path]] = {}
    for t in tables:
        paths = {"md": out / f"{t.name}.md", "csv": out / f"{t.name}.csv", "tex": out / f"{t.name}.tex"}
        paths["md"].write_text(to_markdown(t), encoding="utf-8")
        paths["csv"].write_text(to_csv(t), encoding="utf-8")
        paths["tex"].write_text(to_latex(t), encoding="utf-8")
        written[t.name] = paths
    return written
