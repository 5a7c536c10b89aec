"""PAR training objectives (paper §3.2).

Iteration k is supervised on the task state after the first min(c·k, d) operations — progress-aligned targets
(Eq. 3):

    L_PAR = mean over supervised k of  CE( y_k , z_{min(c·k, d)} )

The final-answer baseline supervises every iteration with z_d (the answer after all d operations). Under the hold
schedule, iterations past d / c keep z_d by the same min(·). Cross-entropy is averaged over batch and queries.

Dense progress targets (a par_ray option for from-scratch models, not the paper's; docs/experiments.md,
experiment 8): the readout at operation position j after iteration k is also trained on the whole state z_j, one
class per state appended after the task's vocabulary, for every j <= c·k (positions past the frontier get nothing,
or, with ``recipe.dense_pending``, one more "pending" class after the state classes):

    L_dense = mean over supervised k and j <= min(c·k, d) of  CE( y_k[op_j] , state_class(z_j) )

A frontier that advances c operations per iteration then only needs each operation's left neighbour, a rule that
does not depend on the prompt length or the iteration count.

Tensor suffixes: K iterations read out, B batch, Q queries, V vocabulary, D depth (number of operations).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def target_indices(iterations: list[int], depth: int, ops_per_iteration: int, targets: str,
                   given: int = 0) -> list[int]:
    """0-based index into ``states`` (B, D, Q) that iteration k is trained on.

    ``progress``: min(m + c·k, d) - 1 (Eq. 3; m = ``given``, the operations given solved, 0 but for
    ``task.given_prefix``). ``final`` and ``done``: d - 1 for every k (``done`` then supervises only the iterations
    with m + c·k >= d, see :func:`supervised`). Raises ``ValueError`` for other ``targets``.
    """
    if targets == "progress":
        return [min(given + ops_per_iteration * k, depth) - 1 for k in iterations]
    if targets in ("final", "done"):
        return [depth - 1 for _ in iterations]
    raise ValueError(f"recipe.targets: {targets!r} is not one of ['progress', 'final', 'done']")


def supervised(iterations: list[int], depth: int, ops_per_iteration: int, targets: str,
               given: int = 0) -> list[bool]:
    """Which read-out iterations the query loss covers: all of them, except under ``done`` (a par_ray option for
    dense targets, docs/experiments.md experiment 8), where only iterations that completed the task
    (m + c·k >= d, m = ``given``) are."""
    return [targets != "done" or given + ops_per_iteration * k >= depth for k in iterations]


@dataclass
class LossOutput:
    loss: torch.Tensor
    """Scalar: mean cross-entropy over supervised iterations, batch and queries."""
    per_iteration_K: torch.Tensor
    """(K,) detached cross-entropy of each supervised iteration."""
    correct_KBQ: torch.Tensor
    """(K, B, Q) bool: argmax readout equals the target."""


def par_loss(logits_KBQV: torch.Tensor, iterations: list[int], states_BDQ: torch.Tensor, ops_per_iteration: int,
             targets: str, given: int = 0) -> LossOutput:
    """Cross-entropy of each read-out iteration against its (progress-aligned or final) target.

    Args:
        logits_KBQV: readouts of iterations ``iterations`` (1-based), (K, B, Q, V).
        states_BDQ: target token ids after every prefix, (B, D, Q); D is the batch's depth d.
        ops_per_iteration: c.
        targets: ``progress``, ``final`` or ``done`` (z_d at the iterations with c·k >= d only).
        given: m, operations given solved in the prompt (``Episode.given``); 0 = none.
    """
    idx = target_indices(iterations, states_BDQ.shape[1], ops_per_iteration, targets, given)
    target_KBQ = states_BDQ[:, idx].permute(1, 0, 2)
    ce_KBQ = F.cross_entropy(logits_KBQV.float().flatten(0, 2), target_KBQ.flatten(), reduction="none")
    ce_KBQ = ce_KBQ.view(target_KBQ.shape)
    on_K = torch.tensor(supervised(iterations, states_BDQ.shape[1], ops_per_iteration, targets, given),
                        device=ce_KBQ.device)
    return LossOutput(
        loss=ce_KBQ[on_K].mean() if on_K.any() else ce_KBQ.sum() * 0.0,
        per_iteration_K=ce_KBQ.detach().mean(dim=(1, 2)),
        correct_KBQ=logits_KBQV.detach().argmax(-1) == target_KBQ,
    )


def dense_progress_loss(logits_KBDV: torch.Tensor, iterations: list[int], progress_ids_BD: torch.Tensor,
                        ops_per_iteration: int, class_offset: int, pending_id: int | None = None,
                        given: int = 0) -> LossOutput:
    """Cross-entropy of the readout at every operation position j behind iteration k's frontier (j <= m + c·k) against
    the whole state after operation j (module docstring, L_dense).

    Args:
        logits_KBDV: readouts at the d operation positions of iterations ``iterations`` (1-based), (K, B, D, V).
        progress_ids_BD: state class after each prefix, (B, D) in 0..num_states-1 (``Episode.progress_ids``).
        ops_per_iteration: c.
        class_offset: token id of state class 0 (``par_ray.trial.VocabLayout.dense_offset``).
        pending_id: ``None``: positions past the frontier are not supervised. Otherwise the token id they are trained
            on (the "pending" class, ``recipe.dense_pending``).
        given: m, operations given solved as state tokens (``Episode.given``): they are behind the frontier from
            the start, trained to keep their state.
    Returns: :class:`LossOutput`; ``per_iteration_K`` and ``correct_KBQ`` (here (K, B, D)) cover supervised
        positions only (unsupervised positions count as correct).
    Raises: ValueError if an iteration supervises no position (k < 1).
    """
    K, _, D, _ = logits_KBDV.shape
    frontier_K = torch.tensor([min(given + ops_per_iteration * k, D) for k in iterations], device=logits_KBDV.device)
    if (frontier_K < 1).any():
        raise ValueError(f"iterations: must be >= 1, got {iterations}")
    mask_KD = torch.arange(1, D + 1, device=logits_KBDV.device)[None] <= frontier_K[:, None]
    target_KBD = (progress_ids_BD + class_offset)[None].expand(K, -1, -1)
    if pending_id is not None:
        target_KBD = torch.where(mask_KD[:, None], target_KBD, torch.full_like(target_KBD, pending_id))
        mask_KD = torch.ones_like(mask_KD)
    ce_KBD = F.cross_entropy(logits_KBDV.float().flatten(0, 2), target_KBD.flatten(), reduction="none")
    ce_KBD = ce_KBD.view(target_KBD.shape) * mask_KD[:, None]
    per_k_K = ce_KBD.sum(dim=(1, 2)) / (mask_KD.sum(-1) * target_KBD.shape[1])
    right_KBD = (logits_KBDV.detach().argmax(-1) == target_KBD) | ~mask_KD[:, None]
    return LossOutput(loss=per_k_K.mean(), per_iteration_K=per_k_K.detach(), correct_KBQ=right_KBD)


def fixed_point_loss(change_KBD: torch.Tensor, iterations: list[int], ops_per_iteration: int,
                     given: int = 0) -> torch.Tensor:
    """Mean relative state change of the operation tokens whose dense target stays the same at iteration k
    (``recipe.fixed_point_weight``, a par_ray option): j <= m + c·(k-1) (done before iteration k) or j > m + c·k
    (still pending after it), for k >= 2.

    Args:
        change_KBD: ||s_k - s_{k-1}||² / ||s_1||² at the d operation positions, (K, B, D)
            (``LoopedOutput.state_change_KBT`` at ``Episode.op_positions``).
        iterations: 1-based iteration of each of the K rows; ops_per_iteration: c; given: m (``Episode.given``).
    Returns: scalar loss (0 with a graph when no token qualifies).
    """
    D = change_KBD.shape[2]
    j_D = torch.arange(1, D + 1, device=change_KBD.device)
    k_K = torch.tensor(iterations, device=change_KBD.device)[:, None]
    hold_KD = ((j_D <= given + ops_per_iteration * (k_K - 1)) | (j_D > given + ops_per_iteration * k_K)) & (k_K >= 2)
    if not hold_KD.any():
        return change_KBD.sum() * 0.0
    return change_KBD.permute(0, 2, 1)[hold_KD].mean()


# --------------------------------------------------------------------------------------------------------------------
# Learned halting (paper §3, "Learned Halting"): is the computation complete after iteration k?


def halting_targets(iterations: list[int], depth: int, ops_per_iteration: int) -> list[int]:
    """1 (Yes) for iteration k when c·k >= d, else 0 (No). Forced depth (R = ⌈d/c⌉): only k = R is Yes; under the
    hold schedule every k >= ⌈d/c⌉ is Yes."""
    return [int(ops_per_iteration * k >= depth) for k in iterations]


def halting_class_weights(targets_K: torch.Tensor) -> torch.Tensor:
    """Per-iteration weights (K,) inversely proportional to each class's frequency among ``targets_K`` (0/1).

    w_c = K / (C · n_c) with C the number of classes present, so Σ_k w_k = K and the weighted mean of a loss is the
    mean over present classes of each class's mean loss. Every row of a step has the same depth, so the frequencies
    over the step's (K × B) targets equal those over its K iterations, on one rank or many.
    """
    counts = torch.stack([(targets_K == c).sum() for c in (0, 1)]).to(torch.float32)
    present = (counts > 0).sum()
    per_class = targets_K.numel() / (present * counts.clamp_min(1))
    return per_class[targets_K]


@dataclass
class HaltLossOutput:
    loss: torch.Tensor
    """Scalar: class-balanced cross-entropy of the Yes/No readout over supervised iterations and batch."""
    targets_K: torch.Tensor
    """(K,) 0/1 targets (1 = Yes)."""
    weights_K: torch.Tensor
    """(K,) class weights (:func:`halting_class_weights`)."""
    correct_KB: torch.Tensor
    """(K, B) bool: P(Yes) > 0.5 equals the target."""


def halting_loss(yes_no_logits_KB2: torch.Tensor, iterations: list[int], depth: int,
                 ops_per_iteration: int) -> HaltLossOutput:
    """Class-balanced cross-entropy of the halting readout (§3, "Learned Halting").

        L_halt = Σ_{k,b} w_{y_k} · CE(h_{k,b}, y_k) / (K · B),   y_k = [c·k >= d]

    with w from :func:`halting_class_weights`.

    The joint PAR objective is ``par_loss + halt_weight × L_halt`` (``RecipeConfig.halt_weight``, 0.5 in the paper).

    Args:
        yes_no_logits_KB2: (K, B, 2) logits of (No, Yes) at the halting position of iterations ``iterations``.
        iterations: 1-based iteration index of each of the K rows.
        depth: d of the step; ops_per_iteration: c.
    """
    targets_K = torch.tensor(halting_targets(iterations, depth, ops_per_iteration),
                             device=yes_no_logits_KB2.device)
    weights_K = halting_class_weights(targets_K)
    K, B, _ = yes_no_logits_KB2.shape
    target_KB = targets_K[:, None].expand(K, B)
    ce_KB = F.cross_entropy(yes_no_logits_KB2.float().flatten(0, 1), target_KB.flatten(), reduction="none").view(K, B)
    return HaltLossOutput(
        loss=(ce_KB * weights_K[:, None]).mean(),
        targets_K=targets_K,
        weights_K=weights_K,
        correct_KB=yes_no_logits_KB2.detach().argmax(-1) == target_KB,
    )
