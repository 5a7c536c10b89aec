"""Parent decoders that PAR retrofits: Qwen2.5 and Qwen3, built from the registry's sizes and called layer by layer.

The sizes are data in :mod:`par_ray.model.registry` (:data:`BACKBONES`, :class:`BackboneSpec`, :func:`get_spec`,
re-exported here), which imports neither torch nor transformers; this module is where transformers' model code comes
in. No pretrained weights are downloaded by this module; ``load(..., pretrained=PATH_OR_HUB_ID)`` reads a local
safetensors checkpoint, a hub id from the local hub cache (:mod:`par_ray.weights`, offline first).

The parent's decoder layers are called through exactly one function, :func:`run_decoder_layer`, because their
signature moves between transformers releases (``position_embeddings`` became required; ``past_key_values`` became
``cache``, :data:`CACHE_ARG`). transformers is pinned in ``pyproject.toml``. The same function can compute a layer's output at a few
rows only (the readout's last coda layer): see :class:`AllPositionsKeys`.

Attention runs through transformers' own implementations, chosen by ``attn_implementation``: ``sdpa``
(``torch.nn.functional.scaled_dot_product_attention``, the default: fused softmax, faster) or ``eager`` (explicit
matmul + softmax, bit-for-bit the reference). Both agree to float32 round-off (``tests/test_backbones.py`` bounds
the difference of the logits at 1e-5 on the tiny shapes).

Tensor suffixes: B batch, T sequence length, H hidden size, Q selected rows, N heads, D head size.
"""

from __future__ import annotations

import glob
import inspect
import os
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers.masking_utils import create_causal_mask
from transformers.models.qwen2.modeling_qwen2 import rotate_half  # Qwen3's is the same function (one modular source)

from par_ray.config import ATTN_IMPLEMENTATIONS  # transformers attention implementations allowed; first = default
from par_ray.model.registry import BACKBONES, BackboneSpec, get_spec  # re-exported: the registry's public names


CACHE_ARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"
"""The name transformers gives the KV-cache argument of its decoder layers and masks: ``cache`` in the pinned 5.24,
``past_key_values`` before the rename (5.17, what the GPU check machine has: ``benchmarks/gpu_check.py``)."""


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
            local directory holding ``config.json`` + ``*.safetensors`` (a hub id is resolved to its local copy
            by the caller: ``par_ray.weights.resolved_backbone``), loaded with ``from_pretrained(use_safetensors=True,
            trust_remote_code=False, local_files_only=True)``.
        dtype: parameter dtype.
        device: where to allocate; ``"meta"`` builds shapes only (parameter counts, memory plans).
        attn_implementation: one of :data:`ATTN_IMPLEMENTATIONS` (``sdpa`` fast, ``eager`` the exact reference).
        config_overrides: extra config fields (e.g. ``vocab_size`` for a task vocabulary on test shapes).
    Raises:
        ValueError: unknown ``name`` or ``attn_implementation``, or a checkpoint that is not on this machine, lacks
            files, or whose architecture family or sizes differ from ``name``'s registry entry.
    """
    spec = get_spec(name)
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"backbone.attn_implementation: {attn_implementation!r} is not one of "
                         f"{list(ATTN_IMPLEMENTATIONS)}")
    if pretrained is not None:
        # offline first: callers resolve a hub id to its local directory (par_ray.weights.resolved_backbone) before
        # building; here the directory's family and sizes are checked against the registry
        path = os.path.expanduser(pretrained)
        if not os.path.isdir(path):
            raise ValueError(f"backbone.pretrained: {pretrained!r} is not a local checkpoint directory; resolve a hub "
                             f"id to the local cache first (par_ray.weights.resolved_backbone)")
        config = AutoConfig.from_pretrained(path, trust_remote_code=False, attn_implementation=attn_implementation,
                                            local_files_only=True)
        problems = spec.mismatches(config.to_dict())
        if problems:
            raise ValueError(f"backbone.pretrained: {name} checkpoint {path} cannot be loaded: {'; '.join(problems)}")
        return load_checkpoint(path, config, dtype, device or "cpu")
    config = spec.build_config(attn_implementation=attn_implementation, **config_overrides)
    with torch.device(device or "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def load_checkpoint(path: str, config: Any, dtype: torch.dtype, device: str | torch.device) -> PreTrainedModel:
    """The safetensors checkpoint in directory ``path`` (with its transformers ``config``), built on the meta device
    and filled tensor by tensor straight on ``device``: no full copy of the parent on the host first (a GPU worker
    held a 7B parent in fp32 on the host, 30 GB, before moving it; 4–8 workers share a node).

    Meta build (``from_config`` under ``torch.device("meta")``) → ``to_empty(device)`` → every checkpoint tensor read
    with ``safetensors.safe_open`` onto ``device`` and copied into its parameter (cast to ``dtype``) → the tied
    ``lm_head`` re-tied → the rotary embedding's ``inv_freq``, a non-persistent buffer the checkpoint does not hold,
    rebuilt by transformers' own rotary module. transformers' ``from_pretrained(device_map=device)`` does the same
    but needs ``accelerate``, with which transformers also imports DeepSpeed on every load. ``"meta"``: shapes
    only. The result equals ``from_pretrained(path, dtype=dtype)`` moved to ``device``, tensor for tensor
    (``tests/test_backbones.py``).

    Raises:
        ValueError: the checkpoint lacks a parameter of the model, or holds one the model does not have.
    """
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False)
    if torch.device(device).type == "meta":
        return model
    model.to_empty(device=device)
    base = model.model
    base.rotary_emb = type(base.rotary_emb)(config=model.config).to(device)
    state = model.state_dict()
    loaded = set()
    with torch.no_grad():
        for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
            with safe_open(file, framework="pt", device=str(device)) as f:
                for key in f.keys():
                    if key not in state:
                        raise ValueError(f"backbone.pretrained: {file} holds {key!r}, which a {config.model_type} "
                                         f"model of this config does not have")
                    state[key].copy_(f.get_tensor(key))
                    loaded.add(key)
    model.tie_weights()
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = sorted(set(state) - loaded - tied)
    if missing:
        raise ValueError(f"backbone.pretrained: {path} lacks {len(missing)} tensor(s) of the model, e.g. "
                         f"{missing[:3]}")
    return model.eval()  # as from_pretrained returns it


def causal_mask(config: Any, hidden_BTH: torch.Tensor) -> torch.Tensor | None:
    """The causal attention mask transformers' layers expect for ``hidden_BTH`` (no padding, no cache).

    With eager attention this is an explicit additive mask: passing ``None`` to an eager layer would *not* be causal.
    """
    return create_causal_mask(config=config, inputs_embeds=hidden_BTH, attention_mask=None, **{CACHE_ARG: None})


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
        out = layer(hidden_BTH, attention_mask=mask, position_embeddings=position_embeddings, **{CACHE_ARG: cache},
                    use_cache=cache is not None)
        return out[0] if isinstance(out, tuple) else out
    if getattr(layer, "gradient_checkpointing", False):
        raise ValueError("run_decoder_layer: rows_Q needs the layer's cache argument, which gradient checkpointing "
                         "drops; disable gradient checkpointing on the readout's last layer")
    T = hidden_BTH.shape[1]
    if mask is None:  # SDPA's implicit causal mask is square; rows need an explicit one: key j visible iff j <= row
        mask = (torch.arange(T, device=hidden_BTH.device)[None, :] <= rows_Q[:, None])[None, None]
    elif mask.dim() == 4 and mask.shape[0] > 1 and mask.stride(0) == 0:
        # A mask broadcast over the batch (the banded causal mask of ``LoopedLM``) keeps that layout: the rows of one
        # batch entry, expanded. A gathered copy would differ in stride from the full-T calls' mask, and a compiled
        # layer recompiles on a stride change (``par_ray.train.strategies.compile_layers``).
        mask = mask[:1, :, rows_Q, :].expand(mask.shape[0], -1, -1, -1)
    else:
        mask = mask[..., rows_Q, :]
    cos, sin = position_embeddings
    out = layer(hidden_BTH[:, rows_Q], attention_mask=mask, position_embeddings=(cos[:, rows_Q], sin[:, rows_Q]),
                **{CACHE_ARG: AllPositionsKeys(layer, hidden_BTH, position_embeddings)}, use_cache=False)
    return out[0] if isinstance(out, tuple) else out


def parameter_count(model: nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


__all__ = ["ATTN_IMPLEMENTATIONS", "BACKBONES", "AllPositionsKeys", "BackboneSpec", "causal_mask", "get_spec", "load",
           "load_checkpoint", "parameter_count", "run_decoder_layer"]
