"""The MLflow schema: every experiment, tag, metric and artifact name that ``par_ray.tracking`` writes and
``analysis`` reads, defined once (tags, never run names, identify things).

- experiment ``par_ray/<sweep name>`` (:func:`experiment_name`), tagged :data:`TAG_EXPERIMENT_KIND` =
  :data:`EXPERIMENT_KIND`;
- parent run per sweep: :data:`TAG_ROLE` = :data:`ROLE_SWEEP`, :data:`TAG_SWEEP`, :data:`TAG_EXPERIMENT_PATH`,
  :data:`TAG_GIT_COMMIT`, :data:`TAG_PRESET`, :data:`TAG_SMOKE_TEST`;
- child run per trial: :data:`TAG_PARENT`, :data:`TAG_ROLE` = :data:`ROLE_TRIAL`, and :data:`TRIAL_TAGS` (trial id,
  recipe, backbone, task, seed, git commit); params = ``par_ray.config.to_flat(cfg)`` (keys ``section.field``);
- metrics: the loop's reports at ``step=`` the optimizer step (keys in :data:`METRIC_RENAMES` renamed); per test
  depth D ``{kind}_d{D}`` (:func:`depth_metric`), with a stopping rule's suffix ``_k{k}n{n}t{tau}``
  (:func:`rule_suffix`) and/or the pending signal's ``_pending``; per iteration k ``{kind}_k{k}``
  (:func:`iteration_metric`); d50 and G of each stopping (:func:`g_metric`: ``G``, ``G_interp``, ``G_halt``,
  ``G_best``, …) and their 95 % intervals (``G_lo``, ``G_interp_hi``, …); the final curve :data:`CURVE_BY_DEPTH` /
  :data:`CURVE_BY_MULTIPLE`;
- artifacts :data:`ARTIFACTS`; a FAILED trial run also has :data:`TAG_ERROR` and :data:`ARTIFACT_ERROR`; a trial
  run ASHA stopped early ends FINISHED with :data:`TAG_STOPPED_EARLY`;
- cost (issue "what a sweep costs"): the plan as child-run params ``cost.<field>`` (:func:`cost_param`, fields
  :data:`COST_FIELDS`, ``par_ray.cost.TrialCost.params``), what the trial used as metrics :data:`GPU_SECONDS_TRAIN`,
  :data:`GPU_SECONDS_EVAL` and ``gpu_seconds_stage{i}`` (:func:`gpu_seconds_stage`), and the FLOPs its evaluations
  did, :data:`FLOPS_EVAL`; ``analysis.cost`` reads both.

Metric names are parsed back with :func:`parse_metric`, or, column-wise in polars, with the regular expressions of
:func:`depth_metric_pattern` and :func:`iteration_metric_pattern` (named groups, valid in Python's ``re`` and in
polars' Rust regex). This module imports nothing from par_ray: writers and readers at every layer may use it.
"""

from __future__ import annotations

import re
from typing import Sequence

EXPERIMENT_PREFIX = "par_ray/"
"""Experiments are named ``par_ray/<sweep>``."""
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
"""MLflow's experiment kind for model training (3.17 values: ``genai_development``, ``custom_model_development``,
``finetuning``, ``regression``, ``classification``, ``forecasting``, ``automl``); the UI labels it
"Machine learning"."""

TAG_ROLE = "par_ray.role"
"""``sweep`` on a parent run, ``trial`` on a child run."""
ROLE_SWEEP = "sweep"
ROLE_TRIAL = "trial"
TAG_SWEEP = "par_ray.sweep"
TAG_PRESET = "par_ray.preset"
"""The sweep's preset (``local`` or ``paper``), on the parent run."""
TAG_SMOKE_TEST = "par_ray.smoke_test"
"""``true`` on the parent run of a ``--smoke-test`` sweep."""
TAG_EXPERIMENT_PATH = "par_ray.experiment_path"
"""The Tune experiment directory, which identifies a sweep on ``--resume``."""
TAG_PARENT = "mlflow.parentRunId"
TAG_TRIAL_ID = "par_ray.trial_id"
TAG_RECIPE = "par_ray.recipe"
TAG_BACKBONE = "par_ray.backbone"
TAG_TASK = "par_ray.task"
TAG_SEED = "par_ray.seed"
TAG_GIT_COMMIT = "par_ray.git_commit"
TAG_ERROR = "par_ray.error"
"""On a FAILED trial run: ``"<ErrorClass>: <message>"`` (at most :data:`ERROR_TAG_CHARS` characters)."""
TAG_STOPPED_EARLY = "par_ray.stopped_early"
"""On a FINISHED trial run that a search's scheduler (ASHA) stopped before ``train.steps``: ``"step S of N"``. Such a
run ends FINISHED, as Ray's own MLflow callback ends it (the trial completed; nothing failed); ``analysis`` keeps it
out of the aggregates (its metrics are from step S)."""
ERROR_TAG_CHARS = 500
"""Length limit of :data:`TAG_ERROR` (MLflow tags hold 8,000 characters; the runs table shows a line)."""
ARTIFACT_ERROR = "error.txt"
"""On a FAILED trial run: the same reason, longer (:data:`ERROR_TEXT_CHARS`), without Ray's wrapping tracebacks."""
ERROR_TEXT_CHARS = 20_000
TRIAL_TAGS = {"trial_id": TAG_TRIAL_ID, "recipe": TAG_RECIPE, "backbone": TAG_BACKBONE, "task": TAG_TASK,
              "seed": TAG_SEED, "git_commit": TAG_GIT_COMMIT}
"""What a child run's tags name → the tag (besides :data:`TAG_PARENT` and :data:`TAG_ROLE`)."""

METRIC_RENAMES = {"R": "R_last_step", "depth": "depth_last_step"}
"""Loop report keys renamed in MLflow: per-step random draws that would otherwise read like config values."""
CURVE_BY_DEPTH = "acc_by_depth"
"""The final full-state accuracy curve of a FINISHED trial, at step = test depth d (not an optimizer step)."""
CURVE_BY_MULTIPLE = "acc_by_multiple"
"""The same curve at step = d / d_train, for the depths that are integer multiples of d_train."""

ARTIFACT_CONFIG = "config.json"
ARTIFACT_ACCURACY_JSON = "accuracy_by_depth.json"
ARTIFACT_ACCURACY_CSV = "accuracy_by_depth.csv"
ARTIFACT_ACCURACY_PNG = "accuracy_by_depth.png"
ARTIFACTS = (ARTIFACT_ACCURACY_JSON, ARTIFACT_ACCURACY_CSV, ARTIFACT_ACCURACY_PNG, ARTIFACT_CONFIG)
"""A trial run's artifacts (the accuracy files only when the trial was evaluated)."""

DEPTH_KINDS = ("acc", "acc_query", "acc_lo", "acc_hi", "sequences", "cot_tokens", "best_R", "oracle_acc", "best_acc",
               "best_iter", "halt_acc", "halt_gap", "halt_iter", "never_halted", "halt_dR_mean", "halt_dR_std")
"""Metrics logged per test depth D as ``{kind}_d{D}``: full-state and per-query accuracy, the 95 % Wilson interval of
the full-state accuracy over the depth's test sequences (``par_ray.evaluation.wilson_interval``), those sequences
(``sequences``: the first pass's, plus the blocks adaptive sampling added near the crossing), the CoT baseline's
mean generated tokens, the best R of ``eval.best_r`` (the RLT row), and halting
(``par_ray.evaluation.halting_metrics``): accuracy at R = ⌈d/c⌉ (``oracle_acc``), at the oracle best fixed R over
1..R_max (``best_acc``, a fraction) and that R (``best_iter``), and the stopping rule's metrics (:data:`RULE_KINDS`)."""
RULE_KINDS = ("halt_acc", "halt_gap", "halt_iter", "never_halted", "halt_dR_mean", "halt_dR_std")
"""Depth metrics that depend on the stopping rule and signal (oracle stopping does not): logged again per extra rule
and for the pending signal."""
ITERATION_KINDS = ("loss", "rms", "halt_prob")
"""Metrics logged per iteration k as ``{kind}_k{k}``: the probe's loss and state RMS, the mean P(Yes)."""
PENDING_SUFFIX = "_pending"
"""Appended to a rule metric of the pending stopping signal (``recipe.dense_pending``)."""

STOPPINGS = ("ceil", "halt", "best", "halt_pending")
"""The stoppings whose d50 and G are logged (:func:`g_metric`): ``ceil``, R = ⌈d/c⌉ (the ``acc_d{D}`` curve: ``G``,
``d50``, …; every evaluated trial); for trials with a halting read-out (``recipe.halting``,
``par_ray.evaluation.stopping_extrapolation``): ``halt``, the model's own stopping (the primary rule on the halting
query, ``halt_acc_d{D}``), ``best``, the oracle best fixed R per depth (``best_acc_d{D}``), and ``halt_pending``, the
primary rule on the pending signal (``halt_acc_d{D}_pending``; ``recipe.dense_pending`` only)."""
G_KINDS = ("G", "G_censored", "G_interp", "d50", "d50_interp")
"""Trial metrics of one curve's extrapolation (``par_ray.evaluation.extrapolation_metrics``): G (= d50 / d_train, a
lower bound when censored), G_censored (1.0 when accuracy never fell below the midpoint), the interpolated G, d50 and
the interpolated d50 (test depths; not logged when censored)."""
INTERVAL_KINDS = ("G_lo", "G_hi", "G_interp_lo", "G_interp_hi", "G_hi_censored", "d50_lo", "d50_hi", "d50_interp_lo",
                  "d50_interp_hi")
"""Trial metrics of the 95 % bootstrap intervals of one curve's d50, G and interpolated G
(``par_ray.evaluation.extrapolation_interval``, issue 37): the bounds of G and of the interpolated G (max tested
depth / d_train, a lower bound, where a bound is censored), G_hi_censored (1.0 when the upper bounds lie past the
largest tested depth), and the bounds of d50 and of the interpolated d50 (test depths; a censored bound is not
logged). Named like :data:`G_KINDS` by :func:`g_metric`: ``G_lo``, ``G_halt_interp_hi``, ``d50_best_lo``."""


def g_metric(kind: str = "G", stopping: str = "ceil") -> str:
    """The name of extrapolation metric ``kind`` (:data:`G_KINDS`, :data:`INTERVAL_KINDS`) of ``stopping``
    (:data:`STOPPINGS`): ``G``, ``G_interp``, ``d50``, ``G_lo`` for ``ceil``; the stopping after ``G`` / ``d50``
    otherwise: ``G_halt``, ``G_halt_interp``, ``G_best_censored``, ``d50_best``, ``G_halt_pending``,
    ``G_halt_interp_lo``. ValueError naming the allowed values for any other kind or stopping."""
    if kind not in G_KINDS + INTERVAL_KINDS:
        raise ValueError(f"extrapolation metric kind {kind!r} is not one of {G_KINDS + INTERVAL_KINDS}")
    if stopping not in STOPPINGS:
        raise ValueError(f"stopping {stopping!r} is not one of {STOPPINGS}")
    base, _, part = kind.partition("_")
    return base + ("" if stopping == "ceil" else f"_{stopping}") + (f"_{part}" if part else "")


COST_PARAM_PREFIX = "cost."
COST_FIELDS = ("planned_flops", "planned_train_flops", "planned_eval_flops", "device", "devices", "planned_gpu_hours",
               "planned_train_gpu_hours", "planned_eval_gpu_hours", "planned_wall_hours", "planned_startup_hours",
               "planned_usd", "planned_usd_spot", "mfu_train", "mfu_eval", "peak_flops", "node", "checkpoint_bytes",
               "error")
"""The plan's params ``cost.<field>`` on a child run: FLOPs (training, evaluation), the device type and count, its
peak FLOP/s per device, the MFUs assumed, device-hours, wall hours, the start-up (hours of wall time outside the
steps and evaluations), dollars on-demand and spot, the node type priced,
checkpoint bytes written (``par_ray.cost.TrialCost``); ``error`` instead when the trial could not be planned."""
GPU_SECONDS_TRAIN = "gpu_seconds_train"
"""Metric: seconds of the training steps × the trial's devices (CPU workers count as devices), so far."""
GPU_SECONDS_EVAL = "gpu_seconds_eval"
"""Metric: seconds of the evaluations × the trial's devices, so far."""
FLOPS_EVAL = "flops_eval"
"""Metric: FLOPs of the evaluations so far, all ranks together, as they ran: the test sequences adaptive sampling
added near the crossing counted as evaluated (``par_ray.cost.eval_flops_done``), where the plan
(``cost.planned_eval_flops``) counts its worst case. Absent from a run resumed from a checkpoint that predates it."""
_GPU_SECONDS_STAGE = "gpu_seconds_stage"

_RULE = r"_k(?P<halt_k>\d+)n(?P<halt_n>\d+)t(?P<halt_tau>\d[0-9.e-]*)"


def experiment_name(sweep: str) -> str:
    """``par_ray/<sweep>``."""
    return EXPERIMENT_PREFIX + sweep


def rule_suffix(k: int, n: int, tau: float) -> str:
    """``"k4n8t0.3"``: the metric-name suffix of the stopping rule "k of n, τ"; only characters MLflow allows in a
    metric name (alphanumerics, ``.``, and ``-`` in an exponent such as ``1e-05``)."""
    return f"k{int(k)}n{int(n)}t{float(tau)!r}"


def depth_metric(kind: str, depth: int, rule: tuple[int, int, float] | None = None, pending: bool = False) -> str:
    """``{kind}_d{depth}``, then ``_`` + :func:`rule_suffix` of an extra stopping ``rule``, then ``_pending`` for the
    pending signal: ``acc_d8``, ``halt_acc_d32_k4n8t0.3``, ``halt_acc_d32_pending``."""
    name = f"{kind}_d{depth}"
    if rule is not None:
        name += "_" + rule_suffix(*rule)
    return name + (PENDING_SUFFIX if pending else "")


def iteration_metric(kind: str, k: int) -> str:
    """``{kind}_k{k}``: ``rms_k3``, ``loss_k1``, ``halt_prob_k2``."""
    return f"{kind}_k{k}"


def depth_metric_pattern(kinds: Sequence[str] = DEPTH_KINDS, rule: bool = False, pending: bool = False) -> str:
    """Regular expression of :func:`depth_metric` names of ``kinds``, with (``rule``) or without an extra rule's
    suffix, with (``pending``) or without ``_pending``; named groups ``kind``, ``depth`` and, with ``rule``,
    ``halt_k``, ``halt_n``, ``halt_tau``."""
    return (rf"^(?P<kind>{'|'.join(map(re.escape, kinds))})_d(?P<depth>\d+)" + (_RULE if rule else "")
            + (PENDING_SUFFIX if pending else "") + "$")


def iteration_metric_pattern(kinds: Sequence[str] = ITERATION_KINDS) -> str:
    """Regular expression of :func:`iteration_metric` names of ``kinds``; named groups ``kind``, ``k``."""
    return rf"^(?P<kind>{'|'.join(map(re.escape, kinds))})_k(?P<k>\d+)$"


def parse_metric(name: str) -> dict | None:
    """The parts of a per-depth or per-iteration metric name, ``None`` for any other name.

    Returns ``{"kind", "depth"}`` (+ ``"rule": (k, n, tau)`` for an extra rule's metric, ``"pending": True`` for the
    pending signal's) or ``{"kind", "k"}``: ``parse_metric("halt_acc_d32_k4n8t0.3")`` →
    ``{"kind": "halt_acc", "depth": 32, "rule": (4, 8, 0.3), "pending": False}``.
    """
    m = re.match(iteration_metric_pattern(), name)
    if m:
        return {"kind": m["kind"], "k": int(m["k"])}
    for kinds, rule, pending in ((DEPTH_KINDS, False, False), (RULE_KINDS, True, False), (RULE_KINDS, False, True),
                                 (RULE_KINDS, True, True)):
        m = re.match(depth_metric_pattern(kinds, rule, pending), name)
        if m:
            out = {"kind": m["kind"], "depth": int(m["depth"]), "pending": pending}
            if rule:
                out["rule"] = (int(m["halt_k"]), int(m["halt_n"]), float(m["halt_tau"]))
            return out
    return None


def cost_param(field: str) -> str:
    """``cost.<field>``, the param of the trial's planned ``field`` (:data:`COST_FIELDS`); ``ValueError`` naming the
    fields for any other."""
    if field not in COST_FIELDS:
        raise ValueError(f"cost param field {field!r} is not one of {COST_FIELDS}")
    return COST_PARAM_PREFIX + field


def gpu_seconds_stage(stage: int) -> str:
    """``gpu_seconds_stage{stage}``: the training seconds of stage ``stage`` (0-based) × the trial's devices."""
    return f"{_GPU_SECONDS_STAGE}{int(stage)}"


def is_gpu_seconds_metric(name: str) -> bool:
    """Whether ``name`` is a device-seconds metric: :data:`GPU_SECONDS_TRAIN`, :data:`GPU_SECONDS_EVAL` or a
    :func:`gpu_seconds_stage` name."""
    return name in (GPU_SECONDS_TRAIN, GPU_SECONDS_EVAL) or bool(re.fullmatch(_GPU_SECONDS_STAGE + "[0-9]+", name))
