"""Learned halting (paper §3): targets and class weights, the balanced loss, the k-of-n rule, halting evaluation,
the halting query position and tokens, and a training step with halting and frozen parts."""

import dataclasses
import math
import re

import pytest
import torch

from par_ray.config import (BackboneConfig, EvalConfig, RecipeConfig, TaskConfig, TrainConfig, TrialConfig,
                            with_overrides)
from par_ray.evaluation import (best_iteration, extrapolation, extrapolation_metrics, halt_max_iterations,
                                halting_by_depth, halting_metrics, k_of_n_stop, k_of_n_stops, stopping_extrapolation)
from par_ray.halting import (HaltTokens, p_yes, task_halt_tokens, tokenizer_halt_tokens,
                             with_halt_query, yes_no_logits)
from par_ray.model.looped import LoopedOutput, build_looped
from par_ray.objectives import halting_class_weights, halting_loss, halting_targets, par_loss
from par_ray.recipes import apply_recipe
from par_ray.stages import frozen_parameters
from par_ray.tasks import build_task, get_task
from par_ray.train.step import build_step_loss, train_step
from par_ray.tracking_schema import rule_suffix
from par_ray.train.strategies import World, prepare
from par_ray.trial import resolve, validate


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread per module


# ---------------------------------------------------------------------------------------------------------------------
# targets, class weights, loss


def test_targets_forced_depth_window_has_one_yes():
    # forced depth: d = 5, c = 1 -> R = 5; a window of 3 reads k = 3, 4, 5: only k = R says Yes
    assert halting_targets([3, 4, 5], 5, 1) == [0, 0, 1]
    # c = 2, d = 5 -> R = 3: 2·3 = 6 >= 5
    assert halting_targets([1, 2, 3], 5, 2) == [0, 0, 1]
    w = halting_class_weights(torch.tensor([0, 0, 1]))
    assert w.tolist() == pytest.approx([3 / (2 * 2), 3 / (2 * 2), 3 / (2 * 1)])  # K / (C · n_c)


def test_targets_hold_steps_keep_yes_past_d_over_c():
    # hold: d = 3, R = 7, window k = 1..7: Yes from k = 3 on
    assert halting_targets(list(range(1, 8)), 3, 1) == [0, 0, 1, 1, 1, 1, 1]
    w = halting_class_weights(torch.tensor([0, 0, 1, 1, 1, 1, 1]))
    assert w[:2].tolist() == pytest.approx([7 / 4] * 2) and w[2:].tolist() == pytest.approx([7 / 10] * 5)
    # a window entirely past d / c has one class: weights 1, a plain mean
    assert halting_targets([4, 5, 6], 3, 1) == [1, 1, 1]
    assert halting_class_weights(torch.tensor([1, 1, 1])).tolist() == [1.0, 1.0, 1.0]


def test_balanced_loss_is_mean_of_class_means():
    torch.manual_seed(0)
    K, B = 4, 6
    logits = torch.randn(K, B, 2, requires_grad=True)
    out = halting_loss(logits, [1, 2, 3, 4], 2, 1)  # targets 0, 1, 1, 1
    assert out.targets_K.tolist() == [0, 1, 1, 1]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 2), out.targets_K.repeat_interleave(B),
                                           reduction="none").view(K, B)
    want = 0.5 * ce[0].mean() + 0.5 * ce[1:].mean()
    assert torch.allclose(out.loss, want)
    out.loss.backward()
    assert logits.grad.abs().sum() > 0
    assert out.correct_KB.shape == (K, B)


# ---------------------------------------------------------------------------------------------------------------------
# the k-of-n rule


def _stop(seq, k=6, n=8, tau=0.5):
    R, halted = k_of_n_stop(torch.tensor(seq, dtype=torch.float32)[:, None], k, n, tau)
    return int(R[0]), bool(halted[0])


LO, HI = 0.1, 0.9


def test_rule_fires_at_first_qualifying_R():
    # R = 1 exceeds tau but its window holds only 1 of 8; from R = 5 on, eight in a row
    seq = [HI, LO, LO, LO] + [HI] * 8 + [LO] * 8
    assert _stop(seq) == (5, True)
    # a qualifying window that starts on an iteration below tau does not fire there: R must itself exceed tau
    seq = [LO, HI, HI, HI, HI, HI, HI, LO, LO, LO, LO, LO]
    assert _stop(seq) == (2, True)


def test_exactly_six_of_eight_passes_five_does_not():
    six = [LO, LO] + [HI, HI, LO, HI, HI, LO, HI, HI] + [LO] * 10
    assert _stop(six) == (3, True)
    five = [LO, LO] + [HI, HI, LO, HI, LO, LO, HI, HI] + [LO] * 10
    assert _stop(five) == (len(five), False)
    # tau is strict: P(Yes) == tau does not count
    assert _stop([0.5] * 20) == (20, False)


def test_never_fires_is_answered_at_R_max():
    R, halted = k_of_n_stop(torch.full((12, 3), 0.3), 6, 8, 0.5)
    assert R.tolist() == [12, 12, 12] and not halted.any()


def test_window_running_past_R_max_counts_only_run_iterations():
    # R_max = 10: from R = 5 the window 5..12 has only 5..10 run; six of them exceed tau -> fires at 5
    assert _stop([LO] * 4 + [HI] * 6) == (5, True)
    # only five left above tau before R_max: never fires
    assert _stop([LO] * 5 + [HI] * 5) == (10, False)
    # n larger than R_max altogether
    assert _stop([HI] * 4, k=4, n=8) == (1, True)


def test_rule_is_vectorised_over_sequences():
    seqs = torch.tensor([[LO] * 2 + [HI] * 8, [HI] * 10, [LO] * 10]).T  # (R_max=10, B=3)
    R, halted = k_of_n_stop(seqs, 6, 8, 0.5)
    assert R.tolist() == [3, 1, 10] and halted.tolist() == [True, True, False]


def test_several_rules_from_one_probability_tensor_equal_each_rule_alone():
    g = torch.Generator().manual_seed(0)
    # random P(Yes), plus rows that sit exactly on tau and rows that step up late, to exercise window clipping
    p = torch.cat([torch.rand(20, 64, generator=g), torch.full((20, 2), 0.5),
                   (torch.arange(20.0) >= 15).float()[:, None].expand(20, 2) * 0.9 + 0.05], dim=1)
    rules = [(6, 8, 0.5), (4, 8, 0.5), (8, 8, 0.5), (1, 1, 0.5), (6, 8, 0.3), (6, 8, 0.7), (3, 30, 0.4), (2, 2, 0.5)]
    R_XB, halted_XB = k_of_n_stops(p, rules)
    assert R_XB.shape == halted_XB.shape == (len(rules), p.shape[1])
    for x, rule in enumerate(rules):
        R_B, halted_B = k_of_n_stop(p, *rule)
        assert torch.equal(R_XB[x], R_B) and torch.equal(halted_XB[x], halted_B), rule
    assert len({tuple(R.tolist()) for R in R_XB}) > 4  # the rules do differ on this tensor
    with pytest.raises(ValueError, match=r"eval\.halt_rules\[1\]: k must be in \[1, n=4\]"):
        k_of_n_stops(p, [(6, 8, 0.5), (5, 4, 0.5)])
    with pytest.raises(ValueError, match=r"eval\.halt_rules\[0\]: tau must be in \(0, 1\)"):
        k_of_n_stops(p, [(6, 8, 1.0)])


@pytest.mark.parametrize("k,n,tau,field", [(7, 6, 0.5, "eval.halt_k"), (0, 8, 0.5, "eval.halt_k"),
                                           (6, 8, 0.0, "eval.halt_tau"), (6, 8, 1.0, "eval.halt_tau")])
def test_rule_rejects_bad_parameters(k, n, tau, field):
    with pytest.raises(ValueError, match=field):
        k_of_n_stop(torch.zeros(8, 1), k, n, tau)


# ---------------------------------------------------------------------------------------------------------------------
# tokens and the halting query position


def test_task_vocabulary_gains_three_ids_only_with_halting():
    task = get_task("swap_s5")
    tok = task_halt_tokens(task.vocab_size)
    assert (tok.query, tok.yes, tok.no) == (task.vocab_size, task.vocab_size + 1, task.vocab_size + 2)
    halting = apply_recipe(TrialConfig(), "par_halt")
    assert resolve(TrialConfig()).vocab.size == task.vocab_size
    assert resolve(halting).vocab.size == task.vocab_size + 3 and resolve(halting).vocab.halt_offset == tok.query
    pretrained = resolve(with_overrides(halting, backbone={"pretrained": "/some/dir"})).vocab
    assert pretrained.halting == 0 and pretrained.parent is not None  # the tokenizer's own words, no ids added


class _Tokenizer:
    def __init__(self, vocab):
        self.vocab = vocab

    def encode(self, text, add_special_tokens=True):
        return self.vocab[text]


def test_pretrained_parents_use_the_tokenizers_yes_and_no():
    tok = tokenizer_halt_tokens(_Tokenizer({"?": [30], " Yes": [7414], " No": [2308]}))
    assert tok == HaltTokens(query=30, yes=7414, no=2308)
    with pytest.raises(ValueError, match="backbone.pretrained"):
        tokenizer_halt_tokens(_Tokenizer({"?": [30], " Yes": [1, 2], " No": [2308]}))


def test_halt_query_is_appended_and_leaves_answers_unchanged():
    task = get_task("swap_s5")
    ep = task.sample(5, 3, seed=1)
    tok = task_halt_tokens(task.vocab_size)
    hep = with_halt_query(ep, tok.query)
    T = ep.input_ids.shape[1]
    assert torch.equal(hep.input_ids[:, :T], ep.input_ids) and (hep.input_ids[:, T] == tok.query).all()
    assert hep.read_positions.tolist() == [*ep.read_positions.tolist(), T] and hep.states is ep.states
    torch.manual_seed(0)
    model = build_looped(BackboneConfig(), RecipeConfig(), vocab_size=task.vocab_size + 3)
    plain = model.iterate(ep.input_ids, ep.read_positions, 4, read="all").logits_KBQV
    with_q = model.iterate(hep.input_ids, hep.read_positions, 4, read="all").logits_KBQV
    assert torch.allclose(with_q[:, :, :-1], plain, atol=1e-5)  # causal: the appended token changes no answer
    p = p_yes(with_q[:, :, -1], tok)
    assert p.shape == (4, 3) and ((0 < p) & (p < 1)).all()
    assert torch.allclose(p, torch.softmax(yes_no_logits(with_q[:, :, -1], tok), -1)[..., 1])



def test_halt_query_keeps_every_other_episode_field():
    # A given-prefix training batch (task.given_prefix): the appended query must not drop ``given`` (it once did, so
    # halting steps trained a prompt of d + m operations against the targets of d, docs/experiments.md §17).
    task = build_task(TaskConfig(given_prefix=5), train=True)
    ep = next(e for e in (task.sample(3, 2, seed=0, step=s) for s in range(50)) if e.given > 0)
    hep = with_halt_query(ep, task_halt_tokens(task.vocab_size).query)
    for f in dataclasses.fields(ep):
        if f.name not in ("input_ids", "read_positions"):
            a, b = getattr(ep, f.name), getattr(hep, f.name)
            assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b), f.name


# ---------------------------------------------------------------------------------------------------------------------
# evaluation with halting


def streamed(out: LoopedOutput, reduce) -> LoopedOutput:
    """A scripted model's output as ``LoopedLM.iterate`` returns it when given ``reduce``: each iteration's logits
    reduced, in order, and no logits kept."""
    if reduce is None:
        return out
    kept_K = torch.stack([reduce(k, logits_BQV) for k, logits_BQV in zip(out.iterations, out.logits_KBQV)])
    return LoopedOutput(None, out.iterations, out.state_rms_R, reduced_K=kept_K)


def _scripted_halting():
    """(task, halting tokens, eval config, test sets by depth, model_fn) of a fake model whose halting probability
    and answers are scripted per iteration (see the next test)."""
    task = get_task("swap_s5")
    tok = task_halt_tokens(task.vocab_size)
    V = task.vocab_size + 3
    cfg = EvalConfig(depths=(4, 8), num_sequences=20, batch_size=8, seed=3)
    tests = {d: task.sample(d, 20, seed=3) for d in cfg.depths}

    def model_fn(ids, reads, R, window, stretch, read, reduce=None):
        assert read == "all" and R == 16 and (ids[:, -1] == tok.query).all()
        d = ids.shape[1] - 2 - 5 - 1
        ep = tests[d]
        rows = [next(i for i in range(20) if torch.equal(ep.input_ids[i], x[:-1])) for x in ids]
        logits = torch.zeros(R, len(rows), 6, V)
        wrong = (ep.states[rows, -1] + 1 - 2) % 5 + 2  # another object token
        even = ids[:, 1] % 2 == 0
        for k in range(1, R + 1):
            ans = ep.states[rows, -1] if k >= d else wrong
            logits[k - 1, :, :5] = torch.nn.functional.one_hot(ans, V).float() * 10
            yes = even & (k >= d + 1)
            logits[k - 1, :, 5, tok.yes] = torch.where(yes, 5.0, -5.0)
        return streamed(LoopedOutput(logits, list(range(1, R + 1)), torch.ones(R)), reduce)

    return task, tok, cfg, tests, model_fn


def test_halting_by_depth_against_hand_made_model_and_sharding():
    """A fake model whose halting probability and answers are scripted per iteration.

    Rows with an even first operation token say Yes from iteration ⌈d/c⌉ + 1 on (one late) and are answered right
    from R* on; odd rows never say Yes (answered at R_max, right as well since iterations >= R* are right). At depth
    4 R* = 4; R_max = 2 × 8 = 16.
    """
    task, tok, cfg, tests, model_fn = _scripted_halting()
    assert halt_max_iterations(cfg, 1) == 16
    res = halting_by_depth(model_fn, task, cfg, 1, tok, torch.device("cpu"))
    for d in cfg.depths:
        even = (tests[d].input_ids[:, 1] % 2 == 0).float()
        frac_even = even.mean().item()
        r = res[d]
        assert r["oracle_acc"] == 1.0 and r["halt_acc"] == 1.0
        assert r["never_halted"] == pytest.approx(1 - frac_even)
        dR = even * 1 + (1 - even) * (16 - d)
        assert r["dR_mean"] == pytest.approx(dR.mean().item())
        assert r["dR_std"] == pytest.approx(dR.std(unbiased=False).item(), abs=1e-6)
        assert r["halt_iter"] == pytest.approx(d + dR.mean().item())
        assert len(r["p_yes_k"]) == 16
    # rank 0 then rank 1, each on half the rows; rank 1's reduce_sum adds rank 0's tensors (same call order)
    sent = []
    halting_by_depth(model_fn, task, cfg, 1, tok, torch.device("cpu"), rank=0, world_size=2,
                     reduce_sum=lambda t: sent.append(t.clone()) or t)
    merged = halting_by_depth(model_fn, task, cfg, 1, tok, torch.device("cpu"), rank=1, world_size=2,
                              reduce_sum=lambda t: t + sent.pop(0))
    for d in cfg.depths:
        for key in ("halt_acc", "oracle_acc", "never_halted", "dR_mean", "dR_std", "halt_iter"):
            assert merged[d][key] == pytest.approx(res[d][key])
    m = halting_metrics(res, 1)
    assert m["halt_gap_d4"] == 0.0 and m["never_halted_d8"] == res[8]["never_halted"]
    assert {f"halt_prob_k{k}" for k in range(1, 9)} <= set(m) and "halt_prob_k9" not in m  # 2 ⌈4/1⌉ on depth 4
    assert {"halt_acc_d8", "oracle_acc_d8", "halt_iter_d8", "halt_dR_mean_d8", "halt_dR_std_d8"} <= set(m)
    assert all(res[d]["rules"] == {} for d in cfg.depths) and not any("_k" in name for name in m if "_d" in name)


# ---------------------------------------------------------------------------------------------------------------------
# the oracle best fixed R per depth, and G of each stopping


def test_best_iteration_is_the_argmax_of_the_counts_summed_over_ranks_smallest_R_on_ties():
    # right_RB (R_max 5, 6 sequences) split over two ranks: rank 0's best R alone is 2, rank 1's is 4, the whole
    # test set's is 3 — the max must be taken after the sum
    right_RB = torch.tensor([[1, 0, 0, 0, 0, 0],  # rank 0: columns 0, 2, 4; rank 1: columns 1, 3, 5
                             [1, 0, 1, 0, 1, 0],
                             [1, 1, 1, 1, 0, 0],
                             [0, 1, 0, 1, 0, 1],
                             [0, 1, 0, 0, 0, 0]], dtype=torch.bool)
    rank0_R, rank1_R = right_RB[:, 0::2].double().sum(1), right_RB[:, 1::2].double().sum(1)
    assert best_iteration(rank0_R)[0] == 2 and best_iteration(rank1_R)[0] == 4
    assert best_iteration(rank0_R + rank1_R) == (3, 4.0) == best_iteration(right_RB.double().sum(1))
    assert best_iteration(torch.tensor([2.0, 5.0, 5.0, 1.0])) == (2, 5.0)  # ties: the smallest R
    assert best_iteration(torch.zeros(3)) == (1, 0.0)
    with pytest.raises(ValueError, match="right_R: must be"):
        best_iteration(right_RB.double())


def _right_at(rule):
    """:func:`_scripted_halting`'s test sets with a model whose answers are right after iteration k iff
    ``rule(k, i)`` (i: the row of the test set) and which never says Yes."""
    task, tok, cfg, tests, _ = _scripted_halting()
    V = task.vocab_size + 3

    def model_fn(ids, reads, R, window, stretch, read, reduce=None):
        d = ids.shape[1] - 2 - 5 - 1
        ep = tests[d]
        rows = [next(i for i in range(20) if torch.equal(ep.input_ids[i], x[:-1])) for x in ids]
        wrong = (ep.states[rows, -1] + 1 - 2) % 5 + 2
        logits = torch.zeros(R, len(rows), 6, V)
        for k in range(1, R + 1):
            right = torch.tensor([rule(k, i) for i in rows])
            ans = torch.where(right[:, None], ep.states[rows, -1], wrong)
            logits[k - 1, :, :5] = torch.nn.functional.one_hot(ans, V).float() * 10
            logits[k - 1, :, 5, tok.no] = 5.0
        return streamed(LoopedOutput(logits, list(range(1, R + 1)), torch.ones(R)), reduce)

    return task, tok, cfg, model_fn


def test_halting_by_depth_reports_the_best_fixed_R_summed_over_ranks_before_the_max():
    # even rows right at iteration 2, odd rows at 4, rows 0-11 also at 3: rank 0 (even rows) alone would pick 2,
    # rank 1 (odd rows) 4; the test set's best is 3 (12 of 20 right)
    task, tok, cfg, model_fn = _right_at(lambda k, i: k == (2 if i % 2 == 0 else 4) or (k == 3 and i < 12))
    cpu = torch.device("cpu")
    res = halting_by_depth(model_fn, task, cfg, 1, tok, cpu)
    for d in cfg.depths:
        assert (res[d]["best_iter"], res[d]["best_acc"]) == (3, pytest.approx(0.6))
        assert res[d]["halt_acc"] == 0.0 and res[d]["never_halted"] == 1.0  # answered at R_max = 16: wrong
    sent = []
    halting_by_depth(model_fn, task, cfg, 1, tok, cpu, rank=0, world_size=2,
                     reduce_sum=lambda t: sent.append(t.clone()) or t)
    assert len(sent) == 2 * len(cfg.depths)  # one all-reduce of the rule counts, one of the per-R sums, per depth
    alone = halting_by_depth(model_fn, task, cfg, 1, tok, cpu, rank=0, world_size=2)
    assert alone[4]["best_iter"] == 2  # rank 0's rows alone
    merged = halting_by_depth(model_fn, task, cfg, 1, tok, cpu, rank=1, world_size=2,
                              reduce_sum=lambda t: t + sent.pop(0))
    for d in cfg.depths:
        assert (merged[d]["best_iter"], merged[d]["best_acc"]) == (3, pytest.approx(0.6))
    m = halting_metrics(res, 1)
    assert (m["best_acc_d8"], m["best_iter_d8"]) == (pytest.approx(0.6), 3.0)
    # the scripted model of the test above: right from iteration d on, so the best R is d (ties: the smallest)
    task, tok, cfg, _, scripted = _scripted_halting()
    res = halting_by_depth(scripted, task, cfg, 1, tok, cpu)
    assert [(res[d]["best_iter"], res[d]["best_acc"]) for d in cfg.depths] == [(4, 1.0), (8, 1.0)]


def test_G_of_own_halting_best_R_and_the_pending_signal_from_halting_results():
    chance, d_train = 1 / 120, 4
    res = {4: {"halt_acc": 0.9, "best_acc": 1.0, "pending": {(6, 8, 0.5): {"halt_acc": 0.95}}},
           8: {"halt_acc": 0.2, "best_acc": 0.7, "pending": {(6, 8, 0.5): {"halt_acc": 0.6}}},
           16: {"halt_acc": 0.0, "best_acc": 0.3, "pending": {(6, 8, 0.5): {"halt_acc": 0.55}}}}
    ex = stopping_extrapolation(res, chance, d_train)
    assert list(ex) == ["halt", "best", "halt_pending"]
    assert ex["halt"] == extrapolation({4: 0.9, 8: 0.2, 16: 0.0}, chance, d_train)
    assert (ex["halt"].d50, ex["halt"].G, ex["best"].d50, ex["best"].G) == (8, 2.0, 16, 4.0)
    assert ex["halt_pending"].censored and ex["halt_pending"].G == 4.0  # never below the midpoint: ≥ 4
    m = {k: v for s, e in ex.items() for k, v in extrapolation_metrics(e, s).items()}
    mid = (chance + 1) / 2
    assert m["G_halt"] == 2.0 and m["G_halt_censored"] == 0.0 and m["d50_halt"] == 8.0
    assert m["G_halt_interp"] == pytest.approx((4 + (0.9 - mid) / (0.9 - 0.2) * 4) / d_train)
    assert (m["G_best"], m["G_best_censored"]) == (4.0, 0.0)
    assert m["G_best_interp"] == pytest.approx((8 + (0.7 - mid) / (0.7 - 0.3) * 8) / d_train)
    # censored: G and G_interp are the lower bound, no d50
    assert (m["G_halt_pending"], m["G_halt_pending_interp"], m["G_halt_pending_censored"]) == (4.0, 4.0, 1.0)
    assert "d50_halt_pending" not in m and "d50_halt_pending_interp" not in m
    assert set(extrapolation_metrics(ex["halt"])) == {"G", "G_censored", "G_interp", "d50", "d50_interp"}
    no_pending = {d: {k: v for k, v in r.items() if k != "pending"} for d, r in res.items()}
    assert list(stopping_extrapolation(no_pending, chance, d_train)) == ["halt", "best"]
    assert stopping_extrapolation({}, chance, d_train) == {}


EXTRA_RULES = ((4, 8, 0.5), (1, 1, 0.999), (8, 8, 0.3))
"""(1, 1, 0.999) never fires on the scripted model (P(Yes) ≈ 0.993 at most): every sequence runs to R_max."""


def test_extra_rules_from_one_pass_equal_each_rule_run_as_the_primary():
    task, tok, cfg, tests, model_fn = _scripted_halting()
    calls = []
    counted = lambda *a, **kw: calls.append(a[2]) or model_fn(*a, **kw)  # noqa: E731
    res = halting_by_depth(counted, task, dataclasses.replace(cfg, halt_rules=EXTRA_RULES), 1, tok,
                           torch.device("cpu"))
    assert len(calls) == len(cfg.depths) * 3  # 20 sequences in chunks of 8: one pass, not one per rule
    for rule in EXTRA_RULES:
        k, n, tau = rule
        alone = halting_by_depth(model_fn, task, dataclasses.replace(cfg, halt_k=k, halt_n=n, halt_tau=tau), 1, tok,
                                 torch.device("cpu"))
        for d in cfg.depths:
            want = {key: alone[d][key] for key in ("halt_acc", "never_halted", "halt_iter", "dR_mean", "dR_std")}
            assert res[d]["rules"][rule] == pytest.approx(want), (rule, d)
            assert res[d]["oracle_acc"] == alone[d]["oracle_acc"]
    never = res[8]["rules"][(1, 1, 0.999)]
    assert (never["never_halted"], never["halt_iter"], never["dR_mean"], never["dR_std"]) == (1.0, 16.0, 8.0, 0.0)
    # the primary rule's numbers are those of a pass without extra rules
    plain = halting_by_depth(model_fn, task, cfg, 1, tok, torch.device("cpu"))
    assert all({k: v for k, v in res[d].items() if k != "rules"} == {k: v for k, v in plain[d].items() if k != "rules"}
               for d in cfg.depths)

    m = halting_metrics(res, 1)
    assert rule_suffix(4, 8, 0.5) == "k4n8t0.5" and rule_suffix(6, 8, 1e-5) == "k6n8t1e-05"
    for kind in ("halt_acc", "halt_gap", "halt_iter", "halt_dR_mean", "halt_dR_std", "never_halted"):
        assert {f"{kind}_d{d}" for d in cfg.depths} <= set(m)  # the primary rule: names unchanged
        for suffix in ("k4n8t0.5", "k1n1t0.999", "k8n8t0.3"):
            assert {f"{kind}_d{d}_{suffix}" for d in cfg.depths} <= set(m)
    assert not any(name.startswith("oracle_acc") and "_k" in name for name in m)  # oracle stopping: one per depth
    assert m["never_halted_d8_k1n1t0.999"] == 1.0
    assert m["halt_gap_d8_k4n8t0.5"] == pytest.approx(100.0 * (res[8]["oracle_acc"] - res[8]["rules"][(4, 8, 0.5)]
                                                               ["halt_acc"]))
    mlflow_name = re.compile(r"^[A-Za-z0-9_\-. /]+$")  # MLflow's allowed metric-name characters
    assert all(mlflow_name.match(name) for name in m)


# ---------------------------------------------------------------------------------------------------------------------
# the last operation's pending signal (recipe.dense_pending; a par_ray signal, docs/experiments.md §14)


PENDING_RULES = ((1, 1, 0.5), (8, 8, 0.5))


def _scripted_pending():
    """:func:`_scripted_halting` plus a scripted dense read-out at the last operation, read when the evaluation asks
    for it (a seventh read position). Row b's pending logit is 20 · (d + s_b − k) + 10 after iteration k, every other
    logit 0, s_b = (first operation token mod 3) − 2 ∈ {−2, −1, 0}: 1 − P(pending) > 0.5 exactly from iteration
    d + s_b + 1 on (P(pending) > 0.99 before, < 1e-6 after). Every logit tensor returned is kept in ``seen``."""
    task, tok, cfg, tests, halting_fn = _scripted_halting()
    offset = task.vocab_size + 3  # VocabLayout.dense_offset of a random-init halting trial
    pending_id = offset + task.num_states
    V = pending_id + 1
    seen = []

    def model_fn(ids, reads, R, window, stretch, read, reduce=None):
        d = ids.shape[1] - 2 - 5 - 1
        out = halting_fn(ids, reads[:6], R, window, stretch, read)
        logits = torch.zeros(R, ids.shape[0], len(reads), V)
        logits[:, :, :6, : out.logits_KBQV.shape[-1]] = out.logits_KBQV
        if len(reads) == 7:
            assert reads[-1] == tests[d].op_positions[-1] == d  # the last operation
            shift = ids[:, 1] % 3 - 2
            k = torch.arange(1, R + 1)[:, None]
            logits[:, :, 6, pending_id] = 20.0 * (d + shift[None] - k) + 10.0
        seen.append(logits)
        return streamed(LoopedOutput(logits, list(range(1, R + 1)), torch.ones(R)), reduce)

    return task, tok, dataclasses.replace(cfg, halt_rules=PENDING_RULES), tests, model_fn, pending_id, seen


def test_pending_signal_is_the_k_of_n_rule_on_one_minus_p_pending_from_the_same_pass():
    task, tok, cfg, tests, model_fn, pending_id, seen = _scripted_pending()
    cpu = torch.device("cpu")
    res = halting_by_depth(model_fn, task, cfg, 1, tok, cpu, pending_id=pending_id)
    calls_with = len(seen)
    seen.clear()
    plain = halting_by_depth(model_fn, task, cfg, 1, tok, cpu)
    assert len(seen) == calls_with == len(cfg.depths) * 3  # the pending signal costs no forward call
    assert all("pending" not in plain[d] for d in cfg.depths)
    # the query signal's numbers are unchanged by reading the last operation too
    assert all({k: v for k, v in res[d].items() if k != "pending"} == plain[d] for d in cfg.depths)

    rules = [(6, 8, 0.5), *PENDING_RULES]  # primary first
    seen.clear()
    res = halting_by_depth(model_fn, task, cfg, 1, tok, cpu, pending_id=pending_id)
    chunks = iter(seen)
    for d in cfg.depths:
        assert list(res[d]["pending"]) == rules
        logits_RBQV = torch.cat([next(chunks) for _ in range(3)], dim=1)  # this depth's three chunks
        right_RB = (logits_RBQV[:, :, :5].argmax(-1) == tests[d].states[:, -1]).all(-1)
        p_RB = 1.0 - logits_RBQV[:, :, 6].softmax(-1)[..., pending_id]
        R_XB, halted_XB = k_of_n_stops(p_RB, rules)
        for rule, R_B, halted_B in zip(rules, R_XB, halted_XB):
            dR_B = (R_B - d).double()
            want = {"halt_acc": right_RB.gather(0, (R_B - 1)[None])[0].double().mean().item(),
                    "never_halted": (~halted_B).double().mean().item(), "halt_iter": R_B.double().mean().item(),
                    "dR_mean": dR_B.mean().item(), "dR_std": dR_B.std(unbiased=False).item()}
            assert res[d]["pending"][rule] == pytest.approx(want, abs=1e-9), (d, rule)
        # by hand: every rule stops at d + s + 1 (the signal never falls back); rows with s = -2 stop at d - 1, before
        # the answer is right (from iteration d on)
        shift = (tests[d].input_ids[:, 1] % 3 - 2).double()
        for rule in rules:
            r = res[d]["pending"][rule]
            assert r["never_halted"] == 0.0 and r["dR_mean"] == pytest.approx((shift + 1).mean().item())
            assert r["halt_acc"] == pytest.approx((shift > -2).double().mean().item())

    # rank 0 then rank 1 on half the rows: one all-reduce carries both signals
    sent = []
    halting_by_depth(model_fn, task, cfg, 1, tok, cpu, rank=0, world_size=2, pending_id=pending_id,
                     reduce_sum=lambda t: sent.append(t.clone()) or t)
    merged = halting_by_depth(model_fn, task, cfg, 1, tok, cpu, rank=1, world_size=2, pending_id=pending_id,
                              reduce_sum=lambda t: t + sent.pop(0))
    for d in cfg.depths:
        for rule in rules:
            assert merged[d]["pending"][rule] == pytest.approx(res[d]["pending"][rule])


def test_pending_metric_names_only_with_the_pending_signal():
    task, tok, cfg, tests, model_fn, pending_id, _ = _scripted_pending()
    res = halting_by_depth(model_fn, task, cfg, 1, tok, torch.device("cpu"), pending_id=pending_id)
    m = halting_metrics(res, 1)
    kinds = ("halt_acc", "halt_gap", "halt_iter", "halt_dR_mean", "halt_dR_std", "never_halted")
    for d in cfg.depths:
        for kind in kinds:
            assert f"{kind}_d{d}_pending" in m  # the primary rule
            assert {f"{kind}_d{d}_{rule_suffix(*rule)}_pending" for rule in PENDING_RULES} <= set(m)
        p = res[d]["pending"]
        assert m[f"halt_acc_d{d}_pending"] == p[(6, 8, 0.5)]["halt_acc"]
        assert m[f"halt_dR_mean_d{d}_k8n8t0.5_pending"] == p[(8, 8, 0.5)]["dR_mean"]
        assert m[f"halt_gap_d{d}_k1n1t0.5_pending"] == pytest.approx(
            100.0 * (res[d]["oracle_acc"] - p[(1, 1, 0.5)]["halt_acc"]))
        assert m[f"halt_acc_d{d}"] == res[d]["halt_acc"]  # the query signal's names and values stay
    assert not any(name.startswith("oracle_acc") and name.endswith("_pending") for name in m)
    pending_names = {name for name in m if name.endswith("_pending")}
    assert len(pending_names) == len(cfg.depths) * len(kinds) * (1 + len(PENDING_RULES))
    assert all(re.match(r"^[A-Za-z0-9_\-. /]+$", name) for name in m)
    plain = halting_metrics(halting_by_depth(model_fn, task, cfg, 1, tok, torch.device("cpu")), 1)
    assert set(m) - pending_names == set(plain) and not any("pending" in name for name in plain)


@pytest.mark.parametrize("dense_pending", [True, False])
def test_the_loops_evaluation_logs_the_pending_signal_only_with_dense_pending(dense_pending):
    from par_ray import presets
    from par_ray.halting import halt_tokens
    from par_ray.train.loop import eval_metrics

    cfg = validate(with_overrides(presets.local_trial(), task=dict(train_depth=3),
                                  recipe=dict(halting=True, dense_targets=True, dense_pending=dense_pending,
                                              grad_window=2),
                                  train=dict(steps=2, batch_size=4, warmup_steps=1),
                                  eval=dict(depths=(3,), num_sequences=4, batch_size=4)))
    task = get_task("swap_s5")
    vocab = resolve(cfg).vocab
    assert (vocab.pending_id is not None) == dense_pending
    if dense_pending:
        assert vocab.pending_id == vocab.dense_offset + task.num_states == task.vocab_size + 3 + task.num_states
    torch.manual_seed(0)
    model = build_looped(cfg.backbone, cfg.recipe, vocab_size=vocab.size)
    engine = prepare(model, cfg.train, World())
    m = eval_metrics(engine, task, cfg, halt=halt_tokens(task))
    assert {"halt_acc_d3", "oracle_acc_d3", "never_halted_d3", "best_acc_d3", "best_iter_d3"} <= set(m)
    # G of each stopping: R = ⌈d/c⌉ (G), own halting (G_halt), the best fixed R (G_best), each from its own curve
    for stopping, curve in (("", "acc_d3"), ("_halt", "halt_acc_d3"), ("_best", "best_acc_d3")):
        assert {f"G{stopping}", f"G{stopping}_interp", f"G{stopping}_censored"} <= set(m)
        # and its 95 % interval (a bootstrap over the test sequences, issue 37)
        assert m[f"G{stopping}_lo"] <= m[f"G{stopping}_hi"] and f"G{stopping}_hi_censored" in m
        below = m[curve] < (m["chance"] + 1) / 2  # one test depth: G = 1 when below the midpoint, else ≥ 1
        assert (m[f"G{stopping}"], m[f"G{stopping}_censored"]) == (1.0, 0.0 if below else 1.0)
    assert m["best_acc_d3"] >= m["oracle_acc_d3"]  # R = ⌈d/c⌉ is one of the R the best is taken over
    assert ("G_halt_pending" in m) == dense_pending
    if dense_pending:
        kinds = ("halt_acc", "halt_gap", "halt_iter", "halt_dR_mean", "halt_dR_std", "never_halted")
        assert {f"{kind}_d3_pending" for kind in kinds} <= set(m)
        assert 0.0 <= m["halt_acc_d3_pending"] <= 1.0 and 0.0 <= m["never_halted_d3_pending"] <= 1.0
    else:
        assert not any("pending" in name for name in m)


# ---------------------------------------------------------------------------------------------------------------------
# a training step with halting, and frozen parts


TASK = TaskConfig(train_depth=4)
HALT = RecipeConfig(grad_window=3, max_iterations=12, halting=True, depth_schedule="hold", hold_lambda=4.0)
TRAIN = TrainConfig(steps=6, batch_size=4, warmup_steps=1)


def _engine(seed=0):
    task = get_task("swap_s5")
    torch.manual_seed(seed)
    model = build_looped(BackboneConfig(), HALT, vocab_size=task.vocab_size + 3)
    return prepare(model, TRAIN, World()), task, task_halt_tokens(task.vocab_size)


def test_step_loss_is_par_plus_half_balanced_halting():
    engine, task, tok = _engine()
    snapshot = {n: p.detach().clone() for n, p in engine.raw.named_parameters()}
    res = train_step(engine, task, TASK, build_step_loss(HALT, task, halt=tok), 0, 0, 4)
    # recompute step 0's loss with the weights from before the step
    with torch.no_grad():
        for n, p in engine.raw.named_parameters():
            p.copy_(snapshot[n])
    from par_ray.schedules import plan_step

    plan = plan_step(TASK, HALT, 0, 0)
    ep = with_halt_query(task.sample(plan.depth, 4, seed=0, step=0), tok.query)
    out = engine.raw.iterate(ep.input_ids, ep.read_positions, plan.R, HALT.grad_window, plan.stretch)
    par = par_loss(out.logits_KBQV[:, :, :-1], out.iterations, ep.states, 1, "progress").loss
    halt = halting_loss(yes_no_logits(out.logits_KBQV[:, :, -1], tok), out.iterations, plan.depth, 1).loss
    assert res.loss == pytest.approx((par + 0.5 * halt).item(), rel=1e-5)
    assert res.halt_loss == pytest.approx(halt.item(), rel=1e-5) and 0.0 <= res.halt_accuracy <= 1.0
    with pytest.raises(ValueError, match="recipe.halting"):
        build_step_loss(HALT, task)



def test_halting_step_on_a_given_prefix_trains_the_answers_as_without_halting():
    # The halting query is appended after the prompt, so (causal) the answer, dense and fixed-point losses of a
    # given-prefix step are those of the same step without halting; the joint loss adds halt_weight × halting.
    task_cfg = TaskConfig(train_depth=3, given_prefix=4)
    task = build_task(task_cfg, train=True)
    plain = RecipeConfig(grad_window=3, max_iterations=12, depth_schedule="forced", extra_iterations=2,
                         dense_targets=True, dense_pending=True, fixed_point_weight=1.0, targets="done")
    halting = dataclasses.replace(plain, halting=True)
    from par_ray.schedules import plan_step

    # m is drawn per (depth, step): a step whose batch has operations given
    step = next(s for s in range(50) if task.sample(plan_step(task_cfg, plain, 0, s).depth, 2, seed=0, step=s).given)
    offset = task.vocab_size + 3  # dense state class 0 after the halting tokens
    losses = {}
    for name, recipe in (("plain", plain), ("halting", halting)):
        torch.manual_seed(0)
        model = build_looped(BackboneConfig(), recipe, vocab_size=offset + task.num_states + 1)
        loss_fn = build_step_loss(recipe, task, halt=task_halt_tokens(task.vocab_size) if recipe.halting else None,
                                  dense_offset=offset)
        res = train_step(prepare(model, TRAIN, World()), task, task_cfg, loss_fn, 0, step, 4)
        losses[name] = res
    assert losses["halting"].plan == losses["plain"].plan and losses["plain"].plan.depth >= 1
    without_halt = losses["halting"].loss - halting.halt_weight * losses["halting"].halt_loss
    assert without_halt == pytest.approx(losses["plain"].loss, rel=1e-5)
    assert losses["halting"].accuracy == losses["plain"].accuracy


def test_frozen_parameters_do_not_move():
    engine, task, tok = _engine()
    frozen = frozen_parameters(engine.raw, "all_but_coda")
    names = {n for n, p in engine.raw.named_parameters() if any(p is f for f in frozen)}
    assert names and all(not n.startswith(("coda.", "norm.")) for n in names)
    assert "embed_tokens.weight" in names and any(n.startswith("core.") for n in names)
    before = {n: p.detach().clone() for n, p in engine.raw.named_parameters()}
    for step in range(3):
        train_step(engine, task, TASK, build_step_loss(HALT, task, halt=tok), 0, step, 4, frozen=frozen)
    after = dict(engine.raw.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in names)
    assert any(not torch.equal(before[n], after[n]) for n in after if n.startswith("coda."))
    assert frozen_parameters(engine.raw, "none") == []
    with pytest.raises(ValueError, match="frozen"):
        frozen_parameters(engine.raw, "everything")


def test_halting_checkpoint_round_trip_continues_identically(tmp_path):
    engine, task, tok = _engine()
    loss_fn = build_step_loss(HALT, task, halt=tok)
    run = lambda e, steps: [train_step(e, task, TASK, loss_fn, 0, s, 4).loss for s in steps]  # noqa: E731
    run(engine, range(2))
    engine.save(str(tmp_path), {"step": 2})
    want = run(engine, range(2, 4))
    fresh, _, _ = _engine(seed=5)
    fresh.load(str(tmp_path))
    assert run(fresh, range(2, 4)) == pytest.approx(want, abs=1e-6)


def test_halting_recipe_config_dataclass_defaults():
    r = RecipeConfig()
    assert (r.halting, r.halt_weight, r.stretch_ramp) == (False, 0.5, False)
    e = EvalConfig()
    assert (e.halt_k, e.halt_n, e.halt_tau, e.halt_max_iterations) == (6, 8, 0.5, 0)
    assert halt_max_iterations(dataclasses.replace(e, halt_max_iterations=200), 1) == 200
    assert halt_max_iterations(e, 2) == 2 * math.ceil(64 / 2)


# ---------------------------------------------------------------------------------------------------------------------
# streaming: halting evaluation keeps per-iteration reductions, never the (R_max, B, Q, V) logits


def _halting_model(vocab: int, pending: bool = False):
    """A tiny random-init looped model for halting evaluation on swap-S5 with ``vocab`` read-out classes (the task's
    tokens, the halting tokens, then unused ids up to ``vocab``; the last id is the dense "pending" class)."""
    task = get_task("swap_s5")
    tok = task_halt_tokens(task.vocab_size)
    torch.manual_seed(0)
    model = build_looped(BackboneConfig(), RecipeConfig(), vocab_size=vocab).eval()
    return task, tok, model, (vocab - 1 if pending else None)


@torch.no_grad()
def _halting_counts_unstreamed(model, task, cfg, tok, pending_id):
    """The halting evaluation as it was before streaming: every iteration's full read-out logits stacked
    (R_max, B, Q, V), then the same counts. The reference the streamed evaluation must equal exactly."""
    from par_ray.evaluation import _rule_counts, halting_rules, sum_over_test_sets

    rules, R_max, cpu = halting_rules(cfg), halt_max_iterations(cfg, 1), torch.device("cpu")

    def counts(depth, ep, ids_BT, answers_BQ):
        q_halt = ep.read_positions.numel() - 1
        reads_Q = ep.read_positions
        if pending_id is not None:
            reads_Q = torch.cat([reads_Q, ep.op_positions[-1:].to(reads_Q.dtype)])
        logits_RBQV = model(ids_BT, reads_Q, R_max, None, 1.0, "all").logits_KBQV
        right_RB = (logits_RBQV[:, :, :q_halt].argmax(-1) == answers_BQ).all(-1)
        p_RB = p_yes(logits_RBQV[:, :, q_halt], tok)
        counts_SX7 = torch.zeros(1 + (pending_id is not None), len(rules), 7, dtype=torch.float64)
        counts_SX7[0] += _rule_counts(right_RB, p_RB, rules, depth)
        if pending_id is not None:
            done_RB = 1.0 - logits_RBQV[:, :, q_halt + 1].float().softmax(-1)[..., pending_id]
            counts_SX7[1] += _rule_counts(right_RB, done_RB, rules, depth)
        return counts_SX7, p_RB.double().sum(1)

    return sum_over_test_sets(task, cfg, counts, cpu, prepare=lambda ep: with_halt_query(ep, tok.query))


@pytest.mark.parametrize("pending", [False, True])
def test_streamed_halting_equals_the_stacked_logits_computation(pending):
    """On a real (tiny, random-init) model, the streamed evaluation's counts equal exactly those of the old one that
    stacked every iteration's logits — with extra rules and with the pending signal's second read row."""
    task, tok, model, pending_id = _halting_model(64, pending)
    cfg = EvalConfig(depths=(4, 6), num_sequences=10, batch_size=4, seed=3, halt_k=2, halt_n=3, halt_tau=0.4,
                     halt_rules=((1, 1, 0.5), (3, 4, 0.45)))
    want = _halting_counts_unstreamed(model, task, cfg, tok, pending_id)
    got = halting_by_depth(model, task, cfg, 1, tok, torch.device("cpu"), pending_id=pending_id)
    for d in cfg.depths:
        counts_SX7, p_sum_R = want[d]
        n = counts_SX7[0, 0, 6]
        assert got[d]["p_yes_k"] == (p_sum_R / n).tolist()
        assert got[d]["oracle_acc"] == (counts_SX7[0, 0, 1] / n).item()
        assert [got[d]["halt_acc"], got[d]["halt_iter"], got[d]["never_halted"]] == [
            (counts_SX7[0, 0, i] / n).item() for i in (0, 3, 2)]
        assert [r["halt_iter"] for r in got[d]["rules"].values()] == [(c[3] / n).item() for c in counts_SX7[0, 1:]]
        if pending:
            assert [r["halt_iter"] for r in got[d]["pending"].values()] == [(c[3] / n).item() for c in counts_SX7[1]]


def test_halting_evaluation_memory_does_not_grow_with_the_vocabulary_times_R_max():
    """The live tensor memory (``tests/memtrack.py``) of a halting evaluation at two vocabulary sizes: 64 → 4,096
    read-out classes adds a few iterations' worth of one read-out, (B, Q + 2, ΔV) floats — not R_max = 32 of them,
    as the computation that stacked every iteration's logits does (measured here on the same model as the
    reference). The largest tensor is at most one iteration's read-out."""
    from memtrack import LiveBytes

    B, R_max = 4, 32
    cfg = EvalConfig(depths=(8,), num_sequences=B, batch_size=B, seed=3, halt_max_iterations=R_max)
    streamed, stacked, largest = {}, {}, {}
    for V in (64, 4096):
        task, tok, model, pending_id = _halting_model(V, pending=True)
        with LiveBytes() as mem:
            halting_by_depth(model, task, cfg, 1, tok, torch.device("cpu"), pending_id=pending_id)
        streamed[V], largest[V] = mem.peak, mem.largest
        with LiveBytes() as mem:
            _halting_counts_unstreamed(model, task, cfg, tok, pending_id)
        stacked[V] = mem.peak
    one_readout = B * (5 + 2) * (4096 - 64) * 4  # (B, Q + 2, ΔV) float32: Q = 5 answers + halting + pending rows
    assert streamed[4096] - streamed[64] < 4 * one_readout
    assert stacked[4096] - stacked[64] > R_max * one_readout  # the reference does grow with R_max × V
    assert largest[4096] <= B * (5 + 2) * 4096 * 4
