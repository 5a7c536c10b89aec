"""Prefix self-distillation (PSD; paper §3, "Prefix Self-Distillation"): progress alignment from final answers only.

Only the final answer z_d of a prompt with d operations is labelled. Iteration k of the student, reading the full
prompt, is trained by

    k >= ⌈d/c⌉:  CE( y_k , z_d )                                                    (the labelled answer)
    k <  ⌈d/c⌉:  T² · KL( softmax(t_k / T) ‖ softmax(y_k / T) )                      (distillation)

where t_k are the logits of a *teacher* reading the same prompt truncated after its first c·k operations — a
shorter problem whose answer is z_{c·k} — at the teacher's final iteration R_teacher = ⌈c·k / c⌉ = k. The KL runs
from the teacher's distribution to the student's (forward KL, KL(teacher ‖ student) = Σ_v p_t (log p_t − log p_s)),
summed over the vocabulary and averaged over batch and queries, softened by the temperature T
(``RecipeConfig.distill_temperature``, default 1) and scaled by T² so gradient sizes do not depend on T (Hinton et
al. 2015). The teacher gets no gradient: it runs under ``torch.no_grad`` and its logits are constants. The per-
iteration losses are averaged over the supervised iterations, as ``objectives.par_loss`` averages its
cross-entropies.

Teacher (``RecipeConfig.distill``): ``ema`` — an exponential moving average of the student's parameters, updated
after every optimizer step by :func:`ema_update_` (ema ← decay · ema + (1 − decay) · student), kept in float32
outside the DDP / FSDP2 / DeepSpeed wrapper and saved in every checkpoint, so a resumed trial continues the same EMA
(the strategies hold it: ``par_ray.train.strategies``). Under FSDP2 it is sharded over the student's units; under
DeepSpeed it is a full float32 copy on every rank, also at ZeRO-3 (not partitioned: 4 bytes × Ψ per GPU, counted by
``par_ray.planner``); under DDP a replicated full copy. ``live`` — the student itself under ``torch.no_grad``.

The truncated prompt of the serial layout ``[BOS, op_1 … op_d, SEP, …queries]`` (``Task.op_width`` = w tokens per
operation) is ``[BOS, op_1 … op_n, SEP, …queries]`` with n = c·k: the operation blocks past n are cut out and every
position after the operation region moves left by (d − n)·w (so separator fillers, ``TaskConfig.train_filler``, and an
appended halting query come along). With ``op_order="recent_first"`` the prompt lists op_d … op_1 and the first n
applied operations are the *last* n blocks of the region: ``[BOS, op_n … op_1, SEP, …]``. Tasks without a serial
layout (reachability) are refused (``TrialConfig.validate`` names ``recipe.distill``).

Tensor suffixes: K iterations read out, B batch, T sequence length, Q queries, V vocabulary, D depth.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from par_ray.objectives import LossOutput

Teacher = Callable[[torch.Tensor, torch.Tensor, int, float], torch.Tensor]
"""``teacher(input_ids_BT, read_positions_Q, R, stretch) -> logits_BQV`` of iteration R, computed without gradient
(``Engine.teacher``)."""


def truncated_prompt(input_ids_BT: torch.Tensor, read_positions_Q: torch.Tensor, depth: int, n_ops: int,
                     op_width: int | None, op_order: str = "forward") -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt cut after its first ``n_ops`` applied operations, and where its answers are read.

    Args:
        input_ids_BT: (B, T) serial prompts of ``depth`` operations, ``op_width`` tokens each.
        read_positions_Q: (Q,) answer positions in ``input_ids_BT`` (after the operation region).
        n_ops: n in 1..depth, operations kept (c·k for iteration k).
        op_order: ``forward`` (op_1 first) or ``recent_first`` (op_d first), ``TaskConfig.op_order``.
    Returns: (B, T − (depth − n)·w) token ids and (Q,) read positions shifted by −(depth − n)·w.
    Raises: ValueError for a task without a serial layout (``op_width`` None), n outside [1, depth], an unknown
        ``op_order``, or read positions inside the operation region.
    """
    if op_width is None:
        raise ValueError("recipe.distill: the task has no serial [BOS, ops, SEP, queries] layout (op_width is None), "
                         "so a prompt truncated after c·k operations is undefined")
    if not 1 <= n_ops <= depth:
        raise ValueError(f"n_ops: must be in [1, depth={depth}], got {n_ops}")
    if op_order not in ("forward", "recent_first"):
        raise ValueError(f"task.op_order: {op_order!r} is not one of ['forward', 'recent_first']")
    w, cut = op_width, (depth - n_ops) * op_width
    end = 1 + depth * w  # first position after the operation region
    if (read_positions_Q < end).any():
        raise ValueError(f"read_positions: {read_positions_Q.tolist()} fall inside the operation region [1, {end})")
    if op_order == "forward":  # keep [BOS, op_1 … op_n], drop op_{n+1} … op_d
        ids = torch.cat([input_ids_BT[:, : 1 + n_ops * w], input_ids_BT[:, end:]], dim=1)
    else:  # [BOS, op_d … op_1]: drop the first d − n blocks (op_d … op_{n+1})
        ids = torch.cat([input_ids_BT[:, :1], input_ids_BT[:, 1 + cut:]], dim=1)
    return ids, read_positions_Q - cut


def distilled_iterations(iterations: Iterable[int], depth: int, ops_per_iteration: int) -> list[int]:
    """The read-out iterations k that get the teacher's KL: those with c·k < d (the others are labelled with z_d)."""
    return [k for k in iterations if ops_per_iteration * k < depth]


def teacher_logits(teacher: Teacher, input_ids_BT: torch.Tensor, read_positions_Q: torch.Tensor,
                   iterations: Iterable[int], depth: int, ops_per_iteration: int, op_width: int | None,
                   op_order: str = "forward", stretch: float = 1.0) -> dict[int, torch.Tensor]:
    """The teacher's answer logits for every distilled iteration k (c·k < d): ``{k: (B, Q, V)}``.

    For each k the teacher reads ``truncated_prompt(…, n_ops=c·k)`` and runs R_teacher = ⌈c·k / c⌉ = k iterations;
    its last readout is the target. ``stretch``: the student's positional stretch factor of this step, applied to the
    teacher too (it reads "the same prompt"). Every rank calls the teacher the same number of times in the same order
    (a sharded teacher's forward is collective). Returned tensors carry no autograd history.
    """
    out = {}
    for k in distilled_iterations(iterations, depth, ops_per_iteration):
        ids_BT, reads_Q = truncated_prompt(input_ids_BT, read_positions_Q, depth, ops_per_iteration * k, op_width,
                                           op_order)
        out[k] = teacher(ids_BT, reads_Q, k, stretch).detach()
    return out


def psd_loss(logits_KBQV: torch.Tensor, iterations: list[int], teacher_BQV: dict[int, torch.Tensor],
             states_BDQ: torch.Tensor, ops_per_iteration: int, temperature: float = 1.0) -> LossOutput:
    """Prefix self-distillation loss of one step (module docstring).

    Args:
        logits_KBQV: the student's answer readouts of iterations ``iterations`` (1-based), (K, B, Q, V).
        teacher_BQV: ``{k: (B, Q, V)}`` teacher logits for every k with c·k < d (:func:`teacher_logits`).
        states_BDQ: (B, D, Q) answer ids after every prefix; the loss reads only the final answers
            ``states_BDQ[:, -1]``; earlier prefixes serve the ``correct_KBQ`` diagnostic only.
        ops_per_iteration: c. temperature: T > 0.
    Returns: :class:`~par_ray.objectives.LossOutput`: ``loss`` the mean over the K iterations of each one's loss
        (CE or T²·KL, each a mean over B and Q), ``per_iteration_K`` those K values, ``correct_KBQ`` whether argmax
        equals the progress-aligned answer z_min(c·k, d) (a diagnostic; not a training signal).
    Raises: ValueError for T <= 0 or a distilled iteration without teacher logits.
    """
    if not temperature > 0:
        raise ValueError(f"recipe.distill_temperature: must be > 0, got {temperature}")
    depth = states_BDQ.shape[1]
    missing = [k for k in distilled_iterations(iterations, depth, ops_per_iteration) if k not in teacher_BQV]
    if missing:
        raise ValueError(f"teacher_BQV: no teacher logits for distilled iterations {missing}")
    final_BQ = states_BDQ[:, -1]
    per_k = []
    for i, k in enumerate(iterations):
        y_BQV = logits_KBQV[i].float()
        if ops_per_iteration * k >= depth:
            per_k.append(F.cross_entropy(y_BQV.flatten(0, 1), final_BQ.flatten()))
        else:
            log_p_t = F.log_softmax(teacher_BQV[k].float() / temperature, dim=-1)
            log_p_s = F.log_softmax(y_BQV / temperature, dim=-1)
            kl_BQ = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)
            per_k.append(kl_BQ.mean() * temperature ** 2)
    per_k_K = torch.stack(per_k)
    idx = [min(ops_per_iteration * k, depth) - 1 for k in iterations]
    return LossOutput(loss=per_k_K.mean(), per_iteration_K=per_k_K.detach(),
                      correct_KBQ=logits_KBQV.detach().argmax(-1) == states_BDQ[:, idx].permute(1, 0, 2))


@torch.no_grad()
def ema_update_(ema_params: Iterable[torch.Tensor], student_params: Iterable[torch.Tensor], decay: float) -> None:
    """In place, for every pair: ema ← decay · ema + (1 − decay) · student (student cast to the EMA's float32).

    Tensors are local ones (a sharded strategy passes matching shards). Raises ValueError for decay outside [0, 1) or
    lists of different lengths or shapes.
    """
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"recipe.ema_decay: must be in [0, 1), got {decay}")
    ema, student = list(ema_params), list(student_params)
    if len(ema) != len(student) or any(e.shape != s.shape for e, s in zip(ema, student)):
        raise ValueError(f"ema_update_: {len(ema)} EMA tensors do not match {len(student)} student tensors")
    for e, s in zip(ema, student):
        e.mul_(decay).add_(s.detach().to(e.dtype), alpha=1.0 - decay)


__all__ = ["Teacher", "distilled_iterations", "ema_update_", "psd_loss", "teacher_logits",
           "truncated_prompt"]
