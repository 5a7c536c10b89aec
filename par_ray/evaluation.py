"""Extrapolation evaluation: accuracy by test depth, d50 and the extrapolation factor G (PAR paper §4.2).

For each test depth d the model runs R = ceil(d / c) iterations on fresh sequences of d operations and is read out
once, after iteration R. Full-state accuracy counts a sequence right only when all Q queries are right (swap-S5).

    d50 = the first test depth whose accuracy falls below the midpoint (chance + 1) / 2
    G   = d50 / d_train

When accuracy never falls below the midpoint, d50 is *censored*: it is only known that d50 > max tested depth, and G
is reported as the lower bound ``max tested / d_train`` with ``censored=True`` (shown as "≥ G").

Tensor suffixes: B batch, Q queries, V vocabulary, R iterations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch


@dataclass(frozen=True)
class Extrapolation:
    """d50 and G of one accuracy-by-depth curve."""

    d50: int | None
    """First test depth below the midpoint; ``None`` when accuracy never crosses (censored)."""
    G: float
    """d50 / d_train, or max tested depth / d_train when censored (a lower bound)."""
    censored: bool
    """True when accuracy stayed at or above the midpoint at every tested depth (G is a lower bound)."""
    midpoint: float
    """(chance + 1) / 2, the threshold used."""


def extrapolation(accuracy_by_depth: Mapping[int, float], chance: float, train_depth: int) -> Extrapolation:
    """d50 and G from accuracies at test depths (paper §4.2, "extrapolation factor").

    Args:
        accuracy_by_depth: test depth -> accuracy in [0, 1]; depths need not be sorted.
        chance: chance accuracy of the same metric (e.g. 1/120 for swap-S5 full-state accuracy).
        train_depth: d_train, the largest depth trained on.
    Raises:
        ValueError: empty curve, non-positive train depth, or chance outside [0, 1).
    """
    if not accuracy_by_depth:
        raise ValueError("accuracy_by_depth: empty; need at least one test depth")
    if train_depth < 1:
        raise ValueError(f"train_depth: must be >= 1, got {train_depth}")
    if not 0.0 <= chance < 1.0:
        raise ValueError(f"chance: must be in [0, 1), got {chance}")
    midpoint = (chance + 1.0) / 2.0
    depths = sorted(accuracy_by_depth)
    for d in depths:
        acc = accuracy_by_depth[d]
        if math.isnan(acc) or acc < midpoint:
            return Extrapolation(d50=d, G=d / train_depth, censored=False, midpoint=midpoint)
    return Extrapolation(d50=None, G=depths[-1] / train_depth, censored=True, midpoint=midpoint)


def format_G(ex: Extrapolation) -> str:
    """``"4.00"`` or ``"≥ 8.00"`` for a censored G."""
    return f"≥ {ex.G:.2f}" if ex.censored else f"{ex.G:.2f}"


@torch.no_grad()
def accuracy_by_depth(
    model_fn,
    task,
    eval_cfg,
    ops_per_iteration: int,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
    reduce_sum=lambda t: t,
) -> dict[int, dict[str, float]]:
    """Accuracy at each test depth with R = ceil(d / c), read out once after iteration R (paper §4.2).

    Args:
        model_fn: ``(input_ids_BT, read_positions_Q, R, grad_window, stretch, read) -> LoopedOutput`` — the
            (possibly wrapped) model's forward; every rank must call it the same number of times (FSDP).
        task: a :class:`par_ray.tasks.Task`; test sets are ``task.sample(d, n, eval_cfg.seed, step=0)``.
        eval_cfg: ``EvalConfig`` (depths, num_sequences, batch_size, seed).
        rank, world_size: rows ``rank::world_size`` of each test set are evaluated here.
        reduce_sum: sums a tensor over ranks (identity on one rank).
    Returns:
        ``{d: {"acc": full-state accuracy, "acc_query": per-query accuracy}}``, fractions in [0, 1].
    """
    results: dict[int, dict[str, float]] = {}
    for depth in eval_cfg.depths:
        ep = task.sample(depth, eval_cfg.num_sequences, seed=eval_cfg.seed, step=0)
        R = math.ceil(depth / ops_per_iteration)
        ids_BT = ep.input_ids[rank::world_size]
        answers_BQ = ep.states[rank::world_size, -1]
        reads_Q = ep.read_positions.to(device)
        # Same number of forward calls on every rank, whatever its share of rows.
        n_chunks = math.ceil(math.ceil(eval_cfg.num_sequences / world_size) / eval_cfg.batch_size)
        counts = torch.zeros(3, dtype=torch.float64, device=device)  # full-state right, queries right, sequences
        for ids, ans in zip(ids_BT.tensor_split(n_chunks), answers_BQ.tensor_split(n_chunks)):
            logits_BQV = model_fn(ids.to(device), reads_Q, R, None, 1.0, "last").logits_KBQV[-1]
            right_BQ = logits_BQV.argmax(-1) == ans.to(device)
            counts += torch.stack([right_BQ.all(-1).sum(), right_BQ.float().mean(-1).sum(),
                                   torch.tensor(ids.shape[0], device=device)]).double()
        counts = reduce_sum(counts)
        n = counts[2].clamp_min(1)
        results[depth] = {"acc": (counts[0] / n).item(), "acc_query": (counts[1] / n).item()}
    return results
