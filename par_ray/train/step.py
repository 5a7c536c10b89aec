"""The PAR training step, shared by every way of running a trial (single process, Ray Train, any strategy).

One step: sample the step's episode batch (d, R, s from :func:`par_ray.schedules.plan_step`), run the looped model
with the gradient window, apply the step's loss terms to every iteration in the window, backward, and let the
strategy's engine step the optimizer.

The loss is built once per stage (:func:`build_step_loss`, in the spirit of torchtitan's ``build_loss_fn``) from the
stage's recipe and the model's vocabulary layout, as an answer term plus extra terms, added in this fixed order:

1. answers (always): PAR / final-answer cross-entropy (``targets``: progress, final or done), or, with ``distill``
   ``ema`` / ``live``, prefix self-distillation (``par_ray.distill``: CE on z_d where c·k >= d, KL to the teacher
   reading the prompt truncated after c·k operations); weight 1.
2. halting (``halting``): the prompts get the halting query appended (``par_ray.halting``) and its read-out is
   trained with class-balanced cross-entropy; weight ``halt_weight``.
3. dense progress (``dense_targets``): the read-out at every operation position on its state class
   (``par_ray.objectives``; ``dense_pending``: one "pending" class past the frontier); weight 1.
4. fixed point (``dense_targets`` and ``fixed_point_weight`` > 0): the state change at operation positions that
   hold; weight ``fixed_point_weight``.

The read rows of one forward are laid out as ``answers (Q) | halting query (1, with halting) | operation positions
(D, with dense targets)``. With ``task.given_prefix`` (``Episode.given`` > 0) the first operations are read in as
their state tokens (dense state classes after the vocabulary) and every term counts them as solved. The
chain-of-thought baseline needs no term of its own: its task (``par_ray.cot.CotTask``) and recipe make the answer
term the language-model loss on the trace. A stage's frozen parameters have their gradients dropped before the
optimizer step (``par_ray.stages``); the engine's EMA teacher (if any) is updated after it.

Tensor suffixes: K iterations read out, B batch, T tokens, Q read rows, D operations, V vocabulary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from par_ray.distill import psd_loss, teacher_logits
from par_ray.halting import HaltTokens, with_halt_query, yes_no_logits
from par_ray.objectives import dense_progress_loss, fixed_point_loss, halting_loss, par_loss
from par_ray.schedules import StepPlan, noise_seed, plan_step, supervised_iterations
from par_ray.tasks.common import Episode


@dataclass
class StepResult:
    plan: StepPlan
    loss: float
    per_iteration: list[float]
    """Loss of each supervised iteration (oldest first)."""
    iterations: list[int]
    accuracy: float
    """Full-state accuracy of the last iteration on this step's (local) batch."""
    state_rms: list[float]
    """Mean state RMS after each iteration 1..R."""
    grad_norm: float
    seconds: float
    tokens: int
    """Tokens processed by this rank (B_local × T × R)."""
    halt_loss: float | None = None
    """Class-balanced halting cross-entropy (unweighted), when the step's recipe trains halting."""
    halt_accuracy: float | None = None
    """Fraction of (iteration, row) halting decisions (P(Yes) > 0.5) equal to the target, when halting."""


@dataclass(frozen=True)
class StepBatch:
    """This rank's share of one step's episode batch, laid out for the forward (module docstring)."""

    plan: StepPlan
    ep: Episode
    """The global batch (with the halting query appended when the step trains halting)."""
    ids_BT: torch.Tensor
    """This rank's prompts (given operations read in as state tokens), on the device."""
    states_BDQ: torch.Tensor
    """This rank's task states after each operation, on the device."""
    reads_Q: torch.Tensor
    """Read positions of the forward: answers | halting query | operation positions."""
    n_answers: int
    """Read rows trained on the task's answers (the first ``n_answers``)."""
    n_read: int
    """Read rows of the episode (answers, + the halting query): operation positions follow."""
    rank: int
    world_size: int


@dataclass
class TermOutput:
    """What one extra loss term adds to the step: ``loss`` (weighted, added to the total) and step metrics."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    """Scalars (tensors) the step reports, e.g. the halting term's unweighted loss and accuracy."""


@dataclass(frozen=True)
class AnswerTerm:
    """The loss on the answers' read rows: PAR / final-answer cross-entropy, or prefix self-distillation."""

    recipe: object
    """The stage's ``RecipeConfig`` (``targets``, ``ops_per_iteration``, ``distill``, ``distill_temperature``,
    ``grad_window``)."""
    task: object
    """The training task; the distillation teacher truncates its prompts after c·k operations (``op_width``)."""
    op_order: str
    """``TaskConfig.op_order`` of the prompts, read by the distillation teacher's truncated prompt."""

    def teacher_targets(self, engine, batch: StepBatch) -> dict[int, torch.Tensor] | None:
        """The distillation teacher's logits (no gradient), computed before the student's forward; ``None``
        without distillation."""
        r = self.recipe
        if r.distill == "none":
            return None
        window = supervised_iterations(r, batch.plan.R, batch.plan.depth)
        return teacher_logits(engine.teacher(r.distill), batch.ids_BT, batch.reads_Q[:batch.n_answers], window,
                              batch.plan.depth, r.ops_per_iteration, self.task.op_width, self.op_order,
                              batch.plan.stretch)

    def __call__(self, logits_KBQV: torch.Tensor, iterations: list[int], batch: StepBatch,
                 targets: dict[int, torch.Tensor] | None):
        """``LossOutput`` of the answers (``logits_KBQV``: the answers' read rows only)."""
        r = self.recipe
        if targets is not None:
            return psd_loss(logits_KBQV, iterations, targets, batch.states_BDQ, r.ops_per_iteration,
                            r.distill_temperature)
        return par_loss(logits_KBQV, iterations, batch.states_BDQ, r.ops_per_iteration, r.targets, batch.ep.given)


def halting_term(halt: HaltTokens, weight: float, ops_per_iteration: int) -> Callable[..., TermOutput]:
    """``weight`` × class-balanced halting cross-entropy on the halting query's read row (paper §3, Learned
    Halting); reports ``halt_loss`` (unweighted) and ``halt_accuracy``."""
    def term(out, batch: StepBatch) -> TermOutput:
        ho = halting_loss(yes_no_logits(out.logits_KBQV[:, :, batch.n_read - 1], halt), out.iterations,
                          batch.plan.depth, ops_per_iteration)
        return TermOutput(weight * ho.loss, {"halt_loss": ho.loss, "halt_accuracy": ho.correct_KB.float().mean()})

    return term


def dense_term(ops_per_iteration: int, offset: int, pending_id: int | None) -> Callable[..., TermOutput]:
    """Dense progress cross-entropy at the operation positions' read rows (``par_ray.objectives``): state classes
    from token ``offset``; ``pending_id``: the class of positions past the frontier, or ``None``."""
    def term(out, batch: StepBatch) -> TermOutput:
        progress_BD = batch.ep.progress_ids[batch.rank::batch.world_size].to(batch.ids_BT.device)
        dense = dense_progress_loss(out.logits_KBQV[:, :, batch.n_read:], out.iterations, progress_BD,
                                    ops_per_iteration, offset, pending_id, batch.ep.given)
        return TermOutput(dense.loss)

    return term


def fixed_point_term(weight: float, ops_per_iteration: int) -> Callable[..., TermOutput]:
    """``weight`` × the fixed-point loss on the state change at the operation positions (``par_ray.objectives``)."""
    def term(out, batch: StepBatch) -> TermOutput:
        change_KBD = out.state_change_KBT[:, :, batch.ep.op_positions.to(batch.ids_BT.device)]
        return TermOutput(weight * fixed_point_loss(change_KBD, out.iterations, ops_per_iteration, batch.ep.given))

    return term


@dataclass(frozen=True)
class StepLoss:
    """A stage's training loss, built once (:func:`build_step_loss`): how a step's batch is laid out and the terms
    that make its loss."""

    recipe: object
    """The stage's ``RecipeConfig``: the step plan and the forward (``grad_window``, ``supervise``) read it."""
    answers: AnswerTerm
    extras: tuple[Callable[..., TermOutput], ...]
    """Extra terms in the order they are added: halting, dense progress, fixed point."""
    halt_query: int | None
    """Token appended to every prompt as the halting query, or ``None``."""
    state_offset: int
    """Token id of dense state class 0 (given operations are read in as these tokens)."""
    read_ops: bool
    """Read out every operation position too (dense targets)."""
    state_change: bool
    """The forward records each iteration's state change (the fixed-point term reads it)."""

    def batch(self, ep: Episode, plan: StepPlan, rank: int, world_size: int, device: torch.device) -> StepBatch:
        """This rank's rows ``rank::world_size`` of the global batch ``ep``, laid out for the forward."""
        if self.halt_query is not None:
            ep = with_halt_query(ep, self.halt_query)
        ids_BT = ep.input_ids[rank::world_size].to(device)
        if ep.given:  # task.given_prefix: operations 1..m are read in as the state tokens of z_1..z_m
            ids_BT = ids_BT.clone()
            ids_BT[:, ep.op_positions[:ep.given]] = (self.state_offset
                                                     + ep.progress_ids[rank::world_size, :ep.given].to(device))
        reads_Q = ep.read_positions.to(device)
        n_read = reads_Q.shape[0]
        if self.read_ops:  # one readout over the queries (and halting query) and the operation positions
            reads_Q = torch.cat([reads_Q, ep.op_positions.to(device)])
        return StepBatch(plan=plan, ep=ep, ids_BT=ids_BT, states_BDQ=ep.states[rank::world_size].to(device),
                         reads_Q=reads_Q, n_answers=n_read - int(self.halt_query is not None), n_read=n_read,
                         rank=rank, world_size=world_size)


def build_step_loss(recipe_cfg, task, *, halt: HaltTokens | None = None, dense_offset: int | None = None,
                    op_order: str = "forward") -> StepLoss:
    """The training loss of a stage trained with ``recipe_cfg`` on ``task`` (module docstring's table).

    Args:
        halt: the halting token ids; required when ``recipe_cfg.halting``.
        dense_offset: token id of dense state class 0 (``recipe.dense_targets``, ``task.given_prefix``): the model
            vocabulary without the dense classes; ``None`` = ``task.vocab_size`` (no halting tokens).
        op_order: ``TaskConfig.op_order`` of ``task``'s prompts, read by the distillation teacher's truncated prompt
            (``recipe_cfg.distill``; the teacher is ``engine.teacher(recipe_cfg.distill)``).
    Raises:
        ValueError: ``recipe_cfg.halting`` without ``halt`` tokens.
    """
    if recipe_cfg.halting and halt is None:
        raise ValueError("recipe.halting: the training loss needs the halting token ids (halt=HaltTokens)")
    c = recipe_cfg.ops_per_iteration
    offset = task.vocab_size if dense_offset is None else dense_offset  # dense state class 0
    fixed_point = bool(recipe_cfg.dense_targets and recipe_cfg.fixed_point_weight > 0)
    extras = []
    if recipe_cfg.halting:
        extras.append(halting_term(halt, recipe_cfg.halt_weight, c))
    if recipe_cfg.dense_targets:
        extras.append(dense_term(c, offset, offset + task.num_states if recipe_cfg.dense_pending else None))
    if fixed_point:
        extras.append(fixed_point_term(recipe_cfg.fixed_point_weight, c))
    return StepLoss(recipe=recipe_cfg, answers=AnswerTerm(recipe_cfg, task, op_order), extras=tuple(extras),
                    halt_query=halt.query if recipe_cfg.halting else None, state_offset=offset,
                    read_ops=bool(recipe_cfg.dense_targets), state_change=fixed_point)


def train_step(engine, task, task_cfg, loss_fn: StepLoss, seed: int, step: int, global_batch: int, rank: int = 0,
               world_size: int = 1, *, stretch_max: float | None = None,
               frozen: list[torch.nn.Parameter] | tuple = ()) -> StepResult:
    """Run training step ``step`` on this rank's shard of the global batch.

    The global batch of step ``step`` is a pure function of (task, d, seed, step); rank r takes rows r::world_size,
    so any world size sees the same global batch as a single process. ``engine`` is a
    :class:`par_ray.train.strategies.Engine`.

    Args:
        loss_fn: the stage's loss (:func:`build_step_loss`).
        stretch_max: this step's stretch cap (a ramped stretch stage), passed to :func:`plan_step`.
        frozen: parameters whose gradients are dropped before the optimizer step (a stage's frozen parts).
    """
    t0 = time.perf_counter()
    recipe = loss_fn.recipe
    plan = plan_step(task_cfg, recipe, seed, step, stretch_max=stretch_max)
    batch = loss_fn.batch(task.sample(plan.depth, global_batch, seed=seed, step=step), plan, rank, world_size,
                          engine.device)
    targets = loss_fn.answers.teacher_targets(engine, batch)  # before the student's forward, without gradient
    with engine.autocast():
        # every (read_every-th) iteration of the gradient window (PAR) or only the last (the final-answer baselines)
        out = engine.model(batch.ids_BT, batch.reads_Q, plan.R, recipe.grad_window, plan.stretch,
                           supervised_iterations(recipe, plan.R, plan.depth),
                           loss_fn.state_change, position_offset=plan.position_offset,
                           state_noise=recipe.state_noise,
                           noise_seed=noise_seed(seed, step) if recipe.state_noise else None)
        lo = loss_fn.answers(out.logits_KBQV[:, :, :batch.n_answers], out.iterations, batch, targets)
        loss, metrics = lo.loss, {}
        for term in loss_fn.extras:
            t = term(out, batch)
            loss = loss + t.loss
            metrics.update(t.metrics)
    engine.backward(loss)
    for p in frozen:  # AdamW skips parameters without a gradient: no update, no momentum, no weight decay
        p.grad = None
    grad_norm = engine.step()
    engine.update_ema(recipe.ema_decay)  # a no-op unless the engine keeps an EMA teacher
    return StepResult(
        plan=plan,
        loss=loss.item(),
        per_iteration=lo.per_iteration_K.tolist(),
        iterations=out.iterations,
        accuracy=lo.correct_KBQ[-1].all(-1).float().mean().item(),
        state_rms=out.state_rms_R.tolist(),
        grad_norm=float(grad_norm),
        seconds=time.perf_counter() - t0,
        tokens=batch.ids_BT.numel() * plan.R,
        halt_loss=metrics["halt_loss"].item() if "halt_loss" in metrics else None,
        halt_accuracy=metrics["halt_accuracy"].item() if "halt_accuracy" in metrics else None,
    )
