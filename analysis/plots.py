"""Figures of a sweep (PAR paper §5): accuracy vs test depth, G per backbone, state RMS and halting probability over
iterations.

Built on ``matplotlib.figure.Figure`` directly (no pyplot, no global backend switch), rendered by Agg to PNG at a
fixed size: ``FIGSIZE`` inches × ``DPI`` = 640 × 480 pixels, so every file has the same shape. Colours are fixed per
series across figures; a series is a recipe, or "recipe · config" when the trials differ in more than task, backbone
and recipe (an Optuna search; see ``analysis.load.config_labels``). Censored (lower-bound) G values are drawn as
upward triangles.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import polars as pl
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from analysis.aggregate import CEIL, Summary, curve_stats, with_config
from analysis.tables import FIRST_RECIPES, config_label, display_rank

FIGSIZE = (6.4, 4.8)
"""Inches; with ``DPI`` gives 640 × 480 px."""
DPI = 100
_LINESTYLES = ("-", "--", "-.", ":")
MIN_LABEL_OCTAVES = 0.45
"""The least log2 distance between two labelled depths on the accuracy figure's axis (~70 px on a 16–128 axis)."""


def _figure(title: str):
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3, linewidth=0.6)
    return fig, ax


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    return path


def _legend_below(fig: Figure, handles: list, title: str) -> None:
    """Legend under the axes (outside: curves can fill any corner), up to 3 entries a row."""
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(3, len(handles)), fontsize=8,
                   title=title, title_fontsize=8, frameon=False)


def _colors(recipes: list[str]) -> dict[str, tuple]:
    """One tab10 colour per recipe, in display order (stable across figures of the same sweep)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    rank = display_rank(recipes, FIRST_RECIPES)
    return {r: cmap(i % 10) for r, i in rank.items()}


def _in_order(values: list, first: tuple[str, ...] = ()) -> list:
    rank = display_rank(values, first)
    return sorted(rank, key=rank.get)


def with_series(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with a ``series`` column: the recipe, or ``"recipe · config"`` (shortened, :func:`config_label`)
    when the configuration has a non-empty ``config``."""
    return with_config(frame).with_columns(
        pl.when(pl.col("config").fill_null("") == "").then(pl.col("recipe"))
        .otherwise(pl.concat_str(pl.col("recipe"), pl.lit(" · "),
                                 pl.col("config").map_elements(config_label, return_dtype=pl.String)))
        .alias("series"))


def file_stem(*parts: str) -> str:
    """``"accuracy_swap_s5_qwen2.5-7b"``: parts joined by ``_``; characters other than letters, digits, ``.`` and
    ``-`` become ``_``."""
    return "_".join(re.sub(r"[^A-Za-z0-9.-]+", "_", str(p)) for p in parts)


def curve_label(series: str, stopping: str | None) -> str:
    """Legend name of an accuracy curve: the series, followed by its stopping (``analysis.aggregate.STOPPINGS``)
    unless that is R = ⌈d/c⌉ or unknown: ``"par_halt (own halting)"``, ``"par"``."""
    return series if stopping in (None, CEIL) else f"{series} ({stopping})"


def labelled_depths(depths: list[int], d_train: int | None, min_octaves: float = MIN_LABEL_OCTAVES) -> list[int]:
    """The test depths that get a tick label on a log2 depth axis, so labels never overprint on a fine grid such as
    the local main job's (16, 17, …, 32, 38, …, 128): first every power-of-two multiple of ``d_train`` on the grid
    (1×, 2×, 4×, …), then, smallest first, each other depth at least ``min_octaves`` (log2 units) from every label
    chosen so far. The others stay unlabelled ticks. ``depths``: sorted, positive."""
    def power_of_two_multiple(d: int) -> bool:
        return d_train is not None and d % d_train == 0 and (d // d_train) & (d // d_train - 1) == 0

    labelled = [d for d in depths if power_of_two_multiple(d)]
    for d in depths:
        if all(abs(math.log2(d / x)) >= min_octaves for x in labelled):
            labelled.append(d)
    return sorted(labelled)


def accuracy_by_depth(accuracy: pl.DataFrame, path: str | Path, *, task: str, backbone: str) -> Path:
    """Mean full-state accuracy vs test depth (log2 axis), one line per series, band = min–max over seeds, with the
    chance and midpoint lines and the train depth marked. ``accuracy``: :func:`analysis.aggregate.curve_stats` (a
    series whose curve is its own halting's is labelled "(own halting)") or
    :func:`analysis.aggregate.accuracy_stats` (R = ⌈d/c⌉ everywhere)."""
    rows = with_series(accuracy.filter((pl.col("task") == task) & (pl.col("backbone") == backbone))).sort("depth")
    fig, ax = _figure(f"{task} · {backbone}: accuracy vs test depth")
    colors = _colors(rows.get_column("series").to_list())
    for name in _in_order(rows.get_column("series").to_list(), FIRST_RECIPES):
        r = rows.filter(pl.col("series") == name)
        d = r.get_column("depth").to_numpy()
        ax.fill_between(d, r.get_column("min").to_numpy(), r.get_column("max").to_numpy(), color=colors[name],
                        alpha=0.18, linewidth=0)
        stopping = r.get_column("stopping")[0] if "stopping" in r.columns else None
        ax.plot(d, r.get_column("mean").to_numpy(), marker="o", markersize=4, color=colors[name],
                label=f"{curve_label(name, stopping)} (n={r.get_column('n').max()})")
    chance = rows.get_column("chance").drop_nulls()
    if chance.len():
        c = float(chance[0])
        ax.axhline(c, color="0.35", linestyle=":", linewidth=1, label=f"chance ({c:.3g})")
        ax.axhline((c + 1) / 2, color="0.35", linestyle="--", linewidth=1, label="midpoint (chance + 1) / 2")
    d_train = rows.get_column("train_depth").drop_nulls().unique()
    depths = rows.get_column("depth").unique().sort().to_list()
    ax.set_xscale("log", base=2)
    if depths:
        one = int(d_train[0]) if d_train.len() == 1 else None
        labelled = labelled_depths(depths, one)
        ax.set_xticks(labelled, [f"{d}\n{d / one:.3g}×" if one else str(d) for d in labelled])
        ax.set_xticks([d for d in depths if d not in labelled], minor=True)
        ax.xaxis.set_minor_formatter(NullFormatter())
        if one:
            ax.axvline(one, color="0.2", linewidth=0.8, alpha=0.6)
            ax.annotate("d_train", (one, 0.02), xytext=(3, 0), textcoords="offset points", fontsize=8, color="0.2")
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("test depth d (multiple of the train length)")
    ax.set_ylabel("full-state accuracy")
    _legend_below(fig, ax.get_legend_handles_labels()[0], "shaded: min–max over seeds")
    return _save(fig, path)


def g_by_backbone(g: pl.DataFrame, per_seed: pl.DataFrame, path: str | Path, *, task: str) -> Path:
    """G per backbone, one marker per series at mean ± std (error bar) with the seeds as small points; triangles mark
    lower bounds (a censored seed). ``g``: :func:`analysis.aggregate.g_summary`; ``per_seed``:
    :func:`analysis.aggregate.extrapolation_per_seed`."""
    g = with_series(g.filter((pl.col("task") == task) & (pl.col("n") > 0)))
    seeds = with_series(per_seed.filter((pl.col("task") == task) & (pl.col("status") == "FINISHED")
                                        & pl.col("G").is_not_null()))
    fig, ax = _figure(f"{task}: extrapolation factor G per backbone")
    backbones = _in_order(g.get_column("backbone").to_list())
    names = _in_order(g.get_column("series").to_list(), FIRST_RECIPES)
    colors = _colors(names)
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        offset = (i - (len(names) - 1) / 2) * width
        r = g.filter(pl.col("series") == name)
        for row in r.iter_rows(named=True):
            x = backbones.index(row["backbone"]) + offset
            std = row["G_std"] if row["G_std"] is not None and not math.isnan(row["G_std"]) else 0.0
            ax.errorbar(x, row["G_mean"], yerr=std, fmt="^" if row["lower_bound"] else "o", color=colors[name],
                        markersize=7, capsize=3, markerfacecolor="white" if row["lower_bound"] else colors[name])
        s = seeds.filter(pl.col("series") == name).with_columns(
            pl.int_range(pl.len()).over("backbone").alias("_i"))  # spread a configuration's seeds sideways
        if s.height:
            x = (np.array([backbones.index(b) for b in s.get_column("backbone").to_list()]) + offset
                 + (0.15 + 0.07 * s.get_column("_i").to_numpy()) * width)
            cens = s.get_column("censored").fill_null(False).to_numpy()
            gs = s.get_column("G").to_numpy()
            ax.scatter(x[~cens], gs[~cens], s=14, color=colors[name], alpha=0.6, marker="o", linewidths=0)
            ax.scatter(x[cens], gs[cens], s=22, color=colors[name], alpha=0.6, marker="^", linewidths=0)
    ax.axhline(1.0, color="0.35", linestyle=":", linewidth=1)
    ax.set_xticks(range(len(backbones)), backbones, rotation=20 if len(backbones) > 3 else 0)
    ax.set_xlim(-0.6, len(backbones) - 0.4)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("backbone")
    ax.set_ylabel("G = d50 / d_train")
    handles = [Line2D([], [], color=colors[r], marker="o", linestyle="", label=r) for r in names]
    handles += [Line2D([], [], color="0.3", marker="^", markerfacecolor="white", linestyle="",
                       label="mean is a lower bound (≥)"),
                Line2D([], [], color="0.3", marker="o", markersize=4, alpha=0.6, linestyle="", label="seed"),
                Line2D([], [], color="0.3", marker="^", markersize=5, alpha=0.6, linestyle="",
                       label="censored seed (≥)")]
    _legend_below(fig, handles, "mean ± std over seeds (ddof = 1); small markers: single seeds")
    return _save(fig, path)


def _per_iteration(iterations: pl.DataFrame, kind: str, path: str | Path, *, task: str, ylabel: str,
                   title: str, ylim: tuple[float, float] | None) -> Path | None:
    rows = iterations.filter((pl.col("task") == task) & pl.col(f"{kind}_mean").is_not_null()).sort("k")
    if rows.is_empty():
        return None
    rows = with_series(rows)
    fig, ax = _figure(f"{task}: {title}")
    names = _in_order(rows.get_column("series").to_list(), FIRST_RECIPES)
    backbones = _in_order(rows.get_column("backbone").to_list())
    colors = _colors(names)
    for name in names:
        for j, backbone in enumerate(backbones):
            r = rows.filter((pl.col("series") == name) & (pl.col("backbone") == backbone))
            if r.is_empty():
                continue
            k = r.get_column("k").to_numpy()
            ax.fill_between(k, r.get_column(f"{kind}_min").to_numpy(), r.get_column(f"{kind}_max").to_numpy(),
                            color=colors[name], alpha=0.15, linewidth=0)
            label = name if len(backbones) == 1 else f"{name} · {backbone}"
            ax.plot(k, r.get_column(f"{kind}_mean").to_numpy(), color=colors[name],
                    linestyle=_LINESTYLES[j % len(_LINESTYLES)], marker="o", markersize=3,
                    label=f"{label} (n={r.get_column(f'{kind}_n').max()})")
    ks = rows.get_column("k").unique().sort().to_list()
    if len(ks) <= 16:
        ax.set_xticks(ks)
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_xlabel("iteration k")
    ax.set_ylabel(ylabel)
    _legend_below(fig, ax.get_legend_handles_labels()[0], "shaded: min–max over seeds")
    return _save(fig, path)


def rms_trajectory(iterations: pl.DataFrame, path: str | Path, *, task: str) -> Path | None:
    """Mean state RMS after iteration k (``rms_k{K}``) per series (× backbone), band = min–max over seeds.
    ``None`` when no trial of ``task`` logged it. ``iterations``: :func:`analysis.aggregate.iteration_stats`."""
    return _per_iteration(iterations, "rms", path, task=task, ylabel="state RMS", title="state RMS over iterations",
                          ylim=None)


def halting_probability(iterations: pl.DataFrame, path: str | Path, *, task: str) -> Path | None:
    """Mean halting probability after iteration k (``halt_prob_k{K}``) per series (× backbone), band = min–max over
    seeds. ``None`` when no trial of ``task`` logged it."""
    return _per_iteration(iterations, "halt_prob", path, task=task, ylabel="halting probability",
                          title="halting probability vs iteration", ylim=(-0.02, 1.02))


def plot_all(summary: Summary, out_dir: str | Path) -> list[Path]:
    """Every figure the sweep's metrics support, as PNGs in ``out_dir``:
    ``accuracy_<task>_<backbone>.png`` (each configuration's extrapolation curve: its own halting where it has a
    halting read-out, :func:`analysis.aggregate.curve_stats`), ``G_<task>.png`` (R = ⌈d/c⌉), ``rms_<task>.png``,
    ``halt_prob_<task>.png``."""
    out = Path(out_dir)
    paths: list[Path] = []
    pairs = summary.accuracy.select("task", "backbone").unique().drop_nulls()
    curves = curve_stats(summary.accuracy, summary.stopping_accuracy)  # own halting where a configuration has it
    for task, backbone in ordered_pairs(pairs):
        paths.append(accuracy_by_depth(curves, out / f"{file_stem('accuracy', task, backbone)}.png",
                                       task=task, backbone=backbone))
    tasks = _in_order(summary.G.filter(pl.col("n") > 0).get_column("task").drop_nulls().to_list())
    for task in tasks:
        paths.append(g_by_backbone(summary.G, summary.per_seed, out / f"{file_stem('G', task)}.png", task=task))
        for fn, stem in ((rms_trajectory, "rms"), (halting_probability, "halt_prob")):
            p = fn(summary.iterations, out / f"{file_stem(stem, task)}.png", task=task)
            if p is not None:
                paths.append(p)
    return paths


def ordered_pairs(pairs: pl.DataFrame) -> list[tuple[str, str]]:
    """(task, backbone) rows in display order."""
    rows = list(pairs.iter_rows())
    tasks, backbones = display_rank([t for t, _ in rows]), display_rank([b for _, b in rows])
    return sorted(rows, key=lambda r: (tasks[r[0]], backbones[r[1]]))
