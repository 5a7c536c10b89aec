"""Memory planner: bytes per GPU of one PAR training step, per backbone × strategy × world size × R × window.

What one GPU (one data-parallel rank) holds at the peak of a training step of :class:`par_ray.model.looped.LoopedLM`:
model states (parameters, gradients, AdamW state), the activations autograd stores for backward, communication
buffers and transient workspaces. Parameter counts come from building the model on the meta device
(``backbones.load(name, device="meta")`` + ``LoopedLM``: the adapter's 2h² weights and untied core copies included),
never from hand-typed numbers. :func:`min_gpus` finds the smallest GPU count that fits.

Model states (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
§3.1, §5, Fig. 1): mixed-precision AdamW keeps 2 + 2 + K = 16 bytes per parameter (K = 12: fp32 master copy,
momentum, variance). How each strategy of ``par_ray/train/strategies.py`` splits them on GPUs (dtype ``bf16``), and
float32 on CPU (dtype ``fp32``), in bytes per parameter:

    dtype / strategy          param grad optimizer         activations                    compute copy of weights
    bf16 deepspeed              2    2   12 (master, m, v)  bf16                           (the bf16 module itself)
    bf16 fsdp                   4    4    8 (m, v)          bf16 (inputs cast per unit)    bf16 gathered units
    bf16 ddp                    4    4    8 (m, v)          bf16 matmuls, fp32 residual    bf16 autocast casts
    fp32 any                    4    4    8 (m, v)          fp32                           -

(DeepSpeed's bf16 mode; FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` over fp32 shards; torch
autocast over fp32 parameters.) Sharding over N ranks (ZeRO §5.1-5.3):

    ddp                 P, G, O replicated              + DDP reducer buckets, a flat copy of every gradient, when
                                                          N > 1 (PyTorch DDP docs, ``gradient_as_bucket_view``)
    deepspeed ZeRO-1    O / N                           + reduce and all-gather buckets of min(5e8, Ψ) elements
    deepspeed ZeRO-2    G / N, O / N                      (``reduce_bucket_size`` / ``allgather_bucket_size``)
    deepspeed ZeRO-3    P / N, G / N, O / N             + the reduce bucket
    fsdp                as ZeRO-3 (FSDP2 ``fully_shard``)
    offload             ZeRO-Offload (Ren et al. 2021, §4): fp32 master, m, v and the fp32 gradient partition live
                        in host memory, 16Ψ/N bytes per rank; the GPU keeps the bf16 parameters (/N at ZeRO-3) and,
                        at ZeRO-1, the full bf16 gradients (ZeRO-2/3 stream them to the host through the bucket).

Activations stored for backward (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", §4.1: sbh(34 + 5as/h) bytes per GPT layer in 16-bit), re-derived for transformers' Qwen2/Qwen3 decoder
layer with eager attention by listing the tensors autograd saves. b: bytes of matmul outputs, r: bytes of the
residual stream (b = r = 2 in bf16, 4 in fp32; ddp's autocast keeps r = 4); h hidden, a = n_q·d_head,
g = n_kv·d_head, I MLP width, n_q query heads. Per token:

    2 RMSNorms     8h + 2rh + (2b or 5b)h  fp32 input (``pow``), normalised x (r), the output fed to the linear layers:
                                        one saved copy (b), or under autocast a bf16 cast per consumer (q, k, v; gate, up)
    attention      4b·a                 rotated q, k and v *after* ``repeat_kv`` (eager attention materialises the
                                        n_q/n_kv copies, so GQA saves no activation memory), the o_proj input
    SwiGLU MLP     4b·I                 gate, silu(gate), up, silu(gate)·up   (a GeLU MLP stores 19 sbh in the paper)
    Qwen3 q/k norm (4 + b)(a + g)       per-head RMSNorm on q and k: fp32 input + normalised
    per sequence   n_q T² (4 + b)       softmax probabilities in fp32 (transformers runs softmax in fp32) and their
                                        bf16 cast fed to P·V (one fp32 tensor when b = 4); no dropout masks (p = 0)

For Qwen2.5-7B in bf16 that is 66h per token + 6 n_q T² per sequence, against the paper's 34h + 5 n_q T² for a GPT
layer with a 4h GeLU MLP. The looped step (``LoopedLM.iterate``) stores, with K = min(grad_window, R) iterations in
the gradient window:

    prelude layers                 once
    (adapter input [e; s] 2bh + core layers + anchoring 4h + coda layers + final norm (4 + r)h + lm_head input bQh)
                                   × K        (iterations before the window run under no_grad: they store nothing,
                                               so activation memory grows with the window, not with R)
    prelude output e (rh), causal mask (r T²), rotary cos/sin
    logits                         K·B·Q·V (b + 4): the stacked readout and the loss's fp32 log-softmax

Peak. The window's read-outs run after its last iteration as one batch of K·B sequences (``LoopedLM._read_stacked``),
so backward starts with them, all at once (lm_head and a tied embedding first, then the coda), then walks the
iterations in reverse (core, adapter, ..., prelude), freeing each layer's activations as it allocates that layer's
gradients; the planner walks the same order, layer by layer, and keeps the largest (gradients allocated so far -
activations freed so far + transient). The read-outs' backward leaves the gradient of the K stacked states,
K·B·T·h·r, in one buffer whose views feed the K iterations: it is held through the window's walk. A weight's
first contribution becomes its gradient; a shared weight's later ones (tied embedding / lm_head, the looped core and
coda) are added out of place, so the new contribution and the new sum coexist with the old sum: 2 × that weight in
the compute dtype. Sharded gradients count whole from the start. After backward the activations are gone and the
optimizer step has its own temporaries:

    total = P + O + buffers + max( activations + walk peak + backward workspace ,  G + step workspace )

    backward workspace: the logits' gradients K·B·Q·V (4 + b); two of a layer's largest activation gradients
        (max of B·T·I·b and B·n_q·T²·4, × K for the batched read-out's coda layers); bf16 ddp: autocast's bf16
        weight casts (saved for backward) and the fp32 cast of the largest weight's gradient; fsdp: the units
        ``strategies.fsdp`` keeps gathered (core, coda, adapter, untied lm_head and core copies are reused, so
        ``reshard_after_forward=False`` keeps them unsharded until their backward; the root, with tied embeddings,
        stays unsharded) plus the fp32 copy of the largest unit's gradient for the reduce-scatter; ZeRO-3: the
        same reused set, capped at ``stage3_max_live_parameters`` = 1e9 (``strategies.deepspeed_config`` keeps
        reused parameters gathered).
    step workspace: the step's stacked logits K·B·Q·V·b (alive until the step returns); torch AdamW (ddp, fsdp, and
        deepspeed's ``torch_adam``) takes the foreach path on CUDA, which materialises sqrt(v) of every local
        parameter at once, 4 B each (torch.optim docs: foreach trades peak memory for speed); DeepSpeed also
        materialises the fp32 gradient partition it hands the optimizer (ZeRO-3 steps sub-groups of 1e9 elements);
        offload: nothing (DeepSpeedCPUAdam runs on the host). fp32 (CPU): torch AdamW's single-tensor path makes
        sqrt(v) and sqrt(v)/c per parameter while the previous parameter's denominator is still referenced, so
        4 · max over consecutive parameters of (n_prev + 2n).

Prefix self-distillation with an EMA teacher (``par_ray.distill``; ``ema=True``) adds the teacher's float32 copy,
resident for the whole trial: 4Ψ/N bytes per GPU where it is sharded like the student (fsdp), 4Ψ where it is a full
copy on every rank (ddp, and deepspeed at every ZeRO stage: ``strategies.deepspeed`` does not partition it). The
teacher's no-grad forwards (and, under fsdp, its one gathered unit at a time) run before the student's forward and
are freed before it, so they add no peak of their own beyond that; a live teacher adds nothing.

GPU capacity is the product's decimal figure (80 GB = 80e9 bytes; an H100 80GB has 85.5e9, an H200 150.7e9), which
leaves the CUDA context, NCCL buffers and allocator fragmentation some room. ``benchmarks/bench_memory.py`` compares
the fp32 plan with the measured peak of real training steps on CPU (within 1 % on the tiny shapes and on
Qwen2.5-0.5B, Qwen3-0.6B and Qwen2.5-7B layer shapes); ``tests/test_planner.py`` keeps it within 10 %. The bf16
terms follow the sources above and the strategies' code; no GPU measured them.

Usage::

    python -m par_ray.planner --backbone qwen2.5-7b --strategy fsdp --world-size 8 --R 32 --grad-window 8 \\
        --micro-batch 4 --seq-len 64 [--zero-stage 3] [--offload] [--gpu-memory-gb 80] [--dtype bf16]
    python -m par_ray.planner --table      # smallest GPU count per size and strategy, 80 GB and 141 GB
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass

from par_ray.accelerators import GPU_MEMORY_GB  # re-exported: GPU type -> GB, beside the plans that use it
from par_ray.cli_args import exit_with, positive_float, positive_int
from par_ray.config import STRATEGIES, TrialConfig
from par_ray.model.registry import BACKBONES
from par_ray.schedules import iterations_at
from par_ray.trial import Resolved, resolve

ZERO_STAGES = (1, 2, 3)
DTYPES = ("bf16", "fp32")
GPU_SIZES_GB = (80, 141)
DEEPSPEED_BUCKET = 500_000_000
"""DeepSpeed's default ``reduce_bucket_size`` and ``allgather_bucket_size`` (elements)."""
DEEPSPEED_MAX_LIVE = 1_000_000_000
"""DeepSpeed's default ``stage3_max_live_parameters`` (elements)."""
DEEPSPEED_SUB_GROUP = 1_000_000_000
"""DeepSpeed's default ``sub_group_size``: ZeRO-3 runs the optimizer step one sub-group at a time (elements)."""
TABLE_STRATEGIES = (
    ("ddp", 2, False), ("fsdp", 3, False), ("deepspeed", 1, False), ("deepspeed", 2, False), ("deepspeed", 3, False),
    ("deepspeed", 2, True), ("deepspeed", 3, True),
)
"""Columns of the min-GPU table: (strategy, zero stage, offload)."""


@dataclass(frozen=True)
class Precision:
    """Bytes per element of each kind of tensor, for one (dtype, strategy) pair."""

    param: int
    """Parameters as the strategy stores (and shards) them."""
    grad: int
    optimizer: int
    """Optimizer state per parameter: the fp32 master copy where it is separate, AdamW m and v."""
    activation: int
    """Matmul outputs and the linear layers' saved inputs."""
    residual: int
    """The residual stream and RMSNorm outputs."""
    compute: int
    """Weights as the matmuls read them: gathered FSDP/ZeRO-3 units, autocast's casts."""


def precision(dtype: str, strategy: str) -> Precision:
    """How ``strategy`` in ``par_ray/train/strategies.py`` holds each kind of tensor in ``dtype`` (module docstring)."""
    if dtype == "fp32":
        return Precision(param=4, grad=4, optimizer=8, activation=4, residual=4, compute=4)
    if strategy == "deepspeed":  # bf16 module, fp32 master + m + v in the ZeRO optimizer
        return Precision(param=2, grad=2, optimizer=12, activation=2, residual=2, compute=2)
    if strategy == "fsdp":  # fp32 shards; units gathered in bf16 and their inputs cast to bf16
        return Precision(param=4, grad=4, optimizer=8, activation=2, residual=2, compute=2)
    return Precision(param=4, grad=4, optimizer=8, activation=2, residual=4, compute=2)  # ddp: autocast


@dataclass(frozen=True)
class ModelShape:
    """Parameter counts (from the meta device) and the tensor dimensions activations depend on."""

    backbone: str
    family: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    split: tuple[int, int, int]
    qk_norm: bool
    """Qwen3's per-head RMSNorm on q and k."""
    total_params: int
    """Ψ: every distinct parameter of the LoopedLM (tied embeddings once, adapter, untied copies)."""
    layer_params: int
    """One decoder layer."""
    root_params: int
    """Embeddings, lm_head (if untied), final norm, adapter: everything outside the decoder layers."""
    embedding_params: int
    lm_head_params: int
    """0 when the lm_head shares the embedding matrix."""
    largest_param: int
    """Elements of the largest single parameter tensor."""
    largest_layer_param: int
    """Elements of the largest parameter tensor of a decoder layer."""
    adamw_loop_peak: int
    """max over consecutive parameters of n_prev + 2·n: the single-tensor AdamW temporaries (see :func:`plan`)."""


@functools.lru_cache(maxsize=None)
def model_shape(backbone: str, split: tuple[int, int, int] | None = None, tied: bool = True, untied_copies: int = 8,
                vocab_size: int | None = None, num_layers: int | None = None) -> ModelShape:
    """Build ``backbone`` as a LoopedLM on the meta device and read its parameter counts and dimensions.

    ``vocab_size`` / ``num_layers`` override the registry's (task vocabularies, shortened benchmark shapes).
    Raises ``ValueError`` for an unknown backbone or a bad split (from the registry and ``LoopedLM``).
    """
    # here, not at the top: a sweep driver plans trials (and the CLI lists GPU types) without importing model code
    from par_ray.model import backbones
    from par_ray.model.looped import LoopedLM

    overrides = {}
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    if num_layers is not None:
        overrides["num_hidden_layers"] = num_layers
    parent = backbones.load(backbone, device="meta", **overrides)
    model = LoopedLM(parent, split=split, tied=tied, untied_copies=untied_copies)
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    layers = (*model.prelude, *model.core, *model.coda, *model.untied)
    layer_ids = {id(p) for layer in layers for p in layer.parameters()}
    unique = {id(p): p for p in model.parameters()}  # the optimizer's order
    sizes = [p.numel() for p in unique.values()]
    tied_head = model.lm_head.weight is model.embed_tokens.weight
    return ModelShape(
        backbone=backbone,
        family=cfg.model_type,
        hidden=cfg.hidden_size,
        intermediate=cfg.intermediate_size,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        vocab=cfg.vocab_size,
        split=model.split,
        qk_norm=hasattr(model.core[0].self_attn, "q_norm"),
        total_params=backbones.parameter_count(model),
        layer_params=backbones.parameter_count(model.core[0]),
        root_params=sum(p.numel() for i, p in unique.items() if i not in layer_ids),
        embedding_params=model.embed_tokens.weight.numel(),
        lm_head_params=0 if tied_head else model.lm_head.weight.numel(),
        largest_param=max(sizes),
        largest_layer_param=max(p.numel() for p in model.core[0].parameters()),
        adamw_loop_peak=max(prev + 2 * n for prev, n in zip([0, *sizes[:-1]], sizes)),
    )


def layer_activation_bytes(shape: ModelShape, micro_batch: int, seq_len: int, act_bytes: int,
                           residual_bytes: int | None = None) -> int:
    """Bytes one decoder layer with autograd stores for backward (terms in the module docstring).

    ``act_bytes`` b: matmul outputs (2 in bf16, 4 in fp32); ``residual_bytes`` r: the residual stream (default b;
    4 under autocast over fp32 parameters, where each linear layer saves its own bf16 cast of its input).
    Includes the RMSNorms' per-token rsqrt.
    """
    b = act_bytes
    r = b if residual_bytes is None else residual_bytes
    h, I = shape.hidden, shape.intermediate
    q_width, kv_width = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    linear_inputs = 2 * b if r == b else 5 * b  # one saved norm output each, or a cast per q/k/v and gate/up
    per_token = (8 + 2 * r) * h + linear_inputs * h + 4 * b * q_width + 4 * b * I + 2 * 4
    if shape.qk_norm:
        per_token += (4 + b) * (q_width + kv_width) + 4 * (shape.heads + shape.kv_heads)
    probs = shape.heads * seq_len * seq_len * (4 + (b if b < 4 else 0))
    return micro_batch * (seq_len * per_token + probs)


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU (per rank) of one training step; ``total`` is the predicted peak."""

    backbone: str
    strategy: str
    zero_stage: int
    offload: bool
    dtype: str
    world_size: int
    R: int
    grad_window: int
    micro_batch: int
    seq_len: int
    read_positions: int
    num_params: int
    """Ψ, parameters of the whole LoopedLM (not per GPU)."""
    params: int
    grads: int
    """Gradient bytes held after backward (the local shard when gradients are sharded)."""
    optimizer: int
    """Optimizer state on the GPU (fp32 master + AdamW moments, or moments only in fp32)."""
    activations: int
    """Stored for backward at the end of the forward pass: prelude + window × (core + readout) + logits."""
    backward_grads: int
    """The backward walk's peak: gradients allocated so far (plus a shared weight's out-of-place sum) minus the
    activations freed by then (>= 0)."""
    backward_workspace: int
    """Transient during backward: activation/logit gradients, autocast casts, FSDP/ZeRO-3 gathered parameters."""
    step_workspace: int
    """Optimizer-step temporaries (after the activations are freed)."""
    buffers: int
    """Communication buckets (DDP reducer, DeepSpeed reduce/all-gather buckets), resident."""
    host: int
    """Host (CPU) memory per rank for offloaded optimizer state and gradients."""
    teacher: int = 0
    """The EMA teacher of prefix self-distillation: float32, sharded under fsdp, a full copy otherwise (0 without)."""

    @property
    def backward_peak(self) -> int:
        return self.params + self.teacher + self.optimizer + self.buffers + self.activations + self.backward_grads \
            + self.backward_workspace

    @property
    def step_peak(self) -> int:
        return self.params + self.teacher + self.optimizer + self.buffers + self.grads + self.step_workspace

    @property
    def total(self) -> int:
        """Predicted peak bytes on one GPU."""
        return max(self.backward_peak, self.step_peak)

    @property
    def peak_phase(self) -> str:
        return "backward" if self.backward_peak >= self.step_peak else "optimizer step"

    def fits(self, gpu_memory_gb: float) -> bool:
        """Whether ``total`` fits in ``gpu_memory_gb`` decimal GB (the product figure, e.g. 80 or 141)."""
        return self.total <= gpu_memory_gb * 1e9


def _errors(backbone, strategy, world_size, R, grad_window, micro_batch, seq_len, zero_stage, offload, dtype,
            read_positions) -> list[str]:
    errs = []
    if backbone not in BACKBONES:
        errs.append(f"backbone: {backbone!r} is not one of {sorted(BACKBONES)}")
    if strategy not in STRATEGIES:
        errs.append(f"strategy: {strategy!r} is not one of {list(STRATEGIES)}")
    if zero_stage not in ZERO_STAGES:
        errs.append(f"zero_stage: {zero_stage!r} is not one of {list(ZERO_STAGES)}")
    if dtype not in DTYPES:
        errs.append(f"dtype: {dtype!r} is not one of {list(DTYPES)}")
    if offload and strategy != "deepspeed":
        errs.append(f"offload: ZeRO-Offload needs strategy 'deepspeed', got {strategy!r}")
    for name, value in (("world_size", world_size), ("R", R), ("grad_window", grad_window),
                        ("micro_batch", micro_batch), ("seq_len", seq_len), ("read_positions", read_positions)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            errs.append(f"{name}: must be an integer >= 1, got {value!r}")
    if isinstance(read_positions, int) and isinstance(seq_len, int) and read_positions > seq_len:
        errs.append(f"read_positions: {read_positions} exceeds seq_len={seq_len}")
    return errs


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def plan(backbone: str, strategy: str, world_size: int, R: int, grad_window: int, micro_batch: int, seq_len: int,
         zero_stage: int = 2, offload: bool = False, dtype: str = "bf16", read_positions: int = 5,
         split: tuple[int, int, int] | None = None, tied: bool = True, untied_copies: int = 8,
         anchoring: bool = True, vocab_size: int | None = None, num_layers: int | None = None,
         ema: bool = False) -> MemoryPlan:
    """Per-GPU memory of one training step (formulas and sources in the module docstring).

    Args:
        backbone: registry name (``par_ray.model.registry.BACKBONES``).
        strategy: ``ddp`` | ``fsdp`` | ``deepspeed``; ``zero_stage`` (1, 2, 3) applies to ``deepspeed`` only.
        world_size: N data-parallel ranks (GPUs).
        R: core iterations; ``grad_window``: iterations run with autograd (the last min(window, R)).
        micro_batch: sequences per GPU; ``seq_len``: tokens T; ``read_positions``: Q answers read per sequence.
        offload: DeepSpeed ZeRO-Offload of optimizer state (and gradient partitions) to host memory.
        dtype: ``bf16`` (GPU mixed precision) or ``fp32`` (CPU).
        split, tied, untied_copies, anchoring: the LoopedLM's (prelude, core, coda) split and recipe switches.
        vocab_size, num_layers: override the backbone's (task vocabulary; shortened benchmark shapes).
        ema: an EMA teacher (prefix self-distillation): fp32, 4Ψ/N bytes under fsdp, 4Ψ otherwise.
    Returns: a :class:`MemoryPlan` (bytes).
    Raises: ``ValueError`` naming every bad argument and its allowed values.
    """
    errs = _errors(backbone, strategy, world_size, R, grad_window, micro_batch, seq_len, zero_stage, offload, dtype,
                   read_positions)
    if errs:
        raise ValueError("invalid memory plan:\n  - " + "\n  - ".join(errs))
    shape = model_shape(backbone, split, tied, untied_copies, vocab_size, num_layers)
    prec = precision(dtype, strategy)
    N, psi = world_size, shape.total_params
    stage = {"ddp": 0, "fsdp": 3, "deepspeed": zero_stage}[strategy]
    local = _ceil_div(psi, N)

    # --- model states (ZeRO §5: stage 1 shards optimizer state, 2 also gradients, 3 also parameters) -----------------
    params = prec.param * (local if stage >= 3 else psi)
    grads = prec.grad * (local if stage >= 2 else psi)
    optimizer = prec.optimizer * (local if stage >= 1 else psi)
    host = 0
    if offload:  # ZeRO-Offload: fp32 master + m + v and the fp32 gradient partition on the host
        host = (12 + 4) * local
        optimizer = 0
        grads = grads if stage == 1 else 0

    buffers = 0
    if strategy == "ddp" and N > 1:
        buffers = prec.grad * psi
    elif strategy == "deepspeed":
        bucket = min(DEEPSPEED_BUCKET, psi)
        buffers = prec.grad * bucket + (prec.param * bucket if stage < 3 else 0)

    # --- activations, listed in the order backward visits them ------------------------------------------------------
    B, T, Q, V, h = micro_batch, seq_len, read_positions, shape.vocab, shape.hidden
    b, r, g = prec.activation, prec.residual, prec.grad
    n_pre, n_core, n_coda = shape.split
    K = min(grad_window, R)
    layer = layer_activation_bytes(shape, B, T, b, r)
    layer_grads = g * shape.layer_params
    rest_root = shape.root_params - shape.embedding_params - shape.lm_head_params  # final norm + adapter
    head_param = shape.lm_head_params or shape.embedding_params  # a tied embedding's gradient starts at the lm_head
    head = g * head_param + g * rest_root
    # (bytes stored, gradient key, gradient bytes allocated when backward first reaches it, its largest weight)
    order: list[tuple[int, object, int, int]] = []
    # The window's K read-outs run as one batch of K·B sequences after the last iteration (LoopedLM._read_stacked),
    # so backward walks them first, all at once: final norm, lm_head input, coda layers at K·B.
    order.append((K * (B * T * ((4 + r) * h + 4) + B * Q * h * b), "head", head, head_param))
    order += [(K * layer, ("coda", i), layer_grads, shape.largest_layer_param) for i in reversed(range(n_coda))]
    window_start = len(order)
    for k in range(R, R - K, -1):  # iterations in the window, last first; earlier ones stored nothing
        if anchoring and k >= 2:
            order.append((B * T * (4 * h + 16), None, 0, 0))  # fp32 state for the RMS ratio + per-token scalars
        copy = 1 if tied or k == 1 else min(k, untied_copies)
        order += [(layer, ("core", copy, i), layer_grads, shape.largest_layer_param) for i in reversed(range(n_core))]
        order.append((B * T * 2 * h * b, "adapter", 0, 2 * h * h))  # adapter input [e; s]
    window_walk = range(window_start, len(order))
    order += [(layer, ("prelude", i), layer_grads, shape.largest_layer_param) for i in reversed(range(n_pre))]
    if shape.lm_head_params:  # an untied embedding's gradient comes last; a tied one is the head's last contribution
        order.append((0, "embedding", g * shape.embedding_params, shape.embedding_params))
    else:
        order.append((0, "head", 0, shape.embedding_params))
    logits = K * B * Q * V * (b + 4)  # stacked readout logits + the loss's fp32 log-softmax
    once = B * T * h * r + B * T * T * r + 2 * T * shape.head_dim * r  # prelude output e, causal mask, cos/sin
    activations = logits + once + sum(act for act, _, _, _ in order)

    # Gradients allocated as backward reaches each layer. A weight's first contribution becomes its gradient; later
    # ones (a shared weight: tied embedding / lm_head, the looped core and coda) are added out of place, so the new
    # contribution and the new sum briefly coexist with the old sum. Sharded gradients count whole from the start.
    # The read-outs' backward leaves the gradient of the K stacked states in one buffer, each iteration's share a
    # view of it: it is held while backward walks the window's iterations, until the earliest read one.
    read_grads = r * K * B * T * h
    allocated, freed, worst, seen = 0, 0, 0, set()
    for i, (act, key, grad_bytes, largest) in enumerate(order):
        transient = 2 * prec.compute * largest if key in seen else 0
        if key is not None and key not in seen:
            seen.add(key)
            allocated += grad_bytes
        worst = max(worst, allocated - freed + transient + (read_grads if i in window_walk else 0))
        freed += act
    backward_grads = grads + 2 * prec.compute * shape.largest_param if stage >= 2 else worst

    # --- transients during backward ------------------------------------------------------------------------------------
    # the largest activation gradient of a layer: the batched read-out's coda layers see K·B sequences
    largest_tensor = (K if n_coda else 1) * max(B * T * shape.intermediate * b, B * shape.heads * T * T * 4)
    backward_workspace = K * B * Q * V * (4 + b) + 2 * largest_tensor
    copies_used = n_core * (1 if tied else min(R, untied_copies))
    reused = (copies_used + n_coda) * shape.layer_params + rest_root + (shape.lm_head_params or shape.embedding_params)
    if dtype == "bf16" and strategy == "ddp":  # autocast's bf16 weight casts, the fp32 cast of the largest gradient
        backward_workspace += prec.compute * (psi - (shape.embedding_params if shape.lm_head_params else 0)) \
            + 4 * shape.largest_param
    elif strategy == "fsdp":  # the units kept gathered, the largest unit's gradient cast to fp32 for the reduce
        largest_unit = max(shape.layer_params, shape.embedding_params, shape.lm_head_params, rest_root)
        backward_workspace += prec.compute * reused + (4 * largest_unit if prec.compute < 4 else 0)
    elif stage >= 3:  # deepspeed ZeRO-3: reused parameters stay gathered, up to the live-parameter cap
        backward_workspace += prec.compute * min(reused, DEEPSPEED_MAX_LIVE)

    # --- transients of the optimizer step -------------------------------------------------------------------------------
    step_workspace = K * B * Q * V * b  # the training step holds its stacked logits until it returns
    opt_local = local if stage >= 1 else psi
    if offload:
        pass  # DeepSpeedCPUAdam steps on the host
    elif dtype == "fp32" and strategy != "deepspeed":  # torch AdamW off CUDA: the single-tensor path
        step_workspace += 4 * (_ceil_div(shape.adamw_loop_peak, N) if stage >= 1 else shape.adamw_loop_peak)
    elif strategy == "deepspeed":  # one flat fp32 partition: its fp32 gradient and sqrt(v) (per ZeRO-3 sub-group)
        flat = min(opt_local, DEEPSPEED_SUB_GROUP) if stage >= 3 else opt_local
        step_workspace += 4 * flat + 4 * flat * (2 if dtype == "fp32" else 1)
    else:  # torch AdamW's foreach path on CUDA: _foreach_sqrt(v) over every local parameter at once
        step_workspace += 4 * opt_local

    return MemoryPlan(
        backbone=backbone, strategy=strategy, zero_stage=stage if strategy == "deepspeed" else 0, offload=offload,
        dtype=dtype, world_size=N, R=R, grad_window=grad_window, micro_batch=B, seq_len=T, read_positions=Q,
        num_params=psi, params=params, grads=grads, optimizer=optimizer, activations=activations,
        backward_grads=backward_grads, backward_workspace=backward_workspace, step_workspace=step_workspace,
        buffers=buffers, host=host, teacher=(4 * local if strategy == "fsdp" else 4 * psi) if ema else 0,
    )


def plan_trial(cfg: TrialConfig, trial: Resolved | None = None) -> MemoryPlan:
    """The :func:`plan` of one trial's training step, at its largest train depth, per GPU (per worker).

    The one mapping from a :class:`~par_ray.config.TrialConfig` to the planner's workload, read by the sweeps' dry
    run and by the paper preset's choice of strategy, GPU count and GPU type (``par_ray.presets.fit_parallelism``):
    R as the recipe draws it at ``task.train_depth`` (``recipe.max_iterations`` under the hold schedule or untied
    copies; capped at ``recipe.max_iterations``), the global batch split over ``train.num_workers``, the longest
    training sequence and its read positions (``par_ray.trial.Resolved.reads``: the prompt at d_train with any given
    prefix and filler, the chain-of-thought baseline's trace, the halting query; the answers, the halting query and
    the operation positions the dense targets read), the model's vocabulary (``par_ray.trial.VocabLayout``: task |
    halting | CoT | dense classes, or a pretrained parent's own), bf16 on GPUs and fp32 on CPU, and an EMA teacher
    when any stage distills from one. ``trial``: ``par_ray.trial.resolve`` of ``cfg`` (or of a config that differs
    from it only in ``train``, which resolves the same), when the caller has it already.

    Raises ``ValueError`` for an unknown task (the task registry's error) or arguments :func:`plan` rejects.
    """
    trial = trial or resolve(cfg)
    tr, rc, reads = cfg.train, cfg.recipe, trial.reads()
    R = rc.max_iterations if rc.depth_schedule == "hold" or not rc.tied else iterations_at(
        cfg.task.train_depth, rc.ops_per_iteration, rc.fixed_iterations)
    return plan(
        cfg.backbone.name, tr.strategy, tr.num_workers, R=min(R, rc.max_iterations), grad_window=rc.grad_window,
        micro_batch=tr.batch_size // tr.num_workers, seq_len=reads.seq_len,
        zero_stage=tr.zero_stage, offload=tr.zero_offload, dtype="bf16" if tr.use_gpu else "fp32",
        read_positions=reads.total, split=cfg.backbone.split, tied=rc.tied,
        untied_copies=rc.max_iterations, anchoring=rc.anchoring,
        # a pretrained parent keeps its vocabulary (the registry's, as model_shape's default)
        vocab_size=None if cfg.backbone.pretrained else trial.vocab.size, ema=trial.ema)


# ----------------------------------------------------------------------------------------------------------------------
# Evaluation memory


@dataclass(frozen=True)
class EvalMemoryPlan:
    """Bytes per GPU of a trial's evaluations (``par_ray.train.loop.eval_metrics``), run between training steps.

    Each is ``resident`` plus the largest no-grad forward of that evaluation. A no-grad forward holds the prompt's
    hidden states (the embedding, e, s_k, the previous state and the adapter's output, 5 · B·T·h·r), one decoder
    layer's working set (max of the SwiGLU's 3 · B·T·I·b and the eager/SDPA-math attention's B·n_q·T²·(4 + b) plus
    q, k, v), the causal mask, the units FSDP2 / ZeRO-3 keep gathered through the forward, and one iteration's read-out
    — B·Q·V·(b + 4) (logits and an fp32 copy; the probe's cross-entropy adds its fp32 log-softmax) — because halting
    and the probe reduce every iteration's read-out as soon as it exists (``LoopedLM.iterate``'s ``reduce``) and keep
    R × 3 × B (halting) or R (probe) numbers. Without that streaming the halting read-out alone would be
    R_max·B·Q·V·b (``stacked_halting``, shown for comparison).
    """

    resident: int
    """Held through evaluation: parameters, optimizer state, EMA teacher, communication buffers (and DeepSpeed's
    gradient partitions); the gradients of torch's optimizers are freed (``zero_grad(set_to_none=True)``)."""
    plain: int
    """Accuracy by depth at the longest test prompt, ``eval.batch_size`` rows per GPU."""
    halting: int
    """Halting evaluation (0 when no stage trains halting): the same prompt plus the halting query, R_max iterations."""
    probe: int
    """The per-iteration probe at ``task.train_depth``."""
    stacked_halting: int
    """The halting read-out had it kept every iteration's logits, R_max × B × Q × V (0 without halting)."""

    @property
    def total(self) -> int:
        """Peak bytes on one GPU over every evaluation of the trial."""
        return self.resident + max(self.plain, self.halting, self.probe)


def plan_evaluation(cfg: TrialConfig) -> EvalMemoryPlan:
    """The :class:`EvalMemoryPlan` of one trial (per GPU; bf16 on GPUs, fp32 on CPU, as :func:`plan_trial`).

    Raises ``ValueError`` as :func:`plan_trial`. The chain-of-thought baseline's KV cache is not counted.
    """
    from par_ray.evaluation import halt_max_iterations
    from par_ray.tasks import get_task

    trial = resolve(cfg)
    train = plan_trial(cfg, trial)
    task, tr, rc, ev = get_task(cfg.task.name), cfg.train, cfg.recipe, cfg.eval
    halt = trial.halting
    shape = model_shape(cfg.backbone.name, cfg.backbone.split, rc.tied, rc.max_iterations,
                        None if cfg.backbone.pretrained else trial.vocab.size)
    prec = precision(train.dtype, tr.strategy)
    b, r, N, V = prec.activation, prec.residual, tr.num_workers, shape.vocab
    stage = {"ddp": 0, "fsdp": 3, "deepspeed": tr.zero_stage}[tr.strategy]
    resident = train.params + train.optimizer + train.teacher + train.buffers + \
        (train.grads if tr.strategy == "deepspeed" else 0)
    n_pre, n_core, n_coda = shape.split
    rest_root = shape.root_params - shape.embedding_params - shape.lm_head_params
    reused = (n_core * (1 if rc.tied else rc.max_iterations) + n_coda) * shape.layer_params + rest_root + \
        (shape.lm_head_params or shape.embedding_params)
    if tr.strategy == "fsdp":  # units kept gathered through the forward (strategies.fsdp)
        resident += prec.compute * reused
    elif stage >= 3:
        resident += prec.compute * min(reused, DEEPSPEED_MAX_LIVE)
    elif train.dtype == "bf16" and tr.strategy == "ddp":  # autocast caches its bf16 cast of every weight
        resident += prec.compute * shape.total_params
    q_width, kv_width = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim

    def forward(B: int, T: int, Q: int, readout_bytes: int) -> int:
        layer = max(3 * B * T * shape.intermediate * b,
                    B * shape.heads * T * T * (4 + b) + B * T * (q_width + 2 * kv_width) * b)
        return 5 * B * T * shape.hidden * r + layer + T * T * r + B * Q * V * readout_bytes

    def prompt(depth: int) -> tuple[int, int]:
        ep = task.sample(depth, 1, seed=0)
        return int(ep.input_ids.shape[1]), int(ep.read_positions.numel())

    # rows per forward: a test set's (or a block's near the crossing, eval.bracket_*) share per GPU, in batches
    rows = max(ev.num_sequences, ev.bracket_block if ev.bracket_max_sequences else 0)
    B = min(ev.batch_size, -(-rows // N))
    T, Q = prompt(max(ev.depths))
    plain = forward(B, T, Q, b + 4)
    halting = stacked = 0
    if halt:
        R_max = halt_max_iterations(ev, rc.ops_per_iteration)
        Q_halt = Q + 1 + int(trial.vocab.pending)  # the halting query[, the last operation]
        halting = forward(B, T + 1, Q_halt, b + 4) + R_max * 3 * B * 4
        stacked = R_max * B * Q_halt * V * b
    B_probe = -(-max(min(ev.num_sequences, ev.batch_size), N) // N)
    T_probe, Q_probe = prompt(cfg.task.train_depth)
    R_probe = iterations_at(cfg.task.train_depth, rc.ops_per_iteration, rc.fixed_iterations)
    probe = forward(B_probe, T_probe, Q_probe, b + 4 + 4) + 4 * R_probe
    return EvalMemoryPlan(resident=resident, plain=plain, halting=halting, probe=probe, stacked_halting=stacked)


# ----------------------------------------------------------------------------------------------------------------------
# Smallest GPU count

def min_gpus(backbone: str, strategy: str, gpu_memory_gb: float, zero_stage: int = 2, offload: bool = False,
             max_gpus: int = 1024, **workload) -> int | None:
    """Smallest world size N in 1..``max_gpus`` whose :func:`plan` fits in ``gpu_memory_gb``; ``None`` if none does.

    ``workload``: the other :func:`plan` arguments (R, grad_window, micro_batch, seq_len, dtype, ...); the micro-batch
    is per GPU. For N >= 2 every term is constant or shrinks with N (sharded states are ceil(Ψ/N), buckets are
    fixed), so after N = 1 (no DDP buckets) the answer is found by bisection.
    """
    if gpu_memory_gb <= 0:
        raise ValueError(f"gpu_memory_gb: must be > 0, got {gpu_memory_gb!r}")
    if max_gpus < 1:
        raise ValueError(f"max_gpus: must be >= 1, got {max_gpus!r}")

    def fits(n: int) -> bool:
        return plan(backbone, strategy, n, zero_stage=zero_stage, offload=offload, **workload).fits(gpu_memory_gb)

    if fits(1):
        return 1
    if max_gpus < 2 or not fits(max_gpus):
        return None
    lo, hi = 1, max_gpus  # fits(lo) is False, fits(hi) is True
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def _column(strategy: str, zero_stage: int, offload: bool) -> str:
    if strategy != "deepspeed":
        return strategy
    return f"zero{zero_stage}" + ("+off" if offload else "")


def min_gpu_table(names: tuple[str, ...] | None = None, gpu_sizes_gb: tuple[float, ...] = GPU_SIZES_GB,
                  columns: tuple[tuple[str, int, bool], ...] = TABLE_STRATEGIES, max_gpus: int = 1024,
                  **workload) -> dict[float, dict[str, dict[str, int | None]]]:
    """``{gpu_gb: {backbone: {column: min_gpus}}}`` for every real Qwen size (default) and strategy column."""
    names = names or tuple(n for n, spec in BACKBONES.items() if spec.hub_name)
    return {gb: {name: {_column(*col): min_gpus(name, col[0], gb, zero_stage=col[1], offload=col[2],
                                                max_gpus=max_gpus, **workload) for col in columns}
                 for name in names}
            for gb in gpu_sizes_gb}


# ----------------------------------------------------------------------------------------------------------------------
# Text output

def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def format_plan(p: MemoryPlan, gpu_memory_gb: float) -> str:
    """The plan as a table of GB (MB below 1 GB) per GPU with the fit verdict."""
    unit, scale = ("GB", 1e9) if p.total >= 1e9 else ("MB", 1e6)
    strategy = p.strategy + (f" ZeRO-{p.zero_stage}" if p.strategy == "deepspeed" else "") + \
        (" + offload" if p.offload else "")
    K = min(p.grad_window, p.R)
    rows = [
        ("parameters", p.params), *([("EMA teacher (fp32)", p.teacher)] if p.teacher else []),
        ("gradients", p.grads), ("optimizer state", p.optimizer),
        (f"activations ({K} iterations stored)", p.activations),
        ("gradients at backward peak (net)", p.backward_grads),
        ("backward workspace", p.backward_workspace), ("optimizer-step workspace", p.step_workspace),
        ("communication buffers", p.buffers), None,
        ("peak in backward", p.backward_peak), ("peak in optimizer step", p.step_peak),
        (f"total (peak, {p.peak_phase})", p.total),
    ]
    if p.offload:
        rows.append(("host memory per rank (offload)", p.host))
    free = gpu_memory_gb * 1e9 - p.total
    verdict = f"yes ({free / 1e9:.2f} GB free)" if free >= 0 else f"no ({-free / 1e9:.2f} GB over)"
    return "\n".join([
        f"{p.backbone} ({_count(p.num_params)} params), {strategy}, {p.world_size} GPU(s), {p.dtype}",
        f"R={p.R}, grad window {p.grad_window}, micro-batch {p.micro_batch}, seq-len {p.seq_len}, "
        f"{p.read_positions} read positions",
        "",
        f"{'component':<36}{unit + ' / GPU':>10}",
        *("-" * 46 if row is None else f"{row[0]:<36}{row[1] / scale:10.2f}" for row in rows),
        f"fits on a {gpu_memory_gb:g} GB GPU: {verdict}",
    ])


def format_table(table: dict[float, dict[str, dict[str, int | None]]], max_gpus: int, workload: dict) -> str:
    """The min-GPU table as text, one block per GPU size."""
    desc = ", ".join(f"{k}={v}" for k, v in workload.items() if v is not None)
    lines = [f"Smallest GPU count that fits one training step ({desc}); '-' = not within {max_gpus} GPUs",
             "(+off: ZeRO-Offload, which also needs 16 bytes per parameter / N of host memory per rank)"]
    for gb, rows in table.items():
        cols = list(next(iter(rows.values())))
        lines += ["", f"{gb:g} GB GPUs",
                  f"{'backbone':<14}{'params':>8}" + "".join(f"{c:>10}" for c in cols)]
        for name, row in rows.items():
            count = plan(name, "ddp", 1, **workload).num_params
            lines.append(f"{name:<14}{count / 1e9:>7.2f}B" + "".join(f"{'-' if n is None else n:>10}"
                                                                      for n in row.values()))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------------
# CLI

def build_parser() -> argparse.ArgumentParser:
    """The ``python -m par_ray.planner`` argument parser, built without running anything (grouped flags, examples)."""
    ap = argparse.ArgumentParser(
        allow_abbrev=False,  # a flag's prefix is an error, never another flag
        prog="python -m par_ray.planner", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plan GPU memory of a PAR training step: bytes per GPU by backbone, strategy, GPUs, R and window.",
        usage="%(prog)s (--backbone NAME --strategy {ddp,fsdp,deepspeed} | --table) [options]",
        epilog="Pure arithmetic over the backbone registry's exact sizes: nothing is loaded or allocated.\n"
               "\nexamples:\n"
               "  python -m par_ray.planner --backbone qwen2.5-7b --strategy fsdp --world-size 8 --R 32 \\\n"
               "      --grad-window 8\n"
               "  python -m par_ray.planner --table      # smallest GPU count per Qwen size and strategy")
    one = ap.add_argument_group("one plan")
    one.add_argument("--backbone", choices=sorted(BACKBONES), help="registry name (required unless --table)")
    one.add_argument("--strategy", choices=STRATEGIES, help="data-parallel strategy (required unless --table)")
    one.add_argument("--world-size", type=positive_int, default=1, help="GPUs (data-parallel ranks)")
    one.add_argument("--zero-stage", type=int, choices=ZERO_STAGES, default=None,
                     help="DeepSpeed ZeRO stage (--strategy deepspeed; default 2)")
    one.add_argument("--offload", action="store_true", help="DeepSpeed ZeRO-Offload of optimizer state to CPU")
    table = ap.add_argument_group("the table instead")
    table.add_argument("--table", action="store_true", help="smallest GPU count per Qwen size and strategy")
    table.add_argument("--max-gpus", type=positive_int, default=1024, help="largest GPU count --table searches")
    work = ap.add_argument_group("the workload (both)")
    work.add_argument("--R", type=positive_int, default=32, help="core iterations per step")
    work.add_argument("--grad-window", type=positive_int, default=8, help="iterations run with autograd")
    work.add_argument("--micro-batch", type=positive_int, default=4, help="sequences per GPU")
    work.add_argument("--seq-len", type=positive_int, default=64, help="tokens per sequence")
    work.add_argument("--read-positions", type=positive_int, default=5, help="answers read per sequence (Q)")
    work.add_argument("--vocab-size", type=positive_int, default=None,
                      help="override the checkpoint's vocabulary (random-init shapes use the task's)")
    work.add_argument("--untied-copies", type=positive_int, default=None,
                      help="untied baseline with this many core copies (default: weight-tied core)")
    work.add_argument("--dtype", choices=DTYPES, default="bf16", help="bf16 on GPUs, fp32 as on CPU")
    work.add_argument("--gpu-memory-gb", type=positive_float, default=None,
                      help="GPU memory in GB (default 80; --table: both 80 and 141)")
    return ap


_FLAG_OF = {"world_size": "--world-size", "grad_window": "--grad-window", "micro_batch": "--micro-batch",
            "seq_len": "--seq-len", "read_positions": "--read-positions", "offload": "--offload",
            "zero_stage": "--zero-stage", "backbone": "--backbone", "strategy": "--strategy", "dtype": "--dtype",
            "R": "--R"}


def main(argv: list[str] | None = None) -> int:
    """``python -m par_ray.planner``: print one plan or the smallest-GPU-count table; bad input → exit status 2."""
    ap = build_parser()
    args = ap.parse_args(argv)
    workload = dict(R=args.R, grad_window=args.grad_window, micro_batch=args.micro_batch, seq_len=args.seq_len,
                    read_positions=args.read_positions, dtype=args.dtype, vocab_size=args.vocab_size)
    if args.untied_copies is not None:
        workload.update(tied=False, untied_copies=args.untied_copies)
    if args.grad_window > args.R:
        ap.error(f"--grad-window: {args.grad_window} is more than --R {args.R} (the window is at most R iterations)")
    one_plan = [flag for flag, given in (("--backbone", args.backbone), ("--strategy", args.strategy),
                                         ("--world-size", args.world_size != 1), ("--zero-stage", args.zero_stage),
                                         ("--offload", args.offload)) if given]
    if args.table and one_plan:
        ap.error(f"{one_plan[0]}: --table plans every Qwen size and strategy; drop {', '.join(one_plan)} or --table")
    if args.zero_stage is not None and args.strategy != "deepspeed":
        ap.error(f"--zero-stage: only --strategy deepspeed has ZeRO stages (got --strategy {args.strategy})")
    try:
        if args.table:
            sizes = (args.gpu_memory_gb,) if args.gpu_memory_gb else GPU_SIZES_GB
            table = min_gpu_table(gpu_sizes_gb=sizes, max_gpus=args.max_gpus, **workload)
            print(format_table(table, args.max_gpus, workload))
            return 0
        if args.backbone is None or args.strategy is None:
            ap.error("--backbone and --strategy are required unless --table is given")
        p = plan(args.backbone, args.strategy, args.world_size, zero_stage=args.zero_stage or 2, offload=args.offload,
                 **workload)
    except ValueError as e:
        lines = str(e).splitlines()
        lines = [next((line.replace(f"- {k}:", f"- {flag}:", 1) for k, flag in _FLAG_OF.items()
                       if line.strip().startswith(f"- {k}:")), line) for line in lines]
        ap.error("\n".join(lines))
    print(format_plan(p, args.gpu_memory_gb or GPU_SIZES_GB[0]))
    return 0


if __name__ == "__main__":
    exit_with(main)
