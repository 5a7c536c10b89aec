"""G with its uncertainty (issue 37): adaptive sampling near the midpoint crossing and the bootstrap intervals of d50,
G and the interpolated G (``par_ray.evaluation``).

Synthetic models of known accuracy: a per-depth Bernoulli curve p(d), so the true first-crossing d50 and the true
interpolated d50 are known, and a fake task whose "model" answers a row right with probability p(d), decided by a
hash of the row's (depth, block, index), so every count is reproducible.
"""

import math
import threading

import numpy as np
import pytest
import torch

from par_ray.config import EvalConfig, from_flat
from par_ray.evaluation import (bracketing_depths, extrapolation, extrapolation_from_counts, extrapolation_interval,
                                extrapolation_metrics, format_interval, next_bracket_depth, sum_over_test_sets,
                                wilson_interval)
from par_ray.presets import LOCAL_CURRICULUM, local_trial
from par_ray.tasks import get_task
from par_ray.tasks.common import Episode
from par_ray.tracking_schema import INTERVAL_KINDS, g_metric
from par_ray.trial import validate

CHANCE = 1 / 120
MID = (1 + CHANCE) / 2
GRID = (16, 20, 24, 29, 34, 40, 48, 58, 64, 80, 96, 128)


def logistic(center: float, width: float) -> dict[int, float]:
    """p(d) falling from 1 to chance, through the midpoint at ``center``."""
    return {d: CHANCE + (1 - CHANCE) / (1 + math.exp((d - center) / width)) for d in GRID}


# --------------------------------------------------------------------------------------------------------------------
# the bootstrap interval


def _coverage(p: dict[int, float], n0: int, ev: EvalConfig, reps: int, seed: int) -> tuple[float, float]:
    """Fraction of ``reps`` simulated evaluations (first pass of ``n0`` per depth, then adaptive sampling under
    ``ev`` with the decisions of ``next_bracket_depth``) whose 95 % interval holds the true first-crossing d50, and
    the true interpolated d50."""
    true = extrapolation(p, CHANCE, 16)
    rng = np.random.default_rng(seed)
    hit = hit_interp = 0
    for r in range(reps):
        counts = {d: (float(rng.binomial(n0, p[d])), float(n0)) for d in GRID}
        added = 0
        while (d := next_bracket_depth(counts, MID, ev, added)) is not None:
            right, n = counts[d]
            counts[d] = (right + rng.binomial(ev.bracket_block, p[d]), n + ev.bracket_block)
            added += ev.bracket_block
        iv = extrapolation_interval(counts, CHANCE, 16, resamples=1000, seed=r)
        hit += (iv.d50_lo or math.inf) <= true.d50 <= (iv.d50_hi or math.inf)
        hit_interp += (iv.d50_interp_lo or math.inf) <= true.d50_interp <= (iv.d50_interp_hi or math.inf)
    return hit / reps, hit_interp / reps


ADAPTIVE = EvalConfig(bracket_max_sequences=1024, bracket_min_sequences=512, bracket_block=128)


@pytest.mark.parametrize("center, ev", [(50.0, EvalConfig()), (50.0, ADAPTIVE), (48.3, EvalConfig()),
                                        (48.3, ADAPTIVE)],
                         ids=["smooth", "smooth-adaptive", "near-tie", "near-tie-adaptive"])
def test_interval_covers_the_true_d50_at_about_the_nominal_rate(center, ev):
    """400 evaluations of a model of known accuracy (128 sequences per depth; with adaptive sampling >= 512 at the
    bracketing depths): the 95 % interval of the interpolated d50 holds the true one in 90–99.5 % of them (4 standard
    errors of 400 draws around 95 %), that of the first-crossing d50 in at least 93 % (d50 takes grid values, so its
    percentile interval is conservative). ``center`` 48.3 puts p(48) = 0.517 just above the midpoint 0.504: a near
    tie, where the first crossing jumps between 48 and 58 on sampling noise. Fixed seeds: the same numbers every run
    (measured 0.95 / 0.98 / 0.96 / 0.94 for the interpolated d50)."""
    first, interp = _coverage(logistic(center, 6.0), 128, ev, reps=400, seed=int(center * 10))
    assert 0.90 <= interp <= 0.995, interp
    assert first >= 0.93, first


def test_interval_is_reproducible_and_narrows_with_more_sequences():
    p = logistic(50.0, 6.0)
    few = {d: (round(128 * p[d]), 128) for d in GRID}
    many = {d: (round(1024 * p[d]), 1024) for d in GRID}
    a, b = (extrapolation_interval(few, CHANCE, 16, 1000, seed=7) for _ in range(2))
    assert a == b  # a fixed seed: the same interval
    c = extrapolation_interval(many, CHANCE, 16, 1000, seed=7)
    assert c.d50_interp_hi - c.d50_interp_lo < a.d50_interp_hi - a.d50_interp_lo
    assert a.G_interp_lo == a.d50_interp_lo / 16 and a.G_hi == a.d50_hi / 16
    assert a.d50_interp_lo < extrapolation({d: r / n for d, (r, n) in few.items()}, CHANCE, 16).d50_interp \
        < a.d50_interp_hi


def test_a_curve_that_may_never_cross_has_a_censored_upper_bound():
    # 0.55 at the last depth from 64 sequences: some resamples stay above the midpoint everywhere
    counts = {16: (64, 64), 32: (50, 64), 64: (35, 64)}
    iv = extrapolation_interval(counts, CHANCE, 16, 1000, seed=0)
    assert iv.hi_censored and iv.d50_hi is None and iv.G_hi == 4.0 and iv.G_interp_hi == 4.0
    assert not iv.lo_censored and iv.d50_lo == 64
    ex = extrapolation_from_counts(counts, CHANCE, 16, 1000, 0)
    assert format_interval(ex) == "[4.00, ≥ 4.00]" and ex.censored
    m = extrapolation_metrics(ex)
    assert m["G_hi_censored"] == 1.0 and "d50_hi" not in m and "d50_interp_hi" not in m and m["d50_lo"] == 64
    # every stopping gets the same names, with its own infix
    assert {g_metric(k, "halt") for k in INTERVAL_KINDS} >= {"G_halt_lo", "G_halt_interp_hi", "d50_halt_interp_lo",
                                                              "G_halt_hi_censored"}


def test_no_resamples_no_interval():
    ex = extrapolation_from_counts({16: (60, 64), 32: (10, 64)}, CHANCE, 16, resamples=0)
    assert ex.interval is None and format_interval(ex) == ""
    assert not set(extrapolation_metrics(ex)) & set(INTERVAL_KINDS)


@pytest.mark.parametrize("kwargs, field", [
    (dict(counts={}), "counts"), (dict(counts={16: (3, 0)}), "counts"), (dict(counts={16: (5, 4)}), "counts"),
    (dict(resamples=0), "resamples"), (dict(level=1.0), "level"), (dict(train_depth=0), "train_depth"),
])
def test_interval_rejects_bad_input(kwargs, field):
    args = dict(counts={16: (3, 4)}, chance=CHANCE, train_depth=16, resamples=10, seed=0, level=0.95) | kwargs
    with pytest.raises(ValueError, match=field):
        extrapolation_interval(**args)


# --------------------------------------------------------------------------------------------------------------------
# where adaptive sampling draws


def test_bracketing_depths_follow_the_first_crossing_rule():
    assert bracketing_depths({4: (9, 10), 5: (6, 10), 6: (4, 10), 7: (9, 10)}, 0.5) == (5, 6)
    assert bracketing_depths({4: (2, 10), 5: (1, 10)}, 0.5) == (4,)  # below from the first depth
    assert bracketing_depths({5: (9, 10), 4: (9, 10)}, 0.5) == (5,)  # never below: the largest depth
    assert bracketing_depths({4: (5, 10), 5: (4, 10)}, 0.5) == (4, 5)  # at the midpoint counts as above


class FakeTask:
    """A task whose rows carry (depth, block, index); its "model" (:func:`fake_counts`) answers a row right with
    probability p(depth), decided by a hash of the row, or with probability ``first_pass[d]`` on the first pass's
    rows at the depths it names (a first pass that misleads)."""

    full_state_chance = 0.0  # midpoint 0.5

    def __init__(self, p: dict[int, float], first_pass: dict[int, float] | None = None):
        self.p, self.first_pass, self.drawn = p, first_pass or {}, []

    def sample(self, depth: int, n: int, seed: int, step: int = 0) -> Episode:
        self.drawn.append((depth, n, step))
        ids = torch.stack([torch.full((n,), depth), torch.full((n,), step), torch.arange(n)], dim=1)
        return Episode(input_ids=ids, read_positions=torch.tensor([0]), states=torch.zeros(n, depth, 1,
                                                                                           dtype=torch.long),
                       depth=depth)


def fake_counts(task: FakeTask):
    def counts(depth, ep, ids_BT, answers_BQ):
        u = (ids_BT[:, 0] * 7919 + ids_BT[:, 1] * 104729 + ids_BT[:, 2] * 1299709) % 10007 / 10007.0
        first = ids_BT[:, 1] == 0
        p = torch.where(first, task.first_pass.get(depth, task.p[depth]), task.p[depth])
        return torch.stack([(u < p).double().sum(), torch.tensor(float(ids_BT.shape[0]), dtype=torch.float64)])

    return counts


def _run(task, ev, **kw):
    out = sum_over_test_sets(task, ev, fake_counts(task), torch.device("cpu"),
                             score=lambda c: (c[0][0].item(), c[0][1].item()), **kw)
    return {d: (c[0].item(), c[1].item()) for d, (c,) in out.items()}


def test_adaptive_sampling_stops_once_the_bracket_excludes_the_midpoint():
    task = FakeTask({4: 0.95, 5: 0.9, 6: 0.62, 7: 0.35, 8: 0.1})
    ev = EvalConfig(depths=(4, 5, 6, 7, 8), num_sequences=16, batch_size=16, bracket_max_sequences=4096,
                    bracket_block=16)
    counts = _run(task, ev)
    assert {d: n for d, (_, n) in counts.items() if n > 16}.keys() == {6, 7}  # only the bracket got more
    for d in (6, 7):
        right, n = counts[d]
        lo, hi = wilson_interval(right / n, round(n))
        assert not lo <= 0.5 <= hi and n < 4096  # stopped by the interval, not the cap
    assert next_bracket_depth(counts, 0.5, ev, 0) is None
    # blocks are steps 1, 2, … of their depth, in order
    steps = [s for d, n, s in task.drawn if d == 6]
    assert steps == list(range(len(steps))) and all(n == 16 for d, n, s in task.drawn if s > 0)


def test_adaptive_sampling_stops_at_the_cap():
    task = FakeTask({4: 0.95, 5: 0.5, 6: 0.49, 7: 0.1})
    ev = EvalConfig(depths=(4, 5, 6, 7), num_sequences=32, batch_size=64, bracket_max_sequences=32 + 5 * 48,
                    bracket_block=48)
    counts = _run(task, ev)
    assert counts[4][1] == counts[7][1] == 32
    # 5 and 6 sit on the midpoint: each takes blocks until one more would pass the cap, whatever the crossing does
    assert {counts[5][1], counts[6][1]} <= {32 + 5 * 48, 32 + 4 * 48}
    assert max(counts[5][1], counts[6][1]) == 32 + 5 * 48
    assert sum(n for _, n in counts.values()) - 4 * 32 <= 2 * ev.bracket_max_sequences


def test_the_minimum_is_drawn_even_where_the_interval_already_excludes_the_midpoint():
    task = FakeTask({4: 1.0, 5: 0.99, 6: 0.02, 7: 0.0})
    ev = EvalConfig(depths=(4, 5, 6, 7), num_sequences=32, batch_size=32, bracket_max_sequences=512,
                    bracket_min_sequences=100, bracket_block=32)
    counts = _run(task, ev)
    assert {d: n for d, (_, n) in counts.items()} == {4: 32, 5: 128, 6: 128, 7: 32}  # 32 + 3 blocks >= 100


def test_adaptive_sampling_follows_a_crossing_that_more_data_moves():
    """The first pass reads depth 6 low (its rows right with probability 0.2, the model's true accuracy there being
    0.8): the bracket is (5, 6). The blocks that give 6 its minimum show it above the midpoint, so the crossing moves
    to 8, and the new bracket (7, 8) is sampled in turn; 4 and 9 never are."""
    task = FakeTask({4: 0.95, 5: 0.9, 6: 0.8, 7: 0.6, 8: 0.3, 9: 0.1}, first_pass={6: 0.2})
    ev = EvalConfig(depths=(4, 5, 6, 7, 8, 9), num_sequences=16, batch_size=16, bracket_max_sequences=256,
                    bracket_min_sequences=64, bracket_block=16)
    first = {d: (right, n) for d, (right, n) in _run(FakeTask(task.p, task.first_pass),
                                                    EvalConfig(depths=ev.depths, num_sequences=16)).items()}
    assert bracketing_depths(first, 0.5) == (5, 6)  # what the first pass alone reads
    counts = _run(task, ev)
    blocks = {d: sum(1 for dd, _, s in task.drawn if dd == d and s > 0) for d in ev.depths}
    assert blocks[5] > 0 and blocks[6] > 0 and blocks[7] > 0 and blocks[8] > 0 and blocks[4] == blocks[9] == 0
    assert counts[6][0] / counts[6][1] > 0.5  # 6 ends above the midpoint
    assert bracketing_depths(counts, 0.5) == (7, 8)


def test_adaptive_sampling_is_off_without_a_cap_or_a_score():
    task = FakeTask({4: 0.6, 5: 0.4})
    ev = EvalConfig(depths=(4, 5), num_sequences=16, batch_size=16)
    _run(task, ev)
    sum_over_test_sets(task, EvalConfig(depths=(4, 5), num_sequences=16, bracket_max_sequences=64, bracket_block=16),
                       fake_counts(task), torch.device("cpu"))  # no score: nothing to find a crossing of
    assert all(step == 0 for _, _, step in task.drawn)


def test_ranks_take_the_same_decisions_and_sum_to_one_process():
    """Two ranks (threads with an all-reduce): each makes the same forward calls, draws the same blocks, and their
    summed counts are a single process's."""
    p = {4: 0.95, 5: 0.9, 6: 0.6, 7: 0.4, 8: 0.1}
    ev = EvalConfig(depths=(4, 5, 6, 7, 8), num_sequences=24, batch_size=8, bracket_max_sequences=1000,
                    bracket_min_sequences=200, bracket_block=40)
    single = _run(FakeTask(p), ev)
    barrier, slots, out, calls = threading.Barrier(2), [None, None], [None, None], [[], []]

    def all_reduce(rank, t):
        slots[rank] = t
        barrier.wait()
        total = slots[0] + slots[1]
        barrier.wait()
        return total

    def worker(rank):
        task = FakeTask(p)
        counts = fake_counts(task)

        def counting(*a):
            calls[rank].append(a[0])
            return counts(*a)

        res = sum_over_test_sets(task, ev, counting, torch.device("cpu"), rank=rank, world_size=2,
                                 reduce_sum=lambda t: all_reduce(rank, t),
                                 score=lambda c: (c[0][0].item(), c[0][1].item()))
        out[rank] = {d: (c[0].item(), c[1].item()) for d, (c,) in res.items()}

    threads = [threading.Thread(target=worker, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out[0] == out[1] == single
    assert calls[0] == calls[1]  # the same forward calls, depth by depth


def test_blocks_are_fresh_sequences_of_their_own_stream():
    """A block is ``task.sample(d, bracket_block, eval.seed, step=j)``; no block row repeats a first-pass row, another
    block's row or a training row (the trial seeds' batches at d_train, the test depth training reaches)."""
    task = get_task("swap_s5")
    d = LOCAL_CURRICULUM["task.train_depth"]
    ev = EvalConfig(depths=(d,), num_sequences=128, seed=10_000)
    rows = {}
    for step in range(5):  # the first pass (step 0) and 4 blocks of 128
        ep = task.sample(d, 128, seed=ev.seed, step=step)
        for r in ep.input_ids.tolist():
            assert tuple(r) not in rows, (step, rows.get(tuple(r)))
            rows[tuple(r)] = step
    for seed in range(5):
        for step in range(0, 1500, 25):
            assert not any(tuple(r) in rows for r in task.sample(d, 64, seed=seed, step=step).input_ids.tolist())


# --------------------------------------------------------------------------------------------------------------------
# configuration


@pytest.mark.parametrize("flat, field", [
    ({"eval.bracket_max_sequences": -1}, "eval.bracket_max_sequences"),
    ({"eval.bracket_min_sequences": -1}, "eval.bracket_min_sequences"),
    ({"eval.bracket_min_sequences": 600, "eval.bracket_max_sequences": 512}, "eval.bracket_min_sequences"),
    ({"eval.bracket_min_sequences": 64, "eval.bracket_max_sequences": 0}, "eval.bracket_min_sequences"),
    ({"eval.bracket_block": 0}, "eval.bracket_block"),
    ({"eval.bootstrap_resamples": 50}, "eval.bootstrap_resamples"),
    ({"eval.bootstrap_resamples": -1}, "eval.bootstrap_resamples"),
    ({"eval.bracket_block": "x"}, "eval.bracket_block"),
])
def test_bad_adaptive_settings_are_one_error_naming_the_field(flat, field):
    with pytest.raises(ValueError, match=rf"{field}"):
        validate(from_flat({k: str(v) for k, v in flat.items()}, base=local_trial()))


def test_presets_sample_near_the_crossing():
    from par_ray.presets import paper_trial, smoke_overrides

    for cfg in (local_trial(), from_flat(LOCAL_CURRICULUM, base=local_trial()), paper_trial()):
        ev = validate(cfg).eval
        assert ev.bracket_max_sequences >= 4 * ev.num_sequences_fine and ev.bootstrap_resamples >= 1000
    smoke = validate(from_flat(smoke_overrides(local_trial()), base=local_trial())).eval
    assert 0 < smoke.bracket_max_sequences <= 64  # the smoke test exercises it, cheaply


def test_eval_progress_adds_a_block_near_the_crossing_to_the_work_it_knows():
    from par_ray.evaluation import EvalProgress

    lines, now = [], [0.0]
    progress = EvalProgress(lines.append, "accuracy", (4, 8), iterations=lambda d: 1, every_s=1,
                            clock=lambda: now[0], sequences={4: 10, 8: 10}.get)
    now[0] = 36.0
    progress(4, 1, 1)
    progress(8, 1, 1)  # the first pass: 10·4 + 10·8 = 120 units, done
    now[0] = 60.0
    progress(8, 1, 2, 10)  # a block of 10 at d = 8 (80 units) in 2 batches: 160 of 200 done in 60 s
    assert lines[-1] == ("evaluation (accuracy): d=8 +10 near the crossing batch 1/2, depth 2/2, 1m00s elapsed, "
                         "ETA ~15s")
