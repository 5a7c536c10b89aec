"""Training on long problems at a bounded cost (issue 22, part 2): length curriculum, progressive loss, state noise,
random position offsets, and the profiler labels of the no-autograd iterations before the gradient window."""

import dataclasses
import math

import pytest
import torch

from par_ray.config import (BackboneConfig, EvalConfig, RecipeConfig, TaskConfig, TrainConfig, TrialConfig,
                            config_errors, from_flat, to_flat)
from par_ray.model.looped import LoopedLM, build_looped
from par_ray.schedules import curriculum_depth, noise_seed, plan_step, supervised_iterations
from par_ray.tasks import build_task
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare
from par_ray.trial import validate

CURRICULUM = TaskConfig(train_depth=32, curriculum=(4, 8, 16), curriculum_steps=100)


def test_curriculum_phases_cap_the_sampled_depth_by_step():
    assert [curriculum_depth(CURRICULUM, s) for s in (0, 99, 100, 199, 200, 299, 300, 10_000)] == \
        [4, 4, 8, 8, 16, 16, 32, 32]
    assert curriculum_depth(TaskConfig(train_depth=6), 5_000) == 6  # off: d_train throughout
    recipe = RecipeConfig(max_iterations=64)
    for lo, hi, cap in ((0, 100, 4), (100, 200, 8), (200, 300, 16), (300, 400, 32)):
        depths = {plan_step(CURRICULUM, recipe, 0, s).depth for s in range(lo, hi)}
        assert max(depths) <= cap and max(depths) > cap // 2  # the phase's whole range is drawn
        assert min(depths) >= CURRICULUM.min_train_depth


def test_the_paper_schedule_is_unchanged_without_the_new_options():
    """Each option draws only when it is on, so the paper's (d, R, s) stream is the one it always was."""
    task, recipe = TaskConfig(train_depth=8), RecipeConfig(stretch_max=2.0)
    on = RecipeConfig(stretch_max=2.0, position_offset=7, progressive_loss=True, grad_window=64)
    for s in range(50):
        a, b = plan_step(task, recipe, 3, s), plan_step(task, on, 3, s)
        assert (a.depth, a.R, a.stretch, a.position_offset) == (b.depth, b.R, b.stretch, 0)
        assert 0 <= b.position_offset <= 7


def test_progressive_loss_stops_after_a_random_window_start():
    task = TaskConfig(train_depth=32)
    plain, prog = RecipeConfig(grad_window=8), RecipeConfig(grad_window=8, progressive_loss=True)
    starts = set()
    for s in range(300):
        a, b = plan_step(task, plain, 0, s), plan_step(task, prog, 0, s)
        assert a.depth == b.depth
        if a.R <= 8:
            assert b.R == a.R  # the whole step fits the window: unchanged
        else:
            assert 8 <= b.R <= a.R
            starts.add(b.R - 8)  # n: iterations run without autograd before the window
        assert b == plan_step(task, prog, 0, s)  # pure function of (seed, step)
    assert 0 in starts and max(starts) >= 20


def _tiny_read_all(tokens: int):
    """``logits(R, **iterate_kwargs)``: every iteration's logits (K, B, T, V) of one random-init tiny-qwen2 looped
    model (seed 0, vocabulary 64) on one fixed batch of 2 prompts of ``tokens`` tokens, read at every position."""
    torch.manual_seed(0)
    model = build_looped(BackboneConfig(), RecipeConfig(), vocab_size=64).eval()
    ids = torch.randint(0, 64, (2, tokens), generator=torch.Generator().manual_seed(1))

    def logits(R: int, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model.iterate(ids, torch.arange(tokens), R, read="all", **kwargs).logits_KBQV

    return logits


def test_position_offsets_are_drawn_per_step_and_leave_rope_attention_unchanged():
    """o ~ U{0..M} per step. RoPE attention depends on relative positions only, so a common offset changes the
    logits by float round-off alone (what Abacus-style offsets do for learned absolute embeddings, rotary
    embeddings already have; docs/experiments.md §21)."""
    recipe = RecipeConfig(position_offset=5)
    offsets = [plan_step(TaskConfig(), recipe, 0, s).position_offset for s in range(200)]
    assert set(offsets) == set(range(6))
    logits = _tiny_read_all(tokens=12)
    base, shifted, stretched = logits(3), logits(3, position_offset=1000), logits(3, stretch=1.5)
    shift = (shifted - base).abs().max()
    assert shift < 1e-5  # measured 3.9e-7: float round-off of the rotary phases
    assert (stretched - base).abs().max() > 100 * shift  # a stretch does change relative distances (measured 8e-3)


def test_state_noise_perturbs_only_the_carried_state_and_is_a_function_of_the_seed():
    logits = _tiny_read_all(tokens=10)
    clean = logits(3)
    a, b = logits(3, state_noise=0.5, noise_seed=7), logits(3, state_noise=0.5, noise_seed=7)
    c, one = logits(3, state_noise=0.5, noise_seed=8), logits(1, state_noise=0.5, noise_seed=7)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a[0], clean[0]) and torch.equal(one[0], clean[0])  # iteration 1 reads a clean state
    assert (a[1:] - clean[1:]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="state_noise"):
        logits(2, state_noise=-0.1)
    assert noise_seed(0, 5) == noise_seed(0, 5) != noise_seed(0, 6)


def _fresh_steps(task_cfg: TaskConfig, recipe: RecipeConfig):
    """``step(s)``: training step ``s`` (seed 0, batch 4) of a fresh random-init tiny-qwen2 looped model (torch seed 0)
    trained with ``recipe`` on ``task_cfg``; each call of this function starts a new model."""
    torch.set_num_threads(1)
    from par_ray.trial import resolve

    vocab = resolve(validate(TrialConfig(task=task_cfg, recipe=recipe))).vocab
    task = build_task(task_cfg, train=True)
    torch.manual_seed(0)
    model = build_looped(BackboneConfig(), recipe, vocab_size=vocab.size)
    engine = prepare(model, TrainConfig(batch_size=4, warmup_steps=0), World())
    loss_fn = build_step_loss(recipe, task, dense_offset=vocab.dense_offset)
    return lambda s: train_step(engine, task, task_cfg, loss_fn, 0, s, 4)


def test_a_step_with_every_long_problem_option_trains_and_is_reproducible():
    task_cfg = TaskConfig(train_depth=8, curriculum=(3,), curriculum_steps=1, given_prefix=2)
    recipe = RecipeConfig(dense_targets=True, dense_pending=True, grad_window=2, progressive_loss=True,
                          state_noise=0.1, position_offset=4, extra_iterations=2)

    def run():
        step = _fresh_steps(task_cfg, recipe)
        return [step(s) for s in range(3)]

    first, again = run(), run()
    assert [r.loss for r in first] == [r.loss for r in again]
    assert all(math.isfinite(r.loss) for r in first)
    assert first[0].plan.depth <= 3  # phase 0 of the curriculum
    assert all(r.plan.R == len(r.state_rms) for r in first)  # the model ran the plan's (progressive) R


def test_read_every_supervises_every_nth_window_iteration_counted_from_the_done_iteration():
    """Every n-th iteration of the gradient window, in phase with ⌈d/c⌉ (the iteration evaluation reads), so that one
    is supervised whatever the step's slack; n = 1 is the paper's whole window."""
    window = RecipeConfig(grad_window=8)
    every_other = dataclasses.replace(window, read_every=2)
    assert supervised_iterations(window, 17, 16) == tuple(range(10, 18))
    assert supervised_iterations(every_other, 17, 16) == (10, 12, 14, 16)  # one slack iteration: 16 read, 17 not
    assert supervised_iterations(every_other, 18, 16) == (12, 14, 16, 18)
    assert supervised_iterations(dataclasses.replace(every_other, ops_per_iteration=2), 9, 16) == (2, 4, 6, 8)
    assert supervised_iterations(dataclasses.replace(window, read_every=3), 5, 4) == (1, 4)  # R < window
    assert supervised_iterations(every_other, 20, 2) == (14, 16, 18, 20)  # done before the window: its phase
    assert supervised_iterations(RecipeConfig(supervise="last", fixed_iterations=4), 4, 9) == (4,)


def test_a_step_with_read_every_reads_out_only_those_iterations(monkeypatch):
    """The forward reads (and the loss supervises) the iterations :func:`supervised_iterations` names, nothing else:
    the step reads them out together, in one ``par_ray.readout`` over exactly those iterations' stacked states, and
    the loss is finite and reproducible."""
    task_cfg = TaskConfig(train_depth=6, min_train_depth=6)
    recipe = RecipeConfig(dense_targets=True, dense_pending=True, grad_window=6, read_every=2,
                          fixed_point_weight=1.0)
    stacked = []
    read_stacked = LoopedLM._read_stacked

    def spy(self, states, *args, **kwargs):
        stacked.append(len(states))
        return read_stacked(self, states, *args, **kwargs)

    monkeypatch.setattr(LoopedLM, "_read_stacked", spy)

    def run():
        stacked.clear()
        step = _fresh_steps(task_cfg, recipe)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            result = step(0)
        reads = sum(e.count for e in prof.key_averages() if e.key == "par_ray.readout")
        return result, reads, list(stacked)

    (first, reads, stacked_first), (again, _, _) = run(), run()
    assert first.plan.R == 6 and reads == 1 and stacked_first == [len(supervised_iterations(recipe, 6, 6))] == [3]
    assert math.isfinite(first.loss) and first.loss == again.loss


@pytest.mark.parametrize("field, value, match", [
    ("task", dict(curriculum=(4, 4), curriculum_steps=10, train_depth=8), "task.curriculum"),
    ("task", dict(curriculum=(4, 8), curriculum_steps=10, train_depth=8), "task.curriculum"),
    ("task", dict(curriculum=(4,), curriculum_steps=0, train_depth=8), "task.curriculum_steps"),
    ("recipe", dict(state_noise=-0.5), "recipe.state_noise"),
    ("recipe", dict(position_offset=-1), "recipe.position_offset"),
    ("recipe", dict(read_every=0), "recipe.read_every"),
    ("recipe", dict(read_every=2, fixed_iterations=4, supervise="last"), "recipe.read_every"),
    ("recipe", dict(read_every=9, grad_window=8), "recipe.read_every"),
    ("recipe", dict(progressive_loss=True, fixed_iterations=4, supervise="last"), "recipe.progressive_loss"),
])
def test_bad_values_are_refused_naming_the_field(field, value, match):
    cfg = TrialConfig()
    cfg = dataclasses.replace(cfg, **{field: dataclasses.replace(getattr(cfg, field), **value)})
    with pytest.raises(ValueError, match=match):
        validate(cfg)


def test_a_negative_step_count_is_reported_alone_not_as_a_curriculum_that_outlasts_it():
    cfg = TrialConfig(task=CURRICULUM, train=TrainConfig(steps=-5), eval=EvalConfig(depths=(32, 64)))
    errs = config_errors(cfg)
    assert errs == ["train.steps: must be >= 1, got -5"], errs


def test_the_new_fields_round_trip_through_the_flat_form():
    cfg = TrialConfig(task=CURRICULUM, recipe=RecipeConfig(progressive_loss=True, state_noise=0.2, position_offset=3,
                                                           max_iterations=64, read_every=2))
    flat = to_flat(cfg)
    assert flat["task.curriculum"] == "4,8,16" and to_flat(TrialConfig())["task.curriculum"] == "none"
    assert from_flat({k: str(v) for k, v in flat.items()}) == cfg
    assert from_flat({k: str(v) for k, v in to_flat(TrialConfig()).items()}) == TrialConfig()


def test_iterations_before_the_gradient_window_are_labelled_for_the_profiler():
    torch.manual_seed(0)
    model = build_looped(BackboneConfig(), RecipeConfig(), vocab_size=64)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model.iterate(ids, torch.arange(8), 5, grad_window=2)
    counts = {e.key: e.count for e in prof.key_averages() if e.key.startswith("par_ray.")}
    # the two window iterations are read out together: one read-out call over their stacked states
    assert counts == {"par_ray.prelude": 1, "par_ray.core_no_grad": 3, "par_ray.core_grad": 2, "par_ray.readout": 1}


def test_the_cost_plan_follows_the_curriculum_and_the_progressive_cut():
    """``par_ray.cost``: a curriculum's early phases draw shorter problems, the progressive loss runs fewer
    iterations and ``read_every`` reads fewer, so each plans fewer FLOPs than the same trial at d_train throughout;
    the R distribution stays a pmf."""
    from par_ray import cost

    def trial(task=TaskConfig(train_depth=16), **recipe):
        return validate(TrialConfig(task=task, recipe=RecipeConfig(grad_window=4, **recipe),
                                    train=TrainConfig(steps=300, eval_every=300), eval=EvalConfig(depths=(16,))))

    plain = cost.trial_flops(trial()).train
    curriculum = cost.trial_flops(trial(TaskConfig(train_depth=16, curriculum=(4, 8), curriculum_steps=100))).train
    progressive = cost.trial_flops(trial(progressive_loss=True)).train
    every_other = cost.trial_flops(trial(read_every=2)).train
    assert curriculum < plain and progressive < plain and every_other < plain
    for _, pmf in cost._schedule(TaskConfig(train_depth=16), RecipeConfig(grad_window=4, progressive_loss=True,
                                                                          extra_iterations=2)):
        assert sum(pmf.values()) == pytest.approx(1.0) and min(pmf) >= 1
    assert cost._depth_caps(TaskConfig(train_depth=16, curriculum=(6, 11), curriculum_steps=500), 400, 1200) == \
        [(6, 100), (11, 500), (16, 200)]
