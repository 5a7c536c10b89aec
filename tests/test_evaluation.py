"""d50 / G (paper §4.2) and accuracy by depth."""

import math

import pytest
import torch

from par_ray.config import EvalConfig
from par_ray.evaluation import accuracy_by_depth, extrapolation, format_G, rank_chunks, sum_over_test_sets
from par_ray.model.looped import LoopedOutput
from par_ray.tasks import get_task


def test_d50_is_first_depth_below_midpoint():
    chance = 1 / 120
    mid = (1 + chance) / 2
    acc = {8: 1.0, 16: 0.97, 32: 0.6, 64: mid - 1e-9, 128: 0.9}
    ex = extrapolation(acc, chance, 8)
    assert ex.d50 == 64 and ex.G == 8.0 and not ex.censored
    assert format_G(ex) == "8.00"


def test_never_crossing_is_censored_lower_bound():
    ex = extrapolation({16: 1.0, 8: 0.99, 64: 0.8}, 0.2, 8)
    assert ex.d50 is None and ex.censored and ex.G == 8.0
    assert format_G(ex) == "≥ 8.00"


def test_failing_at_train_depth_gives_G_one():
    assert extrapolation({8: 0.0, 16: 0.0}, 0.2, 8).G == 1.0


@pytest.mark.parametrize("args, field", [(({}, 0.2, 8), "accuracy_by_depth"), (({8: 1.0}, 0.2, 0), "train_depth"),
                                         (({8: 1.0}, 1.0, 8), "chance")])
def test_bad_input(args, field):
    with pytest.raises(ValueError, match=field):
        extrapolation(*args)


def test_accuracy_by_depth_with_an_oracle_and_sharding():
    task = get_task("swap_s5")
    cfg = EvalConfig(depths=(4, 8), num_sequences=50, batch_size=16, seed=7)
    answers = {d: task.sample(d, 50, seed=7).states[:, -1] for d in cfg.depths}

    def oracle(ids, reads, R, window, stretch, read):
        ep = {d: task.sample(d, 50, seed=7) for d in cfg.depths}[R]
        # find each row in the test set and answer it right, except rows whose first op token is odd at depth 8
        rows = [next(i for i in range(50) if torch.equal(ep.input_ids[i], x)) for x in ids]
        logits = torch.nn.functional.one_hot(ep.states[rows, -1], task.vocab_size).float()
        if R == 8:
            logits[ids[:, 1] % 2 == 1, 0] = logits[ids[:, 1] % 2 == 1, 0].roll(1, -1)
        return LoopedOutput(logits[None], [R], torch.ones(R))

    full = accuracy_by_depth(oracle, task, cfg, 1, torch.device("cpu"))
    ep8 = task.sample(8, 50, seed=7)
    want8 = (ep8.input_ids[:, 1] % 2 == 0).float().mean().item()
    assert full[4]["acc"] == 1.0 and full[4]["acc_query"] == 1.0
    assert math.isclose(full[8]["acc"], want8, rel_tol=1e-6)
    assert math.isclose(full[8]["acc_query"], 1 - (1 - want8) / 5, rel_tol=1e-6)
    # two "ranks" each see half the rows; summing their counts gives the same answer
    parts = [accuracy_by_depth(oracle, task, cfg, 1, torch.device("cpu"), rank=r, world_size=2) for r in (0, 1)]
    assert math.isclose((parts[0][8]["acc"] * 25 + parts[1][8]["acc"] * 25) / 50, want8, rel_tol=1e-6)
    assert set(answers) == set(full)


@pytest.mark.parametrize("n, batch, world", [(50, 16, 2), (7, 2, 3), (3, 4, 4), (64, 64, 1)])
def test_rank_chunks_give_every_rank_the_same_number_of_calls_and_every_row_once(n, batch, world):
    """The invariant FSDP needs: each rank makes the same number of forward calls, whatever its share of rows."""
    ids = torch.arange(n)[:, None].expand(n, 3)
    per_rank = [list(rank_chunks(n, batch, r, world, ids, ids[:, 0])) for r in range(world)]
    assert len({len(c) for c in per_rank}) == 1
    assert all(len(a) <= batch for chunks in per_rank for a, _ in chunks)
    seen = sorted(int(x) for chunks in per_rank for _, b in chunks for x in b)
    assert seen == list(range(n))


def test_sum_over_test_sets_sums_chunks_then_reduces_each_tensor_once_per_depth():
    task = get_task("swap_s5")
    cfg = EvalConfig(depths=(2, 4), num_sequences=10, batch_size=3, seed=1)
    reduced = []

    def reduce_sum(t):
        reduced.append(t.shape)
        return 2 * t  # a second "rank" with the same counts

    def counts(depth, ep, ids_BT, answers_BQ):
        return torch.tensor([float(ids_BT.shape[0])], dtype=torch.float64), torch.full((2,), float(depth))

    out = sum_over_test_sets(task, cfg, counts, torch.device("cpu"), rank=1, world_size=2, reduce_sum=reduce_sum)
    assert list(out) == [2, 4]
    assert out[2][0].item() == 10.0  # 5 rows on this rank, doubled by the reduction
    assert out[4][1].tolist() == [8.0 * 2, 8.0 * 2]  # 2 chunks of ⌈5 / 3⌉ = 2, each adding the depth, doubled
    assert len(reduced) == 4  # two tensors per depth, one collective each


def test_sum_over_test_sets_reports_every_batch_to_progress():
    task = get_task("swap_s5")
    cfg = EvalConfig(depths=(2, 4), num_sequences=10, batch_size=4, seed=1)
    calls = []
    sum_over_test_sets(task, cfg, lambda *a: torch.zeros(1, dtype=torch.float64), torch.device("cpu"),
                       progress=lambda *a: calls.append(a))
    assert calls == [(2, 1, 3), (2, 2, 3), (2, 3, 3), (4, 1, 3), (4, 2, 3), (4, 3, 3)]


def test_eval_progress_is_silent_when_short_and_gives_an_eta_by_depth_times_iterations():
    from par_ray.evaluation import EvalProgress

    now = [0.0]
    lines = []
    progress = EvalProgress(lines.append, "accuracy", (4, 8), iterations=lambda d: d, every_s=30, clock=lambda: now[0])
    # cost units: d·R = 16 at d=4 and 64 at d=8 (80 in all), two batches per depth
    now[0] = 10.0
    progress(4, 1, 2)  # 8 units in 10 s: too early for a line
    now[0] = 40.0
    progress(4, 2, 2)  # 16 units in 40 s: 2.5 s/unit, 64 left
    now[0] = 50.0
    progress(8, 1, 2)  # within 30 s of the last line
    assert lines == ["evaluation (accuracy): d=4 batch 2/2, depth 1/2, 40s elapsed, ETA ~2m40s"]
    now[0] = 200.0
    progress(8, 2, 2)
    assert lines[-1] == "evaluation (accuracy): d=8 batch 2/2, depth 2/2, 3m20s elapsed, ETA ~0s"
