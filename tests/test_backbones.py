"""Backbone registry: every shipped size against its model card (meta device), tiny-shape quirks, save/load round trip,
and the one function that calls a parent decoder layer (litgpt tests/test_config.py; transformers test_save_load)."""

import math
from pathlib import Path

import pytest
import torch

from par_ray.model.backbones import (
    ATTN_IMPLEMENTATIONS,
    BACKBONES,
    AllPositionsKeys,
    causal_mask,
    get_spec,
    load,
    parameter_count,
    run_decoder_layer,
)

TINY = ["tiny-qwen2", "tiny-qwen3"]
REAL = [name for name in BACKBONES if name not in TINY]


def _embedding_count(model: torch.nn.Module) -> int:
    """Parameters in the input embedding and the lm_head (one matrix when they are tied)."""
    weights = {id(w): w for w in (model.get_input_embeddings().weight, model.get_output_embeddings().weight)}
    return sum(w.numel() for w in weights.values())


def _as_card_figure(count: int, reported: float, rounding: str = "nearest") -> float:
    """``count`` in billions, to as many decimals as the card's figure shows ("1.7" -> 1, "0.49" -> 2)."""
    decimals = len(repr(reported).split(".")[1])
    scale = 10**decimals
    if rounding == "down":
        return math.floor(count / 1e9 * scale) / scale
    return round(count / 1e9, decimals)


def test_every_real_size_is_registered():
    assert sorted(REAL) == sorted(
        ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b"]
    )


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_entry_builds_on_meta_with_its_family_quirks(name):
    spec = get_spec(name)
    model = load(name, device="meta")
    assert all(p.is_meta for p in model.parameters())  # shapes only: nothing allocated
    assert model.config.model_type == spec.family
    assert len(model.model.layers) == spec.num_hidden_layers
    assert model.config.hidden_size == spec.hidden_size
    attn = model.model.layers[0].self_attn
    if spec.family == "qwen2":
        assert attn.q_proj.bias is not None and attn.k_proj.bias is not None and attn.v_proj.bias is not None
    else:
        assert attn.q_proj.bias is None and hasattr(attn, "q_norm") and hasattr(attn, "k_norm")
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == spec.fields["tie_word_embeddings"]


@pytest.mark.parametrize("name", REAL)
def test_real_entry_matches_its_model_card(name):
    spec = get_spec(name)
    assert spec.hub_name and spec.source.startswith(f"https://huggingface.co/{spec.hub_name}/")
    model = load(name, device="meta")
    count = parameter_count(model)
    rounding = spec.notes.get("reported_params_rounding", "nearest")
    assert _as_card_figure(count, spec.reported_params, rounding) == spec.reported_params, count
    reported_non_embedding = spec.notes["reported_non_embedding_params"]
    non_embedding = count - _embedding_count(model)
    assert _as_card_figure(non_embedding, reported_non_embedding) == reported_non_embedding, non_embedding


def test_tiny_shapes_keep_family_quirks():
    qwen2 = load("tiny-qwen2")
    for layer in qwen2.model.layers:
        assert layer.self_attn.q_proj.bias is not None
        assert layer.self_attn.k_proj.bias is not None and layer.self_attn.v_proj.bias is not None
        assert layer.self_attn.o_proj.bias is None

    spec3 = get_spec("tiny-qwen3")
    qwen3 = load("tiny-qwen3")
    assert "head_dim" in spec3.fields and qwen3.config.head_dim == spec3.fields["head_dim"] != 128
    attn = qwen3.model.layers[0].self_attn
    assert attn.q_proj.out_features == qwen3.config.num_attention_heads * spec3.fields["head_dim"]
    assert attn.q_proj.bias is None
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (spec3.fields["head_dim"],)


def test_built_config_does_not_alias_the_registry():
    model = load("tiny-qwen3")
    model.config.rope_parameters["rope_theta"] = 1.0
    assert get_spec("tiny-qwen3").fields["rope_parameters"]["rope_theta"] == 10000.0


@pytest.mark.parametrize("name", TINY)
def test_save_load_round_trip(name, tmp_path: Path):
    torch.manual_seed(0)
    model = load(name).eval()
    # transformers 5 dropped `safe_serialization`: safetensors is the only format it writes.
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()

    loaded = load(name, pretrained=str(tmp_path)).eval()
    expected, got = model.state_dict(), loaded.state_dict()
    assert expected.keys() == got.keys()
    for key, tensor in expected.items():
        assert torch.equal(tensor, got[key]), key
    input_ids = torch.arange(12).reshape(2, 6) % model.config.vocab_size
    with torch.no_grad():
        assert torch.equal(model(input_ids).logits, loaded(input_ids).logits)


def test_loading_another_family_names_the_field(tmp_path: Path):
    load("tiny-qwen3").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="backbone.pretrained"):
        load("tiny-qwen2", pretrained=str(tmp_path))


def test_unknown_name_lists_allowed_names():
    with pytest.raises(ValueError, match="backbone.name") as err:
        get_spec("nope")
    assert all(name in str(err.value) for name in BACKBONES)


@pytest.mark.parametrize("attn", ATTN_IMPLEMENTATIONS)
@pytest.mark.parametrize("name", TINY)
def test_layer_by_layer_reproduces_parent_forward(name, attn):
    """embed -> run_decoder_layer over every layer -> norm -> lm_head == the parent's own forward (float32)."""
    torch.manual_seed(0)
    model = load(name, attn_implementation=attn).eval()
    assert model.config._attn_implementation == attn
    input_ids_BT = torch.randint(0, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        hidden_BTH = model.model.embed_tokens(input_ids_BT)
        position_ids_BT = torch.arange(input_ids_BT.shape[1]).expand_as(input_ids_BT)
        position_embeddings = model.model.rotary_emb(hidden_BTH, position_ids_BT)
        mask = causal_mask(model.config, hidden_BTH)
        for layer in model.model.layers:
            hidden_BTH = run_decoder_layer(layer, hidden_BTH, position_embeddings, mask)
        logits_BTV = model.lm_head(model.model.norm(hidden_BTH))
        expected_BTV = model(input_ids_BT).logits
    assert logits_BTV.dtype == torch.float32
    assert (logits_BTV - expected_BTV).abs().max().item() <= 1e-5


def _layer_inputs(model, B=3, T=11, seed=0):
    """A random residual stream (B, T, H), its rotary embeddings and causal mask for ``model``'s layers."""
    gen = torch.Generator().manual_seed(seed)
    hidden_BTH = torch.randn(B, T, model.config.hidden_size, generator=gen)
    position_embeddings = model.model.rotary_emb(hidden_BTH, torch.arange(T)[None])
    return hidden_BTH, position_embeddings, causal_mask(model.config, hidden_BTH)


@pytest.mark.parametrize("attn", ATTN_IMPLEMENTATIONS)
@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("rows", [[10, 3, 0, 7, 7], [0], list(range(11)), [4, 5, 6, 8, 9]])
def test_layer_at_rows_equals_full_layer_rows(name, attn, rows):
    """Queries at arbitrary rows (any order, repeats, the first and last position) with keys/values from all positions
    give the full layer's output rows, forward and backward (float32, 1e-5): the readout's last coda layer."""
    torch.manual_seed(0)
    model = load(name, attn_implementation=attn)
    layer = model.model.layers[-1]
    with torch.no_grad():  # non-trivial norm weights, so the restated key path's k_norm / input_layernorm matter
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    hidden_BTH, pos, mask = _layer_inputs(model)
    rows_Q = torch.tensor(rows)
    full_in = hidden_BTH.clone().requires_grad_(True)
    want_BQH = run_decoder_layer(layer, full_in, pos, mask)[:, rows_Q]
    rows_in = hidden_BTH.clone().requires_grad_(True)
    got_BQH = run_decoder_layer(layer, rows_in, pos, mask, rows_Q=rows_Q)
    assert got_BQH.shape == (3, len(rows), model.config.hidden_size)
    assert (got_BQH - want_BQH).abs().max().item() <= 1e-5
    weights = torch.randn_like(want_BQH)
    (want_grad,) = torch.autograd.grad((want_BQH * weights).sum(), full_in)
    (got_grad,) = torch.autograd.grad((got_BQH * weights).sum(), rows_in)
    assert (got_grad - want_grad).abs().max().item() <= 1e-5


def test_layer_at_rows_attends_to_all_positions():
    """The rows see every earlier position's keys (not only the other rows'): a change at a non-read position moves
    them, and AllPositionsKeys is what supplies those keys."""
    torch.manual_seed(0)
    model = load("tiny-qwen3")
    layer = model.model.layers[0]
    hidden_BTH, pos, mask = _layer_inputs(model)
    rows_Q = torch.tensor([9, 10])
    calls = []
    update = AllPositionsKeys.update

    def counting_update(self, *args, **kwargs):
        keys, values = update(self, *args, **kwargs)
        calls.append(keys.shape)
        return keys, values

    AllPositionsKeys.update = counting_update
    try:
        with torch.no_grad():
            a = run_decoder_layer(layer, hidden_BTH, pos, mask, rows_Q=rows_Q)
            moved = hidden_BTH.clone()
            moved[:, 2] += 1.0  # position 2 is not a read row
            b = run_decoder_layer(layer, moved, pos, mask, rows_Q=rows_Q)
    finally:
        AllPositionsKeys.update = update
    assert calls and all(shape[2] == 11 for shape in calls)  # (B, N_kv, T, D): keys of all 11 positions
    assert (a - b).abs().max().item() > 1e-3


def test_rows_refused_under_gradient_checkpointing():
    model = load("tiny-qwen2")
    layer = model.model.layers[-1]
    layer.gradient_checkpointing = True
    hidden_BTH, pos, mask = _layer_inputs(model)
    with pytest.raises(ValueError, match="gradient checkpointing"):
        run_decoder_layer(layer, hidden_BTH, pos, mask, rows_Q=torch.tensor([3]))


@pytest.mark.parametrize("name", TINY)
def test_sdpa_matches_eager_parent(name):
    """The two attention implementations give the same parent logits to float32 round-off (1e-5)."""
    ids = torch.randint(0, 32, (3, 13), generator=torch.Generator().manual_seed(0))
    logits = {}
    for attn in ATTN_IMPLEMENTATIONS:
        torch.manual_seed(0)
        with torch.no_grad():
            logits[attn] = load(name, attn_implementation=attn).eval()(ids).logits
    assert (logits["sdpa"] - logits["eager"]).abs().max().item() <= 1e-5


def test_unknown_attn_implementation_names_the_field():
    with pytest.raises(ValueError, match="backbone.attn_implementation") as err:
        load("tiny-qwen2", attn_implementation="flash")
    assert all(name in str(err.value) for name in ATTN_IMPLEMENTATIONS)


@pytest.mark.parametrize("attn", ATTN_IMPLEMENTATIONS)
def test_pretrained_load_keeps_attn_implementation(attn, tmp_path: Path):
    load("tiny-qwen2").save_pretrained(tmp_path)
    assert load("tiny-qwen2", pretrained=str(tmp_path), attn_implementation=attn).config._attn_implementation == attn


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3"])
def test_meta_device_build_loads_the_same_weights_as_transformers(name, tmp_path):
    """A checkpoint written with ``save_pretrained`` (what a hub download leaves on disk) loads through the meta
    device (``load_checkpoint``: meta build, ``to_empty``, tensor by tensor) into exactly the tensors — parameters,
    tied lm_head and the rotary buffers the checkpoint does not hold — of transformers' own ``from_pretrained``; and
    the looped model built on it still reproduces the parent at R = 1."""
    from transformers import AutoModelForCausalLM

    from par_ray.config import BackboneConfig, RecipeConfig
    from par_ray.model.looped import build_looped

    torch.manual_seed(0)
    load(name).save_pretrained(tmp_path)
    want = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, use_safetensors=True)
    got = load(name, pretrained=str(tmp_path))
    assert next(got.parameters()).device.type == "cpu" and not got.training
    want_t = {**dict(want.named_parameters(remove_duplicate=False)), **dict(want.named_buffers())}
    got_t = {**dict(got.named_parameters(remove_duplicate=False)), **dict(got.named_buffers())}
    assert sorted(got_t) == sorted(want_t) and all(torch.equal(got_t[k], want_t[k]) for k in want_t)
    assert (got.lm_head.weight is got.model.embed_tokens.weight) == (want.lm_head.weight is want.model.embed_tokens.weight)
    assert next(load(name, pretrained=str(tmp_path), device="meta").parameters()).is_meta

    looped = build_looped(BackboneConfig(name=name, pretrained=str(tmp_path)), RecipeConfig()).eval()
    ids = torch.randint(0, want.config.vocab_size, (2, 9))
    reads = torch.arange(9)
    with torch.no_grad():
        parent = want(ids).logits
        r1 = looped(ids, reads, 1, None, 1.0, "last").logits_KBQV[0]
    torch.testing.assert_close(r1, parent, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", TINY)
def test_rows_keep_a_mask_broadcast_over_the_batch(name):
    """``LoopedLM``'s banded causal mask is one (T, T) mask expanded over the batch (stride 0). The rows' mask keeps
    that layout, so a compiled layer sees the same kind of mask in the read-out's call as in the core's (a gathered
    copy has another stride, and dynamo recompiles on it); the output rows stay the full layer's."""
    torch.manual_seed(0)
    model = load(name)
    layer = model.model.layers[-1]
    hidden_BTH, pos, _ = _layer_inputs(model)
    B, T = hidden_BTH.shape[:2]
    i_T = torch.arange(T)
    mask = ((i_T[:, None] >= i_T[None, :]) & (i_T[:, None] - i_T[None, :] < 2))[None, None].expand(B, 1, T, T)
    seen = []
    hook = layer.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["attention_mask"]),
                                           with_kwargs=True)
    rows_Q = torch.tensor([10, 3, 7])
    with torch.no_grad():
        want_BQH = run_decoder_layer(layer, hidden_BTH, pos, mask)[:, rows_Q]
        got_BQH = run_decoder_layer(layer, hidden_BTH, pos, mask, rows_Q=rows_Q)
    hook.remove()
    assert seen[1].shape == (B, 1, 3, T) and seen[0].stride(0) == seen[1].stride(0) == 0
    assert torch.equal(seen[1][1, 0], mask[0, 0, rows_Q])
    assert (got_BQH - want_BQH).abs().max().item() <= 1e-5
