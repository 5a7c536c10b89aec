"""PAR training objectives (paper §3.2).

Iteration k is supervised on the task state after the first min(c·k, d) operations — progress-aligned targets
(Eq. 3):

    L_PAR = mean over supervised k of  CE( y_k , z_{min(c·k, d)} )

The final-answer baseline supervises every iteration with z_d (the answer after all d operations). Under the hold
schedule, iterations past d / c keep z_d by the same min(·). Cross-entropy is averaged over batch and queries.

Tensor suffixes: K iterations read out, B batch, Q queries, V vocabulary, D depth (number of operations).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def target_indices(iterations: list[int], depth: int, ops_per_iteration: int, targets: str) -> list[int]:
    """0-based index into ``states`` (B, D, Q) that iteration k is trained on.

    ``progress``: min(c·k, d) - 1 (Eq. 3). ``final``: d - 1 for every k. Raises ``ValueError`` for other ``targets``.
    """
    if targets == "progress":
        return [min(ops_per_iteration * k, depth) - 1 for k in iterations]
    if targets == "final":
        return [depth - 1 for _ in iterations]
    raise ValueError(f"recipe.targets: {targets!r} is not one of ['progress', 'final']")


@dataclass
class LossOutput:
    loss: torch.Tensor
    """Scalar: mean cross-entropy over supervised iterations, batch and queries."""
    per_iteration_K: torch.Tensor
    """(K,) detached cross-entropy of each supervised iteration."""
    correct_KBQ: torch.Tensor
    """(K, B, Q) bool: argmax readout equals the target."""


def par_loss(logits_KBQV: torch.Tensor, iterations: list[int], states_BDQ: torch.Tensor, ops_per_iteration: int,
             targets: str) -> LossOutput:
    """Cross-entropy of each read-out iteration against its (progress-aligned or final) target.

    Args:
        logits_KBQV: readouts of iterations ``iterations`` (1-based), (K, B, Q, V).
        states_BDQ: target token ids after every prefix, (B, D, Q); D is the batch's depth d.
        ops_per_iteration: c.
        targets: ``progress`` or ``final``.
    """
    idx = target_indices(iterations, states_BDQ.shape[1], ops_per_iteration, targets)
    target_KBQ = states_BDQ[:, idx].permute(1, 0, 2)
    ce_KBQ = F.cross_entropy(logits_KBQV.float().flatten(0, 2), target_KBQ.flatten(), reduction="none")
    ce_KBQ = ce_KBQ.view(target_KBQ.shape)
    return LossOutput(
        loss=ce_KBQ.mean(),
        per_iteration_K=ce_KBQ.detach().mean(dim=(1, 2)),
        correct_KBQ=logits_KBQV.detach().argmax(-1) == target_KBQ,
    )


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
