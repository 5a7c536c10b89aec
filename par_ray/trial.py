"""What a trial config means against the registries: one home for validating it and for what it resolves to.

``par_ray.config`` holds the frozen dataclasses and checks their fields on their own; it imports nothing from par_ray.
This module sits one layer up, beside the registries it reads (backbones ``par_ray.model.registry``, tasks
``par_ray.tasks``, recipes ``par_ray.recipes``, GPU types ``par_ray.accelerators``):

- :func:`validate` — the config's own field checks (``config.config_errors``) and every check that needs a registry
  or the file system (:func:`registry_errors`), raised as ONE ``ValueError`` listing every problem, before any
  cluster resource is claimed (litgpt ``validate_args``).
- :func:`resolve` — what a valid config means, once per trial: its stages (each stage's recipe applied once), whether
  halting or an EMA teacher is on, and the one :class:`VocabLayout` (task | halting | CoT | dense classes) that the
  training loop builds its model with, checkpoint loading rebuilds it with and the memory planner plans it with
  (:meth:`Resolved.reads`: the longest training sequence and its read positions).
"""

from __future__ import annotations

import os
import re
import typing
from dataclasses import dataclass

from par_ray.accelerators import GPU_MEMORY_GB
from par_ray.config import (DISTILL_MODES, HALTING_AND_STAGE_FIELDS, StageConfig, TrialConfig, config_errors,
                            format_halt_rules, halt_rules_errors, type_errors)
from par_ray.cot import NUM_COT_TOKENS, CotTask, cot_tokens
from par_ray.halting import NUM_HALT_TOKENS
from par_ray.model.registry import BACKBONES
from par_ray.recipes import RECIPES
from par_ray.stages import Stage, resolve_stages
from par_ray.tasks import TASKS, build_task, get_task

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
    if r.position_offset and "recipe.position_offset" not in bad and b.name in BACKBONES:
        most = BACKBONES[b.name].fields.get("max_position_embeddings")
        check("recipe.position_offset", lambda: most is None or r.position_offset < most,
              lambda: (f"{r.position_offset} would shift every training prompt past {b.name}'s "
                       f"max_position_embeddings={most} (positions its rotary embedding was built for); must be "
                       f"below it"))

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
        stage_errs = _stage_recipe_errors(cfg)
        errs += stage_errs
        ev = cfg.eval
        valid_rules = not halt_rules_errors(ev.halt_rules, (ev.halt_k, ev.halt_n, ev.halt_tau))  # else named already
        if ev.halt_rules and valid_rules and not stage_errs:
            halting = cfg.recipe.halting or any(s.recipe.halting for s in resolve_stages(cfg))
            check("eval.halt_rules", lambda: halting,
                  lambda: (f"{format_halt_rules(cfg.eval.halt_rules)}: extra stopping rules are read from the "
                           f"halting read-out, which this trial does not train (recipe {cfg.recipe.name!r}, no stage "
                           f"with recipe.halting); drop them, or train halting (e.g. recipe par_halt or "
                           f"par_halt_posthoc)"))
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


# --------------------------------------------------------------------------------------------------------------------
# What a valid config resolves to


@dataclass(frozen=True)
class VocabLayout:
    """The model vocabulary of a trial, in id order: task | halting | CoT | dense classes.

    A random-init parent is built with :attr:`size` = the sum of the four parts: the task's tokens (ids 0..task-1),
    then the halting query, Yes and No when some stage trains halting (``par_ray.halting``), then the CoT trace's
    STEP and END (``par_ray.cot``), then one dense class per whole-task state and the "pending" class
    (``recipe.dense_targets``, ``recipe.dense_pending``; ``par_ray.objectives.dense_progress_loss``). A pretrained
    parent keeps its own vocabulary (:attr:`parent`, the registry's size): it adds no ids (halting reads the
    tokenizer's words, ``par_ray.halting.tokenizer_halt_tokens``).
    """

    task: int
    """The task's tokens (``Task.vocab_size``)."""
    halting: int
    """Halting ids after them: :data:`par_ray.halting.NUM_HALT_TOKENS` when a stage trains halting on a random-init
    parent, else 0."""
    cot: int
    """CoT trace ids after those: :data:`par_ray.cot.NUM_COT_TOKENS` with ``recipe.cot`` on a random-init parent."""
    dense: int
    """Dense classes last: ``Task.num_states`` (+ 1 with ``recipe.dense_pending``) with ``recipe.dense_targets``."""
    pending: bool
    """The last dense class is "pending" (``recipe.dense_targets`` and ``recipe.dense_pending``)."""
    parent: int | None = None
    """A pretrained parent's fixed vocabulary (``BACKBONES[name].vocab_size``); ``None`` for random init."""

    @property
    def halt_offset(self) -> int:
        """Id of the halting query (Yes, No follow) on a random-init parent."""
        return self.task

    @property
    def cot_offset(self) -> int:
        """Id of the trace's STEP (END follows)."""
        return self.task + self.halting

    @property
    def dense_offset(self) -> int:
        """Id of dense state class 0: the vocabulary before the dense classes."""
        return self.task + self.halting + self.cot

    @property
    def pending_id(self) -> int | None:
        """Id of the dense "pending" class, ``None`` when there is none."""
        return self.dense_offset + self.dense - 1 if self.pending else None

    @property
    def size(self) -> int:
        """Rows of the model's embedding and lm_head: the sum of the parts, or a pretrained parent's own."""
        return self.parent if self.parent is not None else self.dense_offset + self.dense


@dataclass(frozen=True)
class Reads:
    """The longest training sequence of a trial and the positions the readout reads in it, at d_train."""

    seq_len: int
    """Tokens T: the prompt at d_train (+ ``task.given_prefix`` given operations, + ``task.train_filler``
    separators), the CoT trace, the halting query."""
    answers: int
    """Answer read positions Q of one prompt (the CoT trace's tokens for ``recipe.cot``)."""
    halt: int
    """1 when a stage trains halting (the appended halting query is read after the answers), else 0."""
    dense: int
    """Operation positions read for the dense targets (d_train + ``task.given_prefix``) when a stage trains them."""

    @property
    def total(self) -> int:
        """Read positions of one forward pass: answers, halting query, operation positions (``train_step``)."""
        return self.answers + self.halt + self.dense


@dataclass(frozen=True)
class Resolved:
    """What a validated :class:`~par_ray.config.TrialConfig` means, computed once per trial by :func:`resolve`."""

    config: TrialConfig
    stages: tuple[Stage, ...]
    """The stages with global step bounds and the recipe each trains with (``par_ray.stages.resolve_stages``)."""
    halting: bool
    """Some stage trains the halting read-out: the vocabulary has the halting ids from the start."""
    ema: bool
    """Some stage distills from an EMA teacher: the engine keeps one from the first step (``par_ray.distill``)."""
    dense_reads: bool
    """Some stage trains the dense progress targets (its steps read every operation position)."""
    vocab: VocabLayout

    def reads(self) -> Reads:
        """The longest training sequence and its read positions at d_train (what the planner plans): one episode of
        the task at depth d_train + ``task.given_prefix`` (the CoT baseline's prompt + trace), + ``task.train_filler``
        separators and the halting query."""
        cfg = self.config
        task = build_task(cfg.task)  # op_order applied; the filler and the given prefix are counted below
        data = CotTask(task, cot_tokens(self.vocab.cot_offset)) if cfg.recipe.cot else task
        ops = cfg.task.train_depth + cfg.task.given_prefix
        ep = data.sample(ops, 1, seed=0)
        halt = int(self.halting)
        dense = int(ep.op_positions.numel()) if self.dense_reads and ep.op_positions is not None else 0
        return Reads(seq_len=int(ep.input_ids.shape[1]) + cfg.task.train_filler + halt,
                     answers=int(ep.read_positions.numel()), halt=halt, dense=dense)


def resolve(cfg: TrialConfig) -> Resolved:
    """The stages, flags and vocabulary layout of a validated config (:func:`validate`), each stage's recipe applied
    once. The training loop, checkpoint loading and the memory planner all read them from here.

    Raises ``ValueError`` for an unknown task or stage recipe (the registries' errors; :func:`validate` names them
    first).
    """
    stages = tuple(resolve_stages(cfg))
    recipes = [cfg.recipe, *(s.recipe for s in stages)]
    halting = any(r.halting for r in recipes)
    task = get_task(cfg.task.name)
    r, random_init = cfg.recipe, cfg.backbone.pretrained is None
    vocab = VocabLayout(
        task=task.vocab_size,
        halting=NUM_HALT_TOKENS if halting and random_init else 0,
        cot=NUM_COT_TOKENS if r.cot and random_init else 0,
        dense=task.num_states + int(r.dense_pending) if r.dense_targets else 0,
        pending=bool(r.dense_targets and r.dense_pending),
        parent=None if random_init else BACKBONES[cfg.backbone.name].vocab_size,
    )
    return Resolved(config=cfg, stages=stages, halting=halting, ema=any(r.distill == "ema" for r in recipes),
                    dense_reads=any(r.dense_targets for r in recipes), vocab=vocab)
