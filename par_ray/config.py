"""Typed, frozen configuration of one PAR trial.

A trial is fully described by a :class:`TrialConfig`: the task, the backbone, the recipe (the PAR method and its
ablations), the optimisation and the evaluation protocol. Every component receives only its own sub-config.

Configs validate themselves: :meth:`TrialConfig.validate` collects *every* problem into one ``ValueError`` that names
each field and its allowed values (litgpt ``validate_args``; torchtitan ``Trainer.Config.__post_init__``). Flattening
to a ``{"section.field": value}`` dict happens only here, at the Tune / MLflow boundary (:func:`to_flat`,
:func:`from_flat`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field, fields, replace

TASK_NAMES = ("swap_s5", "s5", "a5")
TARGETS = ("progress", "final")
DEPTH_SCHEDULES = ("forced", "hold")
STRATEGIES = ("ddp", "fsdp", "deepspeed")
ZERO_STAGES = (1, 2, 3)
POSITION_SCHEMES = ("rope", "none")
OP_ORDERS = ("forward", "recent_first")


@dataclass(frozen=True)
class TaskConfig:
    """Which state-tracking task, and the depths trained on (paper §4, task suite)."""

    name: str = "swap_s5"
    """Task family, one of ``TASK_NAMES``."""
    train_depth: int = 8
    """d_train: the largest depth (number of operations in the prompt) trained on."""
    min_train_depth: int = 1
    """Smallest depth sampled during training."""
    op_order: str = "forward"
    """Prompt serialisation: ``forward`` (op_1 first, the paper's) or ``recent_first`` (op_d first); see
    ``par_ray.tasks.common.RecentFirst``."""
    train_filler: int = 0
    """Training prompts only: 0..train_filler extra separator tokens (drawn per batch) between the operations and the
    queries, so the distance from the queries to operation k carries no information; test prompts have none. A
    par_ray option, not the paper's (``par_ray.tasks.common.Filler``; docs/experiments.md, experiment 7)."""


@dataclass(frozen=True)
class BackboneConfig:
    """The parent decoder and how its layers are split into prelude / core / coda (paper §3.1)."""

    name: str = "tiny-qwen2"
    """A key of ``par_ray.model.backbones.BACKBONES``."""
    pretrained: str | None = None
    """``None``: random init from the config. Otherwise a local directory or a hub name for ``from_pretrained``, told
    apart by :func:`pretrained_kind`: a path (absolute, or starting with ``.`` or ``~``, or with more than one ``/``)
    or an existing directory is a local checkpoint and must hold ``config.json``; anything else must be a hub id
    (``name`` or ``org/name``)."""
    split: tuple[int, int, int] | None = None
    """(prelude, core, coda) layer counts summing to the parent's layer count; ``None`` = thirds."""
    position_scheme: str = "rope"
    """``rope``: the parent's rotary embedding. ``none``: no positional encoding (NoPE), random-init shapes only."""


@dataclass(frozen=True)
class RecipeConfig:
    """The PAR method and the knobs its ablations turn (paper §3). Named presets live in ``par_ray.recipes``."""

    name: str = "par"
    """Label of the recipe this config came from (a tag for analysis; behaviour comes from the fields below)."""
    targets: str = "progress"
    """``progress``: iteration k predicts z_min(ck, d) (PAR, Eq. 3). ``final``: every iteration predicts z_d."""
    anchoring: bool = True
    """RMS norm anchoring: rescale each token's state to its first-iteration RMS after every iteration (§3.3)."""
    tied: bool = True
    """Weight-tied core (looped). ``False``: R distinct copies of the core (the deeper-model baseline)."""
    ops_per_iteration: int = 1
    """c: operations consumed per iteration, so R = ceil(d / c)."""
    depth_schedule: str = "forced"
    """``forced``: R = ceil(d / c). ``hold``: R = 1 + Poisson(hold_lambda); iterations past d / c keep z_d."""
    hold_lambda: float = 8.0
    """lambda of the hold schedule's Poisson draw."""
    grad_window: int = 8
    """Gradient window: only the last ``grad_window`` iterations are run with autograd and supervised."""
    max_iterations: int = 64
    """Cap on R during training (the hold schedule's tail, untied copies)."""
    stretch_max: float = 1.0
    """Positional stretch: position ids are multiplied by s ~ U[1, stretch_max] per step (1.0 = off)."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, parallelism and bookkeeping of one trial."""

    steps: int = 3000
    """Optimizer steps."""
    batch_size: int = 64
    """Global batch size (sequences per step, summed over workers)."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 100
    """Linear warm-up steps, then cosine decay to 10 % of ``lr``."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 = off)."""
    seed: int = 0
    """Seeds the model init, the data streams and the per-step schedule."""
    strategy: str = "ddp"
    """Data-parallel wrapping, one of ``STRATEGIES``."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage (``strategy="deepspeed"`` only)."""
    zero_offload: bool = False
    """DeepSpeed ZeRO-Offload of optimizer state to CPU."""
    num_workers: int = 1
    """Ray Train workers (one process per GPU on a GPU cluster)."""
    use_gpu: bool = False
    """Run workers on GPUs (bf16 autocast, NCCL); ``False``: CPU, float32, gloo."""
    threads_per_worker: int = 0
    """torch intra-op threads per worker (0 = leave torch's default)."""
    eval_every: int = 500
    """Evaluate accuracy by depth every this many steps (and at the end)."""
    report_every: int = 50
    """Report training metrics every this many steps."""
    checkpoint_every: int = 500
    """Checkpoint every this many steps (and at the end); 0 = only at the end."""
    fail_at_step: int = -1
    """Fault injection for tests: worker rank 0 dies once when reaching this step (-1 = off)."""
    collective_timeout_s: float = 300.0
    """Seconds a gloo/NCCL collective may wait for the other ranks before the run fails (Ray Train's
    ``TorchConfig.timeout_s``, whose default is 30 minutes). It must cover the slowest wait between ranks in a step:
    a training step, an evaluation pass or a checkpoint write; a rank mismatch then fails in this bounded time."""


@dataclass(frozen=True)
class EvalConfig:
    """Extrapolation protocol: accuracy at each test depth with R = ceil(d / c) (paper §4.2)."""

    depths: tuple[int, ...] = (8, 16, 32, 64)
    """Test depths; every one must be >= the train depth."""
    num_sequences: int = 256
    """Sequences per test depth (the paper uses 1,024)."""
    batch_size: int = 256
    """Sequences per evaluation forward pass."""
    seed: int = 10_000
    """Seed of the test sets (disjoint from training streams, which use the trial seed); a non-negative int."""


@dataclass(frozen=True)
class TrialConfig:
    """One trial: everything needed to train and evaluate one looped model."""

    task: TaskConfig = field(default_factory=TaskConfig)
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def validate(self) -> "TrialConfig":
        """Check every field; raise one ``ValueError`` listing all problems (field, value, allowed). Returns self."""
        errors = config_errors(self)
        if errors:
            raise ValueError("invalid trial config:\n  - " + "\n  - ".join(errors))
        return self


MAX_SEED = 2**63 - 1
"""Seeds are non-negative ints below 2**63 (``numpy.random.SeedSequence`` refuses negatives; torch takes 64 bits)."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)?$")


def pretrained_kind(value: str) -> str:
    """``"local"`` or ``"hub"``: how ``backbone.pretrained`` is read (the rule in ``BackboneConfig.pretrained``).

    A value that exists as a directory, is absolute, starts with ``.`` or ``~``, or has more than one ``/`` names a
    local checkpoint. Anything else is a Hugging Face hub id (``gpt2``, ``Qwen/Qwen2.5-0.5B``), which is legal even
    when no such directory exists here: ``from_pretrained`` reads it from the hub cache or the hub. So a relative
    local directory of one or two components (``mymodel``) that does not exist is taken as a hub id; write
    ``./mymodel`` to have it checked as a path.
    """
    expanded = os.path.expanduser(value)
    if (os.path.isdir(expanded) or os.path.isabs(expanded) or value.startswith((".", "~"))
            or value.count("/") > 1 or os.sep != "/" and os.sep in value):
        return "local"
    return "hub"


def _type_ok(value: typing.Any, hint: typing.Any) -> bool:
    """``value`` has the declared type ``hint`` (bool is not an int here; an int is a float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_type_ok(v, args[0]) for v in value)
        return len(value) == len(args) and all(_type_ok(v, a) for v, a in zip(value, args))
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint: typing.Any) -> str:
    if typing.get_origin(hint) is None and hasattr(hint, "__name__"):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _type_errors(cfg: TrialConfig) -> tuple[list[str], set[str]]:
    """Fields whose value is not of the declared type, or a non-finite float: (messages, ``"section.field"`` names).

    Every numeric field of every section rejects ``inf`` and ``nan`` here, whatever its own range check says.
    """
    errs, bad = [], set()
    for section in fields(cfg):
        sub = getattr(cfg, section.name)
        hints = typing.get_type_hints(type(sub))
        for f in fields(sub):
            name, value, hint = f"{section.name}.{f.name}", getattr(sub, f.name), hints[f.name]
            if not _type_ok(value, hint):
                errs.append(f"{name}: expected {_type_name(hint)}, got {value!r} ({type(value).__name__})")
                bad.add(name)
            elif isinstance(value, float) and not math.isfinite(value):
                errs.append(f"{name}: must be a finite number, got {value}")
                bad.add(name)
    return errs, bad


def config_errors(cfg: TrialConfig) -> list[str]:
    """All problems of ``cfg`` as ``"field: message"`` strings (empty when valid).

    First the declared type of every field (and finiteness of every float), then each field's domain; a field of
    the wrong type is reported once, by the type check, and skipped by the range checks that would read it.
    """
    from par_ray.model.backbones import BACKBONES  # local: keeps config importable without torch at import time

    t, b, r, tr, ev = cfg.task, cfg.backbone, cfg.recipe, cfg.train, cfg.eval
    errs, bad = _type_errors(cfg)

    def check(names: str, ok: typing.Callable[[], bool], msg: typing.Callable[[], str] | str) -> None:
        """Report ``names.split()[0]: msg`` unless ``ok()``; skipped when any field in ``names`` has a bad type."""
        fs = names.split()
        if any(n in bad for n in fs) or ok():
            return
        errs.append(f"{fs[0]}: {msg() if callable(msg) else msg}")

    def value_of(name: str) -> typing.Any:
        section, _, f = name.partition(".")
        return getattr(getattr(cfg, section), f)

    def at_least(name: str, low: float, note: str = "") -> None:
        value = value_of(name)
        check(name, lambda: value >= low, f"must be >= {low}{note}, got {value}")

    def one_of(name: str, allowed) -> None:
        value = value_of(name)
        check(name, lambda: value in allowed, f"{value!r} is not one of {list(allowed)}")

    def seed(name: str) -> None:
        value = value_of(name)
        check(name, lambda: 0 <= value <= MAX_SEED, f"must be a non-negative int below 2**63, got {value}")

    one_of("task.name", TASK_NAMES)
    one_of("task.op_order", OP_ORDERS)
    at_least("task.train_filler", 0)
    at_least("task.train_depth", 1)
    check("task.min_train_depth task.train_depth", lambda: 1 <= t.min_train_depth <= max(t.train_depth, 1),
          lambda: f"must be in [1, task.train_depth={t.train_depth}], got {t.min_train_depth}")

    one_of("backbone.name", BACKBONES)
    one_of("backbone.position_scheme", POSITION_SCHEMES)
    if b.split is not None and "backbone.split" not in bad and b.name in BACKBONES:
        n_layers = BACKBONES[b.name].num_hidden_layers
        if sum(b.split) != n_layers or min(b.split) < 0 or b.split[1] < 1:
            errs.append(f"backbone.split: {tuple(b.split)} must be non-negative with core >= 1 and sum to "
                        f"{b.name}'s {n_layers} layers")
    if b.pretrained is not None and "backbone.pretrained" not in bad:
        errs.extend(_pretrained_errors(b.pretrained))

    check("recipe.name", lambda: r.name.strip() != "", "must be a non-empty label")
    one_of("recipe.targets", TARGETS)
    one_of("recipe.depth_schedule", DEPTH_SCHEDULES)
    at_least("recipe.ops_per_iteration", 1)
    at_least("recipe.grad_window", 1)
    at_least("recipe.hold_lambda", 0)
    at_least("recipe.stretch_max", 1.0, " (1.0 = off)")
    check("recipe.max_iterations task.train_depth recipe.ops_per_iteration",
          lambda: r.max_iterations >= -(-t.train_depth // max(r.ops_per_iteration, 1)),
          lambda: (f"must be >= ceil(task.train_depth / recipe.ops_per_iteration) = "
                   f"{-(-t.train_depth // max(r.ops_per_iteration, 1))}, got {r.max_iterations}"))

    for name in ("train.steps", "train.batch_size", "train.num_workers", "train.eval_every", "train.report_every"):
        at_least(name, 1)
    check("train.batch_size train.num_workers", lambda: tr.batch_size % max(tr.num_workers, 1) == 0,
          f"{tr.batch_size} must be divisible by train.num_workers={tr.num_workers}")
    check("train.lr", lambda: tr.lr > 0, f"must be > 0, got {tr.lr}")
    for name in ("train.weight_decay", "train.warmup_steps", "train.grad_clip", "train.threads_per_worker",
                 "train.checkpoint_every"):
        at_least(name, 0)
    seed("train.seed")
    one_of("train.strategy", STRATEGIES)
    check("train.strategy recipe.tied", lambda: tr.strategy != "deepspeed" or r.tied,
          "'deepspeed' cannot train the untied baseline (recipe.tied=False): use 'ddp' or 'fsdp' (docs/distributed.md)")
    one_of("train.zero_stage", ZERO_STAGES)
    at_least("train.fail_at_step", -1, " (-1 = off)")
    check("train.collective_timeout_s", lambda: tr.collective_timeout_s >= 1,
          f"must be >= 1 second, got {tr.collective_timeout_s}")

    if "eval.depths" not in bad:
        if not ev.depths or any(d < 1 for d in ev.depths):
            errs.append(f"eval.depths: must be a non-empty list of positive integers, got {ev.depths!r}")
        else:
            low = [d for d in ev.depths if "task.train_depth" not in bad and d < t.train_depth]
            check("eval.depths", lambda: not low,
                  f"{low} are below task.train_depth={t.train_depth}; test depths must be >= it")
            check("eval.depths", lambda: list(ev.depths) == sorted(set(ev.depths)),
                  f"must be strictly increasing, got {list(ev.depths)}")
    at_least("eval.num_sequences", 1)
    at_least("eval.batch_size", 1)
    seed("eval.seed")
    return errs


def _pretrained_errors(value: str) -> list[str]:
    """Problems of ``backbone.pretrained`` under the rule of :func:`pretrained_kind` (checked before anything runs)."""
    if value.strip() == "":
        return ["backbone.pretrained: empty; use None for random init, a local directory or a hub id"]
    if pretrained_kind(value) == "hub":
        if not _HUB_ID.match(value):
            return [f"backbone.pretrained: {value!r} is neither a local directory nor a hub id ('name' or "
                    f"'org/name'); write local directories as ./path or /abs/path"]
        return []
    path = os.path.expanduser(value)
    if not os.path.isdir(path):
        return [f"backbone.pretrained: local directory {value!r} does not exist (a hub id is 'name' or 'org/name'; "
                f"a local checkpoint is a directory holding config.json)"]
    if not os.path.isfile(os.path.join(path, "config.json")):
        return [f"backbone.pretrained: {value!r} holds no config.json, so it is not a transformers checkpoint "
                f"directory"]
    return []


# --------------------------------------------------------------------------------------------------------------------
# Flat dict boundary (Ray Tune param_space, MLflow params)

_SECTIONS = {f.name: f.type for f in fields(TrialConfig)}


def to_flat(cfg: TrialConfig) -> dict[str, typing.Any]:
    """``{"task.name": "swap_s5", ..., "eval.depths": "8,16,32,64"}``: scalars only, tuples joined by commas."""
    flat: dict[str, typing.Any] = {}
    for section in fields(cfg):
        sub = getattr(cfg, section.name)
        for f in fields(sub):
            value = getattr(sub, f.name)
            if isinstance(value, tuple):
                value = ",".join(str(v) for v in value)
            flat[f"{section.name}.{f.name}"] = value
    return flat


def from_flat(flat: typing.Mapping[str, typing.Any], base: TrialConfig | None = None) -> TrialConfig:
    """Inverse of :func:`to_flat`, applied as overrides on ``base`` (default: ``TrialConfig()``).

    Values may be strings (as MLflow returns them); they are converted to each field's declared type.
    Raises ``ValueError`` naming unknown keys or values that do not convert; does *not* validate ranges
    (call ``.validate()``).
    """
    cfg = base or TrialConfig()
    updates: dict[str, dict[str, typing.Any]] = {}
    errs: list[str] = []
    for key, raw in flat.items():
        section, _, name = key.partition(".")
        sub = getattr(cfg, section, None) if section in _SECTIONS else None
        hints = typing.get_type_hints(type(sub)) if sub is not None else {}
        if name not in hints:
            errs.append(f"{key}: unknown config field (sections: {list(_SECTIONS)})")
            continue
        try:
            updates.setdefault(section, {})[name] = _convert(raw, hints[name])
        except (TypeError, ValueError) as e:
            errs.append(f"{key}: cannot read {raw!r} as {hints[name]} ({e})")
    if errs:
        raise ValueError("invalid trial config:\n  - " + "\n  - ".join(errs))
    return replace(cfg, **{s: replace(getattr(cfg, s), **u) for s, u in updates.items()})


def _convert(raw: typing.Any, hint: typing.Any) -> typing.Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):  # X | None
        if raw is None or raw == "None" or raw == "":
            return None
        return _convert(raw, next(a for a in args if a is not type(None)))
    if origin is tuple:
        elem = args[0]
        if isinstance(raw, str):
            items = [x.strip() for x in raw.split(",")]
            if any(x == "" for x in items):
                raise ValueError("empty element in comma-separated list")
        else:
            items = list(raw)
        return tuple(_convert(x, elem) for x in items)
    if hint is bool:
        if isinstance(raw, str):
            if raw.lower() in ("true", "1", "yes"):
                return True
            if raw.lower() in ("false", "0", "no"):
                return False
            raise ValueError("expected true/false")
        return bool(raw)
    if hint is int:
        if isinstance(raw, float) and not raw.is_integer():
            raise ValueError("expected an integer")
        if isinstance(raw, str):
            return int(raw.strip())
        return int(raw)
    if hint is float:
        return float(raw)
    if hint is str:
        return str(raw)
    raise TypeError(f"unsupported field type {hint}")


def with_overrides(cfg: TrialConfig, **sections: dict[str, typing.Any]) -> TrialConfig:
    """``with_overrides(cfg, recipe={"anchoring": False})``: a copy with fields of named sections replaced."""
    return replace(cfg, **{s: dataclasses.replace(getattr(cfg, s), **u) for s, u in sections.items()})
