"""One call from MLflow runs to files: load → summarize → tables + figures → log back to the sweep's parent run.

:func:`analyze` is what ``python -m analysis`` and the sweep scripts (at their end) call. Outputs in ``out_dir``:

- tables: ``main_results``, ``scale``, and when logged ``halting``, ``ablation``, ``label_free``, ``G_intervals``
  (each trial's G and interpolated G with their 95 % intervals, the seed spread beside them) and
  ``plan_vs_actual`` (each trial's planned vs actual device-hours and wall time, :mod:`analysis.cost`), each as
  ``.md``, ``.csv``, ``.tex``
  (:mod:`analysis.tables`);
- figures: ``accuracy_<task>_<backbone>.png``, ``G_<task>.png``, ``rms_<task>.png``, ``halt_prob_<task>.png``
  (:mod:`analysis.plots`);
- data: ``trials.csv`` (every trial, all statuses), ``accuracy.csv``, ``per_seed.csv`` (d50, G, censored),
  ``G.csv``, ``halting.csv``, ``accuracy_by_stopping.csv`` (halting trials: own halting, best R) and
  ``G_by_stopping.csv`` (halting trials: R = ⌈d/c⌉, own halting, best R), ``per_seed_intervals.csv`` (every trial's 95 %
  intervals, ``aggregate.g_intervals``), ``interval_spread.csv`` (``aggregate.interval_spread``),
  ``iterations.csv`` (each only when it has rows; ``trials.csv`` always),
  ``cost_overrides.json`` (the MFU the trials reached per device, for the sweeps' ``--prices``; not after a smoke
  test, whose few steps measure start-up, not MFU);
  ``summary.md`` gathers the tables and the warnings.

Every file is then logged as an artifact of the parent run, under ``analysis/``. The parent run is the one given,
or else the experiment's sweep run (tag ``par_ray.role = "sweep"``; the newest when there are several).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import polars as pl

from analysis import aggregate, load, plots, tables
from analysis import cost as plan_cost
from par_ray import tracking_schema

ARTIFACT_DIR = "analysis"
"""Artifact folder of the parent run that receives the outputs."""


def analyze(experiment: str, parent_run_id: str | None = None, tracking_uri: str | None = None,
            out_dir: str | Path | None = None, *, log_artifacts: bool = True, n_boot: int = 1000,
            ci: float = 0.95, seed: int = 0) -> dict:
    """Analyse a sweep and write its tables and figures.

    Args:
        experiment: MLflow experiment name, e.g. ``"par_ray/backbone_scaling"``.
        parent_run_id: analyse only this sweep's child runs and log to it. ``None``: analyse every trial of the
            experiment and log to its newest sweep run (a warning is added when the experiment has several).
        tracking_uri: MLflow tracking URI; ``None`` = MLflow's default.
        out_dir: output folder (created); ``None`` = a new temporary folder.
        log_artifacts: log the outputs to the parent run under ``analysis/`` (skipped when there is no parent run).
        n_boot, ci, seed: bootstrap settings of :func:`analysis.aggregate.bootstrap_ci`.
    Returns:
        ``{"out_dir", "experiment", "experiment_id", "parent_run_id" (the run logged to, or None), "n_trials",
        "n_finished", "excluded" ({status: n}), "tables" ({name: {"md"|"csv"|"tex": Path}}), "figures" ([Path]),
        "data" ([Path]), "main_table" (Markdown str), "warnings" ([str]), "summary" (aggregate.Summary),
        "frames" (load.SweepFrames)}``.
    Raises:
        load.AnalysisError: unknown experiment, unknown parent run, or no trial runs (message names the flag).
    """
    client = load.mlflow_client(tracking_uri)
    exp_id = load.experiment_id_of(client, experiment)
    warnings: list[str] = []
    target = parent_run_id
    if parent_run_id is None:
        sweeps = load.sweep_runs(client, exp_id)
        target = sweeps[0].info.run_id if sweeps else None
        if len(sweeps) > 1:
            warnings.append(f"experiment {experiment!r} has {len(sweeps)} sweep runs: analysed every trial, logged to "
                            f"the newest ({target}); pass --parent-run to analyse one sweep")
    frames = load.load_sweep(experiment, parent_run_id, tracking_uri)
    summary = aggregate.summarize(frames, n_boot=n_boot, ci=ci, seed=seed)
    warnings += summary.warnings

    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="par_ray_analysis_"))
    out.mkdir(parents=True, exist_ok=True)
    built = tables.build_tables(summary)
    costs = plan_cost.joined(frames.trials, plan_cost.planned_frame(client, frames.trials["run_id"].to_list()))
    vs = plan_cost.plan_vs_actual(costs)
    if vs is not None:  # planned vs actual device-hours and wall time (par_ray.cost's plan on each child run)
        built.append(vs)
    written = tables.write_tables(built, out)
    figures = plots.plot_all(summary, out)
    data = _write_data(frames, summary, out)
    # a smoke test's few steps measure start-up and compilation, not the MFU of real trials: no price file from them
    smoke = target is not None and client.get_run(target).data.tags.get(tracking_schema.TAG_SMOKE_TEST) == "true"
    if not smoke:
        overrides = plan_cost.write_overrides(
            plan_cost.measured_overrides(costs, f"{experiment} (python -m analysis)"), out)
        data += [overrides] if overrides else []
    main_md = tables.to_markdown(built[0])
    report = out / "summary.md"
    report.write_text(_summary_markdown(experiment, frames, built, warnings), encoding="utf-8")

    files = [report, *[p for paths in written.values() for p in paths.values()], *figures, *data]
    logged_to = None
    if log_artifacts and target is not None:
        for path in files:
            client.log_artifact(target, str(path), ARTIFACT_DIR)
        logged_to = target
    excluded = dict(summary.excluded.iter_rows())
    return {
        "out_dir": out,
        "experiment": experiment,
        "experiment_id": exp_id,
        "parent_run_id": logged_to,
        "n_trials": frames.trials.height,
        "n_finished": frames.trials.height - sum(excluded.values()),
        "excluded": excluded,
        "tables": written,
        "figures": figures,
        "data": data,
        "main_table": main_md,
        "warnings": warnings,
        "summary": summary,
        "frames": frames,
    }


def _write_data(frames: load.SweepFrames, summary: aggregate.Summary, out: Path) -> list[Path]:
    """The frames behind the tables as CSV (timestamps as ISO strings); an empty frame (no halting trials, say) writes
    no file, ``trials`` excepted."""
    items = {
        "trials": frames.trials.with_columns(pl.col(pl.Datetime).dt.to_string("%Y-%m-%dT%H:%M:%S%.3fZ")),
        "accuracy": summary.accuracy,
        "per_seed": summary.per_seed,
        "G": summary.G,
        "halting": summary.halting,
        "accuracy_by_stopping": summary.stopping_accuracy,
        "G_by_stopping": summary.stopping_G,
        "per_seed_intervals": summary.intervals,
        "interval_spread": summary.interval_spread,
        "iterations": summary.iterations,
    }
    paths = []
    for name, frame in items.items():
        if frame.height == 0 and name != "trials":
            continue
        path = out / f"{name}.csv"
        frame.write_csv(path)
        paths.append(path)
    return paths


def _summary_markdown(experiment: str, frames: load.SweepFrames, built: list[tables.Table],
                      warnings: list[str]) -> str:
    counts = frames.trials.group_by("status").agg(pl.len()).sort("status").iter_rows()
    lines = [f"# Analysis of `{experiment}`", "",
             f"Trials: {frames.trials.height} ({', '.join(f'{n} {s}' for s, n in counts)}); aggregates use "
             "FINISHED trials only.", ""]
    if warnings:
        lines += ["Warnings:", "", *[f"- {w}" for w in warnings], ""]
    lines += [tables.to_markdown(t) for t in built]
    return "\n".join(lines)
