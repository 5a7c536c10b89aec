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
