"""Tune plumbing shared by every sweep: grid or search, resources, restore, MLflow (STYLE rule 12: only here).

A sweep is declared as a :class:`SweepSpec` (recipes × tasks × backbones × seeds, fixed overrides, optionally an
Optuna + ASHA :class:`Search`) and run by :func:`main` (common CLI flags) or :func:`run_sweep`:

1. Resolve every trial's :class:`~par_ray.config.TrialConfig` (preset → overrides → recipe → recipe overrides, see
   :func:`resolve`) and validate all of them, before Ray is started or any cluster resource is claimed: bad input
   raises one :class:`SweepConfigError` naming the field or flag.
2. Connect to the Ray cluster (``RAY_ADDRESS``, a running local cluster, or a new local one). Preset ``auto``: the
   paper preset if the cluster has a GPU, else the local one (DESIGN.md).
3. ``max_concurrent_trials`` from the cluster's resources and the largest trial's need (a trial = its Train workers
   plus a driver that reserves memory, not CPU), so trials never wait on each other for workers.
4. Tune over Train V2 (ray doc/source/train/doc_code/train_tune_interop.py): each trial runs a driver function that
   builds the trial's ``TorchTrainer`` with a deterministic name ``trial_<trial id>`` and ``TuneReportCallback()``;
   ``FailureConfig`` at both levels (Tune restarts a trial's driver; Train restarts its workers from the latest
   checkpoint). ``--resume`` = ``Tuner.restore``: finished trials are kept, unfinished and errored ones continue from
   their Train checkpoints.
5. MLflow (``par_ray.tracking``) from a Tune callback on the sweep driver: a parent run per sweep, a child run per
   trial, reused on resume. Workers never log to MLflow.
6. At the end: accuracy by depth and G per configuration (mean ± std over seeds), and ``analysis.analyze`` on the
   parent run when the analysis package provides it.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import typing
from dataclasses import dataclass, field, replace

from par_ray import presets
from par_ray.config import TrialConfig, from_flat
from par_ray.model.backbones import BACKBONES
from par_ray.recipes import RECIPES, apply_recipe

PRESET_CHOICES = ("auto", "local", "paper")
DEFAULT_STORAGE = "runs/{name}"
"""``--storage`` default, relative to the working directory (``runs/`` is git-ignored): ``tune/``, ``train/``,
``mlflow.db``, ``mlartifacts/``, ``analysis/``. Under ``ray job submit`` pass an absolute path or a bucket URI: the
job's working directory is a temporary copy."""
DRIVER_RESOURCES = {"CPU": 0.0, "memory": 512 * 2**20}
"""What a trial's driver (a Tune actor that only waits on its TorchTrainer) reserves. Memory, not a CPU sliver: on a
2-core machine a 0.01-CPU driver plus a 1-CPU worker would let only one trial run at a time."""
TUNE_MAX_FAILURES = 1
"""Trial-level retries (Tune restarts the trial's driver, which resumes Train from its latest checkpoint)."""
TRAIN_MAX_FAILURES = 2
"""Worker-group restarts from the latest checkpoint within one driver (Train ``FailureConfig``)."""
METRIC_ALIASES = ("acc_longest",)
"""``acc_longest`` = ``acc_d{largest test depth}``."""


Recipe = typing.Callable[[TrialConfig], TrialConfig]
"""A recipe: a function that changes fields of a base config (``par_ray.recipes``)."""


class SweepConfigError(ValueError):
    """Bad sweep input (a flag, a grid entry or a trial config); the message names the flag or field."""


@dataclass(frozen=True)
class Search:
    """Optuna search with ASHA early stopping over a space of flat config keys."""

    space: typing.Mapping[str, typing.Any] | typing.Callable[[TrialConfig], typing.Mapping[str, typing.Any]]
    """Flat config key → ``ray.tune`` domain (``tune.loguniform``, ``tune.randint``, ``tune.choice`` …), or a
    function of the first grid point's config returning one (e.g. layer splits that depend on the backbone's depth)."""
    metric: str = "G"
    """A reported metric: ``G``, ``loss``, ``train_acc``, ``acc_d{D}``, ``acc_query_d{D}`` or ``acc_longest``."""
    mode: str = "max"
    num_samples: int = 8
    """Trials Optuna proposes."""
    reduction_factor: int = 2
    """ASHA keeps 1 / reduction_factor of the trials at each rung."""
    grace_period: int | None = None
    """Steps before ASHA may stop a trial; ``None`` = the first evaluation (``train.eval_every``)."""
    seed: int = 0
    """Optuna sampler seed."""


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep runs. ``sweeps/*.py`` declare one and call :func:`main`."""

    name: str
    """Tune experiment name and MLflow experiment ``par_ray/<name>``."""
    description: str = ""
    recipes: tuple[str, ...] = ("par",)
    """Keys of ``par_ray.recipes.RECIPES`` or of ``extra_recipes``."""
    extra_recipes: typing.Mapping[str, Recipe] = field(default_factory=dict)
    """Recipes this sweep defines itself (name → function setting ``recipe.name`` to that name)."""
    tasks: tuple[str, ...] = ("swap_s5",)
    backbones: typing.Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(presets.PRESET_BACKBONES))
    """Preset → default backbones (``--backbones`` overrides)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Default seeds (``--seeds`` overrides)."""
    overrides: typing.Mapping[str, typing.Any] = field(default_factory=dict)
    """Flat config overrides applied to every trial (``recipe.*`` keys apply after the recipe)."""
    search: Search | None = None
    """``None``: the full grid. Otherwise Optuna + ASHA; grid dimensions with several values become choices."""
    tune_max_failures: int = TUNE_MAX_FAILURES
    train_max_failures: int = TRAIN_MAX_FAILURES


@dataclass(frozen=True)
class Options:
    """The common flags of every sweep (see :func:`parse_args`)."""

    preset: str = "auto"
    seeds: tuple[int, ...] | None = None
    backbones: tuple[str, ...] | None = None
    storage: str | None = None
    """``None``: ``DEFAULT_STORAGE`` for the sweep's name."""
    mlflow_uri: str | None = None
    dry_run: bool = False
    resume: bool = False
    smoke_test: bool = False
    metric: str | None = None
    num_samples: int | None = None


@dataclass(frozen=True)
class Plan:
    """A sweep resolved against a preset: what Tune gets and every trial config it can produce (validated)."""

    spec: SweepSpec
    preset: str
    param_space: dict[str, typing.Any]
    trials: list[tuple[dict[str, typing.Any], TrialConfig]]
    """Grid: every trial. Search: every grid point at each end of each domain (what validation covers)."""
    search: Search | None
    """The spec's search with the ``--metric`` / ``--num-samples`` / smoke-test settings applied."""
    metric: str | None
    """The search metric, aliases resolved (``None`` for a grid)."""
    mode: str | None


# --------------------------------------------------------------------------------------------------------------------
# Trial configs

def resolve(params: typing.Mapping[str, typing.Any], extra_recipes: typing.Mapping[str, Recipe] | None = None
            ) -> TrialConfig:
    """The trial config of one Tune trial's flat params: ``preset`` and ``recipe`` plus flat config keys.

    Order: ``presets.preset_trial(preset, backbone, task, seed)`` → the non-recipe keys → the recipe (from
    ``RECIPES`` or ``extra_recipes``) → the ``recipe.*`` keys (so a search over ``recipe.hold_lambda`` wins over the
    recipe's value). Raises ``ValueError`` naming unknown keys / values; does not validate ranges.
    """
    flat = {k: v for k, v in params.items() if k not in ("preset", "recipe")}
    cfg = presets.preset_trial(str(params["preset"]), str(flat.pop("backbone.name", "tiny-qwen2")),
                               str(flat.pop("task.name", "swap_s5")), int(flat.pop("train.seed", 0)))
    cfg = from_flat({k: v for k, v in flat.items() if not k.startswith("recipe.")}, base=cfg)
    recipe = str(params.get("recipe", "par"))
    cfg = extra_recipes[recipe](cfg) if extra_recipes and recipe in extra_recipes else apply_recipe(cfg, recipe)
    return from_flat({k: v for k, v in flat.items() if k.startswith("recipe.")}, base=cfg)


def build_plan(spec: SweepSpec, opts: Options, preset: str) -> Plan:
    """Resolve and validate every trial of ``spec`` under ``preset``; raises :class:`SweepConfigError`."""
    from ray import tune

    backbones = tuple(opts.backbones or spec.backbones.get(preset, presets.PRESET_BACKBONES[preset]))
    seeds = tuple(opts.seeds if opts.seeds is not None else spec.seeds)
    dims = {"recipe": tuple(spec.recipes), "task.name": tuple(spec.tasks), "backbone.name": backbones,
            "train.seed": seeds}
    errs = [f"{name}: {v!r} is not one of {sorted(allowed)}" for name, values, allowed in (
        ("recipe", spec.recipes, {**RECIPES, **spec.extra_recipes}), ("backbone.name", backbones, BACKBONES))
        for v in values if v not in allowed]
    errs += [f"{name}: empty" for name, values in dims.items() if not values]
    if errs:
        raise SweepConfigError("invalid sweep:\n  - " + "\n  - ".join(errs))

    fixed: dict[str, typing.Any] = {"preset": preset, **_flat_values(spec.overrides)}
    if opts.smoke_test:
        fixed.update(_flat_values(presets.smoke_overrides(presets.preset_trial(preset, backbones[0]))))
    search = spec.search
    if search is not None:
        search = replace(search, metric=opts.metric or search.metric,
                         num_samples=opts.num_samples or search.num_samples)
        if opts.smoke_test:
            search = replace(search, num_samples=min(search.num_samples, 3))
    space = dict(fixed)
    for key, values in dims.items():
        if len(values) == 1:
            space[key] = values[0]
        else:
            space[key] = tune.choice(list(values)) if search else tune.grid_search(list(values))

    # Every grid point; under a search, each domain at each of its ends (others at their first end).
    grid = [dict(zip(dims, combo)) for combo in itertools.product(*dims.values())]
    variants: list[dict[str, typing.Any]] = [{}]
    if search is not None:
        if callable(search.space):
            search = replace(search, space=dict(search.space(resolve({**fixed, **grid[0]}, spec.extra_recipes))))
        space.update(search.space)
        ends = {k: _domain_ends(k, d) for k, d in search.space.items()}
        first = {k: v[0] for k, v in ends.items()}
        variants = [first] + [{**first, k: v} for k, vs in ends.items() for v in vs[1:]]
    trials, errs = [], []
    for point in grid:
        for variant in variants:
            params = {**fixed, **point, **variant}
            try:
                cfg = resolve(params, spec.extra_recipes).validate()
            except ValueError as e:
                where = ", ".join(f"{k}={v}" for k, v in {**point, **variant}.items())
                errs.append(f"trial ({where}): {e}")
                continue
            trials.append((params, cfg))
    if errs:
        raise SweepConfigError(errs[0] if len(errs) == 1 else f"{len(errs)} invalid trials; the first:\n{errs[0]}")

    metric = mode = None
    if search is not None:
        metric, mode = _check_metric(search.metric, search.mode, [cfg for _, cfg in trials])
    return Plan(spec=spec, preset=preset, param_space=space, trials=trials, search=search, metric=metric, mode=mode)


def _flat_values(flat: typing.Mapping[str, typing.Any]) -> dict[str, typing.Any]:
    """Tuples as comma-joined strings (the ``to_flat`` form), so Tune never expands them."""
    return {k: ",".join(str(x) for x in v) if isinstance(v, (tuple, list)) else v for k, v in flat.items()}


def _domain_ends(key: str, domain: typing.Any) -> list[typing.Any]:
    from ray.tune.search.sample import Categorical, Float, Integer

    if isinstance(domain, Categorical):
        return list(domain.categories)
    if isinstance(domain, Integer):
        return [domain.lower, domain.upper - 1]  # tune.randint's upper bound is exclusive
    if isinstance(domain, Float):
        return [domain.lower, domain.upper]
    raise SweepConfigError(f"search space {key}: {domain!r} is not a ray.tune domain (tune.uniform, tune.choice …)")


def _check_metric(metric: str, mode: str, cfgs: list[TrialConfig]) -> tuple[str, str]:
    """Resolve ``acc_longest``; check the metric is in *every* report (ASHA and Tune's strict metric check need it)."""
    if mode not in ("max", "min"):
        raise SweepConfigError(f"--mode: {mode!r} is not one of ['max', 'min']")
    depths = {cfg.eval.depths for cfg in cfgs}
    if metric == "acc_longest":
        if len(depths) != 1:
            raise SweepConfigError(f"--metric acc_longest: trials test different depths {sorted(depths)}")
        metric = f"acc_d{max(next(iter(depths)))}"
    eval_metrics = {"G"} | {f"{k}_d{d}" for ds in depths for d in ds for k in ("acc", "acc_query")}
    allowed = sorted(eval_metrics | {"loss", "train_acc"}) + list(METRIC_ALIASES)
    if metric not in allowed:
        raise SweepConfigError(f"--metric: {metric!r} is not one of {allowed}")
    if metric in eval_metrics:
        for cfg in cfgs:
            tr = cfg.train
            if tr.report_every % tr.eval_every or (tr.checkpoint_every and tr.checkpoint_every % tr.eval_every):
                raise SweepConfigError(
                    f"train.eval_every: {metric} must be in every report, so train.report_every ({tr.report_every}) "
                    f"and train.checkpoint_every ({tr.checkpoint_every}) must be multiples of train.eval_every "
                    f"({tr.eval_every})")
    return metric, mode


# --------------------------------------------------------------------------------------------------------------------
# Resources

def trial_resources(cfg: TrialConfig, storage: str) -> dict[str, float]:
    """Cluster resources one trial holds: its Train workers (from the trainer ``build_trainer`` makes) + its driver."""
    from par_ray.train.trainer import build_trainer

    need = dict(build_trainer(cfg, "resources", storage_path=storage).scaling_config.total_resources)
    for k, v in DRIVER_RESOURCES.items():
        need[k] = need.get(k, 0.0) + v
    return {k: float(v) for k, v in need.items() if v}


def max_concurrent_trials(needs: list[tuple[str, dict[str, float]]], cluster: typing.Mapping[str, float]) -> int:
    """How many of the largest trials fit the cluster at once. ``needs``: (label, resources) per trial.

    Raises :class:`SweepConfigError` listing the trials that cannot fit at all (they would wait forever).
    """
    too_big = sorted({f"{label} needs {_fmt(need)}" for label, need in needs
                      if any(cluster.get(k, 0.0) + 1e-9 < v for k, v in need.items())})
    if too_big:
        raise SweepConfigError(f"the Ray cluster ({_fmt(cluster)}) cannot fit these trials: " + "; ".join(too_big)
                               + ". Choose smaller --backbones, --preset local, or add nodes.")
    largest: dict[str, float] = {}
    for _, need in needs:
        for k, v in need.items():
            largest[k] = max(largest.get(k, 0.0), v)
    return max(1, min(int(cluster.get(k, 0.0) // v) for k, v in largest.items() if v > 0))


def cluster_capacity() -> dict[str, float]:
    """The connected cluster's resources: the larger of what it has now and what its autoscaler may add."""
    import ray

    now = {k: float(v) for k, v in ray.cluster_resources().items()}
    try:  # the autoscaler's node-group limits, as Ray Train reads them (ray.train.v2 worker_group.py)
        from ray._private.state import state

        most = state.get_max_resources_from_cluster_config() or {}
    except Exception:  # noqa: BLE001 - no autoscaler config: a fixed cluster
        most = {}
    return {k: max(now.get(k, 0.0), float(most.get(k, 0) or 0)) for k in set(now) | set(most)}


def autoscaler_limits_unknown() -> bool:
    """Whether an autoscaler may add nodes to the connected cluster without Ray publishing how many.

    :func:`cluster_capacity` then sees only the nodes running now (a CPU-0 head before any worker starts): in Ray
    2.60 neither the v1 autoscaler (``ray up``, ``ray start --autoscaling-config``) nor v2 (KubeRay) writes the
    cluster config that ``get_max_resources_from_cluster_config`` reads. v1 is recognised by its status in the GCS
    (what ``ray status`` prints), which maps nodes to the node types of its config; the read-only monitor of a fixed
    cluster names each node ``node_<id>`` instead.
    """
    import json

    from ray._private import ray_constants
    from ray._private.state import state
    from ray.autoscaler.v2.utils import is_autoscaler_v2
    from ray.experimental.internal_kv import _internal_kv_get

    try:
        if state.get_max_resources_from_cluster_config():
            return False
        if is_autoscaler_v2(fetch_from_server=True):
            return True
        status = json.loads(_internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS) or b"{}")
    except Exception:  # noqa: BLE001 - no autoscaler state to read: a fixed cluster
        return False
    mapping = (status.get("autoscaler_report") or {}).get("node_type_mapping") or {}
    return any(node_type != f"node_{node_id}" for node_id, node_type in mapping.items())


def _fmt(resources: typing.Mapping[str, float]) -> str:
    keys = [k for k in ("CPU", "GPU", "memory") if k in resources]
    return ", ".join(f"{resources[k] / 2**30:.1f} GiB memory" if k == "memory" else f"{resources[k]:g} {k}"
                     for k in keys) or "nothing"


def _label(cfg: TrialConfig) -> str:
    return f"{cfg.recipe.name}-{cfg.backbone.name}-{cfg.task.name}-seed{cfg.train.seed}"


# --------------------------------------------------------------------------------------------------------------------
# Tune: the per-trial driver and the MLflow callback

def _trial_driver(params: dict, train_storage: str, train_max_failures: int,
                  extra_recipes: typing.Mapping[str, Recipe] | None = None) -> None:
    """One trial (a Tune function trainable): build this trial's TorchTrainer and fit it; Train reports reach Tune."""
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from par_ray.train.trainer import build_trainer

    cfg = resolve(params, extra_recipes)
    trainer = build_trainer(cfg, name=f"trial_{ray.tune.get_context().get_trial_id()}", storage_path=train_storage,
                            max_failures=train_max_failures, callbacks=[TuneReportCallback()])
    trainer.fit()


def _trial_dirname(trial) -> str:
    return f"trial_{trial.trial_id}"


def _make_callback(tracker, extra_recipes):
    from ray.tune import Callback
    from ray.tune.result import AUTO_RESULT_KEYS

    skip = set(AUTO_RESULT_KEYS) | {"done", "trial_id", "experiment_tag", "checkpoint_path", "should_checkpoint"}

    class MLflowTrials(Callback):
        """Trial → child run of the sweep's parent run (``par_ray.tracking``), on the sweep driver."""

        def __init__(self, tracker, extra_recipes):
            self.tracker, self.extra_recipes = tracker, extra_recipes

        def on_trial_start(self, iteration, trials, trial, **info):
            cfg = resolve(trial.config, self.extra_recipes)
            self.tracker.start_trial(trial.trial_id, cfg, run_name=_label(cfg))

        def on_trial_result(self, iteration, trials, trial, result, **info):
            metrics = {k: v for k, v in result.items() if k not in skip}
            self.tracker.log_metrics(trial.trial_id, metrics, int(result.get("step", result.get("training_iteration"))))

        def on_trial_complete(self, iteration, trials, trial, **info):
            cfg = resolve(trial.config, self.extra_recipes)
            last = trial.last_result or {}
            done = int(last.get("step", 0)) >= cfg.train.steps
            self.tracker.finish_trial(trial.trial_id, cfg, last, "FINISHED" if done else "KILLED")

        def on_trial_error(self, iteration, trials, trial, **info):
            self.tracker.finish_trial(trial.trial_id, resolve(trial.config, self.extra_recipes), trial.last_result,
                                     "FAILED")

    return MLflowTrials(tracker, extra_recipes)


def _init_ray() -> None:
    import ray

    if not ray.is_initialized():
        # RAY_ADDRESS or a running local cluster (`ray start --head`) if there is one, else a new local cluster.
        ray.init(address=os.environ.get("RAY_ADDRESS"), logging_level="WARNING", log_to_driver=True,
                 configure_logging=True)


def _cluster_has_gpu() -> bool:
    import ray

    return ray.cluster_resources().get("GPU", 0) > 0


def _local_preset_guess() -> str:
    """``auto`` for a dry run, without starting Ray: what a new local cluster would choose (or RAY_ADDRESS's)."""
    if os.environ.get("RAY_ADDRESS", "local") != "local":  # an existing cluster: ask it (connecting claims nothing)
        _init_ray()
        return "paper" if _cluster_has_gpu() else "local"
    try:
        import torch

        return "paper" if torch.cuda.is_available() else "local"
    except Exception:  # noqa: BLE001 - no torch CUDA runtime means no GPU
        return "local"


# --------------------------------------------------------------------------------------------------------------------
# Running a sweep

def run_sweep(spec: SweepSpec, opts: Options = Options()) -> int:
    """Run (or ``--dry-run`` / ``--resume``) the sweep ``spec``. Returns 0 when every trial finished, 1 otherwise.

    Raises :class:`SweepConfigError` on bad input, before any cluster resource is claimed.
    """
    from par_ray import tracking

    raw = opts.storage or DEFAULT_STORAGE.format(name=spec.name)
    remote = "://" in raw
    storage = raw.rstrip("/") if remote else os.path.abspath(os.path.expanduser(raw))
    if not remote and not os.path.isabs(os.path.expanduser(raw)) and "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ:
        print(f"warning: --storage {raw} is inside this Ray job's temporary working directory ({storage}); pass an "
              f"absolute path or a bucket URI to keep the results", file=sys.stderr)
    experiment_path, train_storage = f"{storage}/tune/{spec.name}", f"{storage}/train/{spec.name}"
    preset = opts.preset
    if preset not in PRESET_CHOICES:
        raise SweepConfigError(f"--preset: {preset!r} is not one of {list(PRESET_CHOICES)}")
    if preset == "auto" and opts.dry_run:
        preset = _local_preset_guess()
    plan = build_plan(spec, opts, preset) if preset != "auto" else None
    if opts.dry_run:
        print_plan(plan, train_storage)
        return 0
    try:
        uri = tracking.tracking_uri(opts.mlflow_uri, storage)
    except ValueError as e:
        raise SweepConfigError(str(e)) from None
    if opts.resume and not _exists(f"{experiment_path}/tuner.pkl"):
        raise SweepConfigError(f"--resume: no sweep to resume at {experiment_path} (check --storage)")
    if not opts.resume and _exists(experiment_path):
        raise SweepConfigError(f"--storage: a sweep {spec.name!r} already exists at {experiment_path}; pass --resume "
                               f"to continue it or choose another --storage")

    from ray import tune

    _init_ray()
    if plan is None:
        plan = build_plan(spec, opts, "paper" if _cluster_has_gpu() else "local")
    needs = [(_label(cfg), trial_resources(cfg, train_storage)) for _, cfg in plan.trials]
    if autoscaler_limits_unknown():
        # Every trial at once: the worker groups of trials that do not fit yet are the demand the autoscaler adds
        # nodes for (a limit from the nodes running now would keep it from ever scaling up).
        concurrency = _count(plan)
        print(f"sweep {spec.name}: the cluster autoscales without publishing its limits; trials that do not fit the "
              f"nodes running now wait for new ones (`ray status` shows the pending demand)", flush=True)
    else:
        concurrency = max_concurrent_trials(needs, cluster_capacity())
    print(f"sweep {spec.name}: preset {plan.preset}, {_count(plan)} trials, up to {concurrency} at once "
          f"(largest trial: {_fmt(max((n for _, n in needs), key=lambda n: (n.get('GPU', 0), n.get('CPU', 0))))}); "
          f"storage {storage}", flush=True)

    tracker = tracking.SweepTracker.open(
        spec.name, experiment_path, uri, params=_sweep_params(plan, opts),
        tags={"par_ray.preset": plan.preset, "par_ray.smoke_test": str(opts.smoke_test).lower()})
    print(f"MLflow: {uri} (experiment {tracking.experiment_name(spec.name)}, parent run {tracker.parent_run_id})",
          flush=True)

    trainable = tune.with_resources(
        tune.with_parameters(_trial_driver, train_storage=train_storage, train_max_failures=spec.train_max_failures,
                             extra_recipes=dict(spec.extra_recipes)),
        dict(DRIVER_RESOURCES))
    if opts.resume:
        tuner = tune.Tuner.restore(experiment_path, trainable, resume_unfinished=True, resume_errored=True)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=plan.param_space,
            tune_config=_tune_config(plan, concurrency),
            run_config=tune.RunConfig(
                name=spec.name, storage_path=f"{storage}/tune",
                failure_config=tune.FailureConfig(max_failures=spec.tune_max_failures),
                callbacks=[_make_callback(tracker, dict(spec.extra_recipes))], verbose=1),
        )
    try:
        results = tuner.fit()
    except BaseException:
        tracker.finish("KILLED")
        raise
    rows, counts = print_summary(results, plan)
    failed = counts.get("failed", 0) + counts.get("unfinished", 0)
    tracker.close_open_trials("KILLED")  # interrupted trials; --resume reopens their runs
    tracker.finish("FAILED" if counts.get("failed") else "KILLED" if counts.get("unfinished") else "FINISHED")
    out_dir = None if remote else f"{storage}/analysis"
    if not _run_analysis(spec.name, tracker, out_dir) and rows:
        cfg0 = plan.trials[0][1]
        print(f"\naccuracy by depth (%) and G = d50 / d_train (d_train = {cfg0.task.train_depth}), mean ± std over "
              f"seeds")
        print(format_summary(summary_frame(rows), cfg0.eval.depths, cfg0.task.train_depth))
    if failed:
        print(f"{failed} trial(s) failed or did not finish; fix the cause and rerun with --resume (same --storage) "
              f"to finish them", file=sys.stderr)
    return 1 if failed else 0


def _tune_config(plan: Plan, concurrency: int):
    from ray import tune

    search = plan.search
    common = dict(max_concurrent_trials=concurrency, trial_dirname_creator=_trial_dirname)
    if search is None:
        return tune.TuneConfig(**common)
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    cfg = plan.trials[0][1]
    steps = max(c.train.steps for _, c in plan.trials)
    return tune.TuneConfig(
        metric=plan.metric, mode=plan.mode, num_samples=_count(plan),
        search_alg=OptunaSearch(seed=search.seed),
        # stop_last_trials=False: a trial that reaches max_t ends on its own. Stopping it there would kill its driver
        # while Train is still closing its run, leaving the worker placement group to Ray Train's cleaner actor,
        # which cannot find the cluster on a host that runs several Ray instances (it then leaks the group).
        scheduler=ASHAScheduler(time_attr="step", max_t=steps, grace_period=search.grace_period or cfg.train.eval_every,
                                reduction_factor=search.reduction_factor, stop_last_trials=False),
        **common)


def _count(plan: Plan) -> int:
    """Trials Tune will run: the grid's size, or the search's samples."""
    return len(plan.trials) if plan.search is None else plan.search.num_samples


def _sweep_params(plan: Plan, opts: Options) -> dict[str, typing.Any]:
    """The parent run's params: the sweep's grid and search settings (never a config secret: tracking redacts)."""
    cfgs = [cfg for _, cfg in plan.trials]
    out = {
        "preset": plan.preset,
        "recipes": ",".join(plan.spec.recipes),
        "tasks": ",".join(plan.spec.tasks),
        "backbones": ",".join(dict.fromkeys(c.backbone.name for c in cfgs)),
        "seeds": ",".join(str(s) for s in dict.fromkeys(c.train.seed for c in cfgs)),
        "smoke_test": opts.smoke_test,
        "num_trials": _count(plan),
    }
    if plan.search is not None:
        out.update({"search.metric": plan.metric, "search.mode": plan.mode,
                    "search.space": ",".join(plan.search.space)})
    return out


def print_plan(plan: Plan, train_storage: str) -> None:
    """``--dry-run``: the trials, the resources each holds and the planner's memory estimate; starts nothing."""
    print(f"sweep {plan.spec.name}: {plan.spec.description or 'no description'}")
    shown = plan.trials
    if plan.search is None:
        print(f"preset {plan.preset}: {len(plan.trials)} trials (grid: recipes × tasks × backbones × seeds)")
    else:
        first = {k: _domain_ends(k, d)[0] for k, d in plan.search.space.items()}
        shown = [(p, c) for p, c in plan.trials if all(p.get(k) == v for k, v in first.items())]
        print(f"preset {plan.preset}: Optuna + ASHA on {plan.metric} ({plan.mode}), {plan.search.num_samples} trials "
              f"over {len(shown)} grid point(s); search space:")
        for k, d in plan.search.space.items():
            print(f"  {k}: {_describe_domain(d)}")
    print("| # | recipe | backbone | task | seed | strategy | GPUs/workers | resources per trial | steps | d_train | "
          "test depths | memory per GPU (planner) |")
    print("|---:|---|---|---|---:|---|---:|---|---:|---:|---|---|")
    for i, (_, cfg) in enumerate(shown):
        tr = cfg.train
        try:
            res = _fmt(trial_resources(cfg, train_storage))
        except Exception as e:  # noqa: BLE001 - a dry run reports what it cannot compute
            res = f"? ({type(e).__name__})"
        print(f"| {i} | {cfg.recipe.name} | {cfg.backbone.name} | {cfg.task.name} | {tr.seed} | {tr.strategy}"
              f"{f' ZeRO-{tr.zero_stage}' if tr.strategy == 'deepspeed' else ''} | {tr.num_workers} | {res} | "
              f"{tr.steps} | {cfg.task.train_depth} | {','.join(map(str, cfg.eval.depths))} | "
              f"{_memory_estimate(cfg)} |")


def _describe_domain(domain: typing.Any) -> str:
    from ray.tune.search.sample import Categorical

    if isinstance(domain, Categorical):
        return "choice " + str(list(domain.categories))
    sampler = type(domain.get_sampler()).__name__.lower().replace("_", "")
    return f"{sampler} [{domain.lower}, {domain.upper}]"


def _memory_estimate(cfg: TrialConfig) -> str:
    """Peak memory per GPU of one training step from ``par_ray.planner`` at the largest train depth."""
    try:
        from par_ray.planner import plan as plan_memory
        from par_ray.tasks import get_task

        task, tr, rc = get_task(cfg.task.name), cfg.train, cfg.recipe
        episode = task.sample(cfg.task.train_depth, 1, seed=0)
        R = rc.max_iterations if rc.depth_schedule == "hold" or not rc.tied else -(-cfg.task.train_depth
                                                                                  // rc.ops_per_iteration)
        estimate = plan_memory(
            cfg.backbone.name, tr.strategy, tr.num_workers, R=min(R, rc.max_iterations), grad_window=rc.grad_window,
            micro_batch=tr.batch_size // tr.num_workers, seq_len=int(episode.input_ids.shape[1]),
            zero_stage=tr.zero_stage, offload=tr.zero_offload, dtype="bf16" if tr.use_gpu else "fp32",
            read_positions=int(episode.read_positions.numel()), split=cfg.backbone.split, tied=rc.tied,
            untied_copies=rc.max_iterations, anchoring=rc.anchoring,
            vocab_size=None if cfg.backbone.pretrained else task.vocab_size)  # checkpoints keep their vocabulary
    except Exception as e:  # noqa: BLE001 - the planner is optional for a dry run; say why it is missing
        return f"n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
    return f"{estimate.total / 1e9:.2f} GB ({estimate.peak_phase})"


# --------------------------------------------------------------------------------------------------------------------
# End of sweep: the table and the analysis

def summary_frame(rows: list[dict[str, typing.Any]]):
    """Per (task, recipe, backbone): ``n`` seeds and mean ± std of every ``acc_d{D}`` and of ``G`` (polars).

    ``rows``: one dict per finished trial with ``task, recipe, backbone, seed, G, G_censored, acc_d{D}...``.
    Sample std (ddof = 1), null for one seed.
    """
    import polars as pl

    df = pl.DataFrame(rows)
    accs = sorted((c for c in df.columns if c.startswith("acc_d")), key=lambda c: int(c[5:]))
    aggs = [pl.len().alias("n")]
    for c in accs + ["G"]:
        aggs += [pl.col(c).mean().alias(f"{c}_mean"), pl.col(c).std(ddof=1).alias(f"{c}_std")]
    aggs.append((pl.col("G_censored") > 0).any().alias("G_censored"))
    keys = ["task", "recipe", "backbone"]
    return df.group_by(keys, maintain_order=True).agg(aggs).sort(keys)


def format_summary(frame, depths: typing.Sequence[int], d_train: int) -> str:
    """Markdown table of :func:`summary_frame`: accuracy (%) at each test depth and G, "mean ± std" over seeds."""
    def cell(mean, std, scale=100.0, digits=1, prefix=""):
        if mean is None or (isinstance(mean, float) and math.isnan(mean)):
            return "–"
        s = f"{prefix}{mean * scale:.{digits}f}"
        return s + (f" ± {std * scale:.{digits}f}" if std is not None and not math.isnan(std) else "")

    head = ["task", "recipe", "backbone", "seeds"] + [f"d={d} ({d / d_train:g}×)" for d in depths] + ["G"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 4 + "---:|" * (len(depths) + 1)]
    for r in frame.iter_rows(named=True):
        cells = [r["task"], r["recipe"], r["backbone"], str(r["n"])]
        cells += [cell(r.get(f"acc_d{d}_mean"), r.get(f"acc_d{d}_std")) for d in depths]
        cells.append(cell(r["G_mean"], r["G_std"], 1.0, 2, "≥ " if r["G_censored"] else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def print_summary(results, plan: Plan) -> tuple[list[dict[str, typing.Any]], dict[str, int]]:
    """Count the trials (finished / failed / stopped early by ASHA / unfinished, e.g. after Ctrl-C) and print the
    counts and, for a search, the best trial.

    Returns (the final metrics of the finished trials as :func:`summary_frame` rows, the counts).
    """
    rows, counts = [], {}
    for r in results:
        m = r.metrics or {}
        cfg = resolve(r.config, plan.spec.extra_recipes) if r.config else None
        if r.error is not None:
            kind = "failed"
        elif cfg is not None and int(m.get("step", 0)) >= cfg.train.steps:
            kind = "finished"
        elif plan.search is not None and m:
            kind = "stopped early"
        else:
            kind = "unfinished"  # interrupted (Ctrl-C, a lost driver) or never started
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "finished" and "G" in m:
            rows.append({"task": cfg.task.name, "recipe": cfg.recipe.name, "backbone": cfg.backbone.name,
                         "seed": cfg.train.seed, "G": float(m["G"]), "G_censored": float(m.get("G_censored", 0.0)),
                         **{f"acc_d{d}": float(m[f"acc_d{d}"]) for d in cfg.eval.depths if f"acc_d{d}" in m}})
    print("\ntrials: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    if plan.metric is not None and rows:
        best = results.get_best_result(metric=plan.metric, mode=plan.mode, filter_nan_and_inf=True)
        if best is not None and best.metrics:
            print(f"\nbest {plan.metric} = {best.metrics.get(plan.metric)}: "
                  + ", ".join(f"{k}={best.config.get(k)}" for k in plan.search.space))
    return rows, counts


def _run_analysis(sweep: str, tracker, out_dir: str | None) -> bool:
    """``analysis.analyze`` on this sweep's parent run: prints its main table (accuracy by depth and G, mean ± std
    over seeds) and logs its tables and plots to the parent run. Never fails the sweep; False when it did not run."""
    try:
        # analysis.report, not the package: a stale editable install can make `analysis` a namespace package
        from analysis.report import analyze
    except ImportError as e:
        if getattr(e, "name", None) not in ("analysis", "analysis.report"):
            print(f"analysis unavailable ({e})", file=sys.stderr)
        return False
    try:
        report = analyze(f"par_ray/{sweep}", parent_run_id=tracker.parent_run_id, tracking_uri=tracker.uri,
                         out_dir=out_dir)
    except Exception as e:  # noqa: BLE001 - the runs are tracked already; analysis can be rerun with python -m analysis
        print(f"analysis failed ({type(e).__name__}: {e}); rerun: python -m analysis --experiment par_ray/{sweep}",
              file=sys.stderr)
        return False
    report = report if isinstance(report, dict) else {}
    if report.get("main_table"):
        print("\n" + str(report["main_table"]))
    for w in report.get("warnings", ()):
        print(f"analysis: {w}")
    print(f"analysis: tables and figures in {report.get('out_dir', out_dir)}, logged to parent run "
          f"{tracker.parent_run_id}")
    return bool(report.get("main_table"))


def _exists(path: str) -> bool:
    """Whether a local path or a storage URI (``s3://``, ``gs://`` …; through pyarrow, as Ray's storage) exists."""
    if "://" not in path:
        return os.path.exists(path)
    import pyarrow.fs

    fs, inner = pyarrow.fs.FileSystem.from_uri(path)
    return fs.get_file_info(inner).type != pyarrow.fs.FileType.NotFound


# --------------------------------------------------------------------------------------------------------------------
# Command line

def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 0,1,2, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"seeds must be >= 0, got {text!r}")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"duplicate seeds in {text!r}")
    return values


def _backbones(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in BACKBONES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown backbone(s) {unknown or [text]}; choose from {sorted(BACKBONES)}")
    return names


def parse_args(spec: SweepSpec, argv: typing.Sequence[str] | None = None) -> Options:
    """The common flags; argparse exits with status 2 and one line naming the bad flag."""
    p = argparse.ArgumentParser(prog=f"python sweeps/{spec.name}.py", description=spec.description)
    p.add_argument("--preset", choices=PRESET_CHOICES, default="auto",
                   help="auto (default): paper if the Ray cluster has a GPU, else local")
    p.add_argument("--seeds", type=_ints, default=None, help=f"comma-separated seeds (default {spec.seeds})")
    p.add_argument("--backbones", type=_backbones, default=None,
                   help="comma-separated backbone names (default: the preset's)")
    p.add_argument("--storage", default=None,
                   help=f"directory or bucket URI for Tune/Train results, the default MLflow store and the analysis "
                        f"(default {DEFAULT_STORAGE.format(name=spec.name)})")
    p.add_argument("--mlflow-uri", default=None,
                   help="tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///<storage>/mlflow.db)")
    p.add_argument("--dry-run", action="store_true", help="print the trials and resources, then exit")
    p.add_argument("--resume", action="store_true", help="continue the sweep stored under --storage")
    p.add_argument("--smoke-test", action="store_true", help="a few steps per trial, tiny evaluation")
    if spec.search is not None:
        p.add_argument("--metric", default=None,
                       help=f"metric to optimize (default {spec.search.metric}): G, acc_longest, acc_d<D>, loss …")
        p.add_argument("--num-samples", type=int, default=None, help=f"trials (default {spec.search.num_samples})")
    a = p.parse_args(argv)
    if getattr(a, "num_samples", None) is not None and a.num_samples < 1:
        p.error(f"argument --num-samples: must be >= 1, got {a.num_samples}")
    return Options(preset=a.preset, seeds=a.seeds, backbones=a.backbones, storage=a.storage, mlflow_uri=a.mlflow_uri,
                   dry_run=a.dry_run, resume=a.resume, smoke_test=a.smoke_test, metric=getattr(a, "metric", None),
                   num_samples=getattr(a, "num_samples", None))


def main(spec: SweepSpec, argv: typing.Sequence[str] | None = None) -> int:
    """Entry point of a ``sweeps/*.py`` script: parse the common flags, run; bad input → one line, exit status 2."""
    opts = parse_args(spec, argv)
    try:
        return run_sweep(spec, opts)
    except SweepConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
