"""Extrapolation evaluation: accuracy by test depth, d50 and the extrapolation factor G (PAR paper §4.2).

For each test depth d the model runs R = ceil(d / c) iterations on fresh sequences of d operations and is read out
once, after iteration R. Full-state accuracy counts a sequence right only when all Q queries are right (swap-S5).

    d50 = the first test depth whose accuracy falls below the midpoint (chance + 1) / 2
    G   = d50 / d_train

When accuracy never falls below the midpoint, d50 is *censored*: it is only known that d50 > max tested depth, and G
is reported as the lower bound ``max tested / d_train`` with ``censored=True`` (shown as "≥ G").

Beside the paper's first-crossing d50, an *interpolated* d50 (a par_ray addition, labelled as such wherever shown):
the depth where the straight line between the last test depth at or above the midpoint and the first one below
crosses it, so a curve that falls just past a test depth and one that falls just before the next read differently::

    d50_interp = d_a + (acc_a − midpoint) / (acc_a − acc_b) · (d_b − d_a),   G_interp = d50_interp / d_train

(d_b = d50, d_a the test depth before it). Each test depth's accuracy also gets its 95 % Wilson score interval
(:func:`wilson_interval`), the uncertainty of a curve point from n test sequences.

How sure a G is (par_ray additions, issue 37): the evaluation spends extra sequences where G is decided. After the
first pass over the test depths, blocks of ``eval.bracket_block`` fresh sequences are added at the depths that
bracket the midpoint crossing (:func:`bracketing_depths`: d_a and d_b above) until each one's Wilson interval
excludes the midpoint, it has ``eval.bracket_min_sequences``, or it reached the cap ``eval.bracket_max_sequences``;
the crossing is found again after every block, so the bracket follows it when more data moves it
(:func:`next_bracket_depth`, run by :func:`sum_over_test_sets`). Then a bootstrap over test sequences
(:func:`extrapolation_interval`: each depth's per-sequence correctness resampled, d50 and d50_interp recomputed)
gives 95 % intervals of d50, G and the interpolated G (``G_lo``, ``G_hi``, ``G_interp_lo``, ``G_interp_hi``).
The first-crossing G stays the headline; the interval says how far sampling noise could move it.

Trials with a halting read-out are also evaluated with the model's own stopping and with the oracle best fixed R per
depth (:func:`halting_by_depth`, one pass of R_max iterations); :func:`stopping_extrapolation` gives d50 and G of
those curves (``G_halt``, ``G_best``: :func:`extrapolation_metrics`), ``G`` staying R = ⌈d/c⌉'s.

Tensor suffixes: B batch, Q queries, V vocabulary, R iterations.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from par_ray.schedules import iterations_at
from par_ray.tracking_schema import depth_metric, g_metric, iteration_metric


@dataclass(frozen=True)
class ExtrapolationInterval:
    """The bootstrap intervals of one curve's d50, G and interpolated G (:func:`extrapolation_interval`).

    A bound is *censored* when it lies past the largest tested depth: the upper bound when more than (1 − level) / 2
    of the resamples never fell below the midpoint, the lower bound when more than (1 + level) / 2 never did. Its d50
    bound is then ``None`` and its G bound reads max tested depth / d_train, a lower bound (shown "≥"). A censored
    lower bound implies a censored upper bound.
    """

    level: float
    """The interval's coverage, 0.95."""
    resamples: int
    """Bootstrap resamples (0 when read back from logged metrics, :func:`extrapolation_from_metrics`)."""
    d50_lo: float | None
    """Lower bound of the first-crossing d50 (a test depth); ``None`` when censored."""
    d50_hi: float | None
    """Upper bound of the first-crossing d50; ``None`` when censored."""
    d50_interp_lo: float | None
    """Lower bound of the interpolated d50; ``None`` when censored."""
    d50_interp_hi: float | None
    """Upper bound of the interpolated d50; ``None`` when censored."""
    G_lo: float
    """d50_lo / d_train (max tested depth / d_train when censored)."""
    G_hi: float
    """d50_hi / d_train (max tested depth / d_train when censored)."""
    G_interp_lo: float
    """d50_interp_lo / d_train (max tested depth / d_train when censored)."""
    G_interp_hi: float
    """d50_interp_hi / d_train (max tested depth / d_train when censored)."""
    lo_censored: bool
    """The lower bounds lie past the largest tested depth."""
    hi_censored: bool
    """The upper bounds lie past the largest tested depth."""


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
    d50_interp: float | None = None
    """Linearly interpolated d50 (module docstring); ``d50`` itself when the first test depth is already below the
    midpoint or d50's accuracy is NaN (nothing to interpolate from); ``None`` when censored."""
    G_interp: float | None = None
    """d50_interp / d_train; when censored, G (the same lower bound)."""
    interval: ExtrapolationInterval | None = None
    """95 % bootstrap intervals of d50, G and the interpolated G (:func:`extrapolation_from_counts`); ``None`` when
    not measured."""


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
    for i, d in enumerate(depths):
        acc = accuracy_by_depth[d]
        if math.isnan(acc) or acc < midpoint:
            d50_interp = float(d)
            if i > 0 and not math.isnan(acc):  # the line from the last depth at or above the midpoint to d
                d_a, acc_a = depths[i - 1], accuracy_by_depth[depths[i - 1]]
                d50_interp = d_a + (acc_a - midpoint) / (acc_a - acc) * (d - d_a)
            return Extrapolation(d50=d, G=d / train_depth, censored=False, midpoint=midpoint, d50_interp=d50_interp,
                                 G_interp=d50_interp / train_depth)
    G = depths[-1] / train_depth
    return Extrapolation(d50=None, G=G, censored=True, midpoint=midpoint, d50_interp=None, G_interp=G)


def format_G(ex: Extrapolation, interpolated: bool = False) -> str:
    """``"4.00"`` or ``"≥ 8.00"`` for a censored G; ``interpolated``: the same for ``G_interp``."""
    G = ex.G_interp if interpolated and ex.G_interp is not None else ex.G
    return f"≥ {G:.2f}" if ex.censored else f"{G:.2f}"


def format_interval(ex: Extrapolation, interpolated: bool = False) -> str:
    """The 95 % interval of G (``interpolated``: of the interpolated G) as ``"[3.50, 4.25]"``, a censored bound with
    "≥" (``"[3.50, ≥ 8.00]"``); ``""`` when ``ex`` has no interval."""
    iv = ex.interval
    if iv is None:
        return ""
    lo, hi = (iv.G_interp_lo, iv.G_interp_hi) if interpolated else (iv.G_lo, iv.G_hi)
    return f"[{'≥ ' if iv.lo_censored else ''}{lo:.2f}, {'≥ ' if iv.hi_censored else ''}{hi:.2f}]"


BOOTSTRAP_STREAM = 37
"""Second key of the bootstrap's ``SeedSequence([seed, BOOTSTRAP_STREAM])``: a stream no task sampler uses
(``par_ray.tasks.common.make_rng`` keys four numbers)."""


def extrapolation_interval(counts: Mapping[int, tuple[float, float]], chance: float, train_depth: int,
                           resamples: int = 1000, seed: int = 0, level: float = 0.95) -> ExtrapolationInterval:
    """Percentile-bootstrap intervals of the first-crossing d50, the interpolated d50 and their G (issue 37).

    A resample redraws each test depth's sequences with replacement, independently per depth; for 0/1 correctness
    that is right'_d ~ Binomial(n_d, right_d / n_d), which is how it is drawn. Each resample's curve gives d50 and
    d50_interp by the rule of :func:`extrapolation` (a resample that never falls below the midpoint: +∞, censored);
    the bounds are the (1 − level)/2 and (1 + level)/2 quantiles of the resamples (inverted CDF: an order statistic,
    so a discrete d50 keeps grid values). Reproducible: the generator is ``SeedSequence([seed, BOOTSTRAP_STREAM])``.

    Args:
        counts: test depth -> (sequences fully right, sequences), over every test sequence of that depth.
        chance, train_depth: as in :func:`extrapolation`.
        resamples: bootstrap resamples, >= 1.
        seed: a non-negative int (``eval.seed``).
        level: coverage in (0, 1).
    Raises:
        ValueError: no depth, a depth with n < 1 or right outside [0, n], resamples < 1, level outside (0, 1), or
            :func:`extrapolation`'s errors.
    """
    if not counts:
        raise ValueError("counts: empty; need at least one test depth")
    bad = [d for d, (right, n) in counts.items() if not (n >= 1 and 0 <= right <= n)]
    if bad:
        raise ValueError(f"counts: depths {sorted(bad)} need sequences n >= 1 and right in [0, n], got "
                         f"{[counts[d] for d in sorted(bad)]}")
    if resamples < 1:
        raise ValueError(f"resamples: must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: must be in (0, 1), got {level}")
    extrapolation({d: right / n for d, (right, n) in counts.items()}, chance, train_depth)  # its argument checks
    midpoint = (chance + 1.0) / 2.0
    depths = sorted(counts)
    d_D = np.array(depths, dtype=np.float64)
    n_D = np.array([round(counts[d][1]) for d in depths], dtype=np.int64)
    p_D = np.array([counts[d][0] for d in depths], dtype=np.float64) / n_D
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), BOOTSTRAP_STREAM]))
    acc_BD = rng.binomial(n_D, p_D, size=(resamples, len(depths))) / n_D
    below_BD = acc_BD < midpoint
    crossed_B = below_BD.any(axis=1)
    i_B = below_BD.argmax(axis=1)  # the first depth below the midpoint (0 where none: masked by crossed_B)
    a_B = np.maximum(i_B - 1, 0)  # the depth before it
    rows = np.arange(resamples)
    acc_a, acc_b = acc_BD[rows, a_B], acc_BD[rows, i_B]
    step_B = np.divide(acc_a - midpoint, acc_a - acc_b, out=np.zeros(resamples), where=i_B > 0)
    d50_B = np.where(crossed_B, d_D[i_B], np.inf)
    interp_B = np.where(crossed_B, d_D[a_B] + step_B * (d_D[i_B] - d_D[a_B]), np.inf)
    q = [(1.0 - level) / 2.0, (1.0 + level) / 2.0]
    (lo, hi), (ilo, ihi) = (np.quantile(x, q, method="inverted_cdf") for x in (d50_B, interp_B))
    top = float(d_D[-1])

    def finite(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    def G(x: float) -> float:
        return (float(x) if math.isfinite(x) else top) / train_depth

    return ExtrapolationInterval(level=level, resamples=resamples, d50_lo=finite(lo), d50_hi=finite(hi),
                                 d50_interp_lo=finite(ilo), d50_interp_hi=finite(ihi), G_lo=G(lo), G_hi=G(hi),
                                 G_interp_lo=G(ilo), G_interp_hi=G(ihi), lo_censored=not math.isfinite(lo),
                                 hi_censored=not math.isfinite(hi))


def extrapolation_from_counts(counts: Mapping[int, tuple[float, float]], chance: float, train_depth: int,
                              resamples: int = 0, seed: int = 0) -> Extrapolation:
    """:func:`extrapolation` of the accuracies right / n, with :func:`extrapolation_interval`'s 95 % intervals when
    ``resamples`` > 0 (``eval.bootstrap_resamples``; ``seed``: ``eval.seed``).

    Args:
        counts: test depth -> (sequences fully right, sequences).
    Raises:
        ValueError: as :func:`extrapolation` and :func:`extrapolation_interval`.
    """
    ex = extrapolation({d: right / n if n else math.nan for d, (right, n) in counts.items()}, chance, train_depth)
    if resamples:
        ex = dataclasses.replace(ex, interval=extrapolation_interval(counts, chance, train_depth, resamples, seed))
    return ex


WILSON_Z = 1.959963984540054
"""z of a two-sided 95 % interval (the 0.975 quantile of the standard normal)."""


def wilson_interval(accuracy: float, n: int, z: float = WILSON_Z) -> tuple[float, float]:
    """Wilson score interval of a proportion (Wilson 1927): the 95 % interval of an accuracy measured on ``n`` test
    sequences (``acc_lo_d{D}``, ``acc_hi_d{D}``). Unlike the normal approximation it stays inside [0, 1] and is not
    empty at 0 or 1 (n = 256, accuracy 1 → [0.985, 1])::

        center ± half = (p + z²/2n ± z · sqrt(p(1 − p)/n + z²/4n²)) / (1 + z²/n)

    Args:
        accuracy: p, the fraction right, in [0, 1] (NaN gives NaN bounds).
        n: sequences, >= 1.
        z: the normal quantile (default 95 %).
    Returns:
        ``(lo, hi)``, fractions in [0, 1].
    Raises:
        ValueError: n < 1, or accuracy outside [0, 1].
    """
    if n < 1:
        raise ValueError(f"n: must be >= 1 test sequence, got {n}")
    if math.isnan(accuracy):
        return math.nan, math.nan
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy: must be in [0, 1], got {accuracy}")
    z2 = z * z
    center = (accuracy + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, center - half), min(1.0, center + half)


def rank_chunks(num_sequences: int, batch_size: int, rank: int, world_size: int,
                *rows: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """Rows ``rank::world_size`` of each tensor in ``rows`` (all with ``num_sequences`` rows), in chunks of at most
    ``batch_size`` rows: the same number of chunks, ⌈⌈num_sequences / world_size⌉ / batch_size⌉, on every rank, so
    every rank makes the same number of forward calls (FSDP all-gathers in each one and would hang otherwise); a rank
    with fewer rows gets smaller, possibly empty, chunks."""
    n_chunks = math.ceil(math.ceil(num_sequences / world_size) / batch_size)
    return zip(*(r[rank::world_size].tensor_split(n_chunks) for r in rows))


class EvalProgress:
    """Progress lines of an evaluation that runs long (a real-size backbone at d = 256 runs for minutes).

    Called after every test batch (``(depth, batches done at that depth, batches at that depth)``, as
    :func:`sum_over_test_sets` does), it prints, at most once per ``every_s`` seconds and never before ``every_s``
    have passed (a short evaluation prints nothing)::

        evaluation (accuracy): d=256 batch 3/8, depth 5/6, 2m10s elapsed, ETA ~4m05s

    The ETA takes a test set's cost ∝ n(d) × d × R(d) (sequences × tokens × iterations; ``R(d)`` as the evaluation
    reads out) and the time per unit of that cost measured so far. A block added near the crossing (adaptive
    sampling) is reported with its sequences as a fourth argument, ``(depth, batches done, batches, sequences)``: its
    cost joins the total when its first batch is done (the ETA counts only the work known so far) and the line says
    ``+n near the crossing``.

    Args:
        say: prints one line (the worker's rank-0 printer).
        what: the evaluation's name in the line.
        depths: the test depths, in evaluation order.
        iterations: ``d -> R`` at that depth (e.g. ⌈d/c⌉, or R_max for halting).
        sequences: ``d -> n``, test sequences at that depth (``EvalConfig.sequences_at``; default the same at every
            depth).
        every_s: seconds between lines.
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, say: Callable[[str], None], what: str, depths: Sequence[int], iterations: Callable[[int], int],
                 every_s: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 sequences: Callable[[int], int] = lambda d: 1):
        self.say, self.what, self.every_s, self.clock = say, what, every_s, clock
        self.depths = list(depths)
        self.iterations = iterations
        self.cost = {d: sequences(d) * d * max(1, iterations(d)) for d in self.depths}
        self.total = sum(self.cost.values())
        self.t0 = self.last = clock()
        self.done = 0.0  # cost units finished

    def __call__(self, depth: int, batches_done: int, batches: int, added: int = 0) -> None:
        cost = added * depth * max(1, self.iterations(depth)) if added else self.cost[depth]
        if added and batches_done == 1:
            self.total += cost
        self.done += cost / max(1, batches)
        now = self.clock()
        if now - self.last < self.every_s:
            return
        self.last = now
        elapsed = now - self.t0
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        where = f" +{added} near the crossing" if added else ""
        self.say(f"evaluation ({self.what}): d={depth}{where} batch {batches_done}/{batches}, depth "
                 f"{self.depths.index(depth) + 1}/{len(self.depths)}, {_minutes(elapsed)} elapsed, "
                 f"ETA ~{_minutes(eta)}")


def _minutes(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def sum_over_test_sets(task, eval_cfg, chunk_counts: Callable, device: torch.device, rank: int = 0, world_size: int = 1,
                    reduce_sum=lambda t: t, prepare: Callable | None = None,
                    progress: Callable[..., None] | None = None,
                    score: Callable[[tuple[torch.Tensor, ...]], tuple[float, float]] | None = None,
                    ) -> dict[int, tuple[torch.Tensor, ...]]:
    """The rank-split batch loop every evaluation runs (accuracy by depth, halting, CoT): counts summed over test
    batches and ranks, at each test depth.

    First pass: for each d in ``eval_cfg.depths`` the test set is ``task.sample(d, n, eval.seed, step=0)``, n =
    ``eval_cfg.sequences_at(d)`` (``eval.num_sequences``, or ``eval.num_sequences_fine`` at a fine grid's in-between
    depths), passed through ``prepare(ep)`` when given (e.g. appending the halting query); this rank evaluates its rows
    ``rank::world_size`` in :func:`rank_chunks` of ``eval.batch_size``, calling ``chunk_counts(d, ep, ids_BT,
    answers_BQ)`` (the chunk's token ids and final states ``ep.states[:, -1]``, on ``device``) → a tensor or a tuple
    of tensors of counts (float64, on ``device``), summed over chunks, then each tensor reduced over ranks with
    ``reduce_sum`` (one collective per tensor per depth, the same on every rank). ``progress(d, batches done,
    batches)`` is called after every batch (e.g. :class:`EvalProgress`).

    Adaptive sampling near the crossing (with ``score`` and ``eval.bracket_max_sequences`` > 0): ``score(counts of
    a depth)`` → (sequences fully right, sequences) of the curve whose crossing is sought, midpoint
    (``task.full_state_chance`` + 1) / 2. While :func:`next_bracket_depth` names a depth, its next block j = 1, 2, …
    (``task.sample(d, eval.bracket_block, eval.seed, step=j)``: a pure function of (task, depth, seed, j), a stream
    of its own beside the first pass's step 0, the training streams' ``train.seed`` and the probe's ``eval.seed + 1``)
    is evaluated the same way and added to that depth's counts (``progress(d, batches done, batches, block)``). Every
    rank takes the same decisions: they read counts already reduced over ranks.

    Returns:
        ``{d: (summed counts, one tensor per tensor chunk_counts returns)}``, over the first pass and every block.
    """
    def evaluate(depth: int, n: int, step: int, added: int = 0) -> tuple[torch.Tensor, ...]:
        ep = task.sample(depth, n, seed=eval_cfg.seed, step=step)
        if prepare is not None:
            ep = prepare(ep)
        totals: list[torch.Tensor] | None = None
        chunks = list(rank_chunks(n, eval_cfg.batch_size, rank, world_size, ep.input_ids, ep.states[:, -1]))
        for i, (ids_BT, answers_BQ) in enumerate(chunks, start=1):
            got = chunk_counts(depth, ep, ids_BT.to(device), answers_BQ.to(device))
            got = (got,) if isinstance(got, torch.Tensor) else tuple(got)
            totals = list(got) if totals is None else [t + g for t, g in zip(totals, got)]
            if progress is not None:
                progress(depth, i, len(chunks), *((added,) if added else ()))
        return tuple(reduce_sum(t) for t in totals)

    results = {depth: evaluate(depth, eval_cfg.sequences_at(depth), 0) for depth in eval_cfg.depths}
    if score is None or not eval_cfg.bracket_max_sequences:
        return results
    midpoint = (task.full_state_chance + 1.0) / 2.0
    blocks = dict.fromkeys(results, 0)
    while (depth := next_bracket_depth({d: score(c) for d, c in results.items()}, midpoint, eval_cfg,
                                       eval_cfg.bracket_block * sum(blocks.values()))) is not None:
        blocks[depth] += 1
        more = evaluate(depth, eval_cfg.bracket_block, blocks[depth], eval_cfg.bracket_block)
        results[depth] = tuple(a + b for a, b in zip(results[depth], more))
    return results


def bracketing_depths(counts: Mapping[int, tuple[float, float]], midpoint: float) -> tuple[int, ...]:
    """The test depths that bracket the midpoint crossing of a curve (right / n at each depth), by the rule of
    :func:`extrapolation`: the last depth at or above the midpoint and the first depth below it (d_a, d_b = d50);
    only d_b when the first depth is already below; only the largest depth when the curve never falls below
    (censored: more sequences there tell whether it truly stays above).

    Args:
        counts: test depth -> (sequences fully right, sequences); depths need not be sorted.
        midpoint: (chance + 1) / 2.
    Returns:
        One or two depths, increasing.
    """
    depths = sorted(counts)
    for i, d in enumerate(depths):
        right, n = counts[d]
        if not n or right / n < midpoint:
            return tuple(depths[max(0, i - 1): i + 1])
    return (depths[-1],)


def next_bracket_depth(counts: Mapping[int, tuple[float, float]], midpoint: float, eval_cfg,
                       added: int) -> int | None:
    """The depth that gets the next block of adaptive sampling (:func:`sum_over_test_sets`), or ``None``: stop.

    Among :func:`bracketing_depths` of the curve so far, a depth with n sequences wants a block while n +
    ``eval.bracket_block`` <= ``eval.bracket_max_sequences`` (the cap) and either n < ``eval.bracket_min_sequences``
    or its 95 % Wilson interval (:func:`wilson_interval`) holds the midpoint; the one with the fewest sequences goes
    first (ties: the shallower). Nothing is added once another block would take the sequences added this evaluation
    past 2 × the cap (the bracket moved more than once), and nothing when the cap is 0.

    Args:
        counts: test depth -> (sequences fully right, sequences), the first pass and the blocks so far.
        midpoint: (chance + 1) / 2.
        eval_cfg: ``EvalConfig`` (bracket_max_sequences, bracket_min_sequences, bracket_block).
        added: sequences added so far in this evaluation.
    """
    cap, block = eval_cfg.bracket_max_sequences, eval_cfg.bracket_block
    if not cap or added + block > 2 * cap:
        return None
    wants = []
    for d in bracketing_depths(counts, midpoint):
        right, n = counts[d]
        if n + block > cap:
            continue
        lo, hi = wilson_interval(right / n, round(n)) if n else (0.0, 1.0)
        if n < eval_cfg.bracket_min_sequences or lo <= midpoint <= hi:
            wants.append((n, d))
    return min(wants)[1] if wants else None


BEST_R_MULTIPLES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
"""Multiples m of ⌈d/c⌉ read out by the best-R evaluation (``eval.best_r``: the paper's RLT row, "best R per depth"):
from half the iterations the depth needs to twice as many."""


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
    r_multiples: tuple[float, ...] = (),
    progress: Callable[[int, int, int], None] | None = None,
) -> dict[int, dict[str, float]]:
    """Accuracy at each test depth with R = ceil(d / c), read out once after iteration R (paper §4.2).

    With ``r_multiples`` (:data:`BEST_R_MULTIPLES` under ``eval.best_r``, the paper's RLT row, "best R per depth"):
    one forward per batch
    to the largest of R_m = max(1, round(m · ceil(d / c))) reads out every R_m, and each depth reports the R_m with
    the best full-state accuracy (ties: the smallest R).

    With ``eval.bracket_max_sequences`` > 0, more sequences are drawn at the depths that bracket the crossing of the
    full-state curve (the best R's with ``r_multiples``) after the first pass (:func:`sum_over_test_sets`), so ``n``
    differs between depths.

    Args:
        model_fn: ``(input_ids_BT, read_positions_Q, R, grad_window, stretch, read) -> LoopedOutput`` — the
            (possibly wrapped) model's forward; every rank must call it the same number of times (FSDP).
        task: a :class:`par_ray.tasks.Task`; test sets are ``task.sample(d, n, eval_cfg.seed, step=0)`` (and the
            blocks of :func:`sum_over_test_sets`); its ``full_state_chance`` sets the midpoint.
        eval_cfg: ``EvalConfig`` (depths, num_sequences[_fine], batch_size, seed, bracket_*).
        rank, world_size: rows ``rank::world_size`` of each test set are evaluated here.
        reduce_sum: sums a tensor over ranks (identity on one rank).
        fixed_iterations: > 0: R = this at every depth (``recipe.fixed_iterations``, the fixed-R baselines).
        progress: called after every test batch (:func:`sum_over_test_sets`).
    Returns:
        ``{d: {"acc": full-state accuracy, "acc_query": per-query accuracy, "right": sequences fully right, "n":
        sequences}}``, fractions in [0, 1] and counts (floats); with ``r_multiples`` also ``"R"`` (the best R) and
        ``"acc_by_R"`` (``{R_m: full-state accuracy}``), ``acc``, ``acc_query`` and ``right`` then being those of
        the best R.
    """
    def Rs(depth: int) -> tuple[int, ...]:
        R = iterations_at(depth, ops_per_iteration, fixed_iterations)
        return tuple(sorted({max(1, round(m * R)) for m in r_multiples})) if r_multiples else (R,)

    def counts(depth: int, ep, ids_BT: torch.Tensor, answers_BQ: torch.Tensor) -> torch.Tensor:
        reads = Rs(depth)
        read = reads if r_multiples else "last"
        logits_KBQV = model_fn(ids_BT, ep.read_positions.to(device), reads[-1], None, 1.0, read).logits_KBQV
        right_KBQ = logits_KBQV.argmax(-1) == answers_BQ
        # per read R: full-state right, queries right, sequences
        n_K = torch.full((len(reads),), ids_BT.shape[0], device=device)
        return torch.stack([right_KBQ.all(-1).sum(-1), right_KBQ.float().mean(-1).sum(-1), n_K], dim=-1).double()

    def best_read(c_K3: torch.Tensor) -> int:
        """The read with the best full-state accuracy, then the smallest R (one read without ``r_multiples``)."""
        acc_K = (c_K3[:, 0] / c_K3[:, 2].clamp_min(1)).tolist()
        return max(range(len(acc_K)), key=lambda i: (acc_K[i], -i))

    def score(c: tuple[torch.Tensor]) -> tuple[float, float]:
        k = best_read(c[0])
        return c[0][k, 0].item(), c[0][k, 2].item()

    results: dict[int, dict[str, float]] = {}
    for depth, (c_K3,) in sum_over_test_sets(task, eval_cfg, counts, device, rank, world_size, reduce_sum,
                                             progress=progress, score=score).items():
        n_K = c_K3[:, 2].clamp_min(1)
        acc_K = (c_K3[:, 0] / n_K).tolist()
        best = best_read(c_K3)
        results[depth] = {"acc": acc_K[best], "acc_query": (c_K3[best, 1] / n_K[best]).item(),
                          "right": c_K3[best, 0].item(), "n": c_K3[best, 2].item()}
        if r_multiples:
            results[depth].update(R=Rs(depth)[best], acc_by_R=dict(zip(Rs(depth), acc_K)))
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
    _check_rule(k, n, tau)
    R_XB, halted_XB = _k_of_n(p_yes_RB, ((k, n, tau),))
    return R_XB[0], halted_XB[0]


def k_of_n_stops(p_yes_RB: torch.Tensor, rules: Sequence[tuple[int, int, float]]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`k_of_n_stop` for several rules (k, n, tau) on the same P(Yes), in one vectorised pass.

    Args:
        p_yes_RB: (R_max, B) P(Yes) after iteration 1..R_max.
        rules: X rules (k, n, tau), e.g. ``eval.halt_rules``.
    Returns:
        ``(R_XB, halted_XB)``: row x is ``k_of_n_stop(p_yes_RB, *rules[x])``.
    Raises:
        ValueError: a rule with k outside [1, n] or tau outside (0, 1) (named ``eval.halt_rules[x]``), no rule, or an
            empty p_yes_RB.
    """
    if not rules:
        raise ValueError("eval.halt_rules: k_of_n_stops needs at least one rule (k, n, tau)")
    for x, (k, n, tau) in enumerate(rules):
        _check_rule(k, n, tau, f"eval.halt_rules[{x}]")
    return _k_of_n(p_yes_RB, rules)


def _check_rule(k: int, n: int, tau: float, where: str | None = None) -> None:
    """ValueError unless 1 <= k <= n and 0 < tau < 1, naming ``where`` (an extra rule, ``eval.halt_rules[x]``) or,
    for the primary rule, ``eval.halt_k`` / ``eval.halt_tau``."""
    if not 1 <= k <= n:
        raise ValueError(f"eval.halt_k: must be in [1, eval.halt_n={n}], got {k}" if where is None else
                         f"{where}: k must be in [1, n={n}], got k={k}")
    if not 0.0 < tau < 1.0:
        raise ValueError(f"eval.halt_tau: must be in (0, 1), got {tau}" if where is None else
                         f"{where}: tau must be in (0, 1), got {tau}")


def _k_of_n(p_yes_RB: torch.Tensor, rules: Sequence[tuple[int, int, float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The k-of-n rule for X checked rules at once: ``(R_XB, halted_XB)`` (see :func:`k_of_n_stop`)."""
    if p_yes_RB.ndim != 2 or p_yes_RB.shape[0] < 1:
        raise ValueError(f"p_yes_RB: must be (R_max >= 1, B), got shape {tuple(p_yes_RB.shape)}")
    R_max, B = p_yes_RB.shape
    dev = p_yes_RB.device
    k_X = torch.tensor([int(r[0]) for r in rules], device=dev)
    n_X = torch.tensor([int(r[1]) for r in rules], device=dev)
    # tau in P(Yes)'s dtype: the comparison a Python float threshold would make
    tau_X = torch.tensor([float(r[2]) for r in rules], dtype=p_yes_RB.dtype, device=dev)
    above_XRB = p_yes_RB[None] > tau_X[:, None, None]
    # count_XRB[x, r] = exceedances among iterations r+1 … r+n_x (rows r … r+n_x-1), clipped at R_max
    csum_XRB = torch.cat([torch.zeros(len(rules), 1, B, dtype=torch.int64, device=dev),
                          above_XRB.to(torch.int64).cumsum(1)], dim=1)  # row j: exceedances in rows < j
    end_XR = (torch.arange(R_max, device=dev)[None] + n_X[:, None]).clamp(max=R_max)
    count_XRB = csum_XRB.gather(1, end_XR[:, :, None].expand(-1, -1, B)) - csum_XRB[:, :R_max]
    fires_XRB = above_XRB & (count_XRB >= k_X[:, None, None])
    halted_XB = fires_XRB.any(1)
    first_XB = fires_XRB.to(torch.int64).argmax(1) + 1  # argmax: first True (0 where none; fixed below)
    R_XB = torch.where(halted_XB, first_XB, torch.full_like(first_XB, R_max))
    return R_XB, halted_XB


def halting_rules(eval_cfg) -> tuple[tuple[int, int, float], ...]:
    """The rules halting evaluation applies: the primary ``(eval.halt_k, eval.halt_n, eval.halt_tau)``, then
    ``eval.halt_rules``. Raises ValueError naming the field of a bad rule (``TrialConfig.validate`` catches them
    first)."""
    _check_rule(eval_cfg.halt_k, eval_cfg.halt_n, eval_cfg.halt_tau)
    extra = tuple(tuple(r) for r in eval_cfg.halt_rules)
    for x, (k, n, tau) in enumerate(extra):
        _check_rule(k, n, tau, f"eval.halt_rules[{x}]")
    return ((eval_cfg.halt_k, eval_cfg.halt_n, eval_cfg.halt_tau), *extra)


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
    pending_id: int | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> dict[int, dict]:
    """Accuracy when the model stops itself (k-of-n rule) vs oracle stopping R* = ⌈d/c⌉, at every test depth.

    Each test set (the same as :func:`accuracy_by_depth`'s) gets the halting query appended
    (``par_ray.halting.with_halt_query``) and runs R_max = :func:`halt_max_iterations` iterations once, read out at
    every iteration; the answer at each rule's R (the primary rule and every ``eval.halt_rules`` entry, see
    :func:`halting_rules`) and at R* come from that one run, so extra rules cost no forward pass. Memory: streamed —
    each iteration's read-out logits, batch × (Q + 1) × V (``eval.batch_size`` rows; Q + 2 with ``pending_id``), are
    reduced as soon as they exist to what the rules need (whether every answer is right, P(Yes), 1 − P(pending)),
    so a chunk keeps R_max × 3 × batch numbers, never the (R_max, B, Q, V) logits (``LoopedLM.iterate``'s
    ``reduce``; ``par_ray.planner.evaluation_memory``).

    With ``pending_id`` (trials trained with ``recipe.dense_targets`` and ``recipe.dense_pending``), the same forward
    also reads the dense read-out at the *last operation's* position, and every rule is applied a second time to the
    "pending" signal p = 1 − P(pending) there (softmax over the whole vocabulary): a position past iteration k's
    frontier is trained on the pending class, so the last operation stops being pending when the model has computed
    every operation. This is a par_ray signal, not the paper's halting read-out (§3 reads P(Yes) of the halting
    query); at CPU scale it stops where the paper's read-out fires early (docs/experiments.md §14,
    ``scripts/halt_signals.py``). The answers, R* and the oracle accuracy are shared by both signals.

    The same pass also gives the *oracle best fixed R* per depth: the R in 1..R_max at which the most test sequences
    are fully right (ties: the smallest R), counted over the whole test set (every rank's counts are summed before
    the max), an oracle that picks one R per depth with the test answers (as ``eval.best_r`` does among a few
    multiples of ⌈d/c⌉, here among every iteration run).

    Args:
        model_fn, task, eval_cfg, rank, world_size, reduce_sum, progress: as in :func:`accuracy_by_depth`.
        halt: ``par_ray.halting.HaltTokens`` of the trial.
        pending_id: token id of the dense "pending" class (``par_ray.trial.VocabLayout.pending_id``), or ``None``
            (no pending signal: results and forward calls as without the argument).
    Returns:
        ``{d: {"halt_acc", "oracle_acc", "best_acc": full-state accuracy (fractions) under the rule, at R* = ⌈d/c⌉
        and at the best fixed R, "n": test sequences (the first pass's: halting adds none near the crossing),
        "best_iter": that R (int), "halt_iter": mean chosen R,
        "dR_mean", "dR_std": mean and population std over sequences of R − R*, "never_halted": fraction,
        "p_yes_k": [mean P(Yes) after iteration 1..R_max], "rules": {(k, n, tau): {"halt_acc", "halt_iter",
        "dR_mean", "dR_std", "never_halted"}} for each extra rule of eval.halt_rules (empty without)}}``; the
        top-level rule quantities are the primary rule's (eval.halt_k, eval.halt_n, eval.halt_tau). With
        ``pending_id`` each depth also has ``"pending": {(k, n, tau): stats}``, the same five statistics of the
        pending signal for every rule of :func:`halting_rules`, the primary rule first.
    Raises:
        ValueError: a bad rule (:func:`halting_rules`).
    """
    from par_ray.halting import p_yes, with_halt_query

    rules = halting_rules(eval_cfg)
    R_max = halt_max_iterations(eval_cfg, ops_per_iteration)
    X = len(rules)
    signals = 1 + (pending_id is not None)

    def counts(depth: int, ep, ids_BT: torch.Tensor, answers_BQ: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        R_star = math.ceil(depth / ops_per_iteration)
        q_halt = ep.read_positions.numel() - 1  # read rows: answers, the halting query[, the last operation]
        reads_Q = ep.read_positions
        if pending_id is not None:
            reads_Q = torch.cat([reads_Q, ep.op_positions[-1:].to(reads_Q.dtype)])
        def per_iteration(k: int, logits_BQV: torch.Tensor) -> torch.Tensor:
            """What is kept of iteration k's read-out: (3, B) float32 rows answer right (0/1), P(Yes), 1 − P(pending)
            (0 without ``pending_id``)."""
            right_B = (logits_BQV[:, :q_halt].argmax(-1) == answers_BQ).all(-1)
            p_B = p_yes(logits_BQV[:, q_halt], halt)
            done_B = (1.0 - logits_BQV[:, q_halt + 1].float().softmax(-1)[..., pending_id] if pending_id is not None
                      else torch.zeros_like(p_B))
            return torch.stack([right_B.to(p_B.dtype), p_B, done_B])

        kept_R3B = model_fn(ids_BT, reads_Q.to(device), R_max, None, 1.0, "all", reduce=per_iteration).reduced_K
        right_RB, p_RB = kept_R3B[:, 0] > 0.5, kept_R3B[:, 1]
        # per signal s (query[, pending]) and rule x: the counts of _rule_counts; one all-reduce for both signals
        counts_SX7 = torch.zeros(signals, X, 7, dtype=torch.float64, device=device)
        counts_SX7[0] += _rule_counts(right_RB, p_RB, rules, R_star)
        if pending_id is not None:
            counts_SX7[1] += _rule_counts(right_RB, kept_R3B[:, 2], rules, R_star)
        # per iteration: Σ P(Yes) and sequences right, in one tensor (one all-reduce for both)
        return counts_SX7, torch.stack([p_RB.double().sum(1), right_RB.double().sum(1)])

    results: dict[int, dict] = {}
    summed = sum_over_test_sets(task, eval_cfg, counts, device, rank, world_size, reduce_sum,
                             prepare=lambda ep: with_halt_query(ep, halt.query), progress=progress)
    for depth, (counts_SX7, sums_2R) in summed.items():
        n = counts_SX7[0, 0, 6].clamp_min(1)
        per_rule = [_rule_stats(c, n) for c in counts_SX7[0]]
        best_iter, best_right = best_iteration(sums_2R[1])
        results[depth] = {
            **per_rule[0],
            "n": n.item(),
            "oracle_acc": (counts_SX7[0, 0, 1] / n).item(),
            "best_acc": best_right / n.item(),
            "best_iter": best_iter,
            "p_yes_k": (sums_2R[0] / n).tolist(),
            "rules": dict(zip(rules[1:], per_rule[1:])),
        }
        if pending_id is not None:
            results[depth]["pending"] = dict(zip(rules, (_rule_stats(c, n) for c in counts_SX7[1])))
    return results


def best_iteration(right_R: torch.Tensor) -> tuple[int, float]:
    """The oracle best fixed R of one test depth: the iteration with the most sequences right.

    Args:
        right_R: (R_max,) sequences (of the whole test set: summed over chunks and ranks *before* this call, since
            the max of per-rank counts is not the max of their sum) whose full answer is right after iteration
            1..R_max (row r = iteration r + 1).
    Returns:
        ``(R, right)``: the 1-based iteration (ties: the smallest R) and its count (a float, e.g. 231.0).
    Raises:
        ValueError: ``right_R`` is not a non-empty vector.
    """
    if right_R.ndim != 1 or right_R.numel() < 1:
        raise ValueError(f"right_R: must be (R_max >= 1,), got shape {tuple(right_R.shape)}")
    right = right_R.tolist()
    r = max(range(len(right)), key=lambda i: (right[i], -i))  # the most right, then the smallest R
    return r + 1, float(right[r])


def _rule_counts(right_RB: torch.Tensor, p_RB: torch.Tensor, rules: Sequence[tuple[int, int, float]],
                 R_star: int) -> torch.Tensor:
    """(X, 7) float64 counts of one chunk for each rule x applied to the stopping signal ``p_RB`` (R_max, B): halt
    right, oracle right, never halted, Σ R, Σ (R − R*), Σ (R − R*)², sequences (``right_RB``: (R_max, B) whether the
    answer after each iteration is right)."""
    R_XB, halted_XB = _k_of_n(p_RB, rules)
    dR_XB = (R_XB - R_star).double()
    X, B = R_XB.shape
    return torch.stack([
        right_RB.gather(0, R_XB - 1).sum(1).double(), right_RB[R_star - 1].sum().double().expand(X),
        (~halted_XB).sum(1).double(), R_XB.sum(1).double(), dR_XB.sum(1), dR_XB.pow(2).sum(1),
        torch.full((X,), float(B), dtype=torch.float64, device=right_RB.device)], dim=1)


def _rule_stats(counts_7: torch.Tensor, n: torch.Tensor) -> dict[str, float]:
    """One rule's row of :func:`halting_by_depth`'s counts → halt_acc, never_halted, halt_iter, dR_mean, dR_std."""
    dR_mean = (counts_7[4] / n).item()
    return {
        "halt_acc": (counts_7[0] / n).item(),
        "never_halted": (counts_7[2] / n).item(),
        "halt_iter": (counts_7[3] / n).item(),
        "dR_mean": dR_mean,
        "dR_std": math.sqrt(max((counts_7[5] / n).item() - dR_mean**2, 0.0)),
    }


def halting_metrics(results: Mapping[int, Mapping], ops_per_iteration: int) -> dict[str, float]:
    """Flat metric names of :func:`halting_by_depth`'s results, the names ``analysis`` reads
    (``par_ray.tracking_schema.depth_metric`` / ``iteration_metric`` build them).

    Per test depth D: ``oracle_acc_d{D}`` (R = ⌈d/c⌉), ``best_acc_d{D}`` (the oracle best fixed R, a fraction) and
    ``best_iter_d{D}`` (that R); for the primary rule (eval.halt_k, eval.halt_n, eval.halt_tau): ``halt_acc_d{D}``
    (a fraction), ``halt_gap_d{D}`` (oracle − halting, in accuracy points), ``halt_iter_d{D}`` (mean chosen R),
    ``halt_dR_mean_d{D}``, ``halt_dR_std_d{D}`` (R − ⌈d/c⌉), ``never_halted_d{D}`` (fraction). For each extra rule
    (k, n, τ) of ``eval.halt_rules``: the same names but ``oracle_acc``, ``best_acc`` and ``best_iter`` (which no
    rule changes), each followed by ``_`` and ``par_ray.tracking_schema.rule_suffix``, e.g.
    ``halt_acc_d32_k4n8t0.3``, ``halt_gap_d32_k4n8t0.3``, ``never_halted_d32_k8n8t0.5``. Curve: ``halt_prob_k{K}``,
    mean P(Yes) after iteration K on the first (shallowest) test depth, for K = 1 … min(R_max, 2 ⌈d/c⌉). d50 and G
    of these curves: :func:`stopping_extrapolation`.

    Pending signal (results with ``"pending"``, i.e. :func:`halting_by_depth` given ``pending_id``; a par_ray signal,
    not the paper's read-out, docs/experiments.md §14): every rule name above but ``oracle_acc``, ``best_acc`` and
    ``best_iter`` (shared by both signals) once more, with ``_pending`` appended after everything else:
    ``halt_acc_d{D}_pending``, ``halt_gap_d{D}_pending`` (against the same ``oracle_acc_d{D}``),
    ``halt_iter_d{D}_pending``, ``halt_dR_mean_d{D}_pending``, ``halt_dR_std_d{D}_pending``,
    ``never_halted_d{D}_pending`` for the primary rule, ``halt_acc_d32_k4n8t0.3_pending`` and so on for each extra
    rule. Results without ``"pending"`` give none of these names.
    """
    out: dict[str, float] = {}
    for d, v in results.items():
        out[depth_metric("oracle_acc", d)] = v["oracle_acc"]
        if "best_acc" in v:
            out[depth_metric("best_acc", d)] = v["best_acc"]
            out[depth_metric("best_iter", d)] = float(v["best_iter"])
        extra = v.get("rules", {})
        signals = [(False, [(None, v), *extra.items()])]
        if "pending" in v:
            pending = v["pending"]
            primary = next(iter(pending))  # halting_by_depth lists the primary rule first
            signals.append((True, [(None, pending[primary]), *((rule, pending[rule]) for rule in extra)]))
        for is_pending, rows in signals:
            for rule, r in rows:
                def name(kind: str) -> str:
                    return depth_metric(kind, d, rule, is_pending)

                out[name("halt_acc")] = r["halt_acc"]
                out[name("halt_gap")] = 100.0 * (v["oracle_acc"] - r["halt_acc"])
                out[name("halt_iter")] = r["halt_iter"]
                out[name("halt_dR_mean")] = r["dR_mean"]
                out[name("halt_dR_std")] = r["dR_std"]
                out[name("never_halted")] = r["never_halted"]
    if results:
        first = min(results)
        curve = results[first]["p_yes_k"][: 2 * math.ceil(first / ops_per_iteration)]
        out.update({iteration_metric("halt_prob", k): p for k, p in enumerate(curve, start=1)})
    return out


def stopping_extrapolation(results: Mapping[int, Mapping], chance: float, train_depth: int, resamples: int = 0,
                           seed: int = 0) -> dict[str, Extrapolation]:
    """d50 and G (:func:`extrapolation`) of every stopping :func:`halting_by_depth` measured, beside the
    R = ⌈d/c⌉ curve of :func:`accuracy_by_depth` (which gives ``G`` itself):

    - ``"halt"``: the model's own stopping, the primary rule (``eval.halt_k/n/tau``) on P(Yes) of the halting query
      (``halt_acc`` at every depth);
    - ``"best"``: the oracle best fixed R per depth (``best_acc``);
    - ``"halt_pending"``: the primary rule on the pending signal, when the results have it (``recipe.dense_pending``).

    With ``resamples`` > 0 each also gets its 95 % bootstrap intervals (:func:`extrapolation_from_counts`, from each
    depth's ``n`` test sequences; the best fixed R's is that of its count at the chosen R, not of the choice).

    Args:
        results: :func:`halting_by_depth`'s ``{d: {...}}``.
        chance, train_depth: as in :func:`extrapolation`.
        resamples, seed: ``eval.bootstrap_resamples``, ``eval.seed``.
    Returns:
        ``{stopping: Extrapolation}`` (``par_ray.tracking_schema.STOPPINGS`` names), empty for empty results.
    Raises:
        ValueError: as :func:`extrapolation`.
    """
    if not results:
        return {}
    curves = {"halt": {d: v["halt_acc"] for d, v in results.items()},
              "best": {d: v["best_acc"] for d, v in results.items()}}
    if all("pending" in v for v in results.values()):
        # halting_by_depth lists the primary rule first
        curves["halt_pending"] = {d: next(iter(v["pending"].values()))["halt_acc"] for d, v in results.items()}
    if not resamples or not all("n" in v for v in results.values()):
        return {s: extrapolation(c, chance, train_depth) for s, c in curves.items()}
    return {s: extrapolation_from_counts({d: (round(acc * results[d]["n"]), results[d]["n"]) for d, acc in c.items()},
                                         chance, train_depth, resamples, seed) for s, c in curves.items()}


def extrapolation_metrics(ex: Extrapolation, stopping: str = "ceil") -> dict[str, float]:
    """The MLflow metrics of one curve's d50 and G (names: ``par_ray.tracking_schema.g_metric``): G, G_censored
    (1.0 when censored, else 0.0), G_interp (floats; G and G_interp are lower bounds when censored), and d50,
    d50_interp (test depths) unless censored. ``stopping`` ``"ceil"`` (R = ⌈d/c⌉) gives the names ``G``, ``d50``, …;
    ``"halt"`` gives ``G_halt``, ``d50_halt``, ….

    With an interval (``ex.interval``, 95 %): ``G_lo``, ``G_hi``, ``G_interp_lo``, ``G_interp_hi`` (lower bounds,
    max tested depth / d_train, where censored), ``G_hi_censored`` (1.0 when the upper bounds lie past the largest
    tested depth), and ``d50_lo``, ``d50_interp_lo`` unless the lower bounds are censored, ``d50_hi``,
    ``d50_interp_hi`` unless the upper bounds are (``G_halt_lo``, ``d50_halt_interp_hi``, … for another stopping)."""
    out = {g_metric("G", stopping): ex.G, g_metric("G_censored", stopping): float(ex.censored),
           g_metric("G_interp", stopping): ex.G_interp}
    if ex.d50 is not None:
        out[g_metric("d50", stopping)] = float(ex.d50)
        out[g_metric("d50_interp", stopping)] = ex.d50_interp
    iv = ex.interval
    if iv is not None:
        out.update({g_metric(k, stopping): getattr(iv, k) for k in ("G_lo", "G_hi", "G_interp_lo", "G_interp_hi")})
        out[g_metric("G_hi_censored", stopping)] = float(iv.hi_censored)
        for end, censored in (("lo", iv.lo_censored), ("hi", iv.hi_censored)):
            if not censored:
                out.update({g_metric(f"{k}_{end}", stopping): getattr(iv, f"{k}_{end}") for k in ("d50", "d50_interp")})
    return out


def extrapolation_from_metrics(metrics: Mapping[str, float], stopping: str = "ceil") -> Extrapolation | None:
    """The :class:`Extrapolation` that :func:`extrapolation_metrics` logged for ``stopping`` (its interval too when
    logged), read back from a run's metrics (``chance`` gives the midpoint); ``None`` when its G was not logged."""
    def get(kind: str):
        return metrics.get(g_metric(kind, stopping))

    if get("G") is None:
        return None
    interval = None
    if get("G_lo") is not None:
        hi_censored = bool(get("G_hi_censored"))
        lo_censored = get("d50_lo") is None
        interval = ExtrapolationInterval(level=0.95, resamples=0, d50_lo=get("d50_lo"), d50_hi=get("d50_hi"),
                                         d50_interp_lo=get("d50_interp_lo"), d50_interp_hi=get("d50_interp_hi"),
                                         G_lo=get("G_lo"), G_hi=get("G_hi"), G_interp_lo=get("G_interp_lo"),
                                         G_interp_hi=get("G_interp_hi"), lo_censored=lo_censored,
                                         hi_censored=hi_censored)
    d50 = get("d50")
    return Extrapolation(d50=int(d50) if d50 is not None else None, G=get("G"), censored=bool(get("G_censored")),
                         midpoint=(metrics.get("chance", math.nan) + 1) / 2, d50_interp=get("d50_interp"),
                         G_interp=get("G_interp"), interval=interval)
