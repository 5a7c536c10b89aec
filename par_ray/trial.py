"""What a trial config means against the registries: one home for validating it and for what it resolves to.

``par_ray.config`` holds the frozen dataclasses and checks their fields on their own; it imports nothing from par_ray.
This module sits one layer up, beside the registries it reads (backbones ``par_ray.model.registry``, tasks
``par_ray.tasks``, recipes ``par_ray.recipes``, GPU types ``par_ray.accelerators``):

- :func:`validate` — the config's own field checks (``config.config_errors``) and every check that needs a registry
  or the file system (:func:`registry_errors`), raised as ONE ``ValueError`` listing every problem, before any
  cluster resource is claimed (litgpt ``validate_args``).
"""

from __future__ import annotations

import os
import re
import typing

from par_ray.accelerators import GPU_MEMORY_GB
from par_ray.config import (DISTILL_MODES, HALTING_AND_STAGE_FIELDS, StageConfig, TrialConfig, config_errors,
                            type_errors)
from par_ray.model.registry import BACKBONES
from par_ray.recipes import RECIPES
from par_ray.tasks import TASKS

STAGE_FIXED_RECIPE_FIELDS = ("anchoring", "tied", "max_iterations", "cot")
"""Recipe fields built into the model once per trial: a stage's recipe may not change them."""


# --------------------------------------------------------------------------------------------------------------------
# Validation


def validate(cfg: TrialConfig) -> TrialConfig:
    """Check every field of ``cfg`` and every name it gives a registry; return ``cfg``.

    Raises:
        ValueError: ``"invalid trial config:"`` followed by one ``"- field: message"`` line per problem, the field's
            own checks (``par_ray.config.config_errors``) first, then :func:`registry_errors`.
    """
    errors = config_errors(cfg) + registry_errors(cfg)
    if errors:
        raise ValueError("invalid trial config:\n  - " + "\n  - ".join(errors))
    return cfg


def registry_errors(cfg: TrialConfig) -> list[str]:
    """The problems of ``cfg`` that need a registry or the file system, as ``"field: message"`` strings.

    ``backbone.name`` (``BACKBONES``) and ``backbone.split`` against its layer count; ``backbone.pretrained`` (a hub id
    or a local checkpoint directory, :func:`pretrained_kind`); what the task can serve (serial-layout options, its
    ``max_depth``, a whole-task state for ``recipe.dense_targets``, a serial prompt for ``recipe.distill``);
    ``train.accelerator_type`` (``GPU_MEMORY_GB``); the stages' named recipes (``RECIPES``) and what they may change.
    A field whose type is wrong (``par_ray.config.type_errors``, reported by ``config_errors``) is skipped here.
    """
    t, b, r, tr = cfg.task, cfg.backbone, cfg.recipe, cfg.train
    _, bad = type_errors(cfg)
    errs: list[str] = []

    def check(names: str, ok: typing.Callable[[], bool], msg: typing.Callable[[], str] | str) -> None:
        """Report ``names.split()[0]: msg`` unless ``ok()``; skipped when any field in ``names`` has a bad type."""
        fs = names.split()
        if any(n in bad for n in fs) or ok():
            return
        errs.append(f"{fs[0]}: {msg() if callable(msg) else msg}")

    if "task.name" not in bad and t.name in TASKS:
        errs += _task_shape_errors(cfg, bad)

    check("backbone.name", lambda: b.name in BACKBONES, lambda: f"{b.name!r} is not one of {list(BACKBONES)}")
    if b.split is not None and "backbone.split" not in bad and b.name in BACKBONES:
        n_layers = BACKBONES[b.name].num_hidden_layers
        if sum(b.split) != n_layers or min(b.split) < 0 or b.split[1] < 1:
            errs.append(f"backbone.split: {tuple(b.split)} must be non-negative with core >= 1 and sum to "
                        f"{b.name}'s {n_layers} layers")
    if b.pretrained is not None and "backbone.pretrained" not in bad:
        errs += pretrained_errors(b.pretrained)

    if tr.accelerator_type and "train.accelerator_type" not in bad:
        check("train.accelerator_type", lambda: tr.accelerator_type in GPU_MEMORY_GB,
              f"{tr.accelerator_type!r} is not '' (any GPU) or one of {list(GPU_MEMORY_GB)}")
    if r.dense_targets is True:
        check("recipe.dense_targets task.name", lambda: t.name not in TASKS or TASKS[t.name].num_states > 0,
              lambda: (f"task {t.name!r} defines no whole-task state; dense targets need one of "
                       f"{[n for n, task in TASKS.items() if task.num_states > 0]}"))
    if r.distill in DISTILL_MODES[1:]:
        check("recipe.distill task.name", lambda: t.name not in TASKS or TASKS[t.name].op_width is not None,
              lambda: (f"task {t.name!r} has no serial [BOS, ops, SEP, queries] prompt, so the distillation teacher's "
                       f"truncated prompt is undefined; recipe.distill needs one of "
                       f"{[n for n, task in TASKS.items() if task.op_width is not None]}"))
    if not bad & HALTING_AND_STAGE_FIELDS:  # the stage checks of config.halting_and_stage_errors ran
        errs += _stage_recipe_errors(cfg)
    return errs


def _stage_recipe_errors(cfg: TrialConfig) -> list[str]:
    """Each stage's named recipe: one of ``RECIPES``, changing none of :data:`STAGE_FIXED_RECIPE_FIELDS`, and not
    training halting under a fixed iteration count."""
    stages, r = cfg.stages, cfg.recipe
    if not isinstance(stages, tuple) or not stages or not all(isinstance(s, StageConfig) for s in stages):
        return []  # config.halting_and_stage_errors names the tuple itself
    errs: list[str] = []
    for i, s in enumerate(stages):
        if not s.recipe:
            continue
        if s.recipe not in RECIPES:
            errs.append(f"stages[{i}].recipe: {s.recipe!r} is not one of {['', *RECIPES]}")
            continue
        sr = RECIPES[s.recipe](cfg).recipe
        changed = [f for f in STAGE_FIXED_RECIPE_FIELDS if getattr(sr, f) != getattr(r, f)]
        if changed:
            errs.append(f"stages[{i}].recipe: {s.recipe!r} changes {changed}, which are built into the model once per "
                        "trial; a stage may not change them")
        if sr.halting and sr.fixed_iterations:
            errs.append(f"stages[{i}].recipe: {s.recipe!r} trains learned halting, which needs R to follow the depth "
                        f"(recipe.fixed_iterations={sr.fixed_iterations})")
    return errs


def _task_shape_errors(cfg: TrialConfig, bad: set[str]) -> list[str]:
    """What the task itself cannot serve, found here rather than when a worker first builds the task: a serial-layout
    option (``task.op_order='recent_first'``, ``task.train_filler``) on a task without a serial layout
    (``Task.op_width is None``: reachability), and train or test depths past the task's ``max_depth``."""
    t, ev = cfg.task, cfg.eval
    task = TASKS[t.name]
    errs: list[str] = []
    if task.op_width is None:
        serial = [n for n, k in TASKS.items() if k.op_width is not None]
        if "task.op_order" not in bad and t.op_order == "recent_first":
            errs.append(f"task.op_order: 'recent_first' needs a task with a serial [BOS, ops, SEP, queries] layout, "
                        f"one of {serial}; task {t.name!r} has none: use 'forward'")
        if "task.train_filler" not in bad and t.train_filler != 0:
            errs.append(f"task.train_filler: must be 0 for task {t.name!r}, which has no serial [BOS, ops, SEP, "
                        f"queries] layout (fillers need one of {serial}), got {t.train_filler}")
    if task.max_depth is not None:
        if "task.train_depth" not in bad and t.train_depth > task.max_depth:
            errs.append(f"task.train_depth: must be in [1, {task.max_depth}], the max_depth of task {t.name!r}, got "
                        f"{t.train_depth}")
        if "eval.depths" not in bad and all(isinstance(d, int) for d in ev.depths):
            deep = [d for d in ev.depths if d > task.max_depth]
            if deep:
                errs.append(f"eval.depths: {deep} exceed the max_depth={task.max_depth} of task {t.name!r}; test "
                            f"depths must be in [task.train_depth, {task.max_depth}]")
    return errs


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


def pretrained_errors(value: str) -> list[str]:
    """Problems of ``backbone.pretrained`` under the rule of :func:`pretrained_kind` (checked before anything runs):
    a hub id must be ``name`` or ``org/name``; a local directory must exist and hold ``config.json``."""
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
