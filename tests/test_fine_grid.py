"""Fine G (issue 22, part 1): the fine evaluation grid, fewer sequences on its in-between depths, accuracy's 95 %
Wilson interval per depth, and the linearly interpolated d50 beside the paper's first crossing."""

import math

import pytest
import torch

from par_ray.config import EvalConfig, from_flat
from par_ray.evaluation import EvalProgress, extrapolation, format_G, sum_over_test_sets, wilson_interval
from par_ray.presets import (FINE_GRID_RATIO, LOCAL_TRAIN_DEPTH, fine_depths, local_trial, paper_trial,
                             scaled_depths, smoke_overrides)
from par_ray.tasks import get_task
from par_ray.trial import validate

# --------------------------------------------------------------------------------------------------------------------
# the grid


@pytest.mark.parametrize("train_depth, multiple", [(2, 8), (3, 8), (4, 4), (5, 3), (6, 8), (8, 8), (16, 16),
                                                   (32, 16), (7, 5), (10, 1)])
def test_fine_grid_has_every_depth_to_twice_d_train_then_ratio_at_most_1_25_to_the_top(train_depth, multiple):
    top = multiple * train_depth
    depths = fine_depths(train_depth, top)
    assert depths[0] == train_depth and depths[-1] == top
    assert list(depths) == sorted(set(depths)) and all(isinstance(d, int) for d in depths)
    assert set(range(train_depth, min(2 * train_depth, top) + 1)) <= set(depths)
    geometric = [d for d in depths if d >= 2 * train_depth]
    assert all(b / a <= FINE_GRID_RATIO for a, b in zip(geometric, geometric[1:])), depths
    # the doubling anchors: every d_train × 2^k up to the top is tested (the old coarse columns)
    assert {train_depth * 2**k for k in range(8) if train_depth * 2**k <= top} <= set(depths)


def test_fine_grid_of_the_local_preset():
    assert fine_depths(6, 48) == (6, 7, 8, 9, 10, 11, 12, 14, 17, 20, 24, 29, 34, 40, 48)


def test_below_depth_four_integers_cannot_keep_the_ratio_so_every_depth_is_tested():
    assert fine_depths(1, 8) == (1, 2, 3, 4, 5, 6, 7, 8)


@pytest.mark.parametrize("args, field", [((0, 8), "task.train_depth"), ((6, 5), "eval.depths"),
                                         ((6, 48, 1.0), "ratio"), ((6.5, 48), "task.train_depth")])
def test_fine_grid_rejects_bad_input_naming_the_field(args, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        fine_depths(*args)


def test_local_preset_uses_the_fine_grid_and_the_paper_preset_is_unchanged():
    local = validate(local_trial())
    assert local.eval.depths == fine_depths(LOCAL_TRAIN_DEPTH, 8 * LOCAL_TRAIN_DEPTH)
    assert (local.eval.num_sequences, local.eval.num_sequences_fine, local.eval.batch_size) == (256, 128, 128)
    assert {d for d in local.eval.depths if local.eval.sequences_at(d) == 256} == {6, 12, 24, 48}
    paper = paper_trial()
    assert (paper.eval.depths, paper.eval.num_sequences, paper.eval.num_sequences_fine) == (
        (32, 64, 128, 256, 512), 1024, 0)


def test_scaled_depths_rebuilds_a_fine_grid_and_keeps_other_multiples():
    assert scaled_depths(fine_depths(6, 48), 6, 8) == fine_depths(8, 64)
    assert scaled_depths((16, 32, 64, 128, 256), 16, 8) == (8, 16, 32, 64, 128)


def test_smoke_overrides_validate_on_the_fine_grid():
    cfg = local_trial()
    smoke = validate(from_flat(smoke_overrides(cfg), base=cfg))
    assert smoke.eval.depths == (6, 12)  # 1× and 2×, not 6 and 7
    paper = paper_trial()
    assert from_flat(smoke_overrides(paper), base=paper).eval.depths == paper.eval.depths[:2]


# --------------------------------------------------------------------------------------------------------------------
# sequences per depth


def test_num_sequences_fine_applies_to_the_in_between_depths_only():
    ev = EvalConfig(depths=fine_depths(6, 48), num_sequences=256, num_sequences_fine=64)
    assert {d: ev.sequences_at(d) for d in ev.depths if ev.sequences_at(d) == 256} == {6: 256, 12: 256, 24: 256,
                                                                                       48: 256}
    assert ev.sequences_at(7) == ev.sequences_at(40) == 64
    assert EvalConfig(depths=(6, 7), num_sequences=32).sequences_at(7) == 32  # 0: num_sequences everywhere
    assert ev.coarse_depths() == (6, 12, 24, 48) and EvalConfig(depths=(8, 12, 16)).coarse_depths() == (8, 16)


@pytest.mark.parametrize("value", ["-1", "x", "1.5"])
def test_num_sequences_fine_is_validated(value):
    with pytest.raises(ValueError, match=r"eval\.num_sequences_fine"):
        validate(from_flat({"eval.num_sequences_fine": value}, base=local_trial()))


def test_test_sets_use_the_sequences_of_their_depth():
    cfg = EvalConfig(depths=(2, 3, 4), num_sequences=10, num_sequences_fine=4, batch_size=3, seed=1)
    rows = sum_over_test_sets(get_task("swap_s5"), cfg,
                              lambda d, ep, ids_BT, answers_BQ: torch.tensor([float(ids_BT.shape[0])]),
                              torch.device("cpu"))
    assert {d: t.item() for d, (t,) in rows.items()} == {2: 10.0, 3: 4.0, 4: 10.0}


def test_eval_progress_weighs_each_depth_by_its_sequences():
    lines, now = [], [0.0]
    progress = EvalProgress(lines.append, "accuracy", (4, 8), iterations=lambda d: 1, every_s=1, clock=lambda: now[0],
                            sequences={4: 30, 8: 5}.get)
    now[0] = 30.0
    progress(4, 1, 1)  # 120 of 160 units (30·4 + 5·8) in 30 s: 40 units left, 10 s
    assert lines == ["evaluation (accuracy): d=4 batch 1/1, depth 1/2, 30s elapsed, ETA ~10s"]


# --------------------------------------------------------------------------------------------------------------------
# 95 % interval


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(0.5, 256)
    assert lo == pytest.approx(0.4392, abs=1e-4) and hi == pytest.approx(0.5608, abs=1e-4)
    lo, hi = wilson_interval(1.0, 256)  # not empty at 1, inside [0, 1]
    assert lo == pytest.approx(0.98522, abs=1e-5) and hi == pytest.approx(1.0)
    lo, hi = wilson_interval(0.0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.27753, abs=1e-5)
    assert all(math.isnan(x) for x in wilson_interval(math.nan, 10))


def test_wilson_interval_narrows_with_more_sequences():
    w64 = wilson_interval(0.8, 64)
    w256 = wilson_interval(0.8, 256)
    assert w64[0] < w256[0] < 0.8 < w256[1] < w64[1]


@pytest.mark.parametrize("acc, n, field", [(0.5, 0, "n"), (1.5, 10, "accuracy"), (-0.1, 10, "accuracy")])
def test_wilson_interval_rejects_bad_input(acc, n, field):
    with pytest.raises(ValueError, match=field):
        wilson_interval(acc, n)


# --------------------------------------------------------------------------------------------------------------------
# interpolated d50

CHANCE = 0.0  # midpoint 0.5


def test_interpolated_d50_between_the_last_depth_above_and_the_first_below():
    ex = extrapolation({6: 1.0, 7: 0.9, 8: 0.7, 9: 0.3, 10: 0.6}, CHANCE, 6)
    assert ex.d50 == 9 and ex.G == 1.5  # the paper's first crossing
    assert ex.d50_interp == pytest.approx(8.5) and ex.G_interp == pytest.approx(8.5 / 6)
    assert format_G(ex, interpolated=True) == "1.42"


def test_interpolated_d50_tells_apart_curves_that_cross_in_the_same_cell():
    slow = extrapolation({12: 0.9, 24: 0.45}, CHANCE, 12)
    fast = extrapolation({12: 0.55, 24: 0.0}, CHANCE, 12)
    assert slow.G == fast.G == 2.0
    assert slow.d50_interp == pytest.approx(12 + 0.4 / 0.45 * 12) and fast.d50_interp == pytest.approx(12 + 0.05 / 0.55 * 12)


def test_interpolated_d50_at_a_point_exactly_at_the_midpoint_is_not_below():
    ex = extrapolation({6: 0.5, 12: 0.25}, CHANCE, 6)
    assert ex.d50 == 12 and ex.d50_interp == pytest.approx(6.0)


def test_interpolated_d50_when_the_first_depth_is_already_below():
    ex = extrapolation({6: 0.2, 12: 0.0}, CHANCE, 6)
    assert (ex.d50, ex.d50_interp, ex.G, ex.G_interp) == (6, 6.0, 1.0, 1.0)


def test_interpolated_d50_at_a_nan_crossing_is_the_crossing_depth():
    ex = extrapolation({6: 0.9, 12: math.nan}, CHANCE, 6)
    assert (ex.d50, ex.d50_interp) == (12, 12.0)


def test_censored_curve_has_no_interpolated_d50_and_the_same_lower_bound():
    ex = extrapolation({6: 1.0, 48: 0.6}, CHANCE, 6)
    assert ex.censored and ex.d50 is None and ex.d50_interp is None and ex.G_interp == ex.G == 8.0
    assert format_G(ex, interpolated=True) == "≥ 8.00"
