"""Backbone registry: every shipped size against its model card (meta device), tiny-shape quirks, save/load round trip,
and the one function that calls a parent decoder layer (litgpt tests/test_config.py; transformers test_save_load)."""

import math
from pathlib import Path

import pytest
import torch

from par_ray.model.backbones import BACKBONES, causal_mask, get_spec, load, parameter_count, run_decoder_layer

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


@pytest.mark.parametrize("name", TINY)
def test_layer_by_layer_reproduces_parent_forward(name):
    """embed -> run_decoder_layer over every layer -> norm -> lm_head == the parent's own forward (float32)."""
    torch.manual_seed(0)
    model = load(name).eval()
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
