"""Parent decoders that PAR retrofits: Qwen2.5 and Qwen3, sizes kept as data.

Sizes are data, not classes (litgpt ``config.py``; torchtitan ``models/qwen3/__init__.py``): each entry of
:data:`BACKBONES` holds the exact public ``config.json`` fields of one checkpoint, with its source, and builds
transformers' own ``Qwen2Config`` / ``Qwen3Config`` from them. No pretrained weights are downloaded by this module;
``load(..., pretrained=PATH)`` reads a local safetensors checkpoint (or a hub name where a hub is reachable).

The parent's decoder layers are called through exactly one function, :func:`run_decoder_layer`, because their
signature moves between transformers releases (``position_embeddings`` became required; ``past_key_value`` became
``cache``). transformers is pinned in ``pyproject.toml``.

Tensor suffixes: B batch, T sequence length, H hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config, Qwen3Config
from transformers.masking_utils import create_causal_mask

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

    @property
    def num_hidden_layers(self) -> int:
        return int(self.fields["num_hidden_layers"])

    @property
    def hidden_size(self) -> int:
        return int(self.fields["hidden_size"])

    def build_config(self, **overrides: Any) -> Qwen2Config | Qwen3Config:
        """The family's transformers config for this entry (eager attention: exact, deterministic on CPU)."""
        kwargs = {"attn_implementation": "eager", **self.fields, **overrides}
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

BACKBONES: dict[str, BackboneSpec] = {
    "tiny-qwen2": BackboneSpec(family="qwen2", fields=dict(_TINY_COMMON), source="test shape (Qwen2.5 quirks)"),
    "tiny-qwen3": BackboneSpec(
        family="qwen3",
        fields=dict(_TINY_COMMON, head_dim=32, attention_bias=False),
        source="test shape (Qwen3 quirks: q/k norm, explicit head_dim)",
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
        config_overrides: extra config fields (e.g. ``vocab_size`` for a task vocabulary on test shapes).
    Raises:
        ValueError: unknown ``name``, or a checkpoint whose architecture family differs from ``name``'s.
    """
    spec = get_spec(name)
    if pretrained is not None:
        model = AutoModelForCausalLM.from_pretrained(
            pretrained, dtype=dtype, use_safetensors=True, trust_remote_code=False, attn_implementation="eager",
        )
        if model.config.model_type != spec.family:
            raise ValueError(f"backbone.pretrained: {pretrained!r} is a {model.config.model_type!r} checkpoint, "
                             f"but backbone.name={name!r} is a {spec.family!r} architecture")
        return model.to(device) if device is not None else model
    config = spec.build_config(**config_overrides)
    with torch.device(device or "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def causal_mask(config: Any, hidden_BTH: torch.Tensor) -> torch.Tensor | None:
    """The causal attention mask transformers' layers expect for ``hidden_BTH`` (no padding, no cache).

    With eager attention this is an explicit additive mask: passing ``None`` to an eager layer would *not* be causal.
    """
    return create_causal_mask(config=config, inputs_embeds=hidden_BTH, attention_mask=None, cache=None)


def run_decoder_layer(
    layer: nn.Module,
    hidden_BTH: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Apply one parent decoder layer. The only place that knows the layer's call signature (transformers 5.24).

    Args:
        hidden_BTH: (B, T, H) residual stream.
        position_embeddings: rotary ``(cos, sin)``, each (B, T, head_dim), from the parent's ``rotary_emb``.
        mask: from :func:`causal_mask`.
    Returns: (B, T, H).
    """
    out = layer(hidden_BTH, attention_mask=mask, position_embeddings=position_embeddings, use_cache=False)
    return out[0] if isinstance(out, tuple) else out


def parameter_count(model: nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
