"""Plan vs actual: each trial's planned cost against what it used, and the MFU that makes the plan match.

A sweep logs on every child run its plan as params (``cost.*``, ``par_ray.cost.TrialCost.params``: planned FLOPs,
GPU-hours for training and evaluation, wall hours, dollars, the device, its peak) and what it used as metrics
(``gpu_seconds_train``, ``gpu_seconds_eval``, ``gpu_seconds_stage{i}``: the training loop's measured seconds × its
devices, ``par_ray.train.loop.gpu_seconds``; ``flops_eval``: the FLOPs its evaluations did); both sets of names are
``par_ray.tracking_schema``'s. MLflow keeps the run's wall time (start to end). This module joins the two into the
``plan_vs_actual`` table and derives the measured MFU per device and phase, FLOPs ÷ (actual device-seconds × peak), and
the start-up (wall time outside the steps and evaluations), written as ``cost_overrides.json``: a price file the sweeps'
``--prices`` reads (``par_ray.hardware.load_table``), so the next plan uses the MFU and start-up this sweep measured.
The FLOPs are the plan's for training (the expectation over the step's draws) and, for evaluation, those the evaluations
did (``flops_eval``, ``par_ray.cost.eval_flops_done``; the plan's where a run predates it): the plan counts the test
sequences adaptive sampling may add at their worst case, 1.7–2.2 × the evaluation FLOPs the ``main_results`` sweep's
trials did, and an MFU measured against it read as much too high (above 1; docs/experiments.md §43).
"""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path

import polars as pl

from analysis.tables import MISSING, Table
from par_ray.tracking_schema import FLOPS_EVAL, GPU_SECONDS_EVAL, GPU_SECONDS_TRAIN, cost_param

PARAMS = {field: cost_param(field) for field in (
    "device", "devices", "peak_flops", "planned_train_flops", "planned_eval_flops", "planned_train_gpu_hours",
    "planned_eval_gpu_hours", "planned_wall_hours", "planned_startup_hours", "planned_usd")}
"""Frame column → MLflow param of the plan (``par_ray.tracking_schema.cost_param``)."""
OVERRIDES_FILE = "cost_overrides.json"


def planned_frame(client, run_ids: typing.Iterable[str]) -> pl.DataFrame:
    """One row per run that logged a cost plan: ``run_id`` and the :data:`PARAMS` columns (numbers as Float64)."""
    rows = []
    for run_id in run_ids:
        params = client.get_run(run_id).data.params
        if PARAMS["planned_train_flops"] in params:
            rows.append({"run_id": run_id, **{col: params.get(key) for col, key in PARAMS.items()}})
    schema = {"run_id": pl.String, **{c: pl.String for c in PARAMS}}
    frame = pl.from_dicts(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
    numeric = [c for c in PARAMS if c != "device"]
    return frame.with_columns(pl.col(numeric).cast(pl.Float64, strict=False))


def joined(trials: pl.DataFrame, planned: pl.DataFrame) -> pl.DataFrame:
    """Finished trials with their plan and their actual device-hours, wall hours, evaluation FLOPs (``eval_flops``:
    the run's :data:`~par_ray.tracking_schema.FLOPS_EVAL`, else the plan's) and measured MFUs."""
    have = set(trials.columns)
    metric = {k: (pl.col(k).cast(pl.Float64) if k in have else pl.lit(None, pl.Float64))
              for k in (GPU_SECONDS_TRAIN, GPU_SECONDS_EVAL, FLOPS_EVAL)}
    frame = trials.filter(pl.col("status") == "FINISHED").join(planned, on="run_id", how="inner")
    return frame.with_columns(
        (metric[GPU_SECONDS_TRAIN] / 3600).alias("actual_train_gpu_hours"),
        (metric[GPU_SECONDS_EVAL] / 3600).alias("actual_eval_gpu_hours"),
        (pl.col("duration_s") / 3600).alias("actual_wall_hours"),
        metric[FLOPS_EVAL].fill_nan(None).fill_null(pl.col("planned_eval_flops")).alias("eval_flops"),
    ).with_columns(
        # the wall time the loop's steps and evaluations do not account for: worker group, model, MLflow, checkpoints
        (pl.col("actual_wall_hours") - (pl.col("actual_train_gpu_hours") + pl.col("actual_eval_gpu_hours"))
         / pl.col("devices")).alias("actual_startup_hours"),
        (pl.col("planned_train_flops") / (pl.col("actual_train_gpu_hours") * 3600 * pl.col("peak_flops")))
        .alias("mfu_train"),
        (pl.col("eval_flops") / (pl.col("actual_eval_gpu_hours") * 3600 * pl.col("peak_flops")))
        .alias("mfu_eval"),
    )


def _pct(planned: float | None, actual: float | None) -> str:
    if planned is None or actual is None or not actual or math.isnan(actual):
        return MISSING
    return f"{100 * (planned - actual) / actual:+.0f} %"


def _h(x: float | None) -> str:
    if x is None or math.isnan(x):
        return MISSING
    return f"{x * 3600:.0f} s" if x < 1 / 60 else f"{x * 60:.1f} min" if x < 1 else f"{x:.2f} h"


def plan_vs_actual(frame: pl.DataFrame) -> Table | None:
    """The ``plan_vs_actual`` table from :func:`joined`: per finished trial, planned and actual device-hours of
    training and evaluation and wall time (planned − actual, in % of actual), and the measured MFUs; ``None``
    without trials that logged a plan."""
    if frame.height == 0:
        return None
    rows = []
    for r in frame.sort("backbone", "recipe", "task", "seed").iter_rows(named=True):
        rows.append({
            "trial": f"{r['recipe']} · {r['backbone']} · {r['task']} · seed {r['seed']}",
            "devices": f"{int(r['devices'] or 0)} × {r['device']}",
            "train: plan": _h(r["planned_train_gpu_hours"]), "train: actual": _h(r["actual_train_gpu_hours"]),
            "eval: plan": _h(r["planned_eval_gpu_hours"]), "eval: actual": _h(r["actual_eval_gpu_hours"]),
            "wall: plan": _h(r["planned_wall_hours"]), "wall: actual": _h(r["actual_wall_hours"]),
            "wall error": _pct(r["planned_wall_hours"], r["actual_wall_hours"]),
            "start-up: plan": _h(r["planned_startup_hours"]), "start-up: actual": _h(r["actual_startup_hours"]),
            "MFU train": MISSING if r["mfu_train"] is None else f"{r['mfu_train']:.3f}",
            "MFU eval": MISSING if r["mfu_eval"] is None else f"{r['mfu_eval']:.3f}",
        })
    totals = frame.select(pl.col("planned_wall_hours", "actual_wall_hours").sum())
    note = (f"Device-hours: training steps and evaluations as the loop measured them × the trial's devices "
            f"(metrics gpu_seconds_train, gpu_seconds_eval); wall: the MLflow run's start to end (Ray start-up, "
            f"checkpoints and reports included); wall error: (plan − actual) ÷ actual, positive where the plan was "
            f"longer; start-up: the wall time outside the steps and evaluations. Plan: "
            f"par_ray.cost at the MFU and start-up in the run's params (cost.mfu_train, cost.mfu_eval, "
            f"cost.planned_startup_hours); measured MFU = FLOPs ÷ (actual device-seconds × peak): training's as "
            f"planned, evaluation's as the run did them (metric {FLOPS_EVAL}; the plan counts the test sequences "
            f"adaptive sampling may add at their worst case). Sum of "
            f"trial wall times: plan {_h(totals[0, 0])}, actual {_h(totals[0, 1])} "
            f"({_pct(totals[0, 0], totals[0, 1])}).")
    return Table("plan_vs_actual", "Planned vs actual cost per trial", pl.DataFrame(rows), (note,))


def measured_overrides(frame: pl.DataFrame, source: str) -> dict:
    """A price file (``par_ray.hardware.load_table``) setting each device's measured MFUs: the device-seconds-weighted
    mean over the finished trials of :func:`joined` (their FLOPs, evaluation's as run, ÷ their device-seconds × peak);
    and, beside a measured MFU, its start-up (``startup_s``: the median over those trials of the wall time outside their
    steps and evaluations)."""
    devices = {}
    for (device,), g in frame.group_by("device"):
        entry = {"mfu_source": source}
        for phase in ("train", "eval"):
            seconds = g.select(pl.col(f"actual_{phase}_gpu_hours") * 3600 * pl.col("peak_flops")).to_series()
            flops = g["planned_train_flops" if phase == "train" else "eval_flops"]
            ok = seconds.is_not_null() & (seconds > 0) & flops.is_not_null()
            if ok.any():
                mfu = float(flops.filter(ok).sum() / seconds.filter(ok).sum())
                if 0 < mfu <= 1:
                    entry[f"mfu_{phase}"] = mfu
        startup = g["actual_startup_hours"].drop_nulls().drop_nans().median()
        if len(entry) > 1 and startup is not None and startup >= 0:
            entry["startup_s"] = float(startup) * 3600
        if len(entry) > 1:
            devices[device] = entry
    return {"devices": devices}


def write_overrides(overrides: dict, out_dir: Path) -> Path | None:
    """``cost_overrides.json`` in ``out_dir`` (``None`` when no device has a measured MFU)."""
    if not overrides["devices"]:
        return None
    path = Path(out_dir) / OVERRIDES_FILE
    path.write_text(json.dumps(overrides, indent=2) + "\n", encoding="utf-8")
    return path
