"""The GPU check: what one short call on a lent GPU must measure before anyone trusts a paper-preset plan; one JSON file.

It needs only torch, transformers and par_ray's model, training step, evaluation and cost model (no Ray, DeepSpeed,
MLflow or polars: ``tests/test_imports.py`` guards that those import without them), so it runs on a bare GPU machine
whose Python has torch + transformers and nothing downloadable (random-init weights of the exact public shapes).
Sections, each timed, each under its own alarm, each in its own ``try`` (an error is recorded, the next section still
runs), all under one global budget; the JSON is rewritten after every section, so a run killed from outside keeps
what it measured:

``environment``      Python / torch / CUDA / transformers versions and the device.
``matmul_peak``      the measured bf16 matmul peak (fp32 on the CPU dry path): best ``torch.mm`` FLOP/s.
``model``            the one model every later section uses: Qwen2.5-0.5B's shape retrofitted, full vocabulary (151,936
                     tokens), float32 master weights (bf16 comes from autocast, as in the paper preset's DDP step),
                     random init on the device, wrapped as a one-rank DDP engine with its AdamW.
``rope_tf32``        the parent's rotary (cos, sin) at positions 0..T−1 (T ≥ 519, the prompt at d = 512) with TF32
                     on (``torch.set_float32_matmul_precision("high")``, as the training loop sets) and off, each
                     against a float64 reference: transformers 5.17 (the device image's) computes the angles as a
                     one-column fp32 matmul, which TF32 may round (transformers issue 48428 reports corrupted angles on
                     B200); 5.24, the project's pin, multiplies elementwise.
``train_mfu``        PAR steps at depths spread over the training distribution (d uniform in 1..d_train, R = d,
                     window 8, batch 64); FLOPs per step two ways: ``par_ray.cost.step_flops`` (the cost model) and
                     ``FlopCounterMode`` over one untimed step with SDPA restricted to its math backend (torch 2.11's
                     formula for the flash / efficient / cuDNN kernels asserts equal query and key heads, which GQA
                     does not have); MFU = ΣFLOPs / Σtime over those depths (the depth distribution's average, not the
                     deepest step's), with the counted FLOPs where counted, against the measured peak and the card's
                     datasheet bf16 peak.
``train_memory``     peak memory of one steady-state step at d = R = d_train (``torch.cuda.max_memory_allocated``,
                     ``max_memory_reserved``, ``mem_get_info``) against ``par_ray.planner.plan``'s figure.
``eval_throughput``  the paper evaluation's deepest test, d = 512 (R = 512) under the training precision: a timed
                     share of the 1,024 test sequences, extrapolated to the time per 1,024; its peak memory.
``halting_memory``   halting evaluation (``par_ray.evaluation.halting_by_depth``, R_max = 2 × d) at its depth: time
                     and peak memory.
``fsdp2``            the same model under FSDP2 (``fully_shard``) on a one-rank NCCL group, a few steps.

Evaluation memory is compared with ``par_ray.planner.plan_evaluation`` (resident training state, optimizer included,
plus that evaluation, with the measured model's vocabulary), as evaluations run between training steps. Every
measured peak also records ``max_memory_reserved`` and ``mem_get_info``: the paper preset fits a plan into 90 % of
the card (``par_ray.presets``), and what the caching allocator reserves is what that headroom must cover.

Exit status: 0 only when every section ran and passed (sections left out with ``--skip`` are listed as such); 1 when
one failed, timed out or was skipped for lack of time (a check that measured less than it should is not a pass); 3
when a GPU run finds no CUDA (nothing measured, never a quiet CPU run); 4 when ``--dry-run`` is asked for on a machine
with CUDA (CPU numbers where GPU numbers are expected). ``--dry-run`` runs every section on the CPU at tiny shapes
(tiny-qwen2, task vocabulary, float32) with the same JSON schema: ``tests/test_benchmarks.py`` runs it in CI.

Usage: ``benchmarks/gpu_check.sh`` (sets the time limit, writes ``$OUT/gpu_check.json``) or
``python benchmarks/gpu_check.py --out X.json [--dry-run] [--budget-s 380] [--skip fsdp2]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import json
import os
import platform
import signal
import statistics
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from par_ray import cost, hardware, planner
from par_ray.config import EvalConfig, RecipeConfig, TaskConfig, TrainConfig, TrialConfig
from par_ray.evaluation import accuracy_by_depth, halting_by_depth
from par_ray.halting import task_halt_tokens
from par_ray.model import backbones
from par_ray.model.looped import LoopedLM
from par_ray.tasks import build_task
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare

SCHEMA_VERSION = 3
EXIT_FAILED = 1
"""Exit status when a section failed, timed out or was skipped because the time budget ran out."""
EXIT_NO_CUDA = 3
"""Exit status of a GPU run on a machine where ``torch.cuda.is_available()`` is false."""
EXIT_DRY_RUN_ON_GPU = 4
"""Exit status of ``--dry-run`` on a machine with CUDA: the GPU is there, so CPU numbers would stand in for its own."""
HEADROOM = 0.9
"""Share of the card a plan may fill (``par_ray.presets`` fits plans into 90 % of the GPU's memory)."""


@dataclass(frozen=True)
class Plan:
    """Sizes of one run of the check: the GPU plan, or the CPU dry plan with the same structure."""

    gpu: bool
    backbone: str
    task_vocab: bool
    """Shrink the vocabulary to the task's (tiny shapes); ``False`` keeps the checkpoint's 151,936 tokens."""
    task: str
    train_depth: int
    """d_train: the training depths are 1..d_train (the paper preset's swap-S5: 32)."""
    mfu_depths: tuple[int, ...]
    """Depths timed for the MFU: the midpoints of equal shares of the uniform depth distribution on 1..d_train."""
    batch: int
    window: int
    warmup: int
    steps: int
    eval_depth: int
    eval_share: int
    """Test sequences timed at ``eval_depth`` (one evaluation batch); the time per 1,024 is extrapolated from it."""
    halt_depth: int
    halt_batch: int
    peak_mm: int
    rope_positions: int
    """Positions 0..n−1 the RoPE probe compares (at least the d = 512 prompt's 519 tokens)."""
    sections_s: dict[str, float]
    """Alarm per section, seconds; their sum stays well under the 450 s of ``gpu_check.sh``."""


GPU_PLAN = Plan(gpu=True, backbone="qwen2.5-0.5b", task_vocab=False, task="swap_s5", train_depth=32,
                mfu_depths=(2, 6, 10, 14, 18, 22, 26, 30), batch=64, window=8, warmup=1, steps=2, eval_depth=512,
                eval_share=32, halt_depth=128, halt_batch=32, peak_mm=8192, rope_positions=4096,
                sections_s={"environment": 10, "matmul_peak": 15, "model": 40, "rope_tf32": 10, "train_mfu": 70,
                            "train_memory": 20, "eval_throughput": 60, "halting_memory": 40, "fsdp2": 40})
DRY_PLAN = Plan(gpu=False, backbone="tiny-qwen2", task_vocab=True, task="swap_s5", train_depth=4,
                mfu_depths=(1, 3), batch=8, window=2, warmup=1, steps=1, eval_depth=16, eval_share=8,
                halt_depth=8, halt_batch=4, peak_mm=256, rope_positions=1024,
                sections_s={"environment": 10, "matmul_peak": 10, "model": 20, "rope_tf32": 10, "train_mfu": 40,
                            "train_memory": 30, "eval_throughput": 30, "halting_memory": 30, "fsdp2": 40})
SECTIONS = ("environment", "matmul_peak", "model", "rope_tf32", "train_mfu", "train_memory", "eval_throughput",
            "halting_memory", "fsdp2")
NEEDS_MODEL = frozenset({"rope_tf32", "train_mfu", "train_memory", "eval_throughput", "halting_memory", "fsdp2"})
"""Sections that use the model the ``model`` section builds (each fails at once, saying so, when it did not)."""
EVAL_SEQUENCES = 1024
"""Test sequences per depth in the paper preset: what the evaluation time is extrapolated to."""


class SectionTimeout(BaseException):
    """Raised by the alarm when a section overruns its time. A ``BaseException``, as ``KeyboardInterrupt``: a
    section's own ``except Exception`` (``train_mfu``'s fallback when the FLOP counter fails) must not swallow it and
    run on with the one-shot timer spent."""


@contextlib.contextmanager
def alarm(seconds: float):
    """Raise :class:`SectionTimeout` in this (main) thread after ``seconds``."""
    def fire(signum, frame):
        raise SectionTimeout(f"section exceeded {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------------------------------------------------
# Shared pieces

def _device(plan: Plan) -> torch.device:
    return torch.device("cuda", 0) if plan.gpu else torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _task(plan: Plan):
    return build_task(TaskConfig(name=plan.task, train_depth=plan.train_depth))


def _vocab_override(plan: Plan) -> int | None:
    """The model's vocabulary when it is the task's (+ 3: the halting ids); ``None``: the checkpoint's own."""
    return _task(plan).vocab_size + 3 if plan.task_vocab else None


def _model(plan: Plan) -> LoopedLM:
    """A random-init retrofit of ``plan.backbone`` in float32 (the loop's master weights; bf16 comes from autocast),
    allocated on the plan's device (on a GPU a 0.5B model initialises there in a fraction of the CPU's time)."""
    torch.manual_seed(0)
    vocab = _vocab_override(plan)
    with torch.device(_device(plan)):  # the adapter; the parent is placed by backbones.load's own device
        return LoopedLM(backbones.load(plan.backbone, device=_device(plan), **({"vocab_size": vocab} if vocab else {})))


def _engine(plan: Plan, model: LoopedLM, strategy: str = "ddp"):
    world = World(rank=0, size=1, device=_device(plan))
    train_cfg = TrainConfig(steps=10_000, batch_size=plan.batch, lr=1e-4, warmup_steps=0, use_gpu=plan.gpu,
                            strategy=strategy)
    return prepare(model, train_cfg, world)


def _shared_engine(state: dict):
    """The engine the ``model`` section built; ``RuntimeError`` when that section did not succeed."""
    if "engine" not in state:
        raise RuntimeError("no model: the 'model' section did not succeed (see its entry)")
    return state["engine"]


def _step_at(plan: Plan, engine, depth: int):
    """``run(i)``: training step i at d = R = ``depth`` (forced schedule); the recipe, T and Q of its prompts."""
    task = _task(plan)
    task_cfg = TaskConfig(name=plan.task, train_depth=depth, min_train_depth=depth)
    recipe = RecipeConfig(grad_window=plan.window, max_iterations=max(64, depth))
    loss_fn = build_step_loss(recipe, task)
    ep = task.sample(depth, 1, seed=0)

    def run(i: int):
        return train_step(engine, task, task_cfg, loss_fn, seed=0, step=i, global_batch=plan.batch)

    return run, recipe, ep.input_ids.shape[1], len(ep.read_positions)


def _model_flops(plan: Plan, recipe: RecipeConfig, depth: int, T: int, Q: int) -> float:
    """``par_ray.cost.step_flops`` of one step at d = R = ``depth`` for the global batch (matmul FLOPs)."""
    shape = planner.model_shape(plan.backbone, vocab_size=_vocab_override(plan))
    cfg = TrialConfig(train=TrainConfig(batch_size=plan.batch, use_gpu=plan.gpu))
    return cost.step_flops(cfg, recipe, shape, depth, depth, (T, Q, 0), None)


def count_flops(fn) -> tuple[object, int]:
    """``fn()``'s result and the FLOPs ``FlopCounterMode`` counted in it, with SDPA restricted to its math backend.

    The math backend runs attention as matmuls, which the counter counts at any head layout. The fused kernels
    (flash, memory-efficient, cuDNN) have formulas of their own, and torch 2.11's assert equal query and key/value
    head counts (``sdpa_flop_count: query/key/value shapes are incompatible``), which grouped-query attention (Qwen:
    14 query, 2 key/value heads at 0.5B; transformers passes ``enable_gqa=True``) does not have; on the CPU the fused
    kernel is not counted at all. Count an untimed step this way, time the others with the default backends.
    """
    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        out = fn()
    return out, int(counter.get_total_flops())


def _memory(device: torch.device) -> dict:
    """CUDA's view of memory now: peaks since the last reset (allocated by tensors, reserved by the caching
    allocator) and the driver's free / total bytes (``mem_get_info``); empty on CPU."""
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    reserved = int(torch.cuda.max_memory_reserved(device))
    return {"max_allocated_bytes": int(torch.cuda.max_memory_allocated(device)), "max_reserved_bytes": reserved,
            "free_bytes": int(free), "total_bytes": int(total), "reserved_share_of_total": reserved / total,
            "within_headroom": reserved <= HEADROOM * total}


def _peak(device: torch.device, fn) -> tuple[object, int | None, dict]:
    """``fn()``'s result, the peak memory it allocated on CUDA (``None`` on CPU) and :func:`_memory` after it."""
    if device.type != "cuda":
        return fn(), None, {}
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    _sync(device)
    mem = _memory(device)
    return out, mem["max_allocated_bytes"], mem


def _eval_trial(plan: Plan, kind: str, depth: int, batch: int) -> TrialConfig:
    """The trial whose ``par_ray.planner.plan_evaluation`` the check's evaluation ``kind`` (``plain`` /
    ``halting``) at ``depth`` with ``batch`` rows is held to: the measured model's vocabulary (the preset's pretrained
    parent keeps the checkpoint's 151,936 tokens; the dry plan's random-init parent has the task's)."""
    from par_ray import presets
    from par_ray.config import with_overrides
    from par_ray.recipes import apply_recipe

    base = presets.paper_trial(plan.backbone, plan.task) if plan.gpu else presets.local_trial(plan.backbone, plan.task)
    cfg = apply_recipe(base, "par_halt") if kind == "halting" else base
    backbone = {"pretrained": None} if plan.task_vocab else {}
    if not plan.task_vocab and cfg.backbone.pretrained is None:
        raise ValueError(f"{plan.backbone}: the plan keeps the checkpoint's vocabulary, but its preset has no "
                         f"pretrained parent to plan it with")
    return with_overrides(cfg, backbone=backbone,
                          task={"train_depth": plan.train_depth, "min_train_depth": 1},
                          train={"strategy": "ddp", "num_workers": 1, "batch_size": plan.batch, "use_gpu": plan.gpu,
                                 "accelerator_type": ""},
                          recipe={"grad_window": plan.window},
                          eval={"depths": (depth,), "num_sequences": batch, "batch_size": batch})


def _planned_eval(plan: Plan, kind: str, depth: int, batch: int) -> int:
    """The planner's peak for evaluation ``kind`` at ``depth`` with ``batch`` rows (resident training state + that
    evaluation) of :func:`_eval_trial`."""
    p = planner.plan_evaluation(_eval_trial(plan, kind, depth, batch))
    return int(p.resident + getattr(p, kind))


def _model_fn(engine):
    """The evaluation forward under the training step's precision (``Engine.autocast``)."""
    def call(*args, **kwargs):
        with engine.autocast():
            return engine.model(*args, **kwargs)
    return call


@contextlib.contextmanager
def one_rank_group(device: torch.device):
    """A one-rank process group in this process (NCCL on CUDA, gloo on CPU), as a one-GPU trial worker has."""
    created = not dist.is_initialized()
    if created:
        for var, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                           ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533")):
            os.environ.setdefault(var, value)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)
    try:
        yield dist.get_backend()
    finally:
        if created:
            dist.destroy_process_group()


# --------------------------------------------------------------------------------------------------------------------
# Sections

def environment(plan: Plan) -> dict:
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "cuda_available": torch.cuda.is_available(), "cpu_count": os.cpu_count(),
           "torch_threads": torch.get_num_threads(), "backbone": plan.backbone}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        out.update(device=props.name, capability=f"{props.major}.{props.minor}", memory_bytes=props.total_memory,
                   free_bytes=free, total_bytes=total, cuda=torch.version.cuda,
                   bf16_supported=torch.cuda.is_bf16_supported())
    else:
        out["device"] = platform.processor() or platform.machine()
    return out


def matmul_peak(plan: Plan) -> dict:
    """Best FLOP/s of an n×n×n ``torch.mm`` (bf16 on CUDA, fp32 on CPU) over repeated timed batches."""
    device = _device(plan)
    dtype = torch.bfloat16 if plan.gpu else torch.float32
    n = plan.peak_mm
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    reps = 20 if plan.gpu else 3
    for _ in range(3):
        torch.mm(a, b)
    best = 0.0
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        _sync(device)
        best = max(best, reps * 2 * n**3 / (time.perf_counter() - t0))
    name = torch.cuda.get_device_name(0) if plan.gpu else ""
    # the datasheet peak the cost model divides by (par_ray.hardware.DEVICES), for the card's Ray accelerator type
    dev = hardware.DEVICES.get(hardware.ray_accelerator_type(name)) if name else None
    datasheet = dev.peak_tflops * 1e12 if dev is not None and dev.peak_tflops is not None else None
    return {"dtype": str(dtype).removeprefix("torch."), "n": n, "peak_flops_per_s": best,
            "datasheet_bf16_flops_per_s": datasheet}


def model(plan: Plan, state: dict) -> dict:
    """Build the one model (and its one-rank DDP engine) that every later section shares."""
    device = _device(plan)
    t0 = time.perf_counter()
    raw = _model(plan)
    _sync(device)
    built = time.perf_counter() - t0
    state["engine"] = _engine(plan, raw)
    return {"backbone": plan.backbone, "params": backbones.parameter_count(raw),
            "vocab_size": raw.config.vocab_size, "build_seconds": built,
            "weights_bytes": torch.cuda.memory_allocated(device) if plan.gpu else None}


def rope_tf32(plan: Plan, state: dict) -> dict:
    """The parent's rotary (cos, sin) at positions 0..``plan.rope_positions``−1 with TF32 allowed and not, each
    against cos / sin of the same fp32 inverse frequencies × positions computed in float64.

    Errors are absolute (cos and sin lie in [−1, 1]); ``first_bad_position`` is the first position whose TF32 error
    exceeds 1e-3. On the CPU both settings run in full fp32 (no TF32 there)."""
    engine = _shared_engine(state)
    device = _device(plan)
    rope = engine.raw.rotary_emb
    n = plan.rope_positions
    positions = torch.arange(n, device=device, dtype=torch.float32)[None]
    x = torch.zeros(1, n, 1, device=device, dtype=torch.float32)
    inv = rope.inv_freq.detach().to("cpu", torch.float64)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    emb = torch.cat([angles, angles], dim=-1)
    want = (emb.cos() * rope.attention_scaling, emb.sin() * rope.attention_scaling)
    before = torch.get_float32_matmul_precision()
    out = {"positions": n, "float32_matmul_precision_restored": before}
    try:
        for label, precision in (("tf32", "high"), ("fp32", "highest")):
            torch.set_float32_matmul_precision(precision)
            with torch.no_grad():
                cos, sin = rope(x, positions)
            err = torch.maximum((cos[0].double().cpu() - want[0]).abs(), (sin[0].double().cpu() - want[1]).abs())
            per_position = err.amax(dim=-1)
            bad = torch.nonzero(per_position > 1e-3)
            out[label] = {"max_abs_error": float(err.max()),
                          "max_abs_error_at_519": float(per_position[min(519, n - 1)]),
                          "first_bad_position": int(bad[0]) if len(bad) else None}
    finally:
        torch.set_float32_matmul_precision(before)
    out["tf32_corrupts_angles"] = out["tf32"]["first_bad_position"] is not None
    return out


def train_mfu(plan: Plan, state: dict, results: dict) -> dict:
    """PAR steps at each of ``plan.mfu_depths``: FLOPs (counted and modelled), time, and the distribution's MFU
    (ΣFLOPs / Σtime)."""
    device = _device(plan)
    engine = _shared_engine(state)
    rows, step = [], state.get("step", 0)
    for depth in plan.mfu_depths:
        run, recipe, T, Q = _step_at(plan, engine, depth)
        counted, error = None, None
        try:
            first, counted = count_flops(lambda: run(step))
        except Exception as e:  # noqa: BLE001 - record why the counter failed; the modelled FLOPs still stand
            error = f"{type(e).__name__}: {e}"
            first = run(step)
        step += 1
        for _ in range(plan.warmup - 1):
            run(step)
            step += 1
        times = []
        for _ in range(plan.steps):
            _sync(device)
            t0 = time.perf_counter()
            run(step)
            _sync(device)
            times.append(time.perf_counter() - t0)
            step += 1
        modelled = _model_flops(plan, recipe, depth, T, Q)
        rows.append({"depth": depth, "R": first.plan.R, "seq_len": T, "read_positions": Q,
                     "flops_per_step": counted if counted else modelled,
                     "flops_counted": counted, "flops_model": modelled,
                     "counted_vs_model": counted / modelled - 1 if counted else None, "count_error": error,
                     "step_seconds": statistics.median(times), "loss": first.loss})
    seconds = sum(r["step_seconds"] for r in rows)
    flops = sum(r["flops_per_step"] for r in rows)
    flops_model = sum(r["flops_model"] for r in rows)
    peak = results.get("matmul_peak", {}).get("result", {})

    def mfu(f: float, key: str) -> float | None:
        return f / seconds / peak[key] if peak.get(key) else None

    out = {"backbone": plan.backbone, "params": backbones.parameter_count(engine.raw), "batch": plan.batch,
           "grad_window": plan.window, "depth_distribution": f"uniform 1..{plan.train_depth}",
           "precision": "bf16 autocast, fp32 weights" if plan.gpu else "fp32", "rows": rows,
           "flops_source": "counted" if all(r["flops_counted"] for r in rows) else "model where not counted",
           "flops_per_s": flops / seconds, "flops_per_s_model": flops_model / seconds,
           "mfu_vs_measured_peak": mfu(flops, "peak_flops_per_s"),
           "mfu_vs_datasheet": mfu(flops, "datasheet_bf16_flops_per_s"),
           "mfu_model_vs_datasheet": mfu(flops_model, "datasheet_bf16_flops_per_s"),
           "tokens_per_s": plan.batch * sum(r["seq_len"] for r in rows) / seconds}
    state["step"] = step
    return out


def train_memory(plan: Plan, state: dict) -> dict:
    """Peak of one steady-state step (optimizer state present) at d = R = d_train vs ``planner.plan``."""
    device = _device(plan)
    engine = _shared_engine(state)
    run, _, T, Q = _step_at(plan, engine, plan.train_depth)
    step = state.get("step", 0)
    run(step)  # the optimizer state exists from here on, as in every later step
    _, measured, mem = _peak(device, lambda: run(step + 1))
    state["step"] = step + 2
    p = planner.plan(plan.backbone, "ddp", 1, plan.train_depth, plan.window, plan.batch, T,
                     dtype="bf16" if plan.gpu else "fp32", read_positions=Q, vocab_size=_vocab_override(plan))
    return {"R": plan.train_depth, "grad_window": plan.window, "batch": plan.batch, "seq_len": T,
            "measured_bytes": measured, "planned_bytes": p.total,
            "plan_error": (p.total - measured) / measured if measured else None, "memory": mem}


def eval_throughput(plan: Plan, state: dict) -> dict:
    """A share of the d = ``plan.eval_depth`` test set, R = d, under the training precision: time and memory."""
    device = _device(plan)
    engine = _shared_engine(state)
    task = _task(plan)
    ev = EvalConfig(depths=(plan.eval_depth,), num_sequences=plan.eval_share, batch_size=plan.eval_share)
    weights = torch.cuda.memory_allocated(device) if plan.gpu else None
    t0 = time.perf_counter()
    acc, measured, mem = _peak(device, lambda: accuracy_by_depth(_model_fn(engine), task, ev, 1, device))
    seconds = time.perf_counter() - t0
    ep = task.sample(plan.eval_depth, 1, seed=0)
    T, Q = ep.input_ids.shape[1], len(ep.read_positions)
    shape = planner.model_shape(plan.backbone, vocab_size=_vocab_override(plan))
    flops = plan.eval_share * cost.forward_flops(shape, T, Q, plan.eval_depth, 1)
    planned = _planned_eval(plan, "plain", plan.eval_depth, plan.eval_share)
    return {"depth": plan.eval_depth, "R": plan.eval_depth, "sequences_timed": plan.eval_share,
            "batch": plan.eval_share, "seq_len": T, "seconds": seconds,
            f"seconds_per_{EVAL_SEQUENCES}": seconds * EVAL_SEQUENCES / plan.eval_share,
            "flops_model": flops, "flops_per_s_model": flops / seconds,
            "precision": "bf16 autocast" if plan.gpu else "fp32", "acc": acc[plan.eval_depth]["acc"],
            "measured_bytes": measured, "weights_bytes": weights, "planned_bytes": planned,
            "plan_error": (planned - measured) / measured if measured else None,
            "vocab_size": engine.raw.config.vocab_size, "memory": mem}


def halting_memory(plan: Plan, state: dict) -> dict:
    """Halting evaluation at d = ``plan.halt_depth`` (R_max = 2d, one batch): time and peak memory."""
    device = _device(plan)
    engine = _shared_engine(state)
    task = _task(plan)
    halt = task_halt_tokens(task.vocab_size)  # ids inside every vocabulary checked here
    ev = EvalConfig(depths=(plan.halt_depth,), num_sequences=plan.halt_batch, batch_size=plan.halt_batch)
    t0 = time.perf_counter()
    res, measured, mem = _peak(device, lambda: halting_by_depth(_model_fn(engine), task, ev, 1, halt, device))
    seconds = time.perf_counter() - t0
    T = task.sample(plan.halt_depth, 1, seed=0).input_ids.shape[1] + 1
    planned = _planned_eval(plan, "halting", plan.halt_depth, plan.halt_batch)
    return {"depth": plan.halt_depth, "R_max": 2 * plan.halt_depth, "batch": plan.halt_batch, "seq_len": T,
            "vocab_size": engine.raw.config.vocab_size, "seconds": seconds, "measured_bytes": measured,
            "weights_bytes": torch.cuda.memory_allocated(device) if plan.gpu else None,
            "keys": sorted(res[plan.halt_depth])[:8], "planned_bytes": planned,
            "plan_error": (planned - measured) / measured if measured else None, "memory": mem}


def fsdp2(plan: Plan, state: dict) -> dict:
    """A few steps of the shared model under FSDP2 on a one-rank group (the DDP engine and its AdamW state are
    dropped first); its peak memory against the plan. The last section: ``fully_shard`` changes the model."""
    device = _device(plan)
    raw = _shared_engine(state).raw
    del state["engine"]
    _free(device)
    with one_rank_group(device) as backend:
        engine = _engine(plan, raw, strategy="fsdp")
        run, _, T, Q = _step_at(plan, engine, plan.mfu_depths[0])
        losses = [run(0).loss]
        _, measured, mem = _peak(device, lambda: losses.append(run(1).loss))
        p = planner.plan(plan.backbone, "fsdp", 1, plan.mfu_depths[0], plan.window, plan.batch, T,
                         dtype="bf16" if plan.gpu else "fp32", read_positions=Q, vocab_size=_vocab_override(plan))
        del engine, run
    _free(device)
    return {"backend": backend, "R": plan.mfu_depths[0], "losses": losses, "measured_bytes": measured,
            "planned_bytes": p.total, "plan_error": (p.total - measured) / measured if measured else None,
            "memory": mem}


# --------------------------------------------------------------------------------------------------------------------

def _write(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, default=str)
    os.replace(tmp, path)


def _refuse(path: str, doc: dict, error: str, status: int) -> int:
    doc["error"] = error
    _write(path, doc)
    print(f"gpu_check: error: {error}", file=sys.stderr)
    return status


def build_parser() -> argparse.ArgumentParser:
    """The GPU check's argument parser, built without running anything (grouped flags, one example)."""
    ap = argparse.ArgumentParser(
        prog="python benchmarks/gpu_check.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure on one GPU what a paper-preset plan rests on (peak, MFU, memory); write one JSON file.",
        epilog="Usually run through benchmarks/gpu_check.sh, which adds the hard time limit.\n"
               "\nexample (CPU, tiny shapes):\n  python benchmarks/gpu_check.py --dry-run --out /tmp/gpu_check.json")
    run = ap.add_argument_group("the run")
    run.add_argument("--dry-run", action="store_true",
                     help="CPU, tiny shapes, float32; refused where CUDA is available (a GPU run needs CUDA)")
    run.add_argument("--budget-s", type=float, default=None,
                     help="global time budget in seconds (default 380 on a GPU, 240 dry); a section that would start "
                          "past it is skipped, and the run fails")
    run.add_argument("--skip", nargs="*", default=[], choices=SECTIONS, help="sections to leave out")
    out = ap.add_argument_group("output")
    out.add_argument("--out", required=True, help="JSON file to write (rewritten after every section)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the GPU check's sections and write ``--out``; the exit status says whether every section passed."""
    ap = build_parser()
    args = ap.parse_args(argv)

    plan = DRY_PLAN if args.dry_run else GPU_PLAN
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    doc = {"schema": SCHEMA_VERSION, "dry_run": not plan.gpu,
           "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "plan": dataclasses.asdict(plan), "elapsed_s": 0.0, "sections": {}}
    if plan.gpu and not torch.cuda.is_available():  # never a quiet CPU run in place of the GPU check
        return _refuse(args.out, doc, f"CUDA is not available (torch {torch.__version__}, built for CUDA "
                                      f"{torch.version.cuda}); nothing was measured. Fix the CUDA install, or pass "
                                      f"--dry-run for the CPU path", EXIT_NO_CUDA)
    if not plan.gpu and torch.cuda.is_available():  # never CPU numbers where the GPU's are expected
        return _refuse(args.out, doc, f"--dry-run on a machine with CUDA ({torch.cuda.get_device_name(0)}): the dry "
                                      f"path measures the CPU at tiny shapes; run without --dry-run",
                       EXIT_DRY_RUN_ON_GPU)
    budget = args.budget_s if args.budget_s is not None else (380.0 if plan.gpu else 240.0)
    doc["budget_s"] = budget
    threads = torch.get_num_threads()
    if plan.gpu:
        torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in fp32, as the training loop
    else:
        torch.set_num_threads(1)  # the dry path shares a CPU; timings are not its point
    t_start = time.perf_counter()
    sections, state = doc["sections"], {}
    current = {"name": None}

    def on_term(signum, frame):  # `timeout` (gpu_check.sh) or the machine ends us: keep what was measured
        if current["name"]:
            sections[current["name"]] = {"status": "killed", "error": f"signal {signum} during this section"}
        doc["elapsed_s"] = time.perf_counter() - t_start
        doc["passed"] = False
        _write(args.out, doc)
        sys.exit(128 + signum)

    previous_term = signal.signal(signal.SIGTERM, on_term)
    jobs = {
        "environment": lambda: environment(plan),
        "matmul_peak": lambda: matmul_peak(plan),
        "model": lambda: model(plan, state),
        "rope_tf32": lambda: rope_tf32(plan, state),
        "train_mfu": lambda: train_mfu(plan, state, sections),
        "train_memory": lambda: train_memory(plan, state),
        "eval_throughput": lambda: eval_throughput(plan, state),
        "halting_memory": lambda: halting_memory(plan, state),
        "fsdp2": lambda: fsdp2(plan, state),
    }
    for name in SECTIONS:
        left = budget - (time.perf_counter() - t_start)
        if name in args.skip:
            sections[name] = {"status": "skipped", "reason": "--skip"}
        elif left < 5:
            sections[name] = {"status": "skipped", "reason": f"time budget of {budget:.0f} s spent"}
        else:
            limit = min(plan.sections_s[name], left)
            t0 = time.perf_counter()
            current["name"] = name
            print(f"gpu_check: {name} (up to {limit:.0f} s) ...", flush=True)
            try:
                with alarm(limit):
                    result = jobs[name]()
                sections[name] = {"status": "ok", "result": result}
            except SectionTimeout as e:
                sections[name] = {"status": "timeout", "error": str(e)}
            except Exception as e:  # record and go on: one failure must not lose the other sections
                sections[name] = {"status": "error", "error": f"{type(e).__name__}: {e}",
                                  "traceback": traceback.format_exc(limit=8)}
            sections[name]["seconds"] = time.perf_counter() - t0
            current["name"] = None
            print(f"gpu_check: {name}: {sections[name]['status']} in {sections[name]['seconds']:.1f} s", flush=True)
        doc["elapsed_s"] = time.perf_counter() - t_start
        _write(args.out, doc)
    signal.signal(signal.SIGTERM, previous_term)
    torch.set_num_threads(threads)
    failed = [n for n, s in sections.items() if s["status"] in ("error", "timeout")
              or (s["status"] == "skipped" and s["reason"] != "--skip")]
    doc["failed"], doc["passed"] = failed, not failed
    doc["left_out"] = [n for n, s in sections.items() if s["status"] == "skipped" and s["reason"] == "--skip"]
    _write(args.out, doc)
    print(f"gpu_check: wrote {args.out}; {len(failed)} section(s) failed or not run"
          f"{': ' + ', '.join(failed) if failed else ''}"
          f"{'; left out with --skip: ' + ', '.join(doc['left_out']) if doc['left_out'] else ''}")
    return EXIT_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
