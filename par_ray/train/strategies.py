"""Parallel strategies: the only module that knows DDP, FSDP2 or DeepSpeed exist (STYLE rule 10).

Each strategy is one function ``(model, train_cfg, world) -> Engine``, in the spirit of torchtitan's
``parallelize_llama``: it applies its wrapping in one fixed, commented order and hands back an :class:`Engine`. The
training loop calls :func:`prepare` once and then only talks to the Engine interface (``engine.model`` to run the
forward, ``backward``, ``step``, ``save``/``load``, ``all_reduce_sum``); it never branches on the strategy name.
With ``train.compile``, :func:`prepare` first compiles the decoder layers (:func:`compile_layers`), as torchtitan
compiles its blocks before FSDP.

=========  ===================================================  ==========================================
strategy   wrapping                                             checkpoint format (``par_ray.train.checkpoint``)
=========  ===================================================  ==========================================
ddp        ``DistributedDataParallel`` (plain module on 1 rank)  ``FULL_STATE``: rank 0's full copy
fsdp       FSDP2 ``fully_shard`` per decoder layer, adapter,    ``DCP_SHARDS``: every rank its shards;
           embeddings, root                                     loads on any world size
deepspeed  ``deepspeed.initialize`` with ZeRO 1/2/3 (+ CPU      ``ZERO_PARTITIONS``: DeepSpeed's own
           offload of the optimizer) from ``TrainConfig``       checkpoints; same world size to resume
=========  ===================================================  ==========================================

The optimizer and LR schedule (AdamW, warm-up + cosine) come from ``par_ray.train.optim``; each engine names its
checkpoint format (``Engine.checkpoint``), whose files and save/load code live in ``par_ray.train.checkpoint``.

EMA teacher (prefix self-distillation, ``par_ray.distill``): with ``prepare(..., ema=True)`` the engine also holds
``engine.ema``, a float32 copy of the student made before wrapping and kept outside the wrapper (no gradients, not in
the optimizer), updated after every optimizer step by ``engine.update_ema(decay)`` and saved in every checkpoint
(``par_ray.train.checkpoint``):

=========  ======================================================  =============================================
strategy   EMA teacher                                             in the checkpoint
=========  ======================================================  =============================================
ddp        a full fp32 copy per rank (replicated, as the student)   ``state.pt["ema"]``
fsdp       FSDP2-sharded like the student (same units, same mesh;  ``"ema"`` in the same DCP checkpoint
           each unit re-sharded after its forward)                 (reshards onto any world size)
deepspeed  a full fp32 copy per rank, NOT sharded under ZeRO-3     rank 0: ``ema.pt`` (full copy)
           (the update gathers each student parameter in turn)
=========  ======================================================  =============================================

Devices and precision: on GPU, bf16 (autocast for ddp/fsdp, FSDP2 keeps bf16 unsharded params and fp32 gradient
reduction; DeepSpeed's own ``bf16`` mode) with NCCL; on CPU, float32 with gloo, or bf16 autocast with
``train.cpu_bf16_autocast`` (ddp and fsdp; faster on CPUs with bf16 dot products when attention is eager,
docs/experiments.md §38). What each backend cannot do on CPU is said where it is handled and in
``docs/distributed.md``. The float32 matmuls' internal precision is ``train.float32_matmul_precision``
(:func:`set_matmul_precision`): TF32 on GPU by default; on CPU IEEE float32, or bf16 products with ``medium``.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from par_ray.distill import Teacher, ema_update_
from par_ray.train.checkpoint import DCP_SHARDS, FULL_STATE, ZERO_PARTITIONS, CheckpointFormat
from par_ray.train.optim import ADAM_BETAS, adamw_params, build_optimizer, build_scheduler


@dataclass(frozen=True)
class World:
    """Where this process sits: rank, world size and device."""

    rank: int = 0
    size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_distributed(self) -> bool:
        """More than one rank and a process group to talk over."""
        return self.size > 1 and self.has_process_group

    @property
    def has_process_group(self) -> bool:
        """A torch.distributed process group exists (Ray Train workers have one even when alone)."""
        return dist.is_available() and dist.is_initialized()


class Engine:
    """A prepared model and its optimizer: what the loop drives, whatever the strategy.

    This base class is the plain / DDP engine; :class:`FSDPEngine` and :class:`DeepSpeedEngine` override what their
    backend does differently (one level of inheritance, no more).

    Attributes:
        model: the module to call (wrapped by the strategy; its ``forward`` is ``LoopedLM.iterate``).
        raw: the unwrapped ``LoopedLM`` (inspection; under FSDP/ZeRO-3 its parameters are shards, so evaluation
            goes through ``model``).
        device: where inputs go.
        ema: the EMA teacher of prefix self-distillation (float32, outside the wrapper; module docstring), or
            ``None`` when the engine was prepared without one.
        checkpoint: the strategy's checkpoint format (``par_ray.train.checkpoint``): what :meth:`save` writes and
            :meth:`load` reads.
    """

    checkpoint: CheckpointFormat = FULL_STATE

    def __init__(self, model: nn.Module, raw: nn.Module, optimizer, scheduler, train_cfg, world: World,
                 ema: nn.Module | None = None):
        self.model, self.raw, self.optimizer, self.scheduler = model, raw, optimizer, scheduler
        self.train_cfg, self.world, self.device = train_cfg, world, world.device
        self.ema = ema

    def autocast(self):
        """The forward passes' precision context: bf16 autocast on CUDA; on CPU bf16 autocast with
        ``train.cpu_bf16_autocast``, else nothing (float32)."""
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        if self.train_cfg.cpu_bf16_autocast:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        """Clip, optimizer step, LR schedule, zero grads. Returns the global gradient norm before clipping."""
        norm = self._clip()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _clip(self) -> torch.Tensor:
        clip = self.train_cfg.grad_clip
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else float("inf"))

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    # Prefix self-distillation teacher (par_ray.distill)
    def teacher(self, kind: str) -> Teacher | None:
        """The PSD teacher for ``RecipeConfig.distill`` = ``kind``: ``None`` for ``none``; for ``ema`` the EMA copy,
        for ``live`` the student itself. Either runs under ``torch.no_grad`` (its logits are constants) and returns
        the (B, Q, V) logits of iteration R. Raises ``ValueError`` for an unknown kind, or ``ema`` on an engine
        prepared without one."""
        if kind == "none":
            return None
        if kind not in ("ema", "live"):
            raise ValueError(f"recipe.distill: {kind!r} is not one of ['none', 'ema', 'live']")
        if kind == "ema" and self.ema is None:
            raise ValueError("recipe.distill: 'ema' needs an engine prepared with ema=True (prepare(..., ema=True))")
        module = self.ema if kind == "ema" else self._live_module()

        def run(input_ids_BT: torch.Tensor, read_positions_Q: torch.Tensor, R: int, stretch: float) -> torch.Tensor:
            with torch.no_grad(), self._teacher_autocast(kind):
                return module(input_ids_BT, read_positions_Q, R, None, stretch, "last").logits_KBQV[0]

        return run

    def _live_module(self) -> nn.Module:
        """The student as a no-grad teacher: the plain module (a DDP replica needs no hooks or buffer broadcast for
        a forward without backward; FSDP2's ``raw`` is the sharded module itself)."""
        return self.raw

    def _teacher_autocast(self, kind: str):
        return self.autocast()

    def _ema_pairs(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(EMA tensors, student tensors) to update, matched by parameter name; local shards of FSDP2 DTensors."""
        def local(t: torch.Tensor) -> torch.Tensor:
            return t.to_local() if hasattr(t, "to_local") else t

        student = dict(self.raw.named_parameters())
        names = [n for n, _ in self.ema.named_parameters()]
        return [local(p) for _, p in self.ema.named_parameters()], [local(student[n]) for n in names]

    def update_ema(self, decay: float) -> None:
        """After an optimizer step: ema ← decay · ema + (1 − decay) · student (``par_ray.distill.ema_update_``);
        nothing without an EMA teacher. Every rank calls it after every step."""
        if self.ema is not None:
            ema_update_(*self._ema_pairs(), decay)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over ranks in place (identity on one rank). Every rank must call it at the same point."""
        if self.world.is_distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    # Checkpoints: a directory per report, in this strategy's format (par_ray.train.checkpoint).
    def save(self, directory: str, extra: dict) -> None:
        """Write model + optimizer + scheduler state (+ EMA teacher) and ``extra`` (JSON) into ``directory`` in
        :attr:`checkpoint`'s format. Called on every rank."""
        self.checkpoint.save(self, directory, extra)

    def load(self, directory: str) -> dict:
        """Restore what :meth:`save` wrote, into this engine's sharding; returns ``extra``."""
        return self.checkpoint.load(self, directory)


ONEDNN_PRIMITIVE_CACHE = 16384
"""oneDNN primitive cache capacity a CPU worker with bf16 matmul products asks for (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``,
oneDNN's default 1,024). Under ``medium`` every float32 matmul is a oneDNN primitive, one per shape; a curriculum trial
meets thousands of shapes (lengths, read-out widths, forward and backward), so the default cache kept evicting and
re-creating (JIT-compiling) them: ~5,700 creations in a 300-step proxy, 2,430 with this capacity, and two trials side
by side ran their last phase ~20 % faster (docs/experiments.md §34)."""


def matmul_precision(train_cfg, device: torch.device) -> str:
    """The ``torch.set_float32_matmul_precision`` value a worker on ``device`` runs with: ``train_cfg``'s
    ``float32_matmul_precision``, or where that is ``""`` the device's default — ``high`` on CUDA (TF32 for the
    float32 matmuls autocast leaves), ``highest`` elsewhere (IEEE float32, the numbers the CPU parity tests compare)."""
    return train_cfg.float32_matmul_precision or ("high" if device.type == "cuda" else "highest")


def set_matmul_precision(train_cfg, device: torch.device) -> str:
    """Set this process's float32 matmul precision for a worker on ``device`` (:func:`matmul_precision`) and return
    it. With bf16 products on CPU (``medium``) it also raises oneDNN's primitive cache to :data:`ONEDNN_PRIMITIVE_CACHE`
    unless ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` is set already; oneDNN reads it when it creates its first primitive,
    so call this before the first matmul (the training loop does, first thing on every worker)."""
    precision = matmul_precision(train_cfg, device)
    if precision == "medium" and device.type == "cpu":
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_PRIMITIVE_CACHE))
    torch.set_float32_matmul_precision(precision)
    return precision


def cpu_has_bf16_dot_products() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX tiles), as torch's own dispatch detects it
    (``torch.cpu._is_avx512_bf16_supported`` / ``_is_amx_tile_supported``); without either, bf16 matmuls are
    emulated. ``True`` where this torch cannot tell (no such probes): the note it gates is advice, not a check."""
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    probes = [p for p in probes if p is not None]
    return not probes or any(p() for p in probes)


def cpu_bf16_notes(train_cfg, attn_implementation: str, native: bool | None = None) -> list[str]:
    """Lines a CPU worker prints at its start when ``train.cpu_bf16_autocast`` is set where it will not pay (empty
    otherwise, and always on GPU): on a CPU without bf16 dot products (``native`` False; ``None`` = ask this CPU,
    :func:`cpu_has_bf16_dot_products`) bf16 is emulated and runs slower than float32; with SDPA attention the step
    gains nothing (torch's CPU flash-attention kernel, docs/experiments.md §38). Advice only: the run goes on."""
    if not train_cfg.cpu_bf16_autocast or train_cfg.use_gpu:
        return []
    notes = []
    if not (cpu_has_bf16_dot_products() if native is None else native):
        notes.append("note: train.cpu_bf16_autocast on a CPU without bf16 dot products (no AVX512-BF16, no AMX): "
                     "bf16 runs emulated, expect it slower than float32")
    if attn_implementation != "eager":
        notes.append(f"note: train.cpu_bf16_autocast with backbone.attn_implementation={attn_implementation!r}: "
                     "torch's CPU attention kernel gains nothing in bf16; pair it with 'eager' (docs/experiments.md "
                     "§38)")
    return notes


def _ema_copy(model: nn.Module, train_cfg) -> nn.Module:
    """A float32 copy of ``model`` (made before any wrapping) that never gets gradients: the EMA teacher's start,
    equal to the student at step 0. Its layers are compiled like the student's with ``train_cfg.compile`` (a deep
    copy drops ``nn.Module.compile``: ``Module.__getstate__`` leaves the compiled call out)."""
    ema = copy.deepcopy(model).float()
    ema.requires_grad_(False)
    if train_cfg.compile:
        compile_layers(ema)
    return ema


# --------------------------------------------------------------------------------------------------------------------
# Compile


RECOMPILE_LIMIT = 64
"""Compiled variants of the decoder layers' shared code that :func:`compile_layers` allows before dynamo falls back to
eager: the kinds of call (grad or not, all rows or the read-out's ``rows_Q``) times inductor's size ranges, with
room for evaluation batches and long depths. Each variant compiles once, when first met (a few seconds on CPU)."""


def compile_layers(model: nn.Module, backend: str = "inductor") -> nn.Module:
    """``torch.compile`` every decoder layer of a ``LoopedLM`` in place, as torchtitan compiles each transformer
    block before FSDP (``apply_compile`` in torchtitan/models/llama3/parallelize.py), and return ``model``.

    Each layer of ``prelude``, ``core``, ``coda`` and the untied core copies gets ``layer.compile(backend=backend,
    dynamic=True)`` (``nn.Module.compile``). Unlike torchtitan's ``torch.compile(block)``, the module is not wrapped
    in an ``OptimizedModule``, so parameter names, state dicts and checkpoints stay those of the eager model, and a
    checkpoint loads whether either side compiled. Unlike torchtitan, no ``fullgraph=True``: the compiled call
    includes the layer's forward hooks, which the wrappers add later and which run eagerly, between graphs. Dynamo
    skips FSDP2's (``torch._dynamo.config.skip_fsdp_hooks``), at the layer's edges; DeepSpeed ZeRO-3's are
    ``torch.compiler.disable``d and sit on every submodule, so under ZeRO-3 each layer is split into several graphs
    (correct, less fused).

    ``dynamic=True`` keeps batch size and sequence length symbolic (depth, R and evaluation batches vary). Layers of
    one class share their compiled code; each distinct call (with or without grad, all T rows or the readout's
    ``rows_Q``, the mask's kind, frozen parameters) compiles once, lazily on first use, so the first training step
    and the first evaluation carry the compile time. Inductor adds variants of its own: its kernels guard on size
    ranges (e.g. B·T ≤ 4096), so one kind of call compiles again when the curriculum or an evaluation
    batch crosses such a bound; the local curriculum's training and evaluation made 11 variants in a 60-step probe
    (docs/experiments.md §30). Past ``torch._dynamo.config.recompile_limit`` (torch's default 8) new variants would
    run eagerly for the rest of the process (correct; eager steps were ~20 % slower in §25), so this raises that
    process-wide limit to :data:`RECOMPILE_LIMIT` (never lowers it); on the local recipes that changed no measured
    step time (§30), but which calls run compiled no longer depends on the order in which the depths arrive. A deep
    copy of a compiled layer is not compiled (``Module.__getstate__`` drops the compiled call).

    Args:
        model: a ``par_ray.model.looped.LoopedLM`` (anything with ``prelude``, ``core``, ``coda``, ``untied``).
        backend: ``torch.compile`` backend: ``inductor`` (generated fused kernels) or, in tests, ``aot_eager``
            (traced forward and backward run by eager kernels: checks the trace without the code generation).
    """
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    for layers in (model.prelude, model.core, model.coda, *model.untied):
        for layer in layers:
            layer.compile(backend=backend, dynamic=True)
    return model


# --------------------------------------------------------------------------------------------------------------------
# DDP


def ddp(model: nn.Module, train_cfg, world: World, ema: bool = False) -> Engine:
    """DistributedDataParallel (plain module on one rank).

    Iterations before the gradient window run under ``no_grad``, so DDP's hooks only see the window. The untied
    baseline leaves core copies past R unused in a step, hence ``find_unused_parameters`` for it. ``ema``: also keep
    an EMA teacher, a full float32 copy on every rank (the replicas' updates are identical, like the student's).
    """
    model = model.to(world.device)
    teacher = _ema_copy(model, train_cfg) if ema else None
    wrapped = model
    if world.is_distributed:
        wrapped = nn.parallel.DistributedDataParallel(
            model, device_ids=[world.device.index] if world.device.type == "cuda" else None,
            find_unused_parameters=not getattr(model, "tied", True),
        )
    opt = build_optimizer(model.parameters(), train_cfg)
    return Engine(wrapped, model, opt, build_scheduler(opt, train_cfg), train_cfg, world, teacher)


# --------------------------------------------------------------------------------------------------------------------
# FSDP2


class FSDPEngine(Engine):
    """FSDP2 parameters are DTensor shards: the gradient norm is a DTensor, checkpoints are sharded (DCP)."""

    checkpoint = DCP_SHARDS

    def _clip(self) -> torch.Tensor:
        norm = super()._clip()  # clip_grad_norm_ over DTensor shards: a DTensor holding the global norm
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def fsdp(model: nn.Module, train_cfg, world: World, ema: bool = False) -> Engine:
    """FSDP2 (``torch.distributed.fsdp.fully_shard``), applied by hand: Ray's ``prepare_model(parallel_strategy=
    "fsdp")`` refuses CPU, and we want to choose the units.

    Order (innermost first, as torchtitan's ``apply_fsdp``):

    1. every decoder layer: prelude, core, coda and untied core copies. The weight-tied core (and the coda, read out
       once per window iteration) is called several times in one forward. FSDP2 supports that: each call is one
       forward pre/post hook pair, each use gets its own pre-backward unshard, and every post-backward
       reduce-scatters what was accumulated since the last one into the sharded gradient, so the sum over uses is
       exact. We keep the reused layers unsharded between their calls (``reshard_after_forward=False``): one
       all-gather per step instead of one per iteration, at the cost of holding the core and coda unsharded
       through the forward. No-grad iterations before the window register no backward hooks, as FSDP2 only does
       that when grad is enabled.
    2. the adapter (called once per iteration, same reasoning);
    3. embeddings: with tied word embeddings (``lm_head.weight is embed_tokens.weight``, the tiny and small Qwen
       shapes) the shared matrix must live in exactly one FSDP group, so embeddings and lm_head stay in the root
       group; untied (Qwen2.5-7B) they are sharded as two units of their own;
    4. the root (final norm, and whatever is left).

    ``ema``: an EMA teacher (a float32 copy made before sharding) is sharded over the same units and mesh, so each
    rank holds 1/N of it; its units and its root re-shard after every forward (it never runs backward, and FSDP2
    does not gather a unit again while it is unsharded, so a unit left gathered would keep serving the values of
    before the next EMA update).

    Without a process group (Ray Train local mode) the model is left plain: same optimizer, same DCP checkpoints.
    With one rank in a process group (a 2-worker checkpoint resumed on 1 worker) FSDP runs on a 1-rank mesh.
    On GPU, parameters are all-gathered in bf16 and gradients reduced in fp32 (``MixedPrecisionPolicy``).
    """
    model = model.to(world.device)
    teacher = _ema_copy(model, train_cfg) if ema else None
    if world.has_process_group:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(world.device.type, (dist.get_world_size(),))
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if world.device.type == "cuda" else MixedPrecisionPolicy())

        def shard_units(root: nn.Module, keep_reused: bool) -> None:
            """Steps 1-4 below on ``root``; ``keep_reused``: reused units stay gathered through the forward."""
            def shard(module: nn.Module, reused: bool) -> None:
                fully_shard(module, mesh=mesh, mp_policy=mp, reshard_after_forward=not (reused and keep_reused))

            for layer in root.prelude:
                shard(layer, reused=False)
            for layers in (root.core, root.coda, *root.untied):
                for layer in layers:
                    shard(layer, reused=True)
            shard(root.adapter, reused=True)
            if root.lm_head.weight is not root.embed_tokens.weight:
                shard(root.embed_tokens, reused=False)
                shard(root.lm_head, reused=True)
            # the root: left gathered after its forward by default (backward needs it at once); the EMA teacher's
            # root must re-shard like its units, else its next forward reads the values of before the EMA update
            fully_shard(root, mesh=mesh, mp_policy=mp, **({} if keep_reused else {"reshard_after_forward": True}))

        shard_units(model, keep_reused=True)
        if teacher is not None:
            shard_units(teacher, keep_reused=False)
    opt = build_optimizer(model.parameters(), train_cfg)  # after fully_shard: the optimizer holds the DTensor shards
    return FSDPEngine(model, model, opt, build_scheduler(opt, train_cfg), train_cfg, world, teacher)


# --------------------------------------------------------------------------------------------------------------------
# DeepSpeed


class DeepSpeedEngine(Engine):
    """DeepSpeed owns backward (loss scaling, ZeRO gradient partitioning), the step (clip, optimizer, LR schedule)
    and its checkpoints. ``model`` is the ``deepspeed.DeepSpeedEngine``."""

    checkpoint = ZERO_PARTITIONS

    def autocast(self):
        return contextlib.nullcontext()  # DeepSpeed's bf16 mode holds bf16 parameters itself

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss)

    def step(self) -> float:
        self.model.step()  # clip (config), optimizer step, scheduler step, zero grads
        norm = self.model.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    @property
    def lr(self) -> float:
        return self.model.get_lr()[0]

    def _live_module(self) -> nn.Module:
        return self.model  # the DeepSpeed engine: ZeRO-3 gathers the partitioned parameters in its forward

    def _teacher_autocast(self, kind: str):
        # The float32 EMA copy is not DeepSpeed's bf16 module: on GPU it runs under bf16 autocast like ddp/fsdp.
        if kind == "ema" and self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def update_ema(self, decay: float) -> None:
        """As :meth:`Engine.update_ema`, reading the module's parameters (bf16 on GPU: DeepSpeed copies its fp32
        master weights into them after each step, so the EMA averages bf16-rounded weights there; fp32 on CPU).
        Under ZeRO-3 each student parameter is gathered in turn (a collective per parameter, on every rank) to
        update the full EMA copy."""
        if self.ema is None:
            return
        ema, student = dict(self.ema.named_parameters()), list(self.raw.named_parameters())
        if self.train_cfg.zero_stage != 3:
            ema_update_([ema[n] for n, _ in student], [p for _, p in student], decay)
            return
        import deepspeed as ds

        for name, p in student:
            with ds.zero.GatheredParameters([p], modifier_rank=None):
                ema_update_([ema[name]], [p], decay)


def deepspeed_config(train_cfg, world: World, largest_vector: int = 0) -> dict:
    """The DeepSpeed config generated from ``TrainConfig`` (no JSON files to drift from it).

    Same math as :func:`ddp`: AdamW with betas (0.9, 0.95), ``lr``, ``weight_decay``, eps 1e-8 (``torch_adam``:
    torch's own AdamW; with ZeRO-Offload DeepSpeed's ``DeepSpeedCPUAdam``, which it requires for offload), global
    gradient clipping at ``grad_clip``, micro batch = global batch / workers with no accumulation. The LR schedule
    is the ddp ``LambdaLR``, passed to ``deepspeed.initialize``. bf16 on GPU, fp32 on CPU.

    ZeRO-3 partitions every parameter matrix and keeps vectors (norm weights, biases: at most ``largest_vector``
    elements) whole on every rank. DeepSpeed's default cut (1e5 elements) does the same for real Qwen sizes, but
    would leave every matrix of the tiny test shapes unpartitioned, so the tests would not exercise ZeRO-3 at all.
    """
    offload = train_cfg.zero_offload
    zero: dict = {"stage": train_cfg.zero_stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    if train_cfg.zero_stage == 3:
        zero["stage3_param_persistence_threshold"] = largest_vector + 1
    return {
        "train_batch_size": train_cfg.batch_size,
        "train_micro_batch_size_per_gpu": train_cfg.batch_size // world.size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": train_cfg.grad_clip,
        "optimizer": {"type": "AdamW", "params": {
            **adamw_params(train_cfg), "betas": list(ADAM_BETAS),  # JSON-like config: a list
            **({} if offload else {"torch_adam": True}),
        }},
        "zero_optimization": zero,
        "bf16": {"enabled": world.device.type == "cuda"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


_deepspeed_local_runs = 0
"""DeepSpeed runs in this process that made their own one-rank group (see :func:`deepspeed`)."""


def one_rank_group(device: torch.device) -> str:
    """Start a one-rank process group in this process for a model on ``device`` and return its backend: NCCL for a
    CUDA device (ZeRO's all-gathers and reduce-scatters of CUDA tensors; gloo runs only broadcast and all-reduce on
    them), gloo otherwise. The group's store lives in this process (``HashStore``): no address or port is taken."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return backend


def deepspeed(model: nn.Module, train_cfg, world: World, ema: bool = False) -> Engine:
    """DeepSpeed ZeRO stage ``train_cfg.zero_stage`` (1, 2, 3), optimizer offload to CPU with ``zero_offload``.

    DeepSpeed needs a process group: inside Ray Train it adopts Ray's (``init_distributed`` sees torch.distributed
    initialised and wraps it, gloo on CPU, NCCL on GPU); in Train's local mode (no group) we start a one-rank group
    in this process (:func:`one_rank_group`: NCCL on GPU, gloo on CPU). On CPU, DeepSpeed JIT-compiles C++ ops on
    first use (``deepspeed_shm_comm``, and ``cpu_adam`` for offload), cached under ``TORCH_EXTENSIONS_DIR`` (see
    :func:`build_deepspeed_ops`).

    ``ema``: an EMA teacher, a full float32 copy on every rank made before ``deepspeed.initialize`` (not partitioned
    under ZeRO-3: 4 bytes × Ψ per GPU, which ``par_ray.planner`` counts).
    """
    if not getattr(model, "tied", True):
        # The untied baseline runs only min(R, copies) core copies per step. torch's AdamW skips parameters without a
        # gradient (ddp, fsdp: tested equal); ZeRO hands them zero (ZeRO-2: AdamW keeps moving them on old
        # momentum) or, with ZeRO-3, a gradient norm that already differs from ddp's on the first step that leaves a
        # copy unused. Rather than train a subtly different baseline, refuse.
        raise ValueError("train.strategy: 'deepspeed' does not train the untied baseline (recipe.tied=False) like "
                         "ddp/fsdp (core copies unused in a step get zero or stale gradients under ZeRO); use "
                         "train.strategy='ddp' or 'fsdp' for it")
    import deepspeed as ds

    global _deepspeed_local_runs
    if not world.has_process_group:  # local mode: a one-rank group (Ray's local controller destroys it at the end)
        if _deepspeed_local_runs:
            raise RuntimeError(
                "train.strategy='deepspeed' runs once per process in Ray Train local mode: DeepSpeed keeps the first "
                "process group in module globals (deepspeed.utils.groups), and local mode destroys that group when "
                "its run ends. Use train.num_workers >= 1 with Ray workers, or a fresh process.")
        _deepspeed_local_runs += 1
        one_rank_group(world.device)
        for var in ("RANK", "LOCAL_RANK"):  # DeepSpeed's engine reads them even when the group exists
            os.environ.setdefault(var, "0")
        os.environ.setdefault("WORLD_SIZE", "1")
    # The group exists now, so DeepSpeed only wraps it. (dist_init_required=False also keeps a second local run in
    # the same process from trying DeepSpeed's MPI discovery: its backend object outlives the first group.)
    ds.init_distributed(dist_backend="nccl" if world.device.type == "cuda" else "gloo", dist_init_required=False)
    model = model.to(world.device)
    teacher = _ema_copy(model, train_cfg) if ema else None
    engine, optimizer, _, scheduler = ds.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=deepspeed_config(train_cfg, world, max((p.numel() for p in model.parameters() if p.dim() == 1),
                                                      default=0)),
        lr_scheduler=lambda opt: build_scheduler(opt, train_cfg),
    )
    return DeepSpeedEngine(engine, model, optimizer, scheduler, train_cfg, world, teacher)


def build_deepspeed_ops() -> None:
    """Compile, or load from the ``TORCH_EXTENSIONS_DIR`` cache, the C++ ops DeepSpeed JIT-builds on this machine.

    On CPU: ``deepspeed_shm_comm`` (built when DeepSpeed's communication backend starts, i.e. by every DeepSpeed run)
    and ``cpu_adam`` (ZeRO-Offload's optimizer). Each first build takes one to two minutes on 2 cores; a cached
    ``.so`` loads in under a second. Call once before timed or parallel work (two workers racing to build the same op
    serialise on torch's file lock, with the compile counted inside their run). On GPU builds nothing (DeepSpeed
    builds its CUDA ops itself, when first used).
    """
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return
    for name in ("ShareMemCommBuilder", "CPUAdamBuilder"):
        get_accelerator().create_op_builder(name).load(verbose=False)


# --------------------------------------------------------------------------------------------------------------------

STRATEGY_WRAPPERS: dict[str, Callable[..., Engine]] = {"ddp": ddp, "fsdp": fsdp, "deepspeed": deepspeed}
"""Strategy name (``config.STRATEGIES``) → its wrapping function ``(model, train_cfg, world, ema=False) ->
Engine``."""


def prepare(model: nn.Module, train_cfg, world: World, ema: bool = False) -> Engine:
    """Compile ``model``'s decoder layers if ``train_cfg.compile`` (:func:`compile_layers`), then wrap it with
    ``train_cfg.strategy``; ``ema``: also keep an EMA teacher (``Engine.ema``, module docstring). ``ValueError``
    naming ``train.strategy`` if unknown."""
    if train_cfg.strategy not in STRATEGY_WRAPPERS:
        raise ValueError(f"train.strategy: {train_cfg.strategy!r} is not one of {sorted(STRATEGY_WRAPPERS)}")
    if train_cfg.compile:  # first, as torchtitan: the compiled layers are what the strategy then wraps
        compile_layers(model)
    return STRATEGY_WRAPPERS[train_cfg.strategy](model, train_cfg, world, ema=ema)
