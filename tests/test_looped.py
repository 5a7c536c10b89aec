"""LoopedLM: R=1 parity with the parent, anchoring, gradient window, splits, untied baseline, batched read-out."""

import types

import pytest
import torch

from par_ray.model import backbones
from par_ray.model.backbones import ATTN_IMPLEMENTATIONS, causal_mask, run_decoder_layer
from par_ray.model.looped import LoopedLM, default_split, token_rms

FAMILIES = ["tiny-qwen2", "tiny-qwen3"]


def _parent(name, seed=0, attn=ATTN_IMPLEMENTATIONS[0]):
    torch.manual_seed(seed)
    return backbones.load(name, attn_implementation=attn).eval()


@pytest.mark.parametrize("attn", ATTN_IMPLEMENTATIONS)
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("split", [None, (1, 3, 2), (0, 1, 5), (4, 2, 0)])
def test_one_iteration_reproduces_parent_logits(name, split, attn):
    """R = 1 is the parent, with either attention implementation (float32, 1e-4 as before SDPA; measured ~1e-6)."""
    parent = _parent(name, attn=attn)
    ids = torch.randint(0, parent.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = parent(ids).logits
        looped = LoopedLM(parent, split=split)
        reads = torch.arange(ids.shape[1])
        got = looped.iterate(ids, reads, R=1).logits_KBQV[0]
    assert (got - want).abs().max().item() <= 1e-4


def test_default_split_is_thirds():
    assert default_split(24) == (8, 8, 8)
    assert default_split(28) == (9, 10, 9)
    assert default_split(36) == (12, 12, 12)
    assert sum(default_split(7)) == 7


@pytest.mark.parametrize("split", [(2, 2, 3), (2, 0, 4), (-1, 4, 3)])
def test_bad_split_raises_naming_field(split):
    with pytest.raises(ValueError, match="backbone.split"):
        LoopedLM(_parent("tiny-qwen2"), split=split)


def _states_per_iteration(looped, ids, R):
    """Every iteration's state s_1..s_R, (B, T, H) each, as :meth:`LoopedLM.iterate` hands them to the read-out.

    With autograd on, ``read="all"`` reads every iteration out together after the loop, in one
    :meth:`LoopedLM._read_stacked` over the list of states; the spy keeps that list (the states themselves, in the
    autograd graph, not slices of their stack)."""
    states = []
    orig = looped._read_stacked

    def spy(states_K, reads, pos):
        states.extend(states_K)
        return orig(states_K, reads, pos)

    looped._read_stacked = spy
    out = looped.iterate(ids, torch.arange(ids.shape[1]), R=R, read="all")
    del looped._read_stacked
    assert len(states) == R, "every iteration's state reaches the read-out"
    return states, out


@pytest.mark.parametrize("name", FAMILIES)
def test_anchoring_keeps_every_token_at_first_iteration_rms(name):
    looped = LoopedLM(_parent(name), anchoring=True)
    with torch.no_grad():  # make the adapter non-trivial so the states really drift without anchoring
        looped.adapter.weight.add_(0.3 * torch.randn_like(looped.adapter.weight))
    ids = torch.randint(0, 32, (2, 9))
    states, _ = _states_per_iteration(looped, ids, R=6)
    ref = token_rms(states[0])
    for s in states[1:]:
        assert ((token_rms(s) - ref).abs() / ref).max().item() <= 1e-5
    free = LoopedLM(_parent(name), anchoring=False)
    free.adapter.load_state_dict(looped.adapter.state_dict())
    drift, _ = _states_per_iteration(free, ids, R=6)
    assert ((token_rms(drift[-1]) - token_rms(drift[0])).abs() / token_rms(drift[0])).max().item() > 1e-3


def test_no_gradient_flows_through_anchoring_reference():
    looped = LoopedLM(_parent("tiny-qwen2"), anchoring=True)
    ids = torch.randint(0, 32, (2, 7))
    (s1, _, s3), out = _states_per_iteration(looped, ids, R=3)
    # d s3 / d s1: with the reference detached, s3 depends on s1 only through the recurrence input, so the gradient of
    # ||s3 rms|| wrt s1 through the reference is zero: rescaled rms equals the detached ref exactly.
    g = torch.autograd.grad(token_rms(s3).sum(), s1, allow_unused=True)[0]
    assert g is None or g.abs().max().item() < 1e-6
    assert out.logits_KBQV.shape == (3, 2, 7, 32)


def test_gradient_window_runs_earlier_iterations_without_grad():
    looped = LoopedLM(_parent("tiny-qwen2"))
    ids = torch.randint(0, 32, (2, 7))
    out = looped.iterate(ids, torch.tensor([6]), R=5, grad_window=2)
    assert out.iterations == [4, 5]
    out.logits_KBQV.sum().backward()
    assert looped.adapter.weight.grad is not None
    assert all(p.grad is not None for p in looped.core.parameters())


@pytest.mark.parametrize("name", FAMILIES)
def test_state_keeps_the_residual_streams_dtype_under_autocast(name):
    """Under bf16 autocast over float32 parameters (GPU ddp, ``train.cpu_bf16_autocast``) the state between
    iterations stays float32, as the parent's residual stream does: the core's input is the adapter's bf16 output cast
    back to the prelude's output dtype, so only the matmuls run in bf16 (a bf16 state learned a shorter G on 2 of 2
    seeds, docs/experiments.md §39). In float32 nothing changes dtype."""
    looped = LoopedLM(_parent(name, attn="eager"))
    ids = torch.randint(0, 32, (2, 7))
    seen = []
    looped.core[0].register_forward_pre_hook(lambda module, args: seen.append(("core input", args[0].dtype)))
    looped.core[0].mlp.down_proj.register_forward_hook(lambda module, args, out: seen.append(("matmul", out.dtype)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        looped.iterate(ids, torch.tensor([6]), R=3)
    assert set(seen) == {("core input", torch.float32), ("matmul", torch.bfloat16)}
    seen.clear()
    looped.iterate(ids, torch.tensor([6]), R=3)
    assert set(seen) == {("core input", torch.float32), ("matmul", torch.float32)}


def test_untied_uses_distinct_core_copies_and_keeps_r1_parity():
    parent = _parent("tiny-qwen2")
    ids = torch.randint(0, 32, (2, 7))
    with torch.no_grad():
        want = parent(ids).logits[:, -1:]
    looped = LoopedLM(parent, tied=False, untied_copies=3)
    assert len(looped.untied) == 2 and not looped.tied
    assert looped._core_for(2) is looped.untied[0] and looped._core_for(9) is looped.untied[1]
    with torch.no_grad():
        got = looped.iterate(ids, torch.tensor([6]), R=1).logits_KBQV[0]
    assert (got - want).abs().max().item() <= 1e-4


def test_stretch_and_nope_change_positions_consistently():
    looped = LoopedLM(_parent("tiny-qwen2"))
    ids = torch.randint(0, 32, (1, 7))
    r = torch.tensor([6])
    with torch.no_grad():
        a = looped.iterate(ids, r, R=2, stretch=1.0).logits_KBQV
        b = looped.iterate(ids, r, R=2, stretch=3.0).logits_KBQV
    assert not torch.allclose(a, b)
    nope = LoopedLM(_parent("tiny-qwen2"), position_scheme="none")
    with torch.no_grad():  # no positions: stretch is meaningless, outputs identical
        c = nope.iterate(ids, r, R=2, stretch=1.0).logits_KBQV
        d = nope.iterate(ids, r, R=2, stretch=5.0).logits_KBQV
    assert torch.equal(c, d)


def _full_coda_readout(looped, state_BTH, reads_Q, pos, mask):
    """The reference readout: every coda layer over all T positions, then norm and lm_head at the read rows."""
    for layer in looped.coda:
        state_BTH = run_decoder_layer(layer, state_BTH, pos, mask)
    return looped.lm_head(looped.norm(state_BTH)[:, reads_Q])


@pytest.mark.parametrize("attn", ATTN_IMPLEMENTATIONS)
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("split", [None, (2, 3, 1), (3, 3, 0)])
@pytest.mark.parametrize("reads", [[12, 4, 0, 9, 9, 1], [5], list(range(13))])
def test_readout_at_read_rows_equals_full_coda(name, split, attn, reads):
    """The readout computes the coda's last layer at the read rows only; logits and gradients equal the full coda's
    rows at arbitrary read positions (any order, repeats, first and last), float32 tolerance 1e-5."""
    looped = LoopedLM(_parent(name, attn=attn), split=split)
    gen = torch.Generator().manual_seed(3)
    ids_BT = torch.randint(0, 32, (2, 13), generator=gen)
    reads_Q = torch.tensor(reads)
    x_BTH = looped.embed_tokens(ids_BT)
    pos, mask = looped._positions(x_BTH, 1.0)
    state_BTH = torch.randn(2, 13, looped.config.hidden_size, generator=gen)
    full_in = state_BTH.clone().requires_grad_(True)
    rows_in = state_BTH.clone().requires_grad_(True)
    want_BQV = _full_coda_readout(looped, full_in, reads_Q, pos, mask)
    got_BQV = looped.readout(rows_in, reads_Q, pos, mask)
    assert got_BQV.shape == (2, len(reads), 32)
    assert (got_BQV - want_BQV).abs().max().item() <= 1e-5
    weights_BQV = torch.randn(want_BQV.shape, generator=gen)
    (want_grad,) = torch.autograd.grad((want_BQV * weights_BQV).sum(), full_in)
    (got_grad,) = torch.autograd.grad((got_BQV * weights_BQV).sum(), rows_in)
    assert (got_grad - want_grad).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", FAMILIES)
def test_iterate_logits_equal_full_coda_readout(name):
    """End to end over R = 4 iterations with a non-trivial adapter: iterate's logits equal those of the same model
    whose readout runs the whole coda (float32, 1e-5)."""
    looped = LoopedLM(_parent(name))
    with torch.no_grad():
        looped.adapter.weight.add_(0.1 * torch.randn_like(looped.adapter.weight))
    ids_BT = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(5))
    reads_Q = torch.tensor([11, 2, 7])
    with torch.no_grad():
        got = looped.iterate(ids_BT, reads_Q, R=4, read="all").logits_KBQV
        looped.readout = lambda s, r, pos, mask: _full_coda_readout(looped, s, r, pos, mask)
        want = looped.iterate(ids_BT, reads_Q, R=4, read="all").logits_KBQV
    assert (got - want).abs().max().item() <= 1e-5


def _read_one_by_one(self, states, read_positions_Q, pos):
    """The reference read-out of the window's states: one ``readout`` call per iteration, with the coda mask
    ``iterate`` builds for B sequences."""
    mask = self._local(causal_mask(self.config, states[0]), states[0], self.coda_window)
    return torch.stack([self.readout(s_BTH, read_positions_Q, pos, mask) for s_BTH in states])


@pytest.mark.parametrize("attn", ATTN_IMPLEMENTATIONS)
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("coda_window", [0, 3])
def test_batched_readout_equals_one_readout_per_iteration(name, attn, coda_window):
    """``iterate`` reads its K iterations out in one coda call over the K·B stacked states (``_read_stacked``): the
    logits, and the gradients of the state-change output and of every parameter, equal one read-out per iteration,
    beside read-outs of iterations before the gradient window (read="all", R = 5, window 2: iterations 1-3 read out
    without autograd as they run, 4-5 in one call), with and without a coda window. Float32, 1e-5."""
    def run(one_by_one: bool):
        torch.manual_seed(0)
        looped = LoopedLM(_parent(name, attn=attn), coda_window=coda_window, attention_window=2, adapter_alpha=0.1)
        if one_by_one:
            looped._read_stacked = types.MethodType(_read_one_by_one, looped)
        gen = torch.Generator().manual_seed(7)
        ids_BT = torch.randint(0, 32, (3, 11), generator=gen)
        out = looped.iterate(ids_BT, torch.tensor([10, 3, 7]), R=5, grad_window=2, read="all", state_change=True)
        weights_KBQV = torch.randn(out.logits_KBQV.shape, generator=gen)
        ((out.logits_KBQV * weights_KBQV).sum() + out.state_change_KBT.sum()).backward()
        return out, {n: p.grad for n, p in looped.named_parameters()}

    got, got_grads = run(False)
    want, want_grads = run(True)
    assert got.iterations == want.iterations == [1, 2, 3, 4, 5]
    assert (got.logits_KBQV - want.logits_KBQV).abs().max().item() <= 1e-5
    for n, want_grad in want_grads.items():
        assert (want_grad is None) == (got_grads[n] is None), n
        if want_grad is not None:
            assert (got_grads[n] - want_grad).abs().max().item() <= 1e-5, n


def test_the_logits_iterate_returns_with_autograd_are_no_view():
    """The gradient window's logits come from one lm_head call over (K, B, Q, H), a tensor of their own: FSDP2 warns
    of a root module whose output is a view ("returned a view tensor … can cause backward to fail or produce wrong
    gradients"), printed by every worker of every FSDP run while they were the (K·B, Q, V) logits unflattened."""
    looped = LoopedLM(_parent("tiny-qwen2"))
    ids_BT, reads_Q = torch.randint(0, 32, (2, 9)), torch.tensor([8, 3])
    for window in (1, 3):
        out = looped.iterate(ids_BT, reads_Q, R=3, grad_window=window)
        assert out.logits_KBQV.shape == (window, 2, 2, 32) and out.logits_KBQV._base is None


def test_only_read_outs_with_autograd_are_batched():
    """Read-outs without autograd (evaluation, the iterations before the gradient window) and with ``reduce`` (the
    probe, halting) run as soon as their iteration exists, one (B, T, H) state at a time; the gradient window's run
    after the loop as one call over the stacked states, after the earlier ones, so rows keep the iterations' order."""
    looped = LoopedLM(_parent("tiny-qwen2"))
    batches, readout = [], looped.readout
    looped.readout = lambda s, *args: batches.append(s.shape[:-2].numel()) or readout(s, *args)
    ids_BT, reads_Q = torch.randint(0, 32, (2, 9)), torch.tensor([8])
    with torch.no_grad():
        out = looped.iterate(ids_BT, reads_Q, R=4, read="all", reduce=lambda k, logits_BQV: logits_BQV[..., 0])
        assert out.reduced_K.shape == (4, 2, 1) and batches == [2, 2, 2, 2]
        batches.clear()
        want = looped.iterate(ids_BT, reads_Q, R=4, read="all").logits_KBQV
        assert batches == [2, 2, 2, 2]
    batches.clear()
    got = looped.iterate(ids_BT, reads_Q, R=4, grad_window=2, read="all").logits_KBQV
    assert batches == [2, 2, 4]  # iterations 1, 2 without autograd, then 3 and 4 in one call over 2 × 2 states
    assert got.shape == want.shape == (4, 2, 1, 32) and (got - want).abs().max().item() <= 1e-5
