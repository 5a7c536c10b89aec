"""The backbone registry: the parent checkpoints PAR retrofits (Qwen2.5 and Qwen3), sizes kept as data.

Sizes are data, not classes (litgpt ``config.py``; torchtitan ``models/qwen3/__init__.py``): each entry of
:data:`BACKBONES` holds the exact public ``config.json`` fields of one checkpoint, with its source, and builds
transformers' own ``Qwen2Config`` / ``Qwen3Config`` from them (:meth:`BackboneSpec.build_config`).

Kept apart from :mod:`par_ray.model.backbones` (which builds and calls the parent's layers) so that the processes
that only read sizes and names (config validation, presets, the sweep CLI, a Tune trial driver, a Ray Train
controller) import neither torch nor transformers for it. ``par_ray.model.backbones`` re-exports this module's names.
"""

from __future__ import annotations

import copy
import typing
from dataclasses import dataclass, field
from typing import Any

from par_ray.config import ATTN_IMPLEMENTATIONS  # transformers attention implementations allowed; first = default

if typing.TYPE_CHECKING:
    from transformers import Qwen2Config, Qwen3Config


CHECKED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "tie_word_embeddings")
"""The sizes a pretrained checkpoint's ``config.json`` must share with its registry entry: the planner, the layer
split and the memory plans are computed from the entry, so a checkpoint of another size is refused before it runs
(``BackboneSpec.mismatches``)."""


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

    @property
    def vocab_size(self) -> int:
        return int(self.fields["vocab_size"])

    def mismatches(self, config: dict[str, Any]) -> list[str]:
        """How a checkpoint's ``config.json`` (as a dict) differs from this entry: its ``model_type`` against
        :attr:`family`, and every size field of :data:`CHECKED_FIELDS` this entry sets against the same key of
        ``config`` (a key the checkpoint leaves out is not compared). Empty when the checkpoint is this
        architecture."""
        out = []
        if config.get("model_type") != self.family:
            out.append(f"model_type {config.get('model_type')!r} is not {self.family!r}")
        for key in CHECKED_FIELDS:
            if key in self.fields and key in config and config[key] != self.fields[key]:
                out.append(f"{key} {config[key]!r} differs from the registry's {self.fields[key]!r}")
        return out

    def build_config(self, **overrides: Any) -> Qwen2Config | Qwen3Config:
        """The family's transformers config for this entry (``attn_implementation`` defaults to ``sdpa``)."""
        from transformers import Qwen2Config, Qwen3Config  # here, not at the top: readers of sizes build no config

        # Deep copy: the config keeps the nested rope_parameters dict it is given, and must not alias the registry's.
        kwargs = {"attn_implementation": ATTN_IMPLEMENTATIONS[0], **copy.deepcopy(self.fields), **overrides}
        return {"qwen2": Qwen2Config, "qwen3": Qwen3Config}[self.family](**kwargs)


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
    # Qwen3 dense models: the -Base checkpoints. The paper names the Qwen3 sizes (0.6B-4B), not a variant; we
    # retrofit the base (pretrained-only) models because (1) PAR fine-tunes a pretrained LM on plain task prompts
    # with no chat template, while the post-trained hybrid-thinking checkpoints are tuned to a chat format and
    # <think> blocks those prompts never use; (2) the Qwen2.5 entries are base models too, so a backbone table
    # compares the two families at the same stage of training. Both variants share the architecture (the sizes
    # below are checked against the checkpoint's config.json before a trial runs, par_ray.weights); the post-trained
    # ones stay usable with backbone.pretrained=Qwen/Qwen3-0.6B. max_position_embeddings is the post-trained card's
    # 40960 (only random-init shapes read it; a checkpoint brings its own, and it is not compared).
    "qwen3-0.6b": _checkpoint(
        "qwen3", "Qwen/Qwen3-0.6B-Base", 0.6, 0.44, _QWEN3,
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
    ),
    "qwen3-1.7b": _checkpoint(
        "qwen3", "Qwen/Qwen3-1.7B-Base", 1.7, 1.4, _QWEN3,
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
    ),
    "qwen3-4b": _checkpoint(
        "qwen3", "Qwen/Qwen3-4B-Base", 4.0, 3.6, _QWEN3,
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
    ),
}
"""Registry of parent architectures: a plain dict, name -> :class:`BackboneSpec`."""


def get_spec(name: str) -> BackboneSpec:
    """The registry entry ``name``; ``ValueError`` naming the allowed values if unknown."""
    if name not in BACKBONES:
        raise ValueError(f"backbone.name: {name!r} is not one of {sorted(BACKBONES)}")
    return BACKBONES[name]
