"""Seed aggregates of a sweep: accuracy by depth, d50 and G per seed, G per configuration, halting vs oracle.

A configuration is one (task, backbone, recipe, config), ``config`` being the params that vary between trials of one
(task, backbone, recipe) besides the seed (``analysis.load.config_labels``: empty for a grid sweep, the sampled knobs
for a search); its seeds are its FINISHED trials. Everything here is computed on FINISHED trials only; the other
trials (FAILED, RUNNING, KILLED, and STOPPED_EARLY: ASHA stopped them, ``analysis.load.STOPPED_EARLY``) stay in the
input frames and are counted in ``Summary.excluded`` and in the ``n_excluded`` column of ``Summary.G``.

Statistics over seeds (n = number of seeds):

    mean  = Σ x_i / n
    std   = sqrt(Σ (x_i − mean)² / (n − 1))         (sample std, ddof = 1; null for n = 1)
    CI    = percentile bootstrap over seeds: the (α/2, 1 − α/2) quantiles of B resampled means (null for n = 1)

d50 and G follow the paper (§4.2) and ``par_ray.evaluation.extrapolation``, recomputed here from the ``acc_d{D}``
metrics (a logged ``G`` is never trusted):

    midpoint = (chance + 1) / 2
    d50      = min{ d : acc(d) < midpoint or acc(d) is NaN }          (first test depth below the midpoint)
    G        = d50 / d_train;  censored (d50 never reached): G = max tested depth / d_train, a lower bound "≥ G"

and, labelled "interpolated" wherever shown (a par_ray addition that tells apart curves the grid puts in one cell),

    d50_interp = d_a + (acc_a − midpoint) / (acc_a − acc_b) · (d50 − d_a)   (d_a: the test depth before d50)
    G_interp   = d50_interp / d_train;  d50 itself when d50 is the first test depth or its accuracy is NaN; censored:
                 G_interp = G

The mean G of a configuration with any censored seed is itself a lower bound (``lower_bound``, shown as "≥").

Within a trial (issue 37): the 95 % intervals of G and of the interpolated G that the trial logged
(``par_ray.evaluation.extrapolation_interval``: a bootstrap over its test sequences, after adaptive sampling near the
crossing), read as logged (``G_lo``, ``G_hi``, ``G_interp_lo``, ``G_interp_hi``, ``G_hi_censored``;
``par_ray.tracking_schema.INTERVAL_KINDS``): the bootstrap needs the per-depth sequence counts, which the curve alone
does not carry. :func:`g_intervals` puts them beside each trial's recomputed G, and :func:`interval_spread` the seed
spread beside the intervals' mean width: seeds that differ by more than the intervals are wide differ by more than
test-set sampling explains.

Stoppings (:data:`STOPPINGS`): the curve above is R = ⌈d/c⌉'s (``acc_d{D}``). A trial with a halting read-out
(``recipe.halting``) also logged its accuracy when it stops itself (``halt_acc_d{D}``, the primary rule) and at the
oracle best fixed R per depth (``best_acc_d{D}``); :func:`stopping_accuracy` and :func:`stopping_g` give the same
statistics of those curves and d50 and G of each stopping, and :func:`curve_stats` picks each configuration's
extrapolation curve: its own halting where it has one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import polars as pl

from par_ray import tracking_schema

from analysis.load import RULE_SCHEMA, TRIAL_KEYS, SweepFrames, signal_rank

GROUP = list(TRIAL_KEYS)
FINISHED = pl.col("status") == "FINISHED"
CEIL, OWN_HALTING, BEST_R = "R = ⌈d/c⌉", "own halting", "best R"
STOPPINGS = {CEIL: "acc", OWN_HALTING: "halt_acc", BEST_R: "best_acc"}
"""Stopping (as displayed, in display order) → the ``acc`` frame column of its accuracy by depth: R = ⌈d/c⌉
iterations (every trial), the model's own stopping (the primary halting rule on P(Yes) of the halting query) and the
oracle best fixed R per depth over 1..R_max (``par_ray.evaluation.halting_by_depth``; both for halting trials)."""


def with_config(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with a ``config`` column (``""``: one configuration per (task, backbone, recipe)) when it has none,
    e.g. frames built by hand without :func:`analysis.load.trials_frame`."""
    return frame if "config" in frame.columns else frame.with_columns(pl.lit("", pl.String).alias("config"))

_BOOT_CHUNK = 1 << 21
"""Bootstrap means held at once (groups × distinct resamples); bounds memory to tens of MB whatever the sweep size."""


@dataclass(frozen=True)
class Summary:
    """All aggregates of one sweep (each frame documented by the function that builds it)."""

    accuracy: pl.DataFrame
    """:func:`accuracy_stats`: per configuration and depth."""
    per_seed: pl.DataFrame
    """:func:`extrapolation_per_seed`: d50, G, censored per trial (every status, marked)."""
    G: pl.DataFrame
    """:func:`g_summary`: per configuration (task, backbone, recipe, config)."""
    halting: pl.DataFrame
    """:func:`halting_gap`: per configuration, stopping signal, stopping rule and depth; empty when no halting metrics
    were logged."""
    stopping_accuracy: pl.DataFrame
    """:func:`stopping_accuracy`: per configuration with a halting read-out, stopping (own halting, best R) and
    depth; empty without."""
    stopping_G: pl.DataFrame
    """:func:`stopping_g`: per configuration with a halting read-out and stopping; empty without."""
    iterations: pl.DataFrame
    """:func:`iteration_stats`: per configuration and k; empty when no rms_k / halt_prob_k were logged."""
    intervals: pl.DataFrame
    """:func:`g_intervals`: per trial and stopping with a logged 95 % interval; empty when none was logged."""
    interval_spread: pl.DataFrame
    """:func:`interval_spread`: per configuration and stopping of ``intervals``, FINISHED trials."""
    excluded: pl.DataFrame
    """:func:`excluded_trials`: status, n for every status other than FINISHED."""
    warnings: tuple[str, ...]
    """:func:`consistency_warnings`: duplicate seeds, mixed train depths, untagged trials."""


def summarize(frames: SweepFrames, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0) -> Summary:
    """Every aggregate of :class:`SweepFrames` (see the module docstring for the statistics)."""
    per_seed = extrapolation_per_seed(frames.acc)
    intervals = g_intervals(frames.acc, frames.trials)
    return Summary(
        accuracy=accuracy_stats(frames.acc, n_boot=n_boot, ci=ci, seed=seed),
        per_seed=per_seed,
        G=g_summary(per_seed, frames.trials),
        halting=halting_gap(frames.halting),
        stopping_accuracy=stopping_accuracy(frames.acc, n_boot=n_boot, ci=ci, seed=seed),
        stopping_G=stopping_g(frames.acc, frames.trials),
        iterations=iteration_stats(frames.by_iteration),
        intervals=intervals,
        interval_spread=interval_spread(intervals),
        excluded=excluded_trials(frames.trials),
        warnings=tuple(consistency_warnings(frames.trials)),
    )


def bootstrap_ci(frame: pl.DataFrame, keys: list[str], value: str, *, n_boot: int = 1000, ci: float = 0.95,
                 seed: int = 0) -> pl.DataFrame:
    """Percentile-bootstrap CI of the mean of ``value`` over the rows of each ``keys`` group.

    Groups of equal size n share one (B, n) matrix of multinomial resampling counts drawn from
    ``np.random.default_rng([seed, n])``, so the resampled means of all such groups are one matrix product and a
    group's interval depends only on its own values, n and ``seed`` (see :func:`_percentile_bounds`).

    Args:
        frame: rows to aggregate; nulls in ``value`` are dropped first, NaNs propagate into the interval.
        keys: group columns.
        value: Float64 column.
        n_boot: B, number of bootstrap resamples.
        ci: coverage, e.g. 0.95 → quantiles 0.025 and 0.975.
        seed: non-negative seed of the numpy generator.
    Returns:
        ``keys`` + ``ci_lo``, ``ci_hi`` (Float64; null for single-row groups).
    Raises:
        ValueError: ``ci`` outside (0, 1) or ``n_boot`` < 1.
    """
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci: must be in (0, 1), got {ci}")
    if n_boot < 1:
        raise ValueError(f"n_boot: must be >= 1, got {n_boot}")
    q = np.array([(1.0 - ci) / 2.0, (1.0 + ci) / 2.0])
    grouped = (
        frame.filter(pl.col(value).is_not_null())
        .group_by(keys, maintain_order=True)
        .agg(pl.col(value).cast(pl.Float64).alias("_v"))
        .with_columns(pl.col("_v").list.len().alias("_n"))
    )
    schema = {k: frame.schema[k] for k in keys} | {"ci_lo": pl.Float64, "ci_hi": pl.Float64}
    parts = [pl.DataFrame(schema=schema)]
    for (n,), part in grouped.partition_by("_n", as_dict=True).items():
        if n < 2:  # one seed: no interval
            parts.append(part.select(keys).with_columns(pl.lit(None, pl.Float64).alias(c) for c in ("ci_lo", "ci_hi")))
            continue
        x_gn = part["_v"].list.to_array(n).to_numpy()
        counts_bn = np.random.default_rng([seed, n]).multinomial(n, np.full(n, 1.0 / n), size=n_boot)
        lo_g, hi_g = _percentile_bounds(x_gn, counts_bn, q)
        parts.append(part.select(keys).with_columns(ci_lo=lo_g, ci_hi=hi_g))
    return pl.concat(parts, how="vertical_relaxed")


def _percentile_bounds(x_gn: np.ndarray, counts_bn: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Quantiles ``q`` (numpy's default linear method) of the B resampled means of every row of ``x_gn``.

    Resampling n seeds has at most C(2n−1, n) distinct count vectors (126 for n = 5), so the B draws collapse to U
    unique weight rows with multiplicities; the quantile of the B means is read off the sorted U means and their
    cumulative multiplicities, identical to ``np.quantile(x_gn @ (counts_bn / n).T, q, axis=1)`` at O(G·U) cost.
    Rows containing NaN give NaN. Returns (len(q), G).
    """
    n = x_gn.shape[1]
    counts_un, mult_u = np.unique(counts_bn, axis=0, return_counts=True)
    w_nu = (counts_un / n).T
    b = int(mult_u.sum())
    out = np.empty((q.size, x_gn.shape[0]))
    step = max(1, _BOOT_CHUNK // counts_un.shape[0])
    for start in range(0, x_gn.shape[0], step):
        means_gu = x_gn[start:start + step] @ w_nu
        order_gu = np.argsort(means_gu, axis=1)
        sorted_gu = np.take_along_axis(means_gu, order_gu, axis=1)
        cum_gu = np.cumsum(mult_u[order_gu], axis=1)
        rows = np.arange(sorted_gu.shape[0])
        for i, qi in enumerate(q):
            h = qi * (b - 1)
            j = int(np.floor(h))
            # sorted position j of the B means lies in the unique mean k = #{cum <= j}
            lo = (cum_gu <= j).sum(axis=1)
            hi = (cum_gu <= min(j + 1, b - 1)).sum(axis=1)
            out[i, start:start + step] = sorted_gu[rows, lo] + (h - j) * (sorted_gu[rows, hi] - sorted_gu[rows, lo])
    out[:, np.isnan(x_gn).any(axis=1)] = np.nan
    return out


def accuracy_stats(acc: pl.DataFrame, *, column: str = "acc", n_boot: int = 1000, ci: float = 0.95,
                   seed: int = 0) -> pl.DataFrame:
    """Full-state accuracy over seeds per configuration and depth, FINISHED trials only.

    ``column``: the accuracy aggregated, ``acc`` (R = ⌈d/c⌉) or another stopping's (:data:`STOPPINGS`; then
    ``query_*`` and ``cot_tokens_*`` are null: they were measured at R = ⌈d/c⌉ only). Returns columns: GROUP,
    ``depth``, ``train_depth``, ``multiple`` (depth / d_train), ``chance``, ``n`` (seeds), ``mean``, ``std``
    (ddof = 1), ``ci_lo``, ``ci_hi`` (bootstrap, see :func:`bootstrap_ci`), ``min``, ``max``, ``query_mean``,
    ``query_std`` (per-query accuracy), ``cot_tokens_mean``, ``cot_tokens_std`` (the ``cot`` baseline's mean
    generated tokens per sequence; null where not logged). Accuracies are fractions in [0, 1].
    """
    keys = [*GROUP, "depth"]
    fin = _as_acc(with_config(acc), column).filter(FINISHED & pl.col("acc").is_not_null())
    if "cot_tokens" not in fin.columns:  # frames built by hand with only the accuracy kinds
        fin = fin.with_columns(pl.lit(None, pl.Float64).alias("cot_tokens"))
    stats = fin.group_by(keys).agg(
        pl.col("train_depth").first(),
        pl.col("chance").first(),
        pl.len().alias("n"),
        pl.col("acc").mean().alias("mean"),
        pl.col("acc").std(ddof=1).alias("std"),
        pl.col("acc").min().alias("min"),
        pl.col("acc").max().alias("max"),
        pl.col("acc_query").mean().alias("query_mean"),
        pl.col("acc_query").std(ddof=1).alias("query_std"),
        pl.col("cot_tokens").mean().alias("cot_tokens_mean"),
        pl.col("cot_tokens").std(ddof=1).alias("cot_tokens_std"),
    )
    return (
        stats.join(bootstrap_ci(fin, keys, "acc", n_boot=n_boot, ci=ci, seed=seed), on=keys, how="left",
                   nulls_equal=True)
        .with_columns((pl.col("depth") / pl.col("train_depth")).alias("multiple"))
        .select(*keys, "train_depth", "multiple", "chance", "n", "mean", "std", "ci_lo", "ci_hi", "min", "max",
                "query_mean", "query_std", "cot_tokens_mean", "cot_tokens_std")
        .sort(keys, nulls_last=True)
    )


def _as_acc(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """``frame`` with ``column``'s values as ``acc`` (null where ``frame`` has no such column), and, for a column
    other than ``acc``, null ``acc_query`` and ``cot_tokens`` (measured at R = ⌈d/c⌉ only)."""
    if column == "acc":
        return frame
    value = pl.col(column) if column in frame.columns else pl.lit(None, pl.Float64)
    return frame.with_columns(value.cast(pl.Float64).alias("acc"), pl.lit(None, pl.Float64).alias("acc_query"),
                              pl.lit(None, pl.Float64).alias("cot_tokens"))


def extrapolation_per_seed(acc: pl.DataFrame, column: str = "acc") -> pl.DataFrame:
    """d50 and G of every trial (all statuses; ``status`` kept), vectorised over runs.

    ``column``: the accuracy curve, ``acc`` (R = ⌈d/c⌉) or another stopping's (:data:`STOPPINGS`). Rows with a
    null accuracy (depth not logged) are ignored; a NaN accuracy counts as below the midpoint, as in
    ``par_ray.evaluation.extrapolation``.

    Returns columns: run_id, status, GROUP, seed, train_depth, chance, ``midpoint`` ((chance + 1) / 2), ``n_depths``,
    ``max_depth``, ``d50`` (Int64, null when censored), ``censored`` (bool), ``G`` (Float64; max_depth / d_train when
    censored), ``d50_interp`` (Float64, null when censored) and ``G_interp`` (the module docstring's interpolated d50
    and G). ``censored``, ``G`` and ``G_interp`` are null when chance or train_depth was not logged.
    """
    midpoint = (pl.col("chance") + 1.0) / 2.0
    below = pl.col("acc").is_nan() | (pl.col("acc") < midpoint)
    known = pl.col("midpoint").is_not_null()
    d_a, acc_a, acc_b = pl.col("_d_a"), pl.col("_acc_a"), pl.col("_acc_b")
    interp = (pl.when(pl.col("d50").is_null()).then(None)
              .when(d_a.is_null() | acc_b.is_nan()).then(pl.col("d50").cast(pl.Float64))
              .otherwise(d_a + (acc_a - pl.col("midpoint")) / (acc_a - acc_b) * (pl.col("d50") - d_a)))
    return (
        _as_acc(with_config(acc), column).filter(pl.col("acc").is_not_null())
        .sort("run_id", "depth")
        .with_columns(pl.col("depth").shift(1).over("run_id").alias("_d_a"),
                      pl.col("acc").shift(1).over("run_id").alias("_acc_a"))
        .group_by("run_id", maintain_order=True)
        .agg(
            pl.col("status", *GROUP, "seed", "train_depth", "chance").first(),
            midpoint.first().alias("midpoint"),
            pl.len().alias("n_depths"),
            pl.col("depth").max().alias("max_depth"),
            pl.col("depth").filter(below).min().alias("d50"),
            # the first depth below the midpoint (rows sorted by depth) and the depth before it
            pl.col("_d_a").filter(below).first().cast(pl.Float64).alias("_d_a"),
            pl.col("_acc_a").filter(below).first().alias("_acc_a"),
            pl.col("acc").filter(below).first().alias("_acc_b"),
        )
        .with_columns(interp.alias("d50_interp"))
        .with_columns(
            pl.when(known).then(pl.col("d50").is_null()).alias("censored"),
            pl.when(known).then(pl.coalesce("d50", "max_depth") / pl.col("train_depth")).alias("G"),
            pl.when(known).then(pl.coalesce(pl.col("d50_interp"), pl.col("max_depth").cast(pl.Float64))
                                / pl.col("train_depth")).alias("G_interp"),
        )
        .drop("_d_a", "_acc_a", "_acc_b")
        .sort(*GROUP, "seed", "run_id", nulls_last=True)
    )


def g_summary(per_seed: pl.DataFrame, trials: pl.DataFrame) -> pl.DataFrame:
    """G over seeds per configuration (task, backbone, recipe, config), FINISHED trials only.

    Returns columns: GROUP, ``train_depth``, ``n`` (seeds with a G), ``n_censored``, ``G_mean``, ``G_std``
    (ddof = 1), ``G_min``, ``G_max``, ``G_interp_mean``, ``G_interp_std`` (the interpolated G), ``lower_bound`` (any seed censored: G_mean is a lower bound, "≥"),
    ``n_excluded`` (trials of that configuration not FINISHED), ``anchoring``, ``targets`` and ``distill`` (the
    configuration's ``recipe.anchoring`` / ``recipe.targets`` / ``recipe.distill`` params, for the ablation and
    label-free tables). A configuration whose trials all failed still has a row, with n = 0.
    """
    per_seed, trials = with_config(per_seed), with_config(trials)
    fin = per_seed.filter(FINISHED & pl.col("G").is_not_null())
    stats = fin.group_by(GROUP).agg(
        pl.col("train_depth").first(),
        pl.len().alias("n").cast(pl.Int64),
        pl.col("censored").sum().cast(pl.Int64).alias("n_censored"),
        pl.col("G").mean().alias("G_mean"),
        pl.col("G").std(ddof=1).alias("G_std"),
        pl.col("G").min().alias("G_min"),
        pl.col("G").max().alias("G_max"),
        pl.col("G_interp").mean().alias("G_interp_mean"),
        pl.col("G_interp").std(ddof=1).alias("G_interp_std"),
    )
    others = trials.group_by(GROUP).agg(
        pl.col("anchoring", "targets", "distill").drop_nulls().first(),
        (~FINISHED).sum().cast(pl.Int64).alias("n_excluded"),
    )
    return (
        stats.join(others, on=GROUP, how="full", coalesce=True, nulls_equal=True)
        .with_columns(
            pl.col("n", "n_censored").fill_null(0),
            (pl.col("n_censored") > 0).fill_null(False).alias("lower_bound"),
        )
        .select(*GROUP, "train_depth", "n", "n_censored", "G_mean", "G_std", "G_min", "G_max", "G_interp_mean",
                "G_interp_std", "lower_bound", "n_excluded", "anchoring", "targets", "distill")
        .sort(GROUP, nulls_last=True)
    )


def _halting_runs(acc: pl.DataFrame) -> pl.DataFrame:
    """``run_id`` of every run (any status) that logged its own halting's accuracy (``halt_acc``) at some depth."""
    if "halt_acc" not in acc.columns:
        return pl.DataFrame(schema={"run_id": acc.schema["run_id"]})
    return acc.filter(pl.col("halt_acc").is_not_null()).select("run_id").unique()


def stopping_accuracy(acc: pl.DataFrame, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0) -> pl.DataFrame:
    """:func:`accuracy_stats` of the stoppings other than R = ⌈d/c⌉ (:data:`STOPPINGS`: own halting, best R; R =
    ⌈d/c⌉'s is :func:`accuracy_stats` itself) over the trials with a halting read-out (those that logged
    ``halt_acc``), FINISHED only: ``stopping`` + the columns of :func:`accuracy_stats`, one row per configuration,
    stopping and depth (a stopping whose accuracy was not logged has no rows). Empty when no trial logged halting
    metrics."""
    halting = with_config(acc).join(_halting_runs(acc), on="run_id", how="semi")
    parts = [accuracy_stats(halting, column=column, n_boot=n_boot, ci=ci, seed=seed)
             .select(pl.lit(label, pl.String).alias("stopping"), pl.all())
             for label, column in STOPPINGS.items() if label != CEIL]
    return _in_stopping_order(pl.concat(parts, how="vertical_relaxed"), [*GROUP, "stopping", "depth"])


def stopping_g(acc: pl.DataFrame, trials: pl.DataFrame) -> pl.DataFrame:
    """G over seeds of every stopping (:data:`STOPPINGS`: R = ⌈d/c⌉, own halting, best R) per configuration with a
    halting read-out: :func:`extrapolation_per_seed` of that stopping's curve, then :func:`g_summary`, both over the
    trials that logged ``halt_acc`` (``n_excluded``: those of them not FINISHED). Returns ``stopping`` + the columns
    of :func:`g_summary` (G_mean ± G_std, G_interp_mean ± G_interp_std, lower_bound, …), a configuration's stoppings
    in :data:`STOPPINGS` order; a stopping no trial of the configuration logged has no row. Empty when no trial
    logged halting metrics."""
    runs = _halting_runs(acc)
    halting_acc = with_config(acc).join(runs, on="run_id", how="semi")
    halting_trials = with_config(trials).join(runs, on="run_id", how="semi")
    parts = []
    for label, column in STOPPINGS.items():
        per_seed = extrapolation_per_seed(halting_acc, column)
        g = g_summary(per_seed, halting_trials).join(per_seed.select(GROUP).unique(), on=GROUP, how="semi",
                                                     nulls_equal=True)
        parts.append(g.select(pl.lit(label, pl.String).alias("stopping"), pl.all()))
    return _in_stopping_order(pl.concat(parts, how="vertical_relaxed"), [*GROUP, "stopping"])


STOPPING_METRICS = {CEIL: "ceil", OWN_HALTING: "halt", BEST_R: "best"}
"""Stopping (as displayed) → its name in the tracking schema (``par_ray.tracking_schema.STOPPINGS``, the
``g_metric`` infix: ``G_lo``, ``G_halt_lo``, ``G_best_lo``)."""
INTERVAL_COLUMNS = ("G_lo", "G_hi", "G_interp_lo", "G_interp_hi", "G_hi_censored")
"""The logged 95 % interval metrics read per trial (``par_ray.tracking_schema.INTERVAL_KINDS``, the G ones)."""


def g_intervals(acc: pl.DataFrame, trials: pl.DataFrame) -> pl.DataFrame:
    """Every trial's G and interpolated G (:func:`extrapolation_per_seed`, recomputed from its curve) beside the 95 %
    intervals it logged, per stopping (R = ⌈d/c⌉ for every trial; own halting and best R for the trials with a
    halting read-out, that logged ``G_halt_lo`` / ``G_best_lo``), all statuses (``status`` kept).

    Returns columns: run_id, status, GROUP, seed, ``stopping`` (:data:`STOPPINGS` labels), train_depth, ``G``,
    ``censored``, ``G_interp``, ``G_lo``, ``G_hi``, ``G_interp_lo``, ``G_interp_hi`` (Float64; a censored bound reads
    max tested depth / d_train, a lower bound), ``G_lo_censored`` and ``G_hi_censored`` (Boolean: the lower / upper
    bounds lie past the largest test depth; the lower ones when ``d50_lo`` was not logged); only trials that logged
    an interval for that stopping, in display order (GROUP, stopping, seed).
    Empty when no trial logged one.
    """
    acc, trials = with_config(acc), with_config(trials)
    runs = _halting_runs(acc)
    parts = []
    for label, column in STOPPINGS.items():
        names = {k: tracking_schema.g_metric(k, STOPPING_METRICS[label]) for k in INTERVAL_COLUMNS}
        if names["G_lo"] not in trials.columns:
            continue
        names["d50_lo"] = tracking_schema.g_metric("d50_lo", STOPPING_METRICS[label])  # not logged: censored
        logged = trials.select("run_id", *[(pl.col(n) if n in trials.columns else pl.lit(None, pl.Float64))
                                           .cast(pl.Float64).alias(k) for k, n in names.items()])
        curves = acc if label == CEIL else acc.join(runs, on="run_id", how="semi")
        per_seed = extrapolation_per_seed(curves, column)
        parts.append(per_seed.join(logged.filter(pl.col("G_lo").is_not_null()), on="run_id", how="inner")
                     .select("run_id", "status", *GROUP, "seed", pl.lit(label, pl.String).alias("stopping"),
                             "train_depth", "G", "censored", "G_interp", *INTERVAL_COLUMNS[:-1],
                             pl.col("d50_lo").is_null().alias("G_lo_censored"),
                             (pl.col("G_hi_censored") > 0.5).fill_null(False).alias("G_hi_censored")))
    if not parts:
        return pl.DataFrame(schema={"run_id": pl.String, "status": pl.String, **{k: pl.String for k in GROUP},
                                    "seed": pl.Int64, "stopping": pl.String, "train_depth": pl.Int64,
                                    "G": pl.Float64, "censored": pl.Boolean, "G_interp": pl.Float64,
                                    **{k: pl.Float64 for k in INTERVAL_COLUMNS[:-1]}, "G_lo_censored": pl.Boolean,
                                    "G_hi_censored": pl.Boolean})
    return _in_stopping_order(pl.concat(parts, how="vertical_relaxed"), [*GROUP, "stopping", "seed", "run_id"])


def interval_spread(intervals: pl.DataFrame) -> pl.DataFrame:
    """The seed spread beside the intervals: per configuration and stopping of :func:`g_intervals`, FINISHED trials.

    Returns columns: GROUP, stopping, ``n`` (seeds), ``G_mean``, ``G_std``, ``G_interp_mean``, ``G_interp_std``
    (over seeds, ddof = 1), ``lower_bound`` (any seed censored), ``G_width_mean``, ``G_interp_width_mean`` (the mean
    over seeds of each trial's 95 % interval width, hi − lo; a censored upper bound counts at max tested depth /
    d_train, so the width is then a lower bound), ``any_hi_censored``.
    """
    fin = intervals.filter(FINISHED & pl.col("G").is_not_null())
    return _in_stopping_order(fin.group_by([*GROUP, "stopping"]).agg(
        pl.len().cast(pl.Int64).alias("n"),
        pl.col("G").mean().alias("G_mean"),
        pl.col("G").std(ddof=1).alias("G_std"),
        pl.col("G_interp").mean().alias("G_interp_mean"),
        pl.col("G_interp").std(ddof=1).alias("G_interp_std"),
        pl.col("censored").any().alias("lower_bound"),
        (pl.col("G_hi") - pl.col("G_lo")).mean().alias("G_width_mean"),
        (pl.col("G_interp_hi") - pl.col("G_interp_lo")).mean().alias("G_interp_width_mean"),
        pl.col("G_hi_censored").any().alias("any_hi_censored"),
    ), [*GROUP, "stopping"])


def curve_stats(accuracy: pl.DataFrame, stopping: pl.DataFrame) -> pl.DataFrame:
    """The extrapolation curve of every configuration: its own halting's accuracy where it has one (rows of
    ``stopping`` with stopping :data:`OWN_HALTING`), R = ⌈d/c⌉'s (``accuracy``) otherwise.

    Args:
        accuracy: :func:`accuracy_stats` (``Summary.accuracy``).
        stopping: :func:`stopping_accuracy` (``Summary.stopping_accuracy``).
    Returns:
        ``stopping`` (which curve) + the columns of :func:`accuracy_stats`, sorted by GROUP and depth.
    """
    accuracy = with_config(accuracy)
    own = (with_config(stopping).filter(pl.col("stopping") == OWN_HALTING) if "stopping" in stopping.columns
           else pl.DataFrame(schema={"stopping": pl.String, **accuracy.schema}))
    ceil = accuracy.join(own.select(GROUP).unique(), on=GROUP, how="anti", nulls_equal=True)
    return (pl.concat([ceil.select(pl.lit(CEIL, pl.String).alias("stopping"), pl.all()), own.select("stopping",
                                                                                                     *ceil.columns)],
                      how="vertical_relaxed")
            .sort([*GROUP, "depth"], nulls_last=True))


def _in_stopping_order(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """``frame`` sorted by ``keys``, ``stopping`` in :data:`STOPPINGS` order."""
    rank = pl.col("stopping").replace_strict({s: i for i, s in enumerate(STOPPINGS)}, return_dtype=pl.Int64)
    return frame.sort([rank if k == "stopping" else pl.col(k) for k in keys], nulls_last=True)


def halting_gap(halting: pl.DataFrame) -> pl.DataFrame:
    """Halting-rule accuracy vs oracle stopping (R* = ⌈d/c⌉) per configuration, stopping signal, stopping rule and
    depth, FINISHED trials with both.

    ``halting``: ``SweepFrames.halting`` (one row per run, signal, rule and depth: the primary rule and each extra
    rule of ``eval.halt_rules``, on the halting query and, where logged, on the last operation's pending signal; see
    ``analysis.load.halting_frame``), or an ``acc`` frame, read as the primary rule of the query signal only with
    the rule unknown (null). gap = oracle_acc − halt_acc per seed (in accuracy fractions; negative when the
    rule's iteration beats R*), then mean/std over seeds. Returns columns: GROUP, signal (``query`` or ``pending``,
    ``analysis.load.SIGNALS``), rule ("6 of 8, τ 0.5"; null when
    the run's ``eval.halt_*`` params were not logged), halt_k, halt_n, halt_tau, depth, train_depth, n, halt_mean,
    halt_std, oracle_mean, oracle_std, gap_mean, gap_std, halt_iter_mean (mean iterations run under the halting
    rule), never_halted_mean, never_halted_std (fraction of sequences answered at R_max because the rule never
    fired), dR_mean, dR_std (the per-seed mean over sequences of R − R*, then mean and std over seeds),
    dR_spread_mean (the per-seed std over sequences of R − R*, averaged over seeds); each null when not logged.
    Sorted by GROUP, signal (query first), rule (n, k, τ), depth. Empty when no trial logged ``halt_acc_d{D}`` and
    ``oracle_acc_d{D}``.
    """
    keys = [*GROUP, "signal", "rule", "depth"]
    fin = with_config(halting).filter(FINISHED & pl.col("halt_acc").is_not_null()
                                      & pl.col("oracle_acc").is_not_null())
    fin = fin.with_columns([pl.lit(None, pl.Float64).alias(k) for k in ("never_halted", "halt_dR_mean", "halt_dR_std")
                            if k not in fin.columns])  # frames built by hand without these kinds
    fin = fin.with_columns([pl.lit(None, t).alias(k) for k, t in RULE_SCHEMA.items()
                            if k not in fin.columns])  # an acc frame: the primary rule, unknown
    if "signal" not in fin.columns:  # an acc frame: the halting query's metrics
        fin = fin.with_columns(pl.lit("query", pl.String).alias("signal"))
    gap = pl.col("oracle_acc") - pl.col("halt_acc")
    return (
        fin.group_by(keys)
        .agg(
            pl.col("halt_k", "halt_n", "halt_tau").first(),
            pl.col("train_depth").first(),
            pl.len().alias("n"),
            pl.col("halt_acc").mean().alias("halt_mean"),
            pl.col("halt_acc").std(ddof=1).alias("halt_std"),
            pl.col("oracle_acc").mean().alias("oracle_mean"),
            pl.col("oracle_acc").std(ddof=1).alias("oracle_std"),
            gap.mean().alias("gap_mean"),
            gap.std(ddof=1).alias("gap_std"),
            pl.col("halt_iter").mean().alias("halt_iter_mean"),
            pl.col("never_halted").mean().alias("never_halted_mean"),
            pl.col("never_halted").std(ddof=1).alias("never_halted_std"),
            pl.col("halt_dR_mean").mean().alias("dR_mean"),
            pl.col("halt_dR_mean").std(ddof=1).alias("dR_std"),
            pl.col("halt_dR_std").mean().alias("dR_spread_mean"),
        )
        .select(*GROUP, "signal", *RULE_SCHEMA, "depth", pl.exclude(*GROUP, "signal", *RULE_SCHEMA, "depth"))
        .sort([*GROUP, signal_rank(pl.col("signal")), "halt_n", "halt_k", "halt_tau", "depth"], nulls_last=True)
    )


def iteration_stats(by_iteration: pl.DataFrame) -> pl.DataFrame:
    """State RMS and halting probability after iteration k over seeds, per configuration and k, FINISHED.

    Returns columns: GROUP, k, and for each of ``rms``, ``halt_prob``: ``{kind}_n``, ``{kind}_mean``, ``{kind}_std``
    (ddof = 1), ``{kind}_min``, ``{kind}_max``.
    """
    keys = [*GROUP, "k"]
    aggs = [
        expr
        for kind in ("rms", "halt_prob")
        for expr in (
            pl.col(kind).count().alias(f"{kind}_n"),
            pl.col(kind).mean().alias(f"{kind}_mean"),
            pl.col(kind).std(ddof=1).alias(f"{kind}_std"),
            pl.col(kind).min().alias(f"{kind}_min"),
            pl.col(kind).max().alias(f"{kind}_max"),
        )
    ]
    return with_config(by_iteration).filter(FINISHED).group_by(keys).agg(aggs).sort(keys, nulls_last=True)


def excluded_trials(trials: pl.DataFrame) -> pl.DataFrame:
    """Trials left out of the aggregates: ``status``, ``n`` for every status other than FINISHED."""
    return trials.filter(~FINISHED).group_by("status").agg(pl.len().cast(pl.Int64).alias("n")).sort("status")


def consistency_warnings(trials: pl.DataFrame) -> list[str]:
    """Problems that make seed aggregates misleading, as sentences (empty when none).

    - the same seed twice in one configuration (e.g. several sweeps in one experiment: analyse one parent run);
    - several train depths in one configuration (G and the depth multiples assume one d_train);
    - FINISHED trials without a recipe / backbone / task / seed tag, or without any ``acc_d{D}`` metric.
    """
    fin = with_config(trials).filter(FINISHED)
    out: list[str] = []
    dup = (
        fin.filter(pl.col("seed").is_not_null())
        .group_by(*GROUP, "seed").agg(pl.len().alias("n")).filter(pl.col("n") > 1)
        .sort(*GROUP, "seed", nulls_last=True)
    )
    for r in dup.iter_rows(named=True):
        out.append(f"{_name(r)}: seed {r['seed']} appears in {r['n']} FINISHED trials (several sweeps in one "
                   f"experiment? pass --parent-run to analyse one)")
    mixed = (
        fin.group_by(GROUP).agg(pl.col("train_depth").unique().sort().alias("depths"))
        .filter(pl.col("depths").list.len() > 1).sort(GROUP, nulls_last=True)
    )
    for r in mixed.iter_rows(named=True):
        out.append(f"{_name(r)}: several train depths {r['depths']}; G uses each trial's own d_train")
    for col in (*GROUP, "seed"):
        if col == "config":  # not a tag: derived from the params, never null
            continue
        n = fin.get_column(col).null_count()
        if n:
            out.append(f"{n} FINISHED trial(s) lack the tag {tracking_schema.TRIAL_TAGS[col]}")
    acc_cols = [c for c in trials.columns if re.fullmatch(tracking_schema.depth_metric_pattern(("acc",)), c)]
    n_no_acc = fin.height if not acc_cols else fin.filter(pl.all_horizontal(pl.col(acc_cols).is_null())).height
    if n_no_acc:
        out.append(f"{n_no_acc} FINISHED trial(s) logged no acc_d{{D}} metric")
    return out


def _name(row: dict) -> str:
    return " ".join(f"{k}={row[k]}" if k != "config" else f"[{row[k]}]" for k in GROUP if k != "config" or row[k])
