"""d50 / G (paper §4.2) and accuracy by depth."""

import math

import pytest
import torch

from par_ray.config import EvalConfig
from par_ray.evaluation import accuracy_by_depth, extrapolation, format_G
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
