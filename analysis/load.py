"""MLflow runs of one sweep → polars frames (the analysis side of the tracking schema, ``par_ray.tracking_schema``,
whose names and metric-name patterns it reads with).

A sweep is one MLflow parent run (tag ``par_ray.role = "sweep"``); each trial is a child run (tags
``mlflow.parentRunId``, ``par_ray.role = "trial"``, ``par_ray.{trial_id,recipe,backbone,task,seed,git_commit}``,
params = the flat trial config, final metrics ``acc_d{D}``, ``acc_query_d{D}``, ``chance``, optional
``halt_acc_d{D}``, ``oracle_acc_d{D}``, ``halt_iter_d{D}``, ``never_halted_d{D}``, ``halt_dR_mean_d{D}``,
``halt_dR_std_d{D}``, ``best_acc_d{D}``, ``best_iter_d{D}`` (``par_ray.evaluation.halting_metrics``: the primary
stopping rule, params ``eval.halt_k``, ``eval.halt_n``, ``eval.halt_tau``), the same but ``oracle_acc``,
``best_acc`` and ``best_iter`` (which no rule changes) for each extra rule of ``eval.halt_rules`` with the rule in
the name, ``{kind}_d{D}_k{k}n{n}t{tau}`` (``halt_acc_d32_k4n8t0.3``), and, for trials trained with
``recipe.dense_pending``, every one of those but ``oracle_acc`` again for the last operation's pending signal with
``_pending`` appended (``halt_acc_d32_pending``, ``halt_acc_d32_k4n8t0.3_pending``), ``cot_tokens_d{D}`` (the ``cot``
baseline's mean generated tokens), ``rms_k{K}``, ``halt_prob_k{K}``). Trials are grouped by
their tags, never by run names, and by their ``config``: the params that vary between the loaded trials of one
(task, backbone, recipe), seed excepted (:func:`config_labels`). After an Optuna search, each sampled configuration is
then its own group with its own seeds; after a grid of recipes × backbones × seeds, ``config`` is empty.

Four frames come out (:class:`SweepFrames`):

- ``trials``: one row per child run, whatever its status (FINISHED, FAILED, RUNNING, KILLED, or
  :data:`STOPPED_EARLY` for a FINISHED run that ASHA stopped early): failed, running and stopped trials are kept and
  marked, aggregates filter on ``status`` later and count what they left out; ``error`` is a FAILED trial's reason
  (its run's ``par_ray.error`` tag: error class and message), null otherwise; ``stopped_early`` the
  ``par_ray.stopped_early`` tag ("step S of N"), null otherwise.
- ``acc``: long, one row per (run, test depth): ``acc`` (full-state), ``acc_query``, the primary rule's halting
  metrics ``halt_acc``, ``oracle_acc``, ``halt_iter``, ``never_halted``, ``halt_dR_mean``, ``halt_dR_std``,
  ``cot_tokens``, and the oracle best fixed R's ``best_acc`` and ``best_iter`` (halting trials; null where not
  logged).
- ``halting``: long, one row per (run, stopping signal, stopping rule, test depth) of every run that logged halting
  metrics, the primary rule and each extra rule: the ``signal`` (:data:`SIGNALS`: ``query``, the paper's halting
  read-out; ``pending``, the last operation's pending read-out where logged), the rule (``rule`` =
  ``"6 of 8, τ 0.5"``, ``halt_k``, ``halt_n``, ``halt_tau``, ``primary``) and :data:`HALT_KINDS`, ``oracle_acc``
  being the run's one oracle-stopping accuracy at that depth.
- ``by_iteration``: long, one row per (run, iteration k): ``rms`` and ``halt_prob`` (null where not logged).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl
import polars.selectors as cs

from par_ray import tracking_schema

TRIAL_KEYS = ("task", "backbone", "recipe", "config")
"""Columns that name a configuration (three tags and :func:`config_labels`); seeds of one configuration are aggregated
together."""
SEED_PARAMS = ("train.seed",)
"""Flat config keys that tell seeds of one configuration apart (never part of ``config``)."""

_TAGS = {**tracking_schema.TRIAL_TAGS, "error": tracking_schema.TAG_ERROR,  # frame column -> MLflow tag
         "stopped_early": tracking_schema.TAG_STOPPED_EARLY}
STOPPED_EARLY = "STOPPED_EARLY"
"""``status`` of a trial a search's scheduler (ASHA) stopped before ``train.steps``: its MLflow run is FINISHED with
the tag ``par_ray.stopped_early`` (``tracking_schema.TAG_STOPPED_EARLY``). Its metrics are from the step where it
stopped, so the aggregates (FINISHED only) leave it out and count it apart."""
_PARAMS = {  # frame column -> flat config key (par_ray.config.to_flat); only what the tables and plots use
    "train_depth": "task.train_depth",
    "eval_depths": "eval.depths",
    "anchoring": "recipe.anchoring",
    "targets": "recipe.targets",
    "distill": "recipe.distill",
    "halt_k": "eval.halt_k",
    "halt_n": "eval.halt_n",
    "halt_tau": "eval.halt_tau",
}
DEPTH_KINDS = ("acc", "acc_query", "halt_acc", "oracle_acc", "halt_iter", "never_halted", "halt_dR_mean",
               "halt_dR_std", "cot_tokens", "best_acc", "best_iter")
"""Per (run, depth) columns of the ``acc`` frame: the schema's depth metrics (``par_ray.tracking_schema``) but
``halt_gap`` (recomputed from halt_acc and oracle_acc where needed), ``acc_lo`` / ``acc_hi`` and ``best_R``."""
ITER_KINDS = ("rms", "halt_prob")
"""Per (run, iteration) columns of the ``by_iteration`` frame."""
HALT_KINDS = ("halt_acc", "oracle_acc", "halt_iter", "never_halted", "halt_dR_mean", "halt_dR_std")
"""Per (run, rule, depth) columns of the ``halting`` frame."""
_RULE_KINDS = tuple(k for k in HALT_KINDS if k != "oracle_acc")  # oracle stopping does not depend on the rule
_DEPTH_METRIC = tracking_schema.depth_metric_pattern(DEPTH_KINDS)
_ITER_METRIC = tracking_schema.iteration_metric_pattern(ITER_KINDS)
_RULE_METRIC = tracking_schema.depth_metric_pattern(_RULE_KINDS, rule=True)
"""An extra rule's metric: ``halt_acc_d32_k4n8t0.3``."""
_PENDING_METRIC = tracking_schema.depth_metric_pattern(_RULE_KINDS, pending=True)
"""The primary rule's metric on the pending signal: ``halt_acc_d32_pending``."""
_PENDING_RULE_METRIC = tracking_schema.depth_metric_pattern(_RULE_KINDS, rule=True, pending=True)
"""An extra rule's metric on the pending signal: ``halt_acc_d32_k4n8t0.3_pending``."""
SIGNALS = ("query", "pending")
"""Stopping signals of ``halting`` rows, in display order: ``query``, P(Yes) of the halting query (paper §3); and
``pending``, 1 − P(pending) of the dense read-out at the last operation (``recipe.dense_pending``; a par_ray signal,
docs/experiments.md §14)."""
RULE_SCHEMA = {"rule": pl.String, "halt_k": pl.Int64, "halt_n": pl.Int64, "halt_tau": pl.Float64}
"""The stopping rule of a ``halting`` row: its label (:func:`rule_label`) and (k, n, τ)."""

TRIAL_SCHEMA = {
    "run_id": pl.String,
    "status": pl.String,
    "trial_id": pl.String,
    "task": pl.String,
    "backbone": pl.String,
    "recipe": pl.String,
    "config": pl.String,
    "seed": pl.Int64,
    "git_commit": pl.String,
    "error": pl.String,
    "stopped_early": pl.String,
    "train_depth": pl.Int64,
    "eval_depths": pl.String,
    "anchoring": pl.String,
    "targets": pl.String,
    "distill": pl.String,
    "halt_k": pl.Int64,
    "halt_n": pl.Int64,
    "halt_tau": pl.Float64,
    "start_time": pl.Datetime("ms", "UTC"),
    "end_time": pl.Datetime("ms", "UTC"),
    "duration_s": pl.Float64,
    "chance": pl.Float64,
}
"""Columns every ``trials`` frame has, in order; the run's final metrics follow as Float64 columns."""
_ID_COLUMNS = ("run_id", "status", "task", "backbone", "recipe", "config", "seed", "train_depth", "chance")
"""Trial columns carried into the long frames."""


class AnalysisError(ValueError):
    """Bad input to the analysis (unknown experiment, no trial runs, unknown parent run). The message names the
    CLI flag at fault, e.g. ``"--experiment: no MLflow experiment named 'x' at sqlite:///m.db"``."""


@dataclass(frozen=True)
class SweepFrames:
    """The runs of one sweep (or one experiment) as polars frames."""

    trials: pl.DataFrame
    """One row per child run: ``TRIAL_SCHEMA`` columns, then one Float64 column per final metric."""
    acc: pl.DataFrame
    """Long: ``_ID_COLUMNS`` + ``depth`` (Int64) + ``DEPTH_KINDS`` (Float64, null where not logged)."""
    halting: pl.DataFrame
    """Long: ``_ID_COLUMNS`` + ``signal`` (String) + ``RULE_SCHEMA`` + ``primary`` (Boolean) + ``depth`` (Int64) +
    ``HALT_KINDS`` (Float64, null where not logged); see :func:`halting_frame`."""
    by_iteration: pl.DataFrame
    """Long: ``_ID_COLUMNS`` + ``k`` (Int64, 1-based iteration) + ``ITER_KINDS`` (Float64, null where not logged)."""
    experiment_id: str | None = None
    """MLflow experiment id the runs came from (``None`` for frames built without MLflow)."""
    parent_run_id: str | None = None
    """Parent (sweep) run the trials were restricted to, if any."""


def config_labels(records: list[dict]) -> list[str]:
    """The ``config`` of each record: ``"key=value"`` pairs, sorted by key and joined by ``", "``, of every param that
    varies between records of the same (task, backbone, recipe) tags, except :data:`SEED_PARAMS` and the cost plan's
    ``cost.*`` params (predictions made from the config, which differ between seeds of one configuration).

    Params fixed by the tags (a backbone's sizes, a recipe's anchoring) and params equal in every trial are left out,
    so a grid sweep gets ``""`` everywhere and an Optuna search gets its sampled knobs (e.g.
    ``"recipe.grad_window=4, train.lr=0.00042"``). A param missing from a run counts as the value ``None``. Values
    are the logged strings, unshortened: two configurations never share a label.
    """
    def group(r: dict) -> tuple:
        return tuple(r["tags"].get(_TAGS[k]) for k in TRIAL_KEYS if k in _TAGS)

    keys = sorted(k for k in {k for r in records for k in r["params"]}
                  if k not in SEED_PARAMS and not k.startswith(tracking_schema.COST_PARAM_PREFIX))
    seen: dict[tuple, dict[str, set]] = {}
    for r in records:
        by_key = seen.setdefault(group(r), {})
        for k in keys:
            by_key.setdefault(k, set()).add(r["params"].get(k))
    varying = [k for k in keys if any(len(by_key[k]) > 1 for by_key in seen.values())]
    return [", ".join(f"{k}={r['params'].get(k)}" for k in varying) for r in records]


def trials_frame(records: list[dict]) -> pl.DataFrame:
    """``trials`` from plain records, one per run.

    Each record: ``run_id``, ``status``, ``start_ms`` / ``end_ms`` (epoch milliseconds, ``None`` while running),
    ``tags`` and ``params`` (str → str, MLflow keys) and ``metrics`` (str → float). Missing tags and params become
    null; ``seed`` and ``train_depth`` that do not parse as integers become null; ``status`` is
    :data:`STOPPED_EARLY` for a FINISHED run tagged ``par_ray.stopped_early``; ``config`` is
    :func:`config_labels` over all the records.
    """
    rows = [
        {
            "run_id": r["run_id"],
            "status": r["status"],
            "config": config,
            "start_ms": r.get("start_ms"),
            "end_ms": r.get("end_ms"),
            **{col: r["tags"].get(tag) for col, tag in _TAGS.items()},
            **{col: r["params"].get(key) for col, key in _PARAMS.items()},
            **{f"metric:{k}": float(v) for k, v in r["metrics"].items()},
        }
        for r, config in zip(records, config_labels(records))
    ]
    raw_schema = {"run_id": pl.String, "status": pl.String, "config": pl.String, "start_ms": pl.Int64,
                  "end_ms": pl.Int64}
    raw_schema |= {col: pl.String for col in (*_TAGS, *_PARAMS)}
    metric_names = sorted({k for r in records for k in r["metrics"]},  # acc_d8 before acc_d16
                          key=lambda m: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", m)])
    raw_schema |= {f"metric:{k}": pl.Float64 for k in metric_names}
    raw = pl.from_dicts(rows, schema=raw_schema) if rows else pl.DataFrame(schema=raw_schema)
    metrics = [m for m in metric_names if m != "chance"]
    return raw.select(
        "run_id",
        pl.when((pl.col("status") == "FINISHED") & pl.col("stopped_early").is_not_null())
        .then(pl.lit(STOPPED_EARLY)).otherwise(pl.col("status")).alias("status"),
        "trial_id",
        "task",
        "backbone",
        "recipe",
        "config",
        pl.col("seed").str.strip_chars().cast(pl.Int64, strict=False),
        "git_commit",
        "error",
        "stopped_early",
        pl.col("train_depth").str.strip_chars().cast(pl.Int64, strict=False),
        "eval_depths",
        "anchoring",
        "targets",
        "distill",
        pl.col("halt_k", "halt_n").str.strip_chars().cast(pl.Int64, strict=False),
        pl.col("halt_tau").str.strip_chars().cast(pl.Float64, strict=False),
        pl.from_epoch("start_ms", time_unit="ms").dt.replace_time_zone("UTC").alias("start_time"),
        pl.from_epoch("end_ms", time_unit="ms").dt.replace_time_zone("UTC").alias("end_time"),
        ((pl.col("end_ms") - pl.col("start_ms")) / 1000.0).alias("duration_s"),
        (pl.col("metric:chance") if "chance" in metric_names else pl.lit(None, pl.Float64)).alias("chance"),
        # a metric named like a trial column (e.g. "seed") keeps its "metric:" prefix rather than shadow it
        *[pl.col(f"metric:{m}").alias(m if m not in TRIAL_SCHEMA else f"metric:{m}") for m in metrics],
    )


def _long(trials: pl.DataFrame, pattern: str, index: str, kinds: tuple[str, ...]) -> pl.DataFrame:
    """Unpivot the metric columns matching ``pattern`` (groups ``kind`` and ``index``) into one row per (run,
    index), one column per kind; kinds never logged become null columns so the schema is fixed."""
    schema = {c: trials.schema[c] for c in _ID_COLUMNS} | {index: pl.Int64} | {k: pl.Float64 for k in kinds}
    metric_cols = trials.select(cs.matches(pattern)).columns
    if not metric_cols:
        return pl.DataFrame(schema=schema)
    long = (
        trials.unpivot(index="run_id", on=metric_cols, variable_name="metric")
        .filter(pl.col("value").is_not_null())  # the wide frame has a null wherever a run did not log a metric
        .with_columns(pl.col("metric").str.extract_groups(pattern))
        .unnest("metric")
        .with_columns(pl.col(index).cast(pl.Int64))
        .pivot(on="kind", index=["run_id", index], values="value")
    )
    missing = [pl.lit(None, pl.Float64).alias(k) for k in kinds if k not in long.columns]
    return (
        long.with_columns(missing)
        .join(trials.select(_ID_COLUMNS), on="run_id", how="left")
        .select(list(schema))
        .sort("run_id", index)
    )


def rule_label(k: pl.Expr, n: pl.Expr, tau: pl.Expr) -> pl.Expr:
    """``"6 of 8, τ 0.5"``: the stopping rule "k of n, τ" for display (null where any part is unknown)."""
    return pl.format("{} of {}, τ {}", k, n, tau)


def halting_frame(trials: pl.DataFrame, acc: pl.DataFrame) -> pl.DataFrame:
    """``SweepFrames.halting``: one row per (run, stopping signal, stopping rule, test depth) of every run that logged
    halting metrics.

    The primary rule's rows are the ``acc`` rows with any of :data:`HALT_KINDS` logged, their rule (k, n, τ) read
    from the run's params ``eval.halt_k``, ``eval.halt_n``, ``eval.halt_tau`` (the ``trials`` columns ``halt_k``,
    ``halt_n``, ``halt_tau``; null when not logged or when ``trials`` has no such columns, e.g. built by hand), with
    ``primary`` true. Each extra rule's rows come from the trial metric columns named like ``halt_acc_d32_k4n8t0.3``
    (k, n, τ read from the name), with ``primary`` false and ``oracle_acc`` the primary rows' value at that depth (one
    oracle-stopping accuracy per run and depth, whatever the rule). These rows have ``signal`` ``"query"``; the same
    metrics of the pending signal (``halt_acc_d32_pending``, ``halt_acc_d32_k4n8t0.3_pending``, see
    ``par_ray.evaluation.halting_metrics``) give rows with ``signal`` ``"pending"``, their rule and ``oracle_acc``
    found the same way. Columns: ``_ID_COLUMNS``, ``signal``, ``RULE_SCHEMA``, ``primary``, ``depth``,
    ``HALT_KINDS``, sorted by run, signal (:data:`SIGNALS` order), rule (n, k, τ) and depth.
    """
    rule_types = {c: t for c, t in RULE_SCHEMA.items() if c != "rule"}
    ids = [c for c in _ID_COLUMNS if c in acc.columns]  # all of them, but in frames built by hand (no config)
    schema = ({c: acc.schema[c] for c in ids} | {"signal": pl.String} | RULE_SCHEMA
              | {"primary": pl.Boolean, "depth": pl.Int64} | {k: pl.Float64 for k in HALT_KINDS})
    rules = trials.select("run_id", *[(pl.col(c) if c in trials.columns else pl.lit(None)).cast(t).alias(c)
                                      for c, t in rule_types.items()])
    acc = acc.with_columns([pl.lit(None, pl.Float64).alias(k) for k in HALT_KINDS if k not in acc.columns])
    primary = (acc.filter(pl.any_horizontal(pl.col(HALT_KINDS).is_not_null()))
               .join(rules, on="run_id", how="left")
               .with_columns(pl.lit(True).alias("primary"), pl.lit("query").alias("signal")))
    parts = [primary]
    for pattern, is_primary, signal in ((_RULE_METRIC, False, "query"), (_PENDING_METRIC, True, "pending"),
                                        (_PENDING_RULE_METRIC, False, "pending")):
        metric_cols = trials.select(cs.matches(pattern)).columns
        if not metric_cols:
            continue
        named = {"depth": pl.Int64} | ({} if is_primary else rule_types)  # groups of the metric name
        part = (
            trials.unpivot(index="run_id", on=metric_cols, variable_name="metric")
            .filter(pl.col("value").is_not_null())
            .with_columns(pl.col("metric").str.extract_groups(pattern))
            .unnest("metric")
            .with_columns([pl.col(c).cast(t) for c, t in named.items()])
            .pivot(on="kind", index=["run_id", *named], values="value")
        )
        if is_primary:  # the rule of the primary rows: the run's params
            part = part.join(rules, on="run_id", how="left")
        part = (part.with_columns([pl.lit(None, pl.Float64).alias(k) for k in _RULE_KINDS if k not in part.columns])
                .join(primary.select("run_id", "depth", "oracle_acc"), on=["run_id", "depth"], how="left")
                .join(trials.select(ids), on="run_id", how="left")
                .with_columns(pl.lit(is_primary).alias("primary"), pl.lit(signal).alias("signal")))
        parts.append(part)
    out = pl.concat([p.with_columns(rule_label(pl.col("halt_k"), pl.col("halt_n"), pl.col("halt_tau")).alias("rule"))
                     .select(list(schema)).cast(schema) for p in parts])
    return out.sort("run_id", signal_rank(pl.col("signal")), "halt_n", "halt_k", "halt_tau", "depth",
                    nulls_last=True)


def signal_rank(signal: pl.Expr) -> pl.Expr:
    """Sort key of a ``signal`` column: its position in :data:`SIGNALS` (``query`` first), unknown names after."""
    return signal.replace_strict({s: i for i, s in enumerate(SIGNALS)}, default=len(SIGNALS),
                                 return_dtype=pl.Int64)


def frames_from_trials(trials: pl.DataFrame, experiment_id: str | None = None,
                       parent_run_id: str | None = None) -> SweepFrames:
    """``acc``, ``halting`` and ``by_iteration`` derived from a ``trials`` frame (metric columns ``acc_d{D}``,
    ``halt_acc_d{D}_k4n8t0.3``, ``rms_k{K}``, …)."""
    acc = _long(trials, _DEPTH_METRIC, "depth", DEPTH_KINDS)
    return SweepFrames(
        trials=trials,
        acc=acc,
        halting=halting_frame(trials, acc),
        by_iteration=_long(trials, _ITER_METRIC, "k", ITER_KINDS),
        experiment_id=experiment_id,
        parent_run_id=parent_run_id,
    )


# --------------------------------------------------------------------------------------------------------------------
# MLflow


def mlflow_client(tracking_uri: str | None):
    """``MlflowClient`` for ``tracking_uri`` (``None`` = MLflow's default); mlflow is imported only here."""
    from mlflow import MlflowClient  # local: the frame-level functions above work without importing mlflow

    return MlflowClient(tracking_uri=tracking_uri)


def _search_all(client, experiment_id: str, filter_string: str, order_by: list[str] | None = None) -> list:
    """Every active run matching ``filter_string``, following MLflow's page tokens."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string, max_results=1000, order_by=order_by,
                                  page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def experiment_id_of(client, experiment: str) -> str:
    """The id of the experiment named ``experiment``. Raises :class:`AnalysisError` (``--experiment``)."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise AnalysisError(f"--experiment: no MLflow experiment named {experiment!r} at tracking URI "
                            f"{client.tracking_uri!r} (check --tracking-uri)")
    return exp.experiment_id


def sweep_runs(client, experiment_id: str) -> list:
    """Parent runs (tag ``par_ray.role = "sweep"``) of the experiment, newest first."""
    return _search_all(client, experiment_id, f"tags.`{tracking_schema.TAG_ROLE}` = '{tracking_schema.ROLE_SWEEP}'",
                       ["attributes.start_time DESC"])


def load_sweep(experiment: str, parent_run_id: str | None = None, tracking_uri: str | None = None) -> SweepFrames:
    """Every trial run of ``experiment`` (or only the children of ``parent_run_id``) as :class:`SweepFrames`.

    Args:
        experiment: MLflow experiment name, e.g. ``"par_ray/backbone_scaling"``.
        parent_run_id: restrict to the child runs of this sweep run; ``None`` = every trial in the experiment.
        tracking_uri: MLflow tracking URI; ``None`` = MLflow's default (``MLFLOW_TRACKING_URI`` or ``./mlruns``).
    Raises:
        AnalysisError: unknown experiment (``--experiment``), unknown or foreign parent run (``--parent-run``), or
            no trial runs (tag ``par_ray.role = "trial"``) to analyse.
    """
    client = mlflow_client(tracking_uri)
    exp_id = experiment_id_of(client, experiment)
    flt = f"tags.`{tracking_schema.TAG_ROLE}` = '{tracking_schema.ROLE_TRIAL}'"
    if parent_run_id is not None:
        check_parent(client, exp_id, experiment, parent_run_id)
        flt += f" and tags.`{tracking_schema.TAG_PARENT}` = '{parent_run_id}'"
    runs = _search_all(client, exp_id, flt)
    if not runs:
        where = f"under parent run {parent_run_id}" if parent_run_id else f"in experiment {experiment!r}"
        flag = "--parent-run" if parent_run_id else "--experiment"
        tag = f"{tracking_schema.TAG_ROLE} = '{tracking_schema.ROLE_TRIAL}'"
        raise AnalysisError(f"{flag}: no trial runs (tag {tag}) {where}")
    records = [
        {
            "run_id": r.info.run_id,
            "status": r.info.status,
            "start_ms": r.info.start_time,
            "end_ms": r.info.end_time,
            "tags": r.data.tags,
            "params": r.data.params,
            "metrics": r.data.metrics,
        }
        for r in runs
    ]
    return frames_from_trials(trials_frame(records).sort("start_time", "run_id"), exp_id, parent_run_id)


def check_parent(client, experiment_id: str, experiment: str, parent_run_id: str) -> None:
    """Raise :class:`AnalysisError` (``--parent-run``) unless ``parent_run_id`` is a run of this experiment."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(parent_run_id)
    except MlflowException:
        raise AnalysisError(f"--parent-run: no MLflow run with id {parent_run_id!r}") from None
    if run.info.experiment_id != experiment_id:
        raise AnalysisError(f"--parent-run: run {parent_run_id} belongs to experiment id {run.info.experiment_id}, "
                            f"not to {experiment!r} (id {experiment_id})")
