"""The from-scratch extrapolation options (docs/experiments.md, experiment 8): dense progress targets on the operation
tokens, slack iteration counts, and the adapter's input-injection init."""

import math

import pytest
import torch
import torch.nn.functional as F

from par_ray.config import BackboneConfig, RecipeConfig, TaskConfig, TrainConfig, TrialConfig
from par_ray.model.looped import build_looped
from par_ray.objectives import dense_progress_loss
from par_ray.schedules import plan_step
from par_ray.tasks import build_task, get_task
from par_ray.tasks.common import Filler, RecentFirst
from par_ray.tasks.permutations import ALL_PERMUTATIONS, OBJ_BASE
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare
from par_ray.trial import resolve, validate


@pytest.mark.parametrize("name", ["swap_s5", "s5", "a5"])
@pytest.mark.parametrize("depth,seed", [(1, 0), (5, 3), (12, 7)])
def test_progress_ids_are_the_whole_state_after_each_prefix(name, depth, seed):
    task = get_task(name)
    ep = task.sample(depth, 32, seed=seed, step=2)
    assert ep.progress_ids.shape == (32, depth) and ep.op_positions.tolist() == list(range(1, depth + 1))
    assert task.num_states == 120 and ep.progress_ids.min() >= 0 and ep.progress_ids.max() < 120
    # Independent reference: replay the moves read from the prompt with plain tuples.
    move_of_token = {tok: move for tok, move in zip(task.move_token_ids, task.moves)}
    for b in range(32):
        state = tuple(range(5))
        for k in range(depth):
            move = move_of_token[int(ep.input_ids[b, ep.op_positions[k]])]
            state = tuple(state[move[p]] for p in range(5))
            assert ALL_PERMUTATIONS[int(ep.progress_ids[b, k])] == state
            # the query answers are read off the same state
            assert [OBJ_BASE + state[q] for q in task.query_positions] == ep.states[b, k].tolist()


def test_wrappers_keep_operation_positions_pointing_at_the_operations():
    base = get_task("swap_s5")
    ep = base.sample(6, 8, seed=1, step=4)
    rf = RecentFirst(base).sample(6, 8, seed=1, step=4)
    assert torch.equal(rf.input_ids[:, rf.op_positions], ep.input_ids[:, ep.op_positions])
    assert torch.equal(rf.progress_ids, ep.progress_ids)
    fi = Filler(base, 5).sample(6, 8, seed=1, step=4)
    assert torch.equal(fi.input_ids[:, fi.op_positions], ep.input_ids[:, ep.op_positions])
    assert torch.equal(fi.progress_ids, ep.progress_ids)
    assert RecentFirst(base).num_states == Filler(base, 5).num_states == 120


def test_dense_loss_supervises_exactly_the_positions_behind_the_frontier():
    torch.manual_seed(0)
    K, B, D, V, offset = 3, 2, 5, 130, 10
    logits = torch.randn(K, B, D, V, requires_grad=True)
    ids = torch.randint(0, 120, (B, D))
    out = dense_progress_loss(logits, [1, 2, 3], ids, ops_per_iteration=2, class_offset=offset)
    # c = 2: iteration 1 supervises j <= 2, iteration 2 j <= 4, iteration 3 j <= 5 (min(c·k, d))
    manual = torch.stack([
        F.cross_entropy(logits[k, :, :n].reshape(-1, V), (ids[:, :n] + offset).reshape(-1))
        for k, n in enumerate([2, 4, 5])
    ])
    assert torch.allclose(out.per_iteration_K, manual.detach()) and torch.allclose(out.loss, manual.mean())
    out.loss.backward()
    assert logits.grad[0, :, 2:].abs().sum() == 0 and logits.grad[1, :, 4:].abs().sum() == 0
    assert logits.grad[0, :, :2].abs().sum() > 0
    perfect = F.one_hot(ids + offset, V).float()[None].expand(K, -1, -1, -1) * 50
    assert dense_progress_loss(perfect, [1, 2, 3], ids, 2, offset).correct_KBQ.all()


def test_slack_iterations_are_drawn_per_step_and_leave_the_paper_schedule_alone():
    task = TaskConfig(train_depth=6)
    paper, slack = RecipeConfig(), RecipeConfig(extra_iterations=3)
    extra = set()
    for step in range(200):
        p, s = plan_step(task, paper, 0, step), plan_step(task, slack, 0, step)
        assert p.depth == s.depth and p.R == p.depth  # same depth stream; the paper's R = ceil(d / c)
        assert p.depth <= s.R <= p.depth + 3
        assert s == plan_step(task, slack, 0, step)  # pure function of (seed, step)
        extra.add(s.R - s.depth)
    assert extra == {0, 1, 2, 3}


def test_adapter_alpha_initialises_input_injection():
    task = get_task("swap_s5")
    for alpha in (0.0, 0.1):
        model = build_looped(BackboneConfig(adapter_alpha=alpha), RecipeConfig(), vocab_size=task.vocab_size)
        h = model.config.hidden_size
        W = model.adapter.weight
        assert torch.equal(W[:, h:], torch.eye(h)) and torch.allclose(W[:, :h], alpha * torch.eye(h))


def test_dense_step_trains_every_readout_and_keeps_the_query_accuracy():
    torch.set_num_threads(1)
    task_cfg, recipe = TaskConfig(train_depth=4), RecipeConfig(dense_targets=True, extra_iterations=2, grad_window=3)
    task = build_task(task_cfg)
    vocab = resolve(TrialConfig(task=task_cfg, recipe=recipe)).vocab
    assert vocab.dense == 120 and vocab.dense_offset == task.vocab_size and vocab.size == task.vocab_size + 120
    torch.manual_seed(0)
    model = build_looped(BackboneConfig(), recipe, vocab_size=vocab.size)
    engine = prepare(model, TrainConfig(batch_size=8, warmup_steps=0), World())
    losses = [train_step(engine, task, task_cfg, build_step_loss(recipe, task), 0, step, 8).loss for step in range(3)]
    # query CE starts near ln(V) and the dense CE near ln(V) too: their sum
    assert math.isfinite(losses[0]) and losses[0] == pytest.approx(2 * math.log(task.vocab_size + 120), rel=0.15)
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_config_refuses_unusable_values_of_the_new_fields():
    bad = TrialConfig(recipe=RecipeConfig(extra_iterations=-1, dense_targets=True),
                      backbone=BackboneConfig(adapter_alpha=-0.5, pretrained="/some/checkpoint"))
    with pytest.raises(ValueError) as e:
        validate(bad)
    for field in ("recipe.extra_iterations", "backbone.adapter_alpha", "recipe.dense_targets"):
        assert field in str(e.value)
    validate(TrialConfig(recipe=RecipeConfig(dense_targets=True, extra_iterations=2),
                         backbone=BackboneConfig(adapter_alpha=0.1)))


def test_done_targets_supervise_the_queries_only_once_the_task_is_complete():
    from par_ray.objectives import par_loss, supervised

    assert supervised([1, 2, 3, 4, 5], 4, 1, "done") == [False, False, False, True, True]
    assert supervised([1, 2, 3], 5, 2, "done") == [False, False, True]
    assert supervised([1, 2], 4, 1, "progress") == [True, True]
    torch.manual_seed(0)
    K, B, Q, V, D = 4, 3, 5, 9, 3
    logits = torch.randn(K, B, Q, V, requires_grad=True)
    states = torch.randint(0, V, (B, D, Q))
    out = par_loss(logits, [1, 2, 3, 4], states, 1, "done")
    manual = torch.stack([F.cross_entropy(logits[k].reshape(-1, V), states[:, -1].reshape(-1)) for k in (2, 3)])
    assert torch.allclose(out.loss, manual.mean())
    out.loss.backward()
    assert logits.grad[:2].abs().sum() == 0 and logits.grad[2:].abs().sum() > 0
    # no completed iteration in the window: a zero loss that still backpropagates (every rank runs backward)
    assert par_loss(logits[:1], [1], states, 1, "done").loss.item() == 0.0


def test_conv_position_scheme_is_causal_and_sees_three_left_neighbours():
    torch.manual_seed(0)
    model = build_looped(BackboneConfig(position_scheme="conv"), RecipeConfig(), vocab_size=30)
    assert model.state_conv is not None and model.state_conv.kernel_size == (4,)
    ids = torch.randint(0, 30, (2, 12))
    base = model.iterate(ids, torch.arange(12), 1, read="last").logits_KBQV[-1]
    changed = ids.clone()
    changed[:, 6] = (ids[:, 6] + 1) % 30
    diff_T = (model.iterate(changed, torch.arange(12), 1, read="last").logits_KBQV[-1] - base).abs().amax(dim=(0, 2))
    assert (diff_T[:6] == 0).all() and (diff_T[6:] > 0).all()  # causal: only token 6 and later move
    assert build_looped(BackboneConfig(), RecipeConfig(), vocab_size=30).state_conv is None  # rope: no conv


def test_attention_window_limits_how_far_one_iteration_moves_information():
    torch.manual_seed(0)
    # tiny shapes: 2 prelude + 2 core layers with window 2 move information at most 4 positions in iteration 1;
    # the coda (2 layers) keeps full causal attention, so read the state, not the logits
    model = build_looped(BackboneConfig(attention_window=2), RecipeConfig(), vocab_size=30)
    ids = torch.randint(0, 30, (2, 14))
    changed = ids.clone()
    changed[:, 3] = (ids[:, 3] + 1) % 30

    def state_after_one_iteration(x):
        captured = {}
        hook = model.core[-1].register_forward_hook(
            lambda m, i, o: captured.setdefault("s", o[0] if isinstance(o, tuple) else o))
        model.iterate(x, torch.arange(14), 1, read="last")
        hook.remove()
        return captured["s"]

    diff_T = (state_after_one_iteration(changed) - state_after_one_iteration(ids)).abs().amax(dim=(0, 2))
    assert (diff_T[:3] == 0).all() and (diff_T[3:8] > 0).all() and (diff_T[8:] == 0).all()
    full = build_looped(BackboneConfig(), RecipeConfig(), vocab_size=30)
    mask = full._positions(full.embed_tokens(ids), 1.0)[1]
    assert full._local(mask, ids[..., None]) is mask  # window 0: the parent's mask (None under SDPA), untouched
    with pytest.raises(ValueError, match="backbone.attention_window"):
        validate(TrialConfig(backbone=BackboneConfig(attention_window=-1)))


def test_pending_class_supervises_every_position_past_the_frontier():
    torch.manual_seed(0)
    K, B, D, V, offset = 2, 3, 4, 140, 10
    pending = offset + 120
    logits = torch.randn(K, B, D, V, requires_grad=True)
    ids = torch.randint(0, 120, (B, D))
    out = dense_progress_loss(logits, [1, 3], ids, ops_per_iteration=1, class_offset=offset, pending_id=pending)
    target = torch.stack([ids + offset, ids + offset])
    target[0, :, 1:] = pending  # iteration 1: operation 1 done, 2..4 pending
    target[1, :, 3:] = pending  # iteration 3: operations 1..3 done, 4 pending
    manual = torch.stack([F.cross_entropy(logits[k].reshape(-1, V), target[k].reshape(-1)) for k in range(K)])
    assert torch.allclose(out.per_iteration_K, manual.detach())
    out.loss.backward()
    assert (logits.grad.abs().sum(-1) > 0).all()  # every position of every iteration is trained
    recipe = RecipeConfig(dense_targets=True, dense_pending=True)
    vocab = resolve(TrialConfig(recipe=recipe)).vocab
    assert vocab.dense == 121 and vocab.pending_id == get_task("swap_s5").vocab_size + 120 == vocab.size - 1
    with pytest.raises(ValueError, match="recipe.dense_pending"):
        validate(TrialConfig(recipe=RecipeConfig(dense_pending=True)))


def test_given_prefix_draws_m_per_batch_and_computes_d_more_operations():
    from par_ray.tasks.common import GivenPrefix

    base = get_task("swap_s5")
    task = build_task(TaskConfig(name="swap_s5", given_prefix=4), train=True)
    assert isinstance(task, GivenPrefix) and not isinstance(build_task(TaskConfig(given_prefix=4)), GivenPrefix)
    seen = set()
    for step in range(40):
        ep = task.sample(3, 5, seed=1, step=step)
        m = ep.given
        seen.add(m)
        assert 0 <= m <= 4 and ep.depth == 3 + m
        ref = base.sample(3 + m, 5, seed=1, step=step)  # the base task's batch at depth d + m, untouched
        assert torch.equal(ep.input_ids, ref.input_ids) and torch.equal(ep.states, ref.states)
        again = task.sample(3, 5, seed=1, step=step)
        assert again.given == m and torch.equal(again.input_ids, ep.input_ids)  # pure function of (d, seed, step)
    assert seen == {0, 1, 2, 3, 4}
    with pytest.raises(ValueError, match="task.given_prefix"):
        GivenPrefix(get_task("reachability"), 2)


def test_given_prefix_moves_every_target_by_m():
    from par_ray.objectives import supervised, target_indices

    # m = 3 given, d = 8 in the prompt, c = 1: iteration k's query target is z_{min(3 + k, 8)}
    assert target_indices([1, 2, 5, 6], 8, 1, "progress", given=3) == [3, 4, 7, 7]
    assert supervised([4, 5], 8, 1, "done", given=3) == [False, True]
    K, B, D, V, offset = 2, 2, 6, 130, 10
    logits = torch.randn(K, B, D, V, requires_grad=True)
    ids = torch.randint(0, 120, (B, D))
    out = dense_progress_loss(logits, [1, 2], ids, 1, offset, given=3)
    out.loss.backward()
    # frontier m + c·k: positions 1..4 after iteration 1, 1..5 after iteration 2; nothing past it
    assert logits.grad[0, :, 4:].abs().sum() == 0 and logits.grad[0, :, :4].abs().sum() > 0
    assert logits.grad[1, :, 5:].abs().sum() == 0 and logits.grad[1, :, 4].abs().sum() > 0


def test_given_prefix_step_reads_the_given_operations_as_state_tokens(monkeypatch):
    torch.set_num_threads(1)
    task_cfg = TaskConfig(train_depth=3, given_prefix=2)
    recipe = RecipeConfig(dense_targets=True, dense_pending=True, grad_window=2)
    vocab = resolve(validate(TrialConfig(task=task_cfg, recipe=recipe))).vocab
    task = build_task(task_cfg, train=True)
    torch.manual_seed(0)
    model = build_looped(BackboneConfig(), recipe, vocab_size=vocab.size)
    engine = prepare(model, TrainConfig(batch_size=4, warmup_steps=0), World())
    seen = []
    real = model.iterate
    monkeypatch.setattr(model, "iterate", lambda ids, *a, **k: seen.append(ids.clone()) or real(ids, *a, **k))
    step = next(s for s in range(50) if task.sample(plan_step(task_cfg, recipe, 0, s).depth, 4, 0, s).given == 2)
    ep = task.sample(plan_step(task_cfg, recipe, 0, step).depth, 4, 0, step)
    res = train_step(engine, task, task_cfg, build_step_loss(recipe, task), 0, step, 4)
    ids = seen[0]
    assert torch.equal(ids[:, 1:3], task.vocab_size + ep.progress_ids[:, :2])  # z_1, z_2 as state tokens
    assert torch.equal(ids[:, 3:], ep.input_ids[:, 3:])  # the rest of the prompt as drawn
    assert res.plan.R == plan_step(task_cfg, recipe, 0, step).R and math.isfinite(res.loss)


def test_given_prefix_needs_dense_targets():
    with pytest.raises(ValueError, match="task.given_prefix"):
        validate(TrialConfig(task=TaskConfig(given_prefix=3)))
    with pytest.raises(ValueError, match="task.given_prefix"):
        validate(TrialConfig(task=TaskConfig(given_prefix=-1), recipe=RecipeConfig(dense_targets=True)))


def test_fixed_point_loss_covers_exactly_the_tokens_that_hold_or_wait():
    from par_ray.objectives import fixed_point_loss

    K, B, D = 3, 2, 6
    change = torch.rand(K, B, D, requires_grad=True)
    # m = 1 given, c = 1: iteration k moves the frontier from 1 + (k-1) to 1 + k; k = 1 has no previous state
    loss = fixed_point_loss(change, [1, 2, 3], 1, given=1)
    loss.backward()
    g = change.grad
    assert g[0].abs().sum() == 0  # k = 1: nothing
    assert g[1, :, 2].abs().sum() == 0 and g[2, :, 3].abs().sum() == 0  # the frontier tokens (j = m + k) change
    assert (g[1, :, [0, 1, 3, 4, 5]] > 0).all() and (g[2, :, [0, 1, 2, 4, 5]] > 0).all()
    held = torch.cat([change[1, :, [0, 1, 3, 4, 5]].flatten(), change[2, :, [0, 1, 2, 4, 5]].flatten()])
    assert torch.allclose(loss, held.mean())


def test_state_change_is_the_relative_change_of_each_token_between_iterations():
    torch.manual_seed(0)
    task = get_task("swap_s5")
    model = build_looped(BackboneConfig(adapter_alpha=0.1), RecipeConfig(), vocab_size=task.vocab_size)
    ep = task.sample(3, 2, seed=0)
    out = model.iterate(ep.input_ids, ep.read_positions, 3, read="all", state_change=True)
    assert out.state_change_KBT.shape == (3, 2, ep.input_ids.shape[1])
    assert (out.state_change_KBT[0] == 0).all() and (out.state_change_KBT[1:] > 0).all()
    assert model.iterate(ep.input_ids, ep.read_positions, 3).state_change_KBT is None
    with pytest.raises(ValueError, match="recipe.fixed_point_weight"):
        validate(TrialConfig(recipe=RecipeConfig(fixed_point_weight=1.0)))


def test_coda_window_limits_what_the_read_out_sees():
    torch.manual_seed(0)
    task = get_task("swap_s5")
    model = build_looped(BackboneConfig(coda_window=3), RecipeConfig(), vocab_size=task.vocab_size)
    ids = task.sample(6, 2, seed=0).input_ids
    T = ids.shape[1]
    read = torch.tensor([T - 1])  # the last query
    x = model.embed_tokens(ids)
    pos, mask = model._positions(x, 1.0)
    coda_mask = model._local(mask, x, model.coda_window)
    state = torch.randn(2, T, model.config.hidden_size)
    moved = state.clone()
    moved[:, : T - 1 - 2 * (3 - 1)] += 1.0  # every token the last query cannot reach through 2 coda layers of w = 3
    assert torch.allclose(model.readout(state, read, pos, coda_mask), model.readout(moved, read, pos, coda_mask),
                          atol=1e-5)
    assert not torch.allclose(model.readout(state, read, pos, mask), model.readout(moved, read, pos, mask), atol=1e-5)
    moved[:, T - 1 - 2 * (3 - 1)] += 1.0  # the furthest token it reaches
    assert not torch.allclose(model.readout(state, read, pos, coda_mask), model.readout(moved, read, pos, coda_mask),
                              atol=1e-5)
