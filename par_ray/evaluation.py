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

from par_ray.schedules import iterations_at


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
    fixed_iterations: int = 0,
) -> dict[int, dict[str, float]]:
    """Accuracy at each test depth with R = ceil(d / c), read out once after iteration R (paper §4.2).

    Args:
        model_fn: ``(input_ids_BT, read_positions_Q, R, grad_window, stretch, read) -> LoopedOutput`` — the
            (possibly wrapped) model's forward; every rank must call it the same number of times (FSDP).
        task: a :class:`par_ray.tasks.Task`; test sets are ``task.sample(d, n, eval_cfg.seed, step=0)``.
        eval_cfg: ``EvalConfig`` (depths, num_sequences, batch_size, seed).
        rank, world_size: rows ``rank::world_size`` of each test set are evaluated here.
        reduce_sum: sums a tensor over ranks (identity on one rank).
        fixed_iterations: > 0: R = this at every depth (``recipe.fixed_iterations``, the fixed-R baselines).
    Returns:
        ``{d: {"acc": full-state accuracy, "acc_query": per-query accuracy}}``, fractions in [0, 1].
    """
    results: dict[int, dict[str, float]] = {}
    for depth in eval_cfg.depths:
        ep = task.sample(depth, eval_cfg.num_sequences, seed=eval_cfg.seed, step=0)
        R = iterations_at(depth, ops_per_iteration, fixed_iterations)
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


# --------------------------------------------------------------------------------------------------------------------
# Evaluation with learned halting (paper §3, "Learned Halting"; Table 4)


def k_of_n_stop(p_yes_RB: torch.Tensor, k: int, n: int, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The "k of n" halting rule on P(Yes) after iterations 1..R_max, for every sequence at once.

    The answer is read at the first iteration R with P(Yes)_R > tau such that at least ``k`` of iterations
    R … R+n-1 exceed tau (R itself counts). The window is clipped at R_max: iterations past R_max were not run and
    count as not exceeding tau, so near R_max the rule fires only if k of the iterations that remain exceed tau.
    A sequence where it never fires is answered at R_max and counted as never halted.

    Args:
        p_yes_RB: (R_max, B) P(Yes) after iteration 1..R_max (row r = iteration r + 1).
        k, n: at least k of n iterations; tau: threshold in (0, 1).
    Returns:
        ``(R_B, halted_B)``: chosen 1-based iteration (int64, R_max where it never fired) and whether the rule fired.
    Raises:
        ValueError: not 1 <= k <= n, tau outside (0, 1), or an empty p_yes_RB.
    """
    if not 1 <= k <= n:
        raise ValueError(f"eval.halt_k: must be in [1, eval.halt_n={n}], got {k}")
    if not 0.0 < tau < 1.0:
        raise ValueError(f"eval.halt_tau: must be in (0, 1), got {tau}")
    if p_yes_RB.ndim != 2 or p_yes_RB.shape[0] < 1:
        raise ValueError(f"p_yes_RB: must be (R_max >= 1, B), got shape {tuple(p_yes_RB.shape)}")
    R_max = p_yes_RB.shape[0]
    above_RB = (p_yes_RB > tau).to(torch.int64)
    # count_RB[r] = number of exceedances among iterations r+1 … r+n (0-based rows r … r+n-1), clipped at R_max
    padded = torch.cat([above_RB, torch.zeros(n, above_RB.shape[1], dtype=torch.int64, device=above_RB.device)])
    csum = torch.cat([torch.zeros_like(padded[:1]), padded.cumsum(0)])
    count_RB = csum[n:n + R_max] - csum[:R_max]
    fires_RB = above_RB.bool() & (count_RB >= k)
    halted_B = fires_RB.any(0)
    first_B = fires_RB.to(torch.int64).argmax(0) + 1  # argmax: first True (0 where none; fixed below)
    R_B = torch.where(halted_B, first_B, torch.full_like(first_B, R_max))
    return R_B, halted_B


def halt_max_iterations(eval_cfg, ops_per_iteration: int) -> int:
    """R_max of halting evaluation: ``eval.halt_max_iterations``, or 2 × ⌈max(depths) / c⌉ when that is 0."""
    if eval_cfg.halt_max_iterations:
        return eval_cfg.halt_max_iterations
    return 2 * math.ceil(max(eval_cfg.depths) / ops_per_iteration)


@torch.no_grad()
def halting_by_depth(
    model_fn,
    task,
    eval_cfg,
    ops_per_iteration: int,
    halt,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
    reduce_sum=lambda t: t,
) -> dict[int, dict]:
    """Accuracy when the model stops itself (k-of-n rule) vs oracle stopping R* = ⌈d/c⌉, at every test depth.

    Each test set (the same as :func:`accuracy_by_depth`'s) gets the halting query appended
    (``par_ray.halting.with_halt_query``) and runs R_max = :func:`halt_max_iterations` iterations once, read out at
    every iteration; the answer at the rule's R and at R* come from that one run. Memory: the read-out logits,
    R_max × batch × (Q + 1) × V per chunk (``eval.batch_size`` rows).

    Args:
        model_fn, task, eval_cfg, rank, world_size, reduce_sum: as in :func:`accuracy_by_depth`.
        halt: ``par_ray.halting.HaltTokens`` of the trial.
    Returns:
        ``{d: {"halt_acc", "oracle_acc": full-state accuracy (fractions), "halt_iter": mean chosen R,
        "dR_mean", "dR_std": mean and population std over sequences of R − R*, "never_halted": fraction,
        "p_yes_k": [mean P(Yes) after iteration 1..R_max]}}``.
    """
    from par_ray.halting import p_yes, with_halt_query

    R_max = halt_max_iterations(eval_cfg, ops_per_iteration)
    results: dict[int, dict] = {}
    for depth in eval_cfg.depths:
        ep = with_halt_query(task.sample(depth, eval_cfg.num_sequences, seed=eval_cfg.seed, step=0), halt.query)
        R_star = math.ceil(depth / ops_per_iteration)
        ids_BT = ep.input_ids[rank::world_size]
        answers_BQ = ep.states[rank::world_size, -1]
        reads_Q = ep.read_positions.to(device)
        n_chunks = math.ceil(math.ceil(eval_cfg.num_sequences / world_size) / eval_cfg.batch_size)
        # halt right, oracle right, never halted, Σ R, Σ (R - R*), Σ (R - R*)², sequences
        counts = torch.zeros(7, dtype=torch.float64, device=device)
        p_sum_R = torch.zeros(R_max, dtype=torch.float64, device=device)
        for ids, ans in zip(ids_BT.tensor_split(n_chunks), answers_BQ.tensor_split(n_chunks)):
            logits_RBQV = model_fn(ids.to(device), reads_Q, R_max, None, 1.0, "all").logits_KBQV
            right_RB = (logits_RBQV[:, :, :-1].argmax(-1) == ans.to(device)).all(-1)
            p_RB = p_yes(logits_RBQV[:, :, -1], halt)
            R_B, halted_B = k_of_n_stop(p_RB, eval_cfg.halt_k, eval_cfg.halt_n, eval_cfg.halt_tau)
            dR_B = (R_B - R_star).double()
            counts += torch.stack([
                right_RB.gather(0, (R_B - 1)[None]).sum().double(), right_RB[R_star - 1].sum().double(),
                (~halted_B).sum().double(), R_B.sum().double(), dR_B.sum(), dR_B.pow(2).sum(),
                torch.tensor(float(ids.shape[0]), dtype=torch.float64, device=device)])
            p_sum_R += p_RB.double().sum(1)
        counts, p_sum_R = reduce_sum(counts), reduce_sum(p_sum_R)
        n = counts[6].clamp_min(1)
        dR_mean = (counts[4] / n).item()
        results[depth] = {
            "halt_acc": (counts[0] / n).item(),
            "oracle_acc": (counts[1] / n).item(),
            "never_halted": (counts[2] / n).item(),
            "halt_iter": (counts[3] / n).item(),
            "dR_mean": dR_mean,
            "dR_std": math.sqrt(max((counts[5] / n).item() - dR_mean**2, 0.0)),
            "p_yes_k": (p_sum_R / n).tolist(),
        }
    return results


def halting_metrics(results: Mapping[int, Mapping], ops_per_iteration: int) -> dict[str, float]:
    """Flat metric names of :func:`halting_by_depth`'s results, the names ``analysis`` reads.

    Per test depth D: ``halt_acc_d{D}``, ``oracle_acc_d{D}`` (fractions), ``halt_gap_d{D}`` (oracle − halting, in
    accuracy points), ``halt_iter_d{D}`` (mean chosen R), ``halt_dR_mean_d{D}``, ``halt_dR_std_d{D}`` (R − ⌈d/c⌉),
    ``never_halted_d{D}`` (fraction). Curve: ``halt_prob_k{K}``, mean P(Yes) after iteration K on the first
    (shallowest) test depth, for K = 1 … min(R_max, 2 ⌈d/c⌉).
    """
    out: dict[str, float] = {}
    for d, v in results.items():
        out[f"halt_acc_d{d}"] = v["halt_acc"]
        out[f"oracle_acc_d{d}"] = v["oracle_acc"]
        out[f"halt_gap_d{d}"] = 100.0 * (v["oracle_acc"] - v["halt_acc"])
        out[f"halt_iter_d{d}"] = v["halt_iter"]
        out[f"halt_dR_mean_d{d}"] = v["dR_mean"]
        out[f"halt_dR_std_d{d}"] = v["dR_std"]
        out[f"never_halted_d{d}"] = v["never_halted"]
    if results:
        first = min(results)
        curve = results[first]["p_yes_k"][: 2 * math.ceil(first / ops_per_iteration)]
        out.update({f"halt_prob_k{k}": p for k, p in enumerate(curve, start=1)})
    return out
