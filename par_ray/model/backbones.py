"""Parent decoders that PAR retrofits: Qwen2.5 and Qwen3, sizes kept as data.

Sizes are data, not classes (litgpt ``config.py``; torchtitan ``models/qwen3/__init__.py``): each entry of
:data:`BACKBONES` holds the exact public ``config.json`` fields of one checkpoint, with its source, and builds
transformers' own ``Qwen2Config`` / ``Qwen3Config`` from them. No pretrained weights are downloaded by this module;
``load(..., pretrained=PATH)`` reads a local safetensors checkpoint (or a hub name where a hub is reachable).

The parent's decoder layers are called through exactly one function, :func:`run_decoder_layer`, because their
signature moves between transformers releases (``position_embeddings`` became required; ``past_key_value`` became
``cache``). transformers is pinned in ``pyproject.toml``. The same function can compute a layer's output at a few
rows only (the readout's last coda layer): see :class:`AllPositionsKeys`.

Attention runs through transformers' own implementations, chosen by ``attn_implementation``: ``sdpa``
(``torch.nn.functional.scaled_dot_product_attention``, the default: fused softmax, faster) or ``eager`` (explicit
matmul + softmax, bit-for-bit the reference). Both agree to float32 round-off (``tests/test_backbones.py`` bounds
the difference of the logits at 1e-5 on the tiny shapes).

Tensor suffixes: B batch, T sequence length, H hidden size, Q selected rows, N heads, D head size.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config, Qwen3Config
from transformers.masking_utils import create_causal_mask
from transformers.models.qwen2.modeling_qwen2 import rotate_half  # Qwen3's is the same function (one modular source)

from par_ray.config import ATTN_IMPLEMENTATIONS  # transformers attention implementations allowed; first = default

FAMILIES = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}


@dataclass(frozen=True)
class BackboneSpec:
    """One parent checkpoint's architecture: transformers config fields plus provenance."""

    family: str
    """``qwen2`` (Qwen2 / Qwen2.5 architecture) or ``qwen3``."""
    fields: dict[str, Any]
    """Keyword arguments of the family's transformers config class (the checkpoint's ``config.json``)."""
    source: str
    """Where the numbers come from (model card / config.json address), or ``test shape``."""
    hub_name: str | None = None
    """Hugging Face hub id of the pretrained checkpoint (``None`` for test shapes)."""
    reported_params: float | None = None
    """Total parameter count the model card reports, in billions (``None`` for test shapes)."""
    notes: dict[str, Any] = field(default_factory=dict)
    """Provenance extras: ``model_card`` address, ``reported_non_embedding_params`` (billions), rounding quirks."""

    @property
    def num_hidden_layers(self) -> int:
        return int(self.fields["num_hidden_layers"])

    @property
    def hidden_size(self) -> int:
        return int(self.fields["hidden_size"])

    def build_config(self, **overrides: Any) -> Qwen2Config | Qwen3Config:
        """The family's transformers config for this entry (``attn_implementation`` defaults to ``sdpa``)."""
        # Deep copy: the config keeps the nested rope_parameters dict it is given, and must not alias the registry's.
        kwargs = {"attn_implementation": ATTN_IMPLEMENTATIONS[0], **copy.deepcopy(self.fields), **overrides}
        return FAMILIES[self.family](**kwargs)


# Tiny test shapes keep each family's quirks: Qwen2.5 has a bias on q/k/v projections; Qwen3 has none, but RMS-norms
# q and k per head and takes an explicit head_dim (transformers defaults it to 128, so it must be given).
_TINY_COMMON = dict(
    vocab_size=32,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    tie_word_embeddings=True,
    hidden_act="silu",
    initializer_range=0.02,
)

# Fields shared by every real checkpoint of a family, as in their config.json. Sliding-window attention is off in all of
# them (use_sliding_window: false), so their sliding_window / max_window_layers values are inert and not restated.
_QWEN2_5 = dict(
    vocab_size=151936,
    hidden_act="silu",
    initializer_range=0.02,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
    use_sliding_window=False,
)
# Qwen3 dense: head_dim is 128 in every size, even where hidden_size / num_attention_heads is not (0.6B: 64; 4B: 80).
_QWEN3 = dict(_QWEN2_5, head_dim=128, attention_bias=False, max_position_embeddings=40960)


def _checkpoint(
    family: str,
    hub_name: str,
    reported_params: float,
    reported_non_embedding_params: float,
    defaults: dict[str, Any],
    notes: dict[str, Any] | None = None,
    **sizes: Any,
) -> BackboneSpec:
    """One published checkpoint: family defaults + its sizes; parameter counts (billions) as its model card states."""
    fields = {**defaults, **sizes}
    fields["rope_parameters"] = {"rope_type": "default", "rope_theta": fields.pop("rope_theta")}  # transformers 5 form
    return BackboneSpec(
        family=family,
        fields=fields,
        source=f"https://huggingface.co/{hub_name}/blob/main/config.json",
        hub_name=hub_name,
        reported_params=reported_params,
        notes={
            "model_card": f"https://huggingface.co/{hub_name}",
            "reported_non_embedding_params": reported_non_embedding_params,
            **(notes or {}),
        },
    )


BACKBONES: dict[str, BackboneSpec] = {
    "tiny-qwen2": BackboneSpec(family="qwen2", fields=dict(_TINY_COMMON), source="test shape (Qwen2.5 quirks)"),
    "tiny-qwen3": BackboneSpec(
        family="qwen3",
        fields=dict(_TINY_COMMON, head_dim=32, attention_bias=False),
        source="test shape (Qwen3 quirks: q/k norm, explicit head_dim)",
    ),
    # Qwen2.5 base models. max_position_embeddings is copied as published: 32768 for 0.5B and 3B, 131072 for 1.5B and 7B.
    "qwen2.5-0.5b": _checkpoint(
        "qwen2", "Qwen/Qwen2.5-0.5B", 0.49, 0.36, _QWEN2_5,
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        max_position_embeddings=32768,
    ),
    "qwen2.5-1.5b": _checkpoint(
        "qwen2", "Qwen/Qwen2.5-1.5B", 1.54, 1.31, _QWEN2_5,
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        max_position_embeddings=131072,
    ),
    "qwen2.5-3b": _checkpoint(
        "qwen2", "Qwen/Qwen2.5-3B", 3.09, 2.77, _QWEN2_5,
        hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
        max_position_embeddings=32768,
    ),
    # 7B differs from its smaller siblings: tie_word_embeddings is false (lm_head is its own matrix) and the vocabulary
    # is padded to 152064 rows. Its card's 7.61B is the count, 7,615,616,512, rounded *down* (rounding gives 7.62);
    # its non-embedding 6.53B is rounded as usual.
    "qwen2.5-7b": _checkpoint(
        "qwen2", "Qwen/Qwen2.5-7B", 7.61, 6.53, _QWEN2_5, notes={"reported_params_rounding": "down"},
        vocab_size=152064, tie_word_embeddings=False,
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        max_position_embeddings=131072,
    ),
    # Qwen3 dense models (the post-trained hybrid-thinking checkpoints; the -Base ones share the architecture).
    "qwen3-0.6b": _checkpoint(
        "qwen3", "Qwen/Qwen3-0.6B", 0.6, 0.44, _QWEN3,
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
    ),
    "qwen3-1.7b": _checkpoint(
        "qwen3", "Qwen/Qwen3-1.7B", 1.7, 1.4, _QWEN3,
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
    ),
    "qwen3-4b": _checkpoint(
        "qwen3", "Qwen/Qwen3-4B", 4.0, 3.6, _QWEN3,
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
    ),
}
"""Registry of parent architectures: a plain dict, name -> :class:`BackboneSpec`."""


def get_spec(name: str) -> BackboneSpec:
    """The registry entry ``name``; ``ValueError`` naming the allowed values if unknown."""
    if name not in BACKBONES:
        raise ValueError(f"backbone.name: {name!r} is not one of {sorted(BACKBONES)}")
    return BACKBONES[name]


def load(
    name: str,
    pretrained: str | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device | None = None,
    attn_implementation: str = ATTN_IMPLEMENTATIONS[0],
    **config_overrides: Any,
) -> PreTrainedModel:
    """Build the parent causal LM (``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``).

    Args:
        name: registry key (architecture).
        pretrained: ``None`` for random init from the registry config (seeded by the caller's torch RNG); otherwise a
            local directory holding ``config.json`` + ``*.safetensors`` (or a hub id), loaded with
            ``from_pretrained(use_safetensors=True, trust_remote_code=False)``.
        dtype: parameter dtype.
        device: where to allocate; ``"meta"`` builds shapes only (parameter counts, memory plans).
        attn_implementation: one of :data:`ATTN_IMPLEMENTATIONS` (``sdpa`` fast, ``eager`` the exact reference).
        config_overrides: extra config fields (e.g. ``vocab_size`` for a task vocabulary on test shapes).
    Raises:
        ValueError: unknown ``name`` or ``attn_implementation``, or a checkpoint whose architecture family differs
            from ``name``'s.
    """
    spec = get_spec(name)
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"backbone.attn_implementation: {attn_implementation!r} is not one of "
                         f"{list(ATTN_IMPLEMENTATIONS)}")
    if pretrained is not None:
        model = AutoModelForCausalLM.from_pretrained(
            pretrained, dtype=dtype, use_safetensors=True, trust_remote_code=False,
            attn_implementation=attn_implementation,
        )
        if model.config.model_type != spec.family:
            raise ValueError(f"backbone.pretrained: {pretrained!r} is a {model.config.model_type!r} checkpoint, "
                             f"but backbone.name={name!r} is a {spec.family!r} architecture")
        return model.to(device) if device is not None else model
    config = spec.build_config(attn_implementation=attn_implementation, **config_overrides)
    with torch.device(device or "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def causal_mask(config: Any, hidden_BTH: torch.Tensor) -> torch.Tensor | None:
    """The causal attention mask transformers' layers expect for ``hidden_BTH`` (no padding, no cache).

    With eager attention this is an explicit additive mask: passing ``None`` to an eager layer would *not* be causal.
    """
    return create_causal_mask(config=config, inputs_embeds=hidden_BTH, attention_mask=None, cache=None)


class AllPositionsKeys:
    """Keys and values of all T positions for a decoder layer whose queries are computed at Q rows only.

    transformers' attention projects keys/values for the rows it is given and hands them to
    ``cache.update(key, value, layer_idx, ...)``, then attends over whatever ``update`` returns. This stand-in for a KV
    cache returns the keys/values of *every* position, so a layer called on the rows (B, Q, H) computes
    "queries at the rows, keys/values from all positions", and the layer's own forward does everything else: norms,
    q projection (and Qwen3's q-norm), rotary, the attention kernel (eager or SDPA), o_proj, both residuals, the MLP.

    The one restated piece of the attention is the key/value half (input_layernorm → k_proj → k_norm where the family
    has one → rotary; input_layernorm → v_proj), because no module computes keys alone. It runs inside ``update``,
    i.e. inside the layer's forward, so a per-layer sharding wrapper (FSDP2 gathers a layer's parameters in its
    pre-forward hook) has the parameters in place. ``tests/test_backbones.py`` checks it against the full layer for
    both families in float32.

    Args:
        layer: the decoder layer being called.
        hidden_BTH: (B, T, H) the layer's input at all positions.
        position_embeddings: rotary ``(cos, sin)`` of all positions, each (B or 1, T, D).
    """

    def __init__(self, layer: nn.Module, hidden_BTH: torch.Tensor, position_embeddings: tuple[torch.Tensor, ...]):
        self.layer, self.hidden_BTH, self.position_embeddings = layer, hidden_BTH, position_embeddings

    def update(self, key_BNQD: torch.Tensor, value_BNQD: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Ignore the rows' own keys/values (they are rows of the result); return (keys, values), each (B, N, T, D)."""
        attn = self.layer.self_attn
        h_BTH = self.layer.input_layernorm(self.hidden_BTH)
        heads_shape = (*h_BTH.shape[:-1], -1, attn.head_dim)
        key_BTND = attn.k_proj(h_BTH).view(heads_shape)
        if hasattr(attn, "k_norm"):  # Qwen3 RMS-norms keys per head before the rotary embedding
            key_BTND = attn.k_norm(key_BTND)
        key_BNTD = key_BTND.transpose(1, 2)
        cos, sin = self.position_embeddings
        key_BNTD = key_BNTD * cos.unsqueeze(1) + rotate_half(key_BNTD) * sin.unsqueeze(1)  # apply_rotary_pos_emb's
        return key_BNTD, attn.v_proj(h_BTH).view(heads_shape).transpose(1, 2)


def run_decoder_layer(
    layer: nn.Module,
    hidden_BTH: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    mask: torch.Tensor | None,
    rows_Q: torch.Tensor | None = None,
    cache: Any = None,
) -> torch.Tensor:
    """Apply one parent decoder layer. The only place that knows the layer's call signature (transformers 5.24).

    Args:
        hidden_BTH: (B, T, H) residual stream.
        position_embeddings: rotary ``(cos, sin)``, each (B, T, head_dim), from the parent's ``rotary_emb``.
        mask: from :func:`causal_mask`.
        rows_Q: (Q,) positions (any order, repeats allowed) to compute the output at; ``None`` = all T. Rows attend
            causally to the keys/values of all positions (:class:`AllPositionsKeys`), so the result equals the full
            output's rows ``[:, rows_Q]`` (to float32 round-off) at about Q/T of the layer's cost.
        cache: a transformers KV cache (``DynamicCache``) for incremental decoding: the layer appends the keys/values
            of ``hidden_BTH``'s positions under its own ``layer_idx`` and attends over everything cached (the
            chain-of-thought baseline, ``par_ray.cot``). Not combined with ``rows_Q``.
    Returns: (B, T, H), or (B, Q, H) with ``rows_Q``.
    Raises: ValueError for ``rows_Q`` on a layer with gradient checkpointing enabled (transformers drops the cache
        argument there, which would silently attend over the rows only).
    """
    if rows_Q is None:
        out = layer(hidden_BTH, attention_mask=mask, position_embeddings=position_embeddings, cache=cache,
                    use_cache=cache is not None)
        return out[0] if isinstance(out, tuple) else out
    if getattr(layer, "gradient_checkpointing", False):
        raise ValueError("run_decoder_layer: rows_Q needs the layer's cache argument, which gradient checkpointing "
                         "drops; disable gradient checkpointing on the readout's last layer")
    T = hidden_BTH.shape[1]
    if mask is None:  # SDPA's implicit causal mask is square; rows need an explicit one: key j visible iff j <= row
        mask = (torch.arange(T, device=hidden_BTH.device)[None, :] <= rows_Q[:, None])[None, None]
    else:
        mask = mask[..., rows_Q, :]
    cos, sin = position_embeddings
    out = layer(hidden_BTH[:, rows_Q], attention_mask=mask, position_embeddings=(cos[:, rows_Q], sin[:, rows_Q]),
                cache=AllPositionsKeys(layer, hidden_BTH, position_embeddings), use_cache=False)
    return out[0] if isinstance(out, tuple) else out


def parameter_count(model: nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
