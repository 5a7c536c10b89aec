"""Training-step throughput as a fraction of the machine's measured fp32 matmul peak, per shape (issue 15).

One PAR training step (``par_ray.train.step.train_step`` on the engine ``par_ray.train.strategies.prepare`` builds:
forward with the gradient window, PAR loss, backward, clip + AdamW step) on swap-S5 at a fixed depth, for the tiny
local-preset shape and the same shape widened to h = 256 and h = 512. For each shape it prints and records:

- ``ratio``: achieved FLOP/s ÷ the machine's fp32 matmul peak (best ``torch.mm`` FLOP/s at 2048³, same thread
  count). Achieved FLOP/s = the step's *reference* FLOPs ÷ the median measured step time. Reference FLOPs are counted
  by ``torch.utils.flop_counter.FlopCounterMode`` on the step as the unoptimised model computes it (eager attention,
  coda over all T positions), so the numerator is the same work before and after an optimisation that skips
  computation and the ratio moves only with the step time (how the issue's 0.55 → 0.65 goal is stated).
- ``ratio_shape_gemm``: the same achieved FLOP/s ÷ the best ``torch.mm`` FLOP/s at the shape's own largest GEMM,
  (B·T, h) × (h, 2h) (the MLP's up projection), i.e. against what a matmul of this size can reach.
- ``ratio_executed``: the FLOPs the step really executes (same counter, the model as configured) ÷ step time ÷
  machine peak: hardware utilisation, lower than ``ratio`` when work is skipped.

The depth is fixed (d = R = ``--depth``, all R iterations in the gradient window) so every step is the same work.

``--recipe local``: instead of the shapes, the local sweeps' step — ``python sweeps/backbone_scaling.py``'s trial
(the local preset with ``presets.LOCAL_LOOP_OPTIONS``, ``LOCAL_PROGRESS_OPTIONS`` and ``LOCAL_CURRICULUM``: dense
targets with a pending class, the fixed-point loss, a given prefix, state noise, attention windows, every other window
iteration read out) on ``--backbone`` at the curriculum's last depth d = ``--depth`` (16), built as the training loop
builds it (``build_looped``, the trial's vocabulary, ``build_step_loss``). R keeps the recipe's slack draws
(d + U{0..3}) and the given prefix its draws, so a step's work varies with its index; the same indices are timed
before and after a change. FLOPs are then counted on every timed step and averaged; the ratios are that mean over the
median step time.

``--matmul-precision``: ``torch.set_float32_matmul_precision`` for the steps and the shape GEMM peaks
(``train.float32_matmul_precision``); the machine peak is always IEEE fp32's, so with ``medium`` (bf16 products on
a CPU with AMX-BF16) ``ratio`` may pass 1. Pair ``medium`` with ``--attn eager`` on CPU: the SDPA flash kernel runs
~10x slower under bf16 products (docs/experiments.md §34).

``--cpu-bf16-autocast``: the steps run under ``torch.autocast("cpu", bfloat16)`` (``train.cpu_bf16_autocast``);
FLOPs are counted in float32 and the peak stays float32's, so ``ratio`` may pass 1. Pair it with ``--attn eager``
(the CPU flash-attention kernel is no faster in bf16; docs/experiments.md §38).

``--compile``: the measured model's decoder layers are compiled (``train.compile``: ``prepare`` calls
``par_ray.train.strategies.compile_layers``, as the training loop does). Executed FLOPs are counted on the eager
model first (``FlopCounterMode`` sees ATen calls, which compiled kernels no longer make; fusing elementwise ops does
not change the matmul FLOPs). The first compiled step compiles every layer variant the step uses; it is left out of
the timing, and ``compile_seconds`` = its time less the median step time (0 without ``--compile``).

Usage::

    python benchmarks/bench_throughput.py [--shapes tiny h256 h512] [--steps 20] [--threads 1] [--out tp.json]
    python benchmarks/bench_throughput.py --attn eager   # the eager-attention arm
    python benchmarks/bench_throughput.py --compile      # compiled decoder layers (train.compile)
    python benchmarks/bench_throughput.py --recipe local --backbone tiny-qwen3 --depth 16 --compile --steps 30
    python benchmarks/bench_throughput.py --recipe local --compile --matmul-precision medium --attn eager
    python benchmarks/bench_throughput.py --recipe local --compile --cpu-bf16-autocast --attn eager
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
import types
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from par_ray.config import RecipeConfig, TaskConfig, TrainConfig, TrialConfig, from_flat
from par_ray.model import backbones
from par_ray.model.looped import LoopedLM, build_looped
from par_ray.presets import (LOCAL_BACKBONES, LOCAL_CURRICULUM, LOCAL_CURRICULUM_DEPTH, LOCAL_LOOP_OPTIONS,
                             LOCAL_PROGRESS_OPTIONS, LOCAL_TRAIN_DEPTH, preset_trial)
from par_ray.tasks import build_task
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare
from par_ray.trial import resolve

LOCAL_RECIPE = {**LOCAL_LOOP_OPTIONS, **LOCAL_PROGRESS_OPTIONS, **LOCAL_CURRICULUM}
"""The local sweeps' recipe (``sweeps/backbone_scaling.py``'s ``LOCAL_RECIPE``) on the local preset."""


@dataclass(frozen=True)
class Shape:
    """A tiny-qwen2 parent with hidden size ``hidden`` (intermediate 2·hidden, 4 heads, 2 KV heads, 6 layers)."""

    hidden: int
    batch: int = 64
    """Sequences per step (the local preset's batch)."""


SHAPES = {"tiny": Shape(128), "h256": Shape(256), "h512": Shape(512)}


def _timing(times: list[float], compile_step: float, compile: bool, reference_flops: float, executed_flops: float,
            shape_peak: float) -> dict:
    """The timing columns of a result row: the median step (seconds), the first step's compile time, FLOP rates and
    their ratio to the matmul peak at the step's shape."""
    seconds = statistics.median(times)
    return {
        "compile_seconds": max(0.0, compile_step - seconds) if compile else 0.0,
        "reference_flops": reference_flops, "executed_flops": executed_flops,
        "step_seconds": seconds, "step_seconds_all": times,
        "achieved_flops_per_s": reference_flops / seconds, "executed_flops_per_s": executed_flops / seconds,
        "shape_gemm_peak_flops_per_s": shape_peak, "ratio_shape_gemm": reference_flops / seconds / shape_peak,
    }


def _build(shape: Shape, vocab: int, attn: str | None, seed: int = 0) -> LoopedLM:
    torch.manual_seed(seed)
    overrides = dict(vocab_size=vocab, hidden_size=shape.hidden, intermediate_size=2 * shape.hidden)
    if attn is not None:
        overrides["attn_implementation"] = attn
    return LoopedLM(backbones.load("tiny-qwen2", **overrides))


def _full_coda_readout(self, state_BTH, read_positions_Q, pos, mask):
    """The unoptimised readout: every coda layer over all T positions, then norm and lm_head at the read rows; stacked
    states (K, B, T, H) as K·B sequences, as ``LoopedLM.readout``."""
    lead = state_BTH.shape[:-2]
    state_BTH = state_BTH.flatten(0, -3)
    for layer in self.coda:
        state_BTH = backbones.run_decoder_layer(layer, state_BTH, pos, mask)
    return self.lm_head(self.norm(state_BTH)[:, read_positions_Q].unflatten(0, lead))


def _step_fn(model: LoopedLM, shape: Shape, depth: int, compile: bool = False, bf16: bool = False):
    """A closure running training step i of ``model`` (fresh engine and AdamW) at depth ``depth``; ``compile``: the
    engine compiles ``model``'s decoder layers (``TrainConfig.compile``, in place); ``bf16``: the step runs under
    CPU bf16 autocast (``TrainConfig.cpu_bf16_autocast``)."""
    train_cfg = TrainConfig(steps=1000, batch_size=shape.batch, lr=1e-4, warmup_steps=0, compile=compile,
                            cpu_bf16_autocast=bf16)
    engine = prepare(model, train_cfg, World())
    task_cfg = TaskConfig(name="swap_s5", train_depth=depth, min_train_depth=depth)
    task = build_task(task_cfg)
    recipe = RecipeConfig(grad_window=depth, max_iterations=depth)
    loss_fn = build_step_loss(recipe, task)
    return lambda i: train_step(engine, task, task_cfg, loss_fn, seed=0, step=i, global_batch=shape.batch)


def local_trial(backbone: str, depth: int, compile: bool, bf16: bool = False) -> TrialConfig:
    """The local sweeps' trial on ``backbone`` (:data:`LOCAL_RECIPE`), every step at depth ``depth`` (no curriculum;
    the recipe's slack iterations and given prefix drawn as in training), layers compiled iff ``compile``, under
    CPU bf16 autocast iff ``bf16``."""
    cfg = from_flat(LOCAL_RECIPE, base=preset_trial("local", backbone))
    return from_flat({"task.train_depth": depth, "task.min_train_depth": depth, "task.curriculum": (),
                      "train.compile": compile, "train.cpu_bf16_autocast": bf16}, base=cfg)


def _local_step_fn(cfg: TrialConfig, attn: str | None, readout=None):
    """A closure running training step i of ``cfg``'s model (built as the training loop builds it, seed 0, fresh
    engine) and the model; ``attn``: the attention implementation (default: the config's); ``readout``: a
    replacement ``LoopedLM.readout`` (the reference FLOP count's)."""
    trial = resolve(cfg)
    task = build_task(cfg.task, train=True)
    backbone = cfg.backbone if attn is None else dataclasses.replace(cfg.backbone, attn_implementation=attn)
    torch.manual_seed(0)
    model = build_looped(backbone, cfg.recipe, vocab_size=trial.vocab.size)
    if readout is not None:
        model.readout = types.MethodType(readout, model)
    engine = prepare(model, cfg.train, World())
    loss_fn = build_step_loss(cfg.recipe, task, dense_offset=trial.vocab.dense_offset, op_order=cfg.task.op_order)
    step = lambda i: train_step(engine, task, cfg.task, loss_fn, seed=cfg.train.seed, step=i,  # noqa: E731
                                global_batch=cfg.train.batch_size)
    return step, model


def measure_local(backbone: str, depth: int, steps: int, warmup: int, attn: str | None, compile: bool,
                  bf16: bool = False) -> dict:
    """:func:`measure` for the local sweeps' step (:func:`local_trial`): median step time over steps
    ``warmup + 1 ..``; reference and executed FLOPs counted eagerly (in float32) on each timed step and averaged."""
    cfg = local_trial(backbone, depth, compile=False)
    first = 1 + warmup + int(compile)
    timed = range(first, first + steps)
    reference, _ = _local_step_fn(cfg, "eager", _full_coda_readout)
    reference_flops = statistics.mean(_count_flops(reference, i) for i in timed)
    executed, _ = _local_step_fn(cfg, attn)
    executed_flops = statistics.mean(_count_flops(executed, i) for i in timed)
    step, model = _local_step_fn(local_trial(backbone, depth, compile, bf16), attn)
    compile_step = 0.0
    if compile:
        t0 = time.perf_counter()
        step(1)  # compiles, lazily, every layer variant the step uses
        compile_step = time.perf_counter() - t0
    for i in range(1 + int(compile), first):
        step(i)
    times, Rs, Ts = [], [], []
    for i in timed:
        t0 = time.perf_counter()
        res = step(i)
        times.append(time.perf_counter() - t0)
        Rs.append(res.plan.R)
        Ts.append(res.tokens / (cfg.train.batch_size * res.plan.R))
    B, T = cfg.train.batch_size, round(statistics.mean(Ts))
    shape_peak = matmul_peak(B * T, model.config.hidden_size, 2 * model.config.hidden_size)
    return {
        "shape": f"local/{backbone}", "hidden": model.config.hidden_size, "batch": B, "seq_len": T,
        "read_positions": None, "R": statistics.mean(Rs), "R_all": Rs, "depth": depth,
        "attn_implementation": model.config._attn_implementation, "compile": compile, "cpu_bf16_autocast": bf16,
        **_timing(times, compile_step, compile, reference_flops, executed_flops, shape_peak),
    }


def _count_flops(step, i: int) -> int:
    with FlopCounterMode(display=False) as counter:
        step(i)
    return counter.get_total_flops()


def matmul_peak(m: int, k: int, n: int, seconds: float = 1.0) -> float:
    """Best FLOP/s of ``torch.mm`` (m×k)·(k×n) in float32 over repeated timed batches of calls."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    flops = 2 * m * k * n
    reps = max(1, int(2e8 // flops))
    for _ in range(3):
        torch.mm(a, b)
    best, t_end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        best = max(best, reps * flops / (time.perf_counter() - t0))
    return best


def measure(name: str, shape: Shape, depth: int, steps: int, warmup: int, attn: str | None,
            compile: bool = False, bf16: bool = False) -> dict:
    """Reference and executed FLOPs of one step of ``shape``, the median step time (seconds), the peaks and the
    ratios; ``compile``: of the model with compiled decoder layers, plus ``compile_seconds`` (module docstring)."""
    task = build_task(TaskConfig(name="swap_s5", train_depth=depth))
    vocab = task.vocab_size
    episode = task.sample(depth, 1, seed=0)
    T, Q = episode.input_ids.shape[1], len(episode.read_positions)

    reference = _build(shape, vocab, "eager")
    reference.readout = types.MethodType(_full_coda_readout, reference)
    reference_flops = _count_flops(_step_fn(reference, shape, depth), 0)
    del reference

    model = _build(shape, vocab, attn)
    step = _step_fn(model, shape, depth)
    executed_flops = _count_flops(step, 0)  # eagerly in float32, also with compile or bf16 (module docstring)
    first, compile_step = 1, 0.0
    if compile or bf16:
        step = _step_fn(model, shape, depth, compile=compile, bf16=bf16)
    if compile:
        t0 = time.perf_counter()
        step(first)  # compiles, lazily, every layer variant the step uses
        compile_step = time.perf_counter() - t0
        first += 1
    for i in range(first, first + warmup):
        step(i)
    times = []
    for i in range(first + warmup, first + warmup + steps):
        t0 = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - t0)
    shape_peak = matmul_peak(shape.batch * T, shape.hidden, 2 * shape.hidden)
    return {
        "shape": name, "hidden": shape.hidden, "batch": shape.batch, "seq_len": T, "read_positions": Q, "R": depth,
        "attn_implementation": model.config._attn_implementation, "compile": compile, "cpu_bf16_autocast": bf16,
        **_timing(times, compile_step, compile, reference_flops, executed_flops, shape_peak),
    }


def build_parser() -> argparse.ArgumentParser:
    """This benchmark's argument parser, built without running anything (grouped flags, one example)."""
    ap = argparse.ArgumentParser(
        prog="python benchmarks/bench_throughput.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure training-step throughput as a fraction of this machine's fp32 matmul peak, per shape.",
        epilog="Prints the machine's peak, then per shape the step time, achieved GFLOP/s and their ratio.\n"
               "\nexamples:\n  python benchmarks/bench_throughput.py --compile --out throughput.json\n"
               "  python benchmarks/bench_throughput.py --recipe local --compile --steps 20")
    step = ap.add_argument_group("the step")
    step.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES), help="shapes to measure")
    step.add_argument("--recipe", choices=["shapes", "local"], default="shapes",
                      help="shapes: PAR at d = R on --shapes (default); local: the local sweeps' step on --backbone "
                           "at d = --depth (module docstring)")
    step.add_argument("--backbone", nargs="+", choices=LOCAL_BACKBONES, default=list(LOCAL_BACKBONES),
                      help="with --recipe local: the backbones to measure")
    step.add_argument("--depth", type=int, default=None,
                      help="d of every step (and R, with the shapes); default: the local preset's d_train, 6, with the "
                           "shapes, the local curriculum's last depth, 16, with --recipe local")
    step.add_argument("--attn", choices=["eager", "sdpa"], default=None,
                      help="attention implementation (default: the registry's)")
    step.add_argument("--compile", action="store_true",
                      help="compile the decoder layers (train.compile); compile time reported apart, not timed")
    step.add_argument("--matmul-precision", choices=["highest", "high", "medium"], default="highest",
                      help="torch.set_float32_matmul_precision for the steps (train.float32_matmul_precision; "
                           "medium: bf16 products on CPUs with AMX-BF16); the machine peak stays IEEE fp32's")
    step.add_argument("--cpu-bf16-autocast", action="store_true",
                      help="run the steps under CPU bf16 autocast (train.cpu_bf16_autocast; pair with --attn eager); "
                           "FLOPs are still counted in float32 and the machine peak stays IEEE fp32's")
    timing = ap.add_argument_group("timing and output")
    timing.add_argument("--steps", type=int, default=20, help="timed steps per shape (the median is reported)")
    timing.add_argument("--warmup", type=int, default=3, help="untimed steps before timing")
    timing.add_argument("--threads", type=int, default=1, help="torch intra-op threads (peak and steps alike)")
    timing.add_argument("--out", help="write the results as JSON to this path")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table; ``--out`` writes it as JSON."""
    ap = build_parser()
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    torch.set_float32_matmul_precision("highest")
    machine_peak = matmul_peak(2048, 2048, 2048)
    rows = []
    print(f"machine fp32 matmul peak (2048^3, {args.threads} thread(s)): {machine_peak / 1e9:.1f} GFLOP/s")
    torch.set_float32_matmul_precision(args.matmul_precision)  # the steps' and their shape GEMM peaks' precision
    print(f"steps at float32 matmul precision {args.matmul_precision!r}")
    print(f"{'shape':<17}{'h':>5}{'B':>4}{'T':>4}{'R':>6} {'attn':<6}{'compile s':>10}{'ref GFLOP':>10}"
          f"{'exec GFLOP':>11}{'step ms':>9}{'GFLOP/s':>9}{'ratio':>7}{'gemm peak':>10}{'ratio/gemm':>11}"
          f"{'executed':>9}", flush=True)
    if args.recipe == "shapes":
        runs = [functools.partial(measure, name, SHAPES[name]) for name in args.shapes]
    else:
        runs = [functools.partial(measure_local, name) for name in args.backbone]
    depth = args.depth or (LOCAL_CURRICULUM_DEPTH if args.recipe == "local" else LOCAL_TRAIN_DEPTH)
    for run in runs:
        r = run(depth, args.steps, args.warmup, args.attn, args.compile, args.cpu_bf16_autocast)
        r["machine_peak_flops_per_s"] = machine_peak
        r["ratio"] = r["achieved_flops_per_s"] / machine_peak
        r["ratio_executed"] = r["executed_flops_per_s"] / machine_peak
        rows.append(r)
        compiled = f"{r['compile_seconds']:.1f}" if args.compile else "-"
        print(f"{r['shape']:<17}{r['hidden']:>5}{r['batch']:>4}{r['seq_len']:>4}{r['R']:>6.4g} "
              f"{r['attn_implementation']:<6}"
              f"{compiled:>10}"
              f"{r['reference_flops'] / 1e9:>10.2f}{r['executed_flops'] / 1e9:>11.2f}{r['step_seconds'] * 1e3:>9.1f}"
              f"{r['achieved_flops_per_s'] / 1e9:>9.1f}{r['ratio']:>7.2f}"
              f"{r['shape_gemm_peak_flops_per_s'] / 1e9:>10.1f}"
              f"{r['ratio_shape_gemm']:>11.2f}{r['ratio_executed']:>9.2f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"threads": args.threads, "depth": depth, "compile": args.compile, "recipe": args.recipe,
                       "float32_matmul_precision": args.matmul_precision,
                       "cpu_bf16_autocast": args.cpu_bf16_autocast, "torch": torch.__version__,
                       "machine_peak_flops_per_s": machine_peak, "shapes": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
