"""Tests of par_ray.tasks: the permutation family against an independent reference (5×5 permutation matrices composed
in a plain loop) with its token layout, move sets and parity; and, for every registered task, the shared layout
conventions, determinism by (task, depth, seed, step), distinct streams, empirical chance levels (a random guesser
over 10⁴ sequences within 3 σ), the registry and the paper depths. The other families' reference checkers are in
tests/test_tasks_*.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from par_ray.tasks import PAPER_DEPTHS, TASKS, Episode, Task, get_task
from par_ray.trial import validate

NAMES = ("swap_s5", "s5", "a5")
"""The permutation word problems (permutations.py)."""
ALL_NAMES = tuple(TASKS)


def permutation_matrix(perm):
    """P with P[p, perm[p]] = 1, so that (P @ S)[p] = S[perm[p]]: the row of position p moves to position p."""
    matrix = [[0] * 5 for _ in range(5)]
    for p, src in enumerate(perm):
        matrix[p][src] = 1
    return matrix


def matmul(a, b):
    return [[sum(a[i][k] * b[k][j] for k in range(5)) for j in range(5)] for i in range(5)]


def determinant(m):
    """Laplace expansion; ±1 on permutation matrices (sign of the permutation)."""
    if len(m) == 1:
        return m[0][0]
    return sum((-1) ** j * m[0][j] * determinant([row[:j] + row[j + 1 :] for row in m[1:]]) for j in range(len(m)))


def reference_moves(name):
    """The canonical move lists, rebuilt here from the spec: matrices in token order."""
    if name == "swap_s5":
        perms = [tuple(range(5))]
        for i, j in itertools.combinations(range(5), 2):
            p = list(range(5))
            p[j], p[i] = i, j
            perms.append(tuple(p))
    else:
        perms = list(itertools.permutations(range(5)))
    matrices = [permutation_matrix(p) for p in perms]
    if name == "a5":
        matrices = [m for m in matrices if determinant(m) == 1]
    return matrices


def reference_states(task, episode, row):
    """Full 5×5 one-hot state (S[position][object]) after every prefix of one row, by matrix composition."""
    moves = reference_moves(task.name)
    state = [[int(p == o) for o in range(5)] for p in range(5)]
    out = []
    for k in range(episode.depth):
        token = int(episode.input_ids[row, 1 + k])
        state = matmul(moves[task.move_token_ids.index(token)], state)
        out.append(state)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_states_match_reference(name):
    task = TASKS[name]
    episode = task.sample(depth=12, n=4, seed=3, step=5)
    for row in range(4):
        for k, state in enumerate(reference_states(task, episode, row)):
            for q, position in enumerate(task.query_positions):
                obj = state[position].index(1)
                assert int(episode.states[row, k, q]) == task.answer_token_ids[obj], (row, k, q)


@pytest.mark.parametrize("name", NAMES)
def test_layout_shapes_and_dtypes(name):
    task = TASKS[name]
    d, n = 7, 16
    episode = task.sample(depth=d, n=n, seed=0)
    q = task.num_queries
    assert isinstance(episode, Episode) and isinstance(task, Task) and episode.depth == d
    assert episode.input_ids.shape == (n, d + 2 + q) and episode.input_ids.dtype == torch.int64
    assert episode.states.shape == (n, d, q) and episode.states.dtype == torch.int64
    assert episode.read_positions.dtype == torch.int64
    assert episode.read_positions.tolist() == list(range(d + 2, d + 2 + q))
    ids = episode.input_ids
    assert (ids[:, 0] == 0).all() and (ids[:, d + 1] == 1).all()
    assert (ids[:, episode.read_positions] == torch.tensor(task.query_token_ids)).all()
    assert torch.isin(ids[:, 1 : d + 1], torch.tensor(task.move_token_ids)).all()
    assert 0 <= int(ids.min()) and int(ids.max()) < task.vocab_size
    assert torch.isin(episode.states, torch.tensor(task.answer_token_ids)).all()
    assert max(task.answer_token_ids) < task.vocab_size and len(task.answer_token_ids) == 5
    roles = [{0, 1}, set(task.answer_token_ids), set(task.query_token_ids), set(task.move_token_ids)]
    assert sum(map(len, roles)) == len(set().union(*roles)) == task.vocab_size


def test_move_sets():
    swap = TASKS["swap_s5"]
    fixed_points = sorted(sum(p == m for p, m in enumerate(move)) for move in swap.moves)
    assert fixed_points == [3] * 10 + [5]  # 10 transpositions and the identity
    assert len(set(swap.moves)) == 11 and swap.vocab_size == 23
    assert len(set(TASKS["s5"].moves)) == 120 and TASKS["s5"].vocab_size == 128
    assert len(set(TASKS["a5"].moves)) == 60 and TASKS["a5"].vocab_size == 68
    assert all(determinant(permutation_matrix(m)) == 1 for m in TASKS["a5"].moves)
    for name in NAMES:  # every move symbol is drawn
        drawn = TASKS[name].sample(depth=4, n=512, seed=0).input_ids[:, 1:5].unique()
        assert drawn.tolist() == list(TASKS[name].move_token_ids)


def test_parity():
    a5 = TASKS["a5"]
    episode = a5.sample(depth=9, n=3, seed=1)
    for row in range(3):
        assert all(determinant(s) == 1 for s in reference_states(a5, episode, row))
    # swap_s5 shows the full state; thanks to the identity move, both parities occur at a fixed depth.
    states = TASKS["swap_s5"].sample(depth=6, n=256, seed=0).states[:, -1, :] - 2
    assert (states.sort(dim=1).values == torch.arange(5)).all()
    signs = {determinant(permutation_matrix(s)) for s in states.tolist()}
    assert signs == {1, -1}


@pytest.mark.parametrize("name", NAMES)
def test_determinism_and_independent_streams(name):
    task = TASKS[name]
    a, b = task.sample(depth=8, n=64, seed=0, step=2), get_task(name).sample(depth=8, n=64, seed=0, step=2)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.states, b.states)
    ops = lambda ep: ep.input_ids[:, 1 : ep.depth + 1]  # noqa: E731
    others = [
        task.sample(depth=8, n=64, seed=1, step=2),
        task.sample(depth=8, n=64, seed=0, step=3),
        task.sample(depth=8, n=64, seed=0),
    ]
    for other in others:
        assert not torch.equal(ops(a)[:, 0], ops(other)[:, 0])
    deeper = task.sample(depth=9, n=64, seed=0, step=2)
    assert not torch.equal(ops(deeper)[:, :8], ops(a)) and not torch.equal(ops(deeper)[:, 0], ops(a)[:, 0])


@pytest.mark.parametrize("name", NAMES)
def test_chance_levels(name):
    task = TASKS[name]
    assert task.chance == pytest.approx(0.2)
    assert task.full_state_chance == pytest.approx(1 / 120 if name == "swap_s5" else 0.2)
    finals = task.sample(depth=32, n=2048, seed=0).states[:, -1, :]
    for q in range(task.num_queries):
        freq = torch.bincount(finals[:, q] - 2, minlength=5).double() / len(finals)
        assert (freq - task.chance).abs().max() < 0.04
    if name == "swap_s5":
        assert len({tuple(r) for r in finals.tolist()}) == 120


@pytest.mark.parametrize(
    "kwargs, arg",
    [({"depth": 0, "n": 1}, "depth"), ({"depth": 1, "n": 0}, "n"), ({"depth": 1, "n": 1, "seed": -1}, "seed")],
)
def test_sample_errors(kwargs, arg):
    kwargs.setdefault("seed", 0)
    with pytest.raises(ValueError, match=f"{arg}:"):
        TASKS["s5"].sample(**kwargs)


def test_registry():
    from par_ray.config import TASK_NAMES

    assert ALL_NAMES == TASK_NAMES and all(TASKS[n].name == n for n in ALL_NAMES)
    assert ALL_NAMES[:3] == NAMES
    with pytest.raises(ValueError, match=r"task.name: 'x' is not one of \['swap_s5', 's5', 'a5', 'rule_table'"):
        get_task("x")


def test_recent_first_reverses_only_the_operations():
    from par_ray.config import TaskConfig
    from par_ray.tasks import build_task

    fwd = build_task(TaskConfig(name="swap_s5"))
    rev = build_task(TaskConfig(name="swap_s5", op_order="recent_first"))
    a, b = fwd.sample(6, 4, seed=2, step=3), rev.sample(6, 4, seed=2, step=3)
    assert torch.equal(b.input_ids[:, 1:7], a.input_ids[:, 1:7].flip(1))
    assert torch.equal(b.input_ids[:, 7:], a.input_ids[:, 7:]) and torch.equal(b.input_ids[:, 0], a.input_ids[:, 0])
    assert torch.equal(b.states, a.states) and torch.equal(b.read_positions, a.read_positions)
    assert rev.full_state_chance == fwd.full_state_chance and rev.vocab_size == fwd.vocab_size


def test_train_filler_inserts_separators_on_training_prompts_only():
    from par_ray.config import TaskConfig
    from par_ray.tasks import Filler, build_task

    cfg = TaskConfig(name="swap_s5", train_filler=5)
    assert not isinstance(build_task(cfg), Filler)  # evaluation prompts: none
    train = build_task(cfg, train=True)
    assert isinstance(train, Filler)
    base = build_task(TaskConfig(name="swap_s5"))
    seen = set()
    for step in range(40):
        a, b = base.sample(6, 4, seed=1, step=step), train.sample(6, 4, seed=1, step=step)
        f = b.input_ids.shape[1] - a.input_ids.shape[1]
        seen.add(f)
        assert torch.equal(b.input_ids[:, :8], a.input_ids[:, :8])  # BOS, 6 operations, SEP
        assert (b.input_ids[:, 8 : 8 + f] == a.input_ids[:, 7:8]).all()  # f more SEPs
        assert torch.equal(b.input_ids[:, 8 + f :], a.input_ids[:, 8:])  # the queries
        assert torch.equal(b.read_positions, a.read_positions + f) and torch.equal(b.states, a.states)
        again = train.sample(6, 4, seed=1, step=step)  # a pure function of (task, depth, seed, step)
        assert torch.equal(again.input_ids, b.input_ids)
    assert seen == set(range(6))
    with pytest.raises(ValueError, match="task.train_filler: must be >= 0"):
        Filler(base, -1)


# --------------------------------------------------------------------------------------------------------------------
# Every registered task: the conventions the training code relies on.

@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("depth", [1, 6])
def test_every_task_keeps_the_layout_conventions(name, depth):
    task = TASKS[name]
    ep = task.sample(depth=depth, n=32, seed=1, step=2)
    B, T = ep.input_ids.shape
    Q = ep.read_positions.numel()
    assert isinstance(task, Task) and ep.depth == depth and B == 32
    assert ep.input_ids.dtype == ep.read_positions.dtype == ep.states.dtype == torch.int64
    assert ep.read_positions.dim() == 1  # one set of read positions for the whole batch
    assert ep.states.shape == (B, depth, Q)
    assert task.num_queries in (Q, None)
    assert (ep.input_ids[:, 0] == 0).all()
    assert 0 <= int(ep.input_ids.min()) and int(ep.input_ids.max()) < task.vocab_size
    assert 0 < int(ep.read_positions.min()) and int(ep.read_positions.max()) < T
    assert torch.isin(ep.states, torch.tensor(task.answer_token_ids)).all()
    assert max(task.answer_token_ids) < task.vocab_size <= 300  # small enough for the tiny shapes
    if task.op_width is not None:  # serial layout: the separator right after the d operations
        assert (ep.input_ids[:, depth * task.op_width + 1] == 1).all()


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_task_is_deterministic_and_streams_differ(name):
    task = TASKS[name]
    a, b = task.sample(depth=8, n=64, seed=0, step=2), get_task(name).sample(depth=8, n=64, seed=0, step=2)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.states, b.states)
    assert torch.equal(a.read_positions, b.read_positions)
    for other in (task.sample(8, 64, seed=1, step=2), task.sample(8, 64, seed=0, step=3), task.sample(8, 64, seed=0)):
        assert not torch.equal(a.input_ids, other.input_ids)
        assert not torch.equal(a.states, other.states)


N_GUESSES = 10_000
CHANCE_DEPTH = {"swap_s5": 32, "s5": 32, "a5": 32, "rule_table": 32, "object_tracking": 48, "parity": 16,
                "addition": 4, "reachability": 8}
"""Depths for the guesser test; addition's is small so that its full-state chance 2^-d is measurable."""


def random_guess(task, ep, rng):
    """A random guesser: a uniformly drawn valid state per sequence, (B, Q) token ids. For swap-S5 the valid states
    are the 120 permutations; for every other task each query's answer is drawn uniformly from the answer tokens."""
    B, _, Q = ep.states.shape
    if task.name == "swap_s5":
        return np.argsort(rng.random((B, 5)), axis=1) + task.answer_token_ids[0]
    return rng.choice(np.array(task.answer_token_ids), size=(B, Q))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_random_guesser_lands_within_three_sigma_of_chance(name):
    task, depth = TASKS[name], CHANCE_DEPTH[name]
    ep = task.sample(depth=depth, n=N_GUESSES, seed=7)
    right_BQ = torch.from_numpy(random_guess(task, ep, np.random.default_rng(0))) == ep.states[:, -1, :]
    # Per-query accuracy averaged over Q (possibly correlated) queries has variance <= p(1 - p) / N.
    for measured, p in ((right_BQ.double().mean().item(), task.chance),
                        (right_BQ.all(-1).double().mean().item(), task.full_state_chance_at(depth))):
        sigma = (p * (1 - p) / N_GUESSES) ** 0.5
        assert abs(measured - p) <= 3 * sigma, (measured, p, sigma)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_no_constant_answer_beats_chance(name):
    """Answers are (near) uniform at a mixing depth, so ``chance`` is not an underestimate: the best constant guess
    of each query is within 4 points of it."""
    task = TASKS[name]
    depth = max(CHANCE_DEPTH[name], 8)  # addition: the carry digit is 1 with probability 1/2 - 2^-d
    finals_BQ = task.sample(depth=depth, n=4096, seed=3).states[:, -1, :]
    for q in range(finals_BQ.shape[1]):
        best = torch.bincount(finals_BQ[:, q], minlength=task.vocab_size).max().item() / len(finals_BQ)
        assert best - task.chance < 0.04, (q, best)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_paper_depths_and_presets(name):
    from par_ray import presets

    depths = PAPER_DEPTHS[name]
    assert 1 <= depths.min_train_depth <= depths.train_depth == depths.test_depths[0] and depths.source
    assert list(depths.test_depths) == sorted(set(depths.test_depths))
    assert TASKS[name].max_depth is None or depths.test_depths[-1] <= TASKS[name].max_depth
    cfg = validate(presets.paper_trial("qwen2.5-0.5b", name))
    assert (cfg.task.train_depth, cfg.task.min_train_depth, cfg.eval.depths) == (
        depths.train_depth, depths.min_train_depth, depths.test_depths)
    validate(presets.local_trial("tiny-qwen2", name))
    TASKS[name].sample(depths.test_depths[-1], 2, seed=0)  # the deepest test depth can be generated


def test_max_depth_is_enforced():
    reach = TASKS["reachability"]
    reach.sample(reach.max_depth, 1, seed=0)
    with pytest.raises(ValueError, match=f"depth: {reach.max_depth + 1} exceeds this task's max_depth"):
        reach.sample(reach.max_depth + 1, 1, seed=0)


def test_serial_options_on_multi_token_operations_and_refused_without_a_serial_layout():
    from par_ray.config import TaskConfig
    from par_ray.tasks import Filler, RecentFirst, build_task

    fwd = build_task(TaskConfig(name="object_tracking"))
    rev = build_task(TaskConfig(name="object_tracking", op_order="recent_first"))
    a, b = fwd.sample(5, 4, seed=2, step=1), rev.sample(5, 4, seed=2, step=1)
    ops_a, ops_b = a.input_ids[:, 1:16].reshape(4, 5, 3), b.input_ids[:, 1:16].reshape(4, 5, 3)
    assert torch.equal(ops_b, ops_a.flip(1))  # whole (VERB, arg, arg) blocks reversed, each kept in order
    assert torch.equal(b.input_ids[:, 16:], a.input_ids[:, 16:]) and torch.equal(b.states, a.states)
    filled = Filler(fwd, 3)
    for step in range(12):
        base, f_ep = fwd.sample(5, 4, seed=0, step=step), filled.sample(5, 4, seed=0, step=step)
        f = f_ep.input_ids.shape[1] - base.input_ids.shape[1]
        assert (f_ep.input_ids[:, 16 : 17 + f] == 1).all()  # the separator after 5 × 3 tokens, f more of them
        assert torch.equal(f_ep.input_ids[:, 17 + f :], base.input_ids[:, 17:])
        assert torch.equal(f_ep.read_positions, base.read_positions + f)
    add = RecentFirst(TASKS["addition"])
    assert add.full_state_chance_at(3) == TASKS["addition"].full_state_chance_at(3) == 1 / 8
    for bad in (TaskConfig(name="reachability", op_order="recent_first"), TaskConfig(name="reachability",
                                                                                        train_filler=2)):
        with pytest.raises(ValueError, match="task 'reachability' has no serial"):
            build_task(bad, train=True)
