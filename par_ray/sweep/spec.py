"""The sweep spec and its trial plan: what a sweep runs, resolved and validated before Ray starts.

A sweep is declared as a :class:`SweepSpec` (recipes × tasks × backbones × seeds, or explicit cells × backbones ×
seeds; fixed overrides, optionally an Optuna + ASHA :class:`Search`). :func:`build_plan` resolves every trial's
:class:`~par_ray.config.TrialConfig` (preset → overrides → recipe → recipe overrides, see :func:`resolve`) and validates all of them, before Ray is started
or any cluster resource is claimed: bad input raises one :class:`SweepConfigError` naming the field or flag.
"""

from __future__ import annotations

import itertools
import json
import typing
from dataclasses import dataclass, field, replace

from par_ray import presets
from par_ray.config import TrialConfig, flat_value, from_flat
from par_ray.model.registry import BACKBONES
from par_ray.recipes import RECIPES, apply_recipe
from par_ray.tracking_schema import depth_metric
from par_ray.trial import validate
from par_ray.weights import local_pretrained, weights_errors

PRESET_CHOICES = ("auto", "local", "paper")
DEFAULT_STORAGE = "runs/{name}"
"""``--storage`` default, relative to the working directory (``runs/`` is git-ignored): ``tune/``, ``train/``,
``mlflow.db``, ``mlartifacts/``, ``analysis/``. Under ``ray job submit`` pass an absolute path or a bucket URI: the
job's working directory is a temporary copy."""
TUNE_MAX_FAILURES = 1
"""Trial-level retries (Tune restarts the trial's driver, which resumes Train from its latest checkpoint)."""
TRAIN_MAX_FAILURES = 2
"""Worker-group restarts from the latest checkpoint within one driver (Train ``FailureConfig``)."""
METRIC_ALIASES = ("acc_longest",)
"""``acc_longest`` = ``acc_d{largest test depth}``."""
MINIMIZED_METRICS = frozenset({"loss"})
"""Search metrics whose better value is the lower one (``Search.mode`` ``None`` → ``min``)."""

CELL_KEY = "cell"
"""Tune param holding one of ``SweepSpec.cells`` (a dict of flat keys; :func:`resolve` unpacks it)."""
GRID_DIMS = ("recipe", "task.name", "backbone.name", "train.seed")
"""The grid's dimensions, each a param :func:`resolve` reads."""
PARALLELISM_KEYS = frozenset({"train.strategy", "train.num_workers", "train.zero_stage", "train.accelerator_type"})
"""Flat keys the paper preset chooses by memory (``presets.fit_parallelism``); a sweep setting one keeps its own."""
MODEL_DIR_KEY = "model_dir"
"""Tune param holding ``--model-dir`` (``""`` = none): where :func:`resolve` looks for a pretrained parent first
(``par_ray.weights.find_checkpoint``), so every trial driver resolves the hub id to the same local directory."""
GPU_TYPES_KEY = "gpu_types"
"""Tune param holding ``--gpu-types`` (comma-joined, cheapest first; ``""`` = ``presets.PAPER_GPU_TYPE``), which :func:`resolve`
reads, so every trial driver and callback resolves the same config."""

Recipe = typing.Callable[[TrialConfig], TrialConfig]
"""A recipe: a function that changes fields of a base config (``par_ray.recipes``)."""
Cell = typing.Mapping[str, typing.Any]
"""One explicit grid point of ``SweepSpec.cells``: flat config keys (and ``recipe``) → values."""


class SweepConfigError(ValueError):
    """Bad sweep input (a flag, a grid entry or a trial config); the message names the flag or field."""


@dataclass(frozen=True)
class Search:
    """Optuna search with ASHA early stopping over a space of flat config keys."""

    space: typing.Mapping[str, typing.Any] | typing.Callable[[TrialConfig], typing.Mapping[str, typing.Any]]
    """Flat config key → ``ray.tune`` domain (``tune.loguniform``, ``tune.randint``, ``tune.choice`` …), or a
    function of the first grid point's config returning one (e.g. layer splits that depend on the backbone's depth)."""
    metric: str = "G"
    """A reported metric: ``G``, ``G_interp`` (the interpolated G, ``par_ray.evaluation.extrapolation``: continuous
    where G steps between test depths), ``G_lo``, ``G_interp_lo`` (their lower 95 % bounds: a G that sampling noise
    does not explain; with ``eval.bootstrap_resamples`` > 0), ``loss``, ``train_acc``, ``acc_d{D}``,
    ``acc_query_d{D}`` or ``acc_longest``."""
    mode: str | None = None
    """``max`` or ``min``; ``None``: the metric's own direction (:data:`MINIMIZED_METRICS` are minimised, the rest,
    G and accuracies, maximised)."""
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
    seeds: tuple[int, ...] | typing.Mapping[str, tuple[int, ...]] = (0, 1, 2)
    """Default seeds (``--seeds`` overrides): one tuple for every preset, or preset → seeds."""
    overrides: typing.Mapping[str, typing.Any] = field(default_factory=dict)
    """Flat config overrides applied to every trial (``recipe.*`` keys apply after the recipe)."""
    preset_overrides: typing.Mapping[str, typing.Mapping[str, typing.Any]] = field(default_factory=dict)
    """Preset → flat overrides applied after ``overrides`` under that preset only (e.g. a shorter local budget)."""
    cells: tuple[Cell, ...] | typing.Mapping[str, tuple[Cell, ...]] = ()
    """Explicit grid points (one tuple for every preset, or preset → tuple) instead of the full product: each cell
    maps flat keys (``recipe``, ``task.name``, any config key such as ``eval.halt_k``) to values, every cell naming
    the same keys. The grid is then cells × the dimensions the cells do not name (of ``recipe``, ``task.name``,
    ``backbone.name``, ``train.seed``), so ``[{"recipe": r, "task.name": "swap_s5"} for r in recipes] +
    [{"recipe": "par", "task.name": t} for t in tasks]`` runs every recipe on one task and only ``par`` on the
    others. Empty: ``recipes`` × ``tasks``. Grid only (not with ``search``); ``recipes`` and ``tasks`` must list
    every recipe and task the cells name. Tune gets them as one grid dimension, the param ``cell``."""
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
    mode: str | None = None
    """``--mode``: ``max`` or ``min``; ``None``: the spec's mode for its own metric, else the metric's direction."""
    num_samples: int | None = None
    overrides: typing.Mapping[str, str] = field(default_factory=dict)
    """``--set SECTION.FIELD=VALUE``: flat overrides applied to every trial after the sweep's own (``recipe.*`` keys
    after the recipe, like ``SweepSpec.overrides``); recorded in the parent run and checked by ``--resume``."""
    gpu_types: tuple[str, ...] = ()
    """Paper preset only: the GPU types trials may run on, cheapest first (``"L40S"`` or ``"L40S:4"``: at most 4
    GPUs per trial, one node's worth; ``par_ray.presets.gpu_targets``). Empty: ``presets.PAPER_GPU_TYPE`` (H100)."""
    model_dir: str | None = None
    """Where pretrained parents are looked for before the hub cache: ``DIR/<hub id>`` trees (``hf download ID
    --local-dir DIR/ID``) or a hub cache (``--cache-dir DIR``); see ``par_ray.weights``. A directory every node
    sees at the same path."""
    prices: str | None = None
    """A price file (TOML/JSON) or a GPU check's JSON overriding the device table (``par_ray.hardware.load_table``)."""
    max_usd: float | None = None
    """Refuse to start a sweep whose planned on-demand cost exceeds this many USD (``par_ray.cost``)."""


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
    overrides: typing.Mapping[str, str] = field(default_factory=dict)
    """``--set`` overrides (``Options.overrides``), in every trial's params."""


_RESOLVED: dict[tuple[str, tuple], TrialConfig] = {}
""":func:`resolve`'s configs by their params: a sweep driver resolves each trial in :func:`build_plan`, then again in
its MLflow callbacks and summary; the config (a frozen dataclass) is computed once per process."""


def resolve(params: typing.Mapping[str, typing.Any], extra_recipes: typing.Mapping[str, Recipe] | None = None
            ) -> TrialConfig:
    """The trial config of one Tune trial's flat params: ``preset`` and ``recipe`` plus flat config keys.

    Order: ``presets.preset_trial(preset, backbone, task, seed, gpu_types)`` → the non-recipe keys → the recipe
    (from ``RECIPES`` or ``extra_recipes``) → the ``recipe.*`` keys (so a search over ``recipe.hold_lambda`` wins over
    the recipe's value). A ``cell`` param (one of ``SweepSpec.cells``, as Tune's grid hands it over) is read as its
    flat keys; the :data:`GPU_TYPES_KEY` param as the paper preset's GPU types. Under the paper preset, unless the
    params set one of :data:`PARALLELISM_KEYS`, the parallelism is chosen once, for the config as resolved
    (``presets.fit_parallelism``: recipe, overrides and EMA teacher counted; with GPU types, cheapest type first;
    without, ``presets.PAPER_GPU_TYPE``). Raises ``ValueError`` naming
    unknown keys / values; does not validate ranges. Resolved once per process for equal params (:data:`_RESOLVED`).
    """
    key = (json.dumps(params, sort_keys=True, default=repr), tuple(sorted((extra_recipes or {}).items())))
    if key not in _RESOLVED:
        _RESOLVED[key] = _resolve(params, extra_recipes)
    return _RESOLVED[key]


def _resolve(params: typing.Mapping[str, typing.Any], extra_recipes: typing.Mapping[str, Recipe] | None
             ) -> TrialConfig:
    params = {**{k: v for k, v in params.items() if k != CELL_KEY}, **dict(params.get(CELL_KEY) or {})}
    flat = {k: v for k, v in params.items() if k not in ("preset", "recipe", GPU_TYPES_KEY, MODEL_DIR_KEY)}
    gpu_types = tuple(t for t in str(params.get(GPU_TYPES_KEY) or "").split(",") if t)
    choose = params["preset"] == "paper" and not PARALLELISM_KEYS & set(flat)
    cfg = presets.preset_trial(str(params["preset"]), str(flat.pop("backbone.name", "tiny-qwen2")),
                               str(flat.pop("task.name", "swap_s5")), int(flat.pop("train.seed", 0)), gpu_types,
                               parallelism=not choose)  # planned once, below, for the config as resolved
    cfg = from_flat({k: v for k, v in flat.items() if not k.startswith("recipe.")}, base=cfg)
    if cfg.backbone.pretrained is not None:  # offline first: the local checkpoint directory, where there is one
        local = local_pretrained(cfg.backbone.pretrained, str(params.get(MODEL_DIR_KEY) or "") or None)
        cfg = from_flat({"backbone.pretrained": local}, base=cfg)
    recipe = str(params.get("recipe", "par"))
    cfg = extra_recipes[recipe](cfg) if extra_recipes and recipe in extra_recipes else apply_recipe(cfg, recipe)
    cfg = from_flat({k: v for k, v in flat.items() if k.startswith("recipe.")}, base=cfg)
    if choose:
        # planned for the trial as it runs, not the preset's base trial (par): a CoT trace, dense targets, untied
        # copies, an EMA teacher or a searched window may need more
        cfg = from_flat(presets.fit_parallelism(cfg, gpu_types), base=cfg)
    return cfg


def build_plan(spec: SweepSpec, opts: Options, preset: str) -> Plan:
    """Resolve and validate every trial of ``spec`` under ``preset``; raises :class:`SweepConfigError`."""
    from ray import tune

    if opts.gpu_types and preset != "paper":
        raise SweepConfigError(f"--gpu-types: only --preset paper plans trials per GPU type; preset {preset!r} runs "
                               f"on CPUs (drop --gpu-types, or pass --preset paper)")
    try:
        presets.gpu_targets(opts.gpu_types)
    except ValueError as e:
        raise SweepConfigError(str(e)) from None
    backbones = tuple(opts.backbones or spec.backbones.get(preset, presets.PRESET_BACKBONES[preset]))
    seeds = tuple(opts.seeds if opts.seeds is not None else default_seeds(spec, preset))
    dims: dict[str, tuple] = {"recipe": tuple(spec.recipes), "task.name": tuple(spec.tasks),
                              "backbone.name": backbones, "train.seed": seeds}
    errs = [f"{name}: {v!r} is not one of {sorted(allowed)}" for name, values, allowed in (
        ("recipe", spec.recipes, {**RECIPES, **spec.extra_recipes}), ("backbone.name", backbones, BACKBONES))
        for v in values if v not in allowed]
    errs += [f"{name}: empty" for name, values in dims.items() if not values]
    cells = cells_of(spec, preset)
    errs += cell_errors(spec, cells)
    if errs:
        raise SweepConfigError("invalid sweep:\n  - " + "\n  - ".join(errs))
    if cells:  # the cells replace the dimensions they name; the others cross with them
        dims = {CELL_KEY: tuple(_flat_values(c) for c in cells), **{k: v for k, v in dims.items() if k not in cells[0]}}

    errs = override_errors(spec, opts.overrides)
    if errs:
        raise SweepConfigError("--set: " + "; ".join(errs))
    fixed: dict[str, typing.Any] = {"preset": preset, **fixed_overrides(spec, preset)}
    if opts.gpu_types:
        fixed[GPU_TYPES_KEY] = ",".join(opts.gpu_types)
    if opts.model_dir:
        fixed[MODEL_DIR_KEY] = opts.model_dir
    if opts.smoke_test:  # sized from the preset trial as the sweep sets it (its train depth and test grid)
        base = from_flat(fixed_overrides(spec, preset), base=presets.preset_trial(preset, backbones[0]))
        fixed.update(_flat_values(presets.smoke_overrides(base)))
    fixed.update(opts.overrides)  # the user's --set wins over the sweep's and the smoke test's values
    search = spec.search
    if search is not None:
        # a --metric of the user's own takes its own direction unless --mode names one
        search = replace(search, metric=opts.metric or search.metric,
                         mode=opts.mode or (search.mode if opts.metric is None else None),
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
    grid = [_unpack(dict(zip(dims, combo))) for combo in itertools.product(*dims.values())]
    variants: list[dict[str, typing.Any]] = [{}]
    if search is not None:
        if callable(search.space):
            search = replace(search, space=dict(search.space(resolve({**fixed, **grid[0]}, spec.extra_recipes))))
        searched = [k for k in opts.overrides if k in search.space]
        if searched:  # the search would overwrite the --set value in every trial it proposes
            raise SweepConfigError("--set: " + "; ".join(
                f"{k} is searched by this sweep (its search space: {sorted(search.space)}); drop the --set, or fix "
                f"it in the sweep's search space" for k in searched))
        space.update(search.space)
        ends = {k: domain_ends(k, d) for k, d in search.space.items()}
        first = {k: v[0] for k, v in ends.items()}
        variants = [first] + [{**first, k: v} for k, vs in ends.items() for v in vs[1:]]
    trials, errs = [], []
    for point in grid:
        for variant in variants:
            params = {**fixed, **point, **variant}
            try:
                cfg = validate(resolve(params, spec.extra_recipes))
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
    return Plan(spec=spec, preset=preset, param_space=space, trials=trials, search=search, metric=metric, mode=mode,
                overrides=dict(opts.overrides))


def override_errors(spec: SweepSpec, overrides: typing.Mapping[str, str]) -> list[str]:
    """Problems of ``--set`` overrides: a key that is not a config field or a value that does not convert
    (``from_flat``), a grid dimension (they have their own flags: ``--seeds``, ``--backbones``, or the spec). A key
    the spec's search samples, and ranges, are checked in :func:`build_plan` (a search space may be a function of the
    trial's config)."""
    if not overrides:
        return []
    reserved = {"train.seed": "--seeds", "backbone.name": "--backbones", "task.name": "the sweep's tasks",
                "recipe.name": "the sweep's recipes"}
    errs = [f"{k} is a grid dimension (set it with {reserved[k]})" for k in overrides if k in reserved]
    try:
        from_flat({k: v for k, v in overrides.items() if k not in reserved})
    except ValueError as e:
        errs.append(str(e))
    return errs


def missing_weights(plan: Plan) -> list[str]:
    """One error per backbone of ``plan`` whose pretrained weights or tokenizer do not resolve on this machine
    (``par_ray.weights.weights_errors``: each names the backbone, where it looked and the download command), then one
    per (backbone, task) whose task words the parent's tokenizer cannot render one token each
    (``par_ray.train.checkpoint.trained_task``, as the trials' workers would). Checked before any cluster resource is
    claimed; empty for random-init trials."""
    from par_ray.train.checkpoint import trained_task

    model_dir = str(plan.param_space.get(MODEL_DIR_KEY) or "") or None
    errors = weights_errors(((cfg.backbone.name, cfg.backbone.pretrained) for _, cfg in plan.trials), model_dir)
    if errors:
        return errors
    for cfg in {(cfg.backbone, cfg.task): cfg for _, cfg in plan.trials if cfg.backbone.pretrained}.values():
        try:
            trained_task(cfg)
        except ValueError as e:
            errors.append(f"{cfg.backbone.name} ({cfg.backbone.pretrained}): {e}")
    return errors


def fixed_overrides(spec: SweepSpec, preset: str) -> dict[str, typing.Any]:
    """The flat overrides every trial of ``spec`` gets under ``preset``: ``overrides``, then that preset's
    ``preset_overrides``, tuples in their ``to_flat`` text."""
    return {**_flat_values(spec.overrides), **_flat_values(spec.preset_overrides.get(preset, {}))}


def default_seeds(spec: SweepSpec, preset: str) -> tuple[int, ...]:
    """``spec.seeds`` under ``preset`` (a tuple for every preset, or preset → seeds; ``(0,)`` for a preset it omits)."""
    if isinstance(spec.seeds, typing.Mapping):
        return tuple(spec.seeds.get(preset, (0,)))
    return tuple(spec.seeds)


def cells_of(spec: SweepSpec, preset: str) -> tuple[Cell, ...]:
    """``spec.cells`` under ``preset`` (a tuple for every preset, or preset → tuple; ``()`` for a preset it omits)."""
    if isinstance(spec.cells, typing.Mapping):
        return tuple(spec.cells.get(preset, ()))
    return tuple(spec.cells)


def cell_errors(spec: SweepSpec, cells: tuple[Cell, ...]) -> list[str]:
    """Problems of ``cells`` (the spec's under one preset) as ``"cells...: message"`` strings (empty when valid or
    when there are none)."""
    if not cells:
        return []
    errs = []
    if spec.search is not None:
        errs.append("cells: an Optuna search samples its own points; use cells only in a grid (search=None)")
    keys = set(cells[0])
    allowed = {"recipe": set(spec.recipes), "task.name": set(spec.tasks)}
    for i, cell in enumerate(cells):
        if not cell:
            errs.append(f"cells[{i}]: empty; a cell names at least one key")
        if set(cell) != keys:
            errs.append(f"cells[{i}]: names keys {sorted(cell)}, but cells[0] names {sorted(keys)}; every cell must "
                        "name the same keys")
        for key, values in allowed.items():
            if key in cell and cell[key] not in values:
                where = "recipes" if key == "recipe" else "tasks"
                errs.append(f"cells[{i}].{key}: {cell[key]!r} is not in the spec's {where} {sorted(values)}")
    if len({tuple(sorted(_flat_values(c).items())) for c in cells}) != len(cells):
        errs.append("cells: the same cell appears twice")
    return errs


def _unpack(point: dict[str, typing.Any]) -> dict[str, typing.Any]:
    """A grid point with its cell (if any) read as flat keys, as :func:`resolve` reads it."""
    cell = point.pop(CELL_KEY, None) or {}
    return {**_flat_values(cell), **point}


def _flat_values(flat: typing.Mapping[str, typing.Any]) -> dict[str, typing.Any]:
    """Tuples (and lists) in their ``to_flat`` text (``"8,16,32"``; rules ``"4/8/0.5,8/8/0.5"``), so Tune never
    expands them."""
    return {k: flat_value(_tuples(v)) if isinstance(v, (tuple, list)) else v for k, v in flat.items()}


def _tuples(value: tuple | list) -> tuple:
    """``value`` with its lists (and the lists in it) as tuples, as :func:`par_ray.config.flat_value` reads them."""
    return tuple(_tuples(v) if isinstance(v, (tuple, list)) else v for v in value)


def domain_ends(key: str, domain: typing.Any) -> list[typing.Any]:
    """The ends of a ``ray.tune`` domain (every value of a choice); raises :class:`SweepConfigError` otherwise."""
    from ray.tune.search.sample import Categorical, Float, Integer

    if isinstance(domain, Categorical):
        return list(domain.categories)
    if isinstance(domain, Integer):
        return [domain.lower, domain.upper - 1]  # tune.randint's upper bound is exclusive
    if isinstance(domain, Float):
        return [domain.lower, domain.upper]
    raise SweepConfigError(f"search space {key}: {domain!r} is not a ray.tune domain (tune.uniform, tune.choice …)")


def _check_metric(metric: str, mode: str | None, cfgs: list[TrialConfig]) -> tuple[str, str]:
    """Resolve ``acc_longest`` and a ``None`` mode (the metric's direction: :data:`MINIMIZED_METRICS`); check the
    metric is in *every* report (ASHA and Tune's strict metric check need it)."""
    if mode is None:
        mode = "min" if metric in MINIMIZED_METRICS else "max"
    if mode not in ("max", "min"):
        raise SweepConfigError(f"--mode: {mode!r} is not one of ['max', 'min']")
    depths = {cfg.eval.depths for cfg in cfgs}
    if metric == "acc_longest":
        if len(depths) != 1:
            raise SweepConfigError(f"--metric acc_longest: trials test different depths {sorted(depths)}")
        metric = depth_metric("acc", max(next(iter(depths))))
    # the lower 95 % bounds (a conservative objective) are in every evaluation's report when every trial bootstraps
    bounds = {"G_lo", "G_interp_lo"} if all(cfg.eval.bootstrap_resamples for cfg in cfgs) else set()
    eval_metrics = {"G", "G_interp"} | bounds | {depth_metric(k, d) for ds in depths for d in ds
                                                 for k in ("acc", "acc_query")}
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


def count_trials(plan: Plan) -> int:
    """Trials Tune will run: the grid's size, or the search's samples."""
    return len(plan.trials) if plan.search is None else plan.search.num_samples


def trial_label(cfg: TrialConfig) -> str:
    """``{recipe}-{backbone}-{task}-seed{seed}``: a trial's MLflow run name and its name in messages."""
    return f"{cfg.recipe.name}-{cfg.backbone.name}-{cfg.task.name}-seed{cfg.train.seed}"
