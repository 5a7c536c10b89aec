"""Measured vs planned peak memory of one PAR training step on CPU (float32), and peak memory vs R at a fixed window.

Runs the real training step (``par_ray.train.step.train_step`` on the engine ``par_ray.train.strategies.prepare``
builds: forward with the gradient window, PAR loss, backward, clip + AdamW step) on tiny shapes and on "small" shapes
(the real Qwen2.5-0.5B / Qwen3-0.6B / Qwen2.5-7B layer shapes with fewer layers), and compares its peak with
``par_ray.planner.plan(..., strategy="ddp", world_size=1, dtype="fp32")``.

Measuring peak memory on CPU (RSS is too noisy: the allocator and the page cache keep freed memory):

- allocator: ``torch.profiler`` with ``profile_memory=True`` records every allocation and free of c10's CPU
  allocator; their running sum over the step is the peak above the step's start, the CPU analogue of
  ``torch.cuda.max_memory_allocated``.
- tensors: a ``TorchDispatchMode`` that registers the storage of every tensor an op returns and drops it when the
  storage is freed (the idea behind ``torch.distributed._tools.mem_tracker.MemTracker``); a cross-check that sees
  only tensors, not allocator-internal scratch.

Both add the bytes live when the step starts: parameters, buffers and the AdamW state (a warm-up step creates it;
gradients are ``None`` after ``zero_grad(set_to_none=True)``).

The batch is synthetic (random tokens, fixed length T, Q read positions at the end) so that the shape, not the task,
sets the memory; the depth schedule is forced with d = R so the step runs exactly R iterations.

Usage::

    python benchmarks/bench_memory.py [--out memory.json] [--shapes tiny-qwen2 small-qwen2.5-0.5b] [--skip-r-sweep]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import weakref
from dataclasses import asdict, dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from par_ray import planner
from par_ray.config import RecipeConfig, TaskConfig, TrainConfig
from par_ray.model import backbones
from par_ray.model.looped import LoopedLM
from par_ray.tasks.common import Episode
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare


@dataclass(frozen=True)
class Shape:
    """One benchmarked step: a backbone (possibly shortened) and the step's sizes."""

    backbone: str
    micro_batch: int
    seq_len: int
    R: int
    grad_window: int
    read_positions: int = 5
    num_layers: int | None = None
    """Override the backbone's layer count (small shapes)."""
    split: tuple[int, int, int] | None = None
    vocab_size: int | None = None
    """Override the vocabulary (None: the checkpoint's, 151936 for Qwen)."""

    def plan(self) -> planner.MemoryPlan:
        return planner.plan(self.backbone, "ddp", 1, self.R, self.grad_window, self.micro_batch, self.seq_len,
                            dtype="fp32", read_positions=self.read_positions, split=self.split,
                            vocab_size=self.vocab_size, num_layers=self.num_layers)


SHAPES = {
    "tiny-qwen2": Shape("tiny-qwen2", micro_batch=4, seq_len=64, R=8, grad_window=8),
    "tiny-qwen3": Shape("tiny-qwen3", micro_batch=4, seq_len=64, R=8, grad_window=8),
    # Qwen2.5-0.5B's layers (h 896, I 4864, 14/2 heads) and its full 151,936-token tied embedding, 3 of 24 layers.
    "small-qwen2.5-0.5b": Shape("qwen2.5-0.5b", micro_batch=2, seq_len=64, R=4, grad_window=2, num_layers=3,
                                split=(1, 1, 1)),
    # Qwen3-0.6B's layers (q/k norm, head_dim 128 with h 1024), full vocabulary, 3 of 28 layers.
    "small-qwen3-0.6b": Shape("qwen3-0.6b", micro_batch=2, seq_len=64, R=4, grad_window=2, num_layers=3,
                              split=(1, 1, 1)),
    # The same layers with a task-sized vocabulary (as random-init training builds them) and longer sequences, so that
    # activations are a large share of the peak.
    "small-qwen2.5-0.5b-task": Shape("qwen2.5-0.5b", micro_batch=2, seq_len=128, R=3, grad_window=3, num_layers=3,
                                     split=(1, 1, 1), vocab_size=64),
    # One Qwen2.5-7B layer (h 3584, I 18944, 28/4 heads) as the looped core, with a task-sized vocabulary.
    "small-qwen2.5-7b": Shape("qwen2.5-7b", micro_batch=1, seq_len=32, R=2, grad_window=2, num_layers=1,
                              split=(0, 1, 0), vocab_size=64),
}
R_SWEEP = (8, 16, 32, 64)
R_SWEEP_SHAPE = Shape("tiny-qwen2", micro_batch=4, seq_len=64, R=8, grad_window=8)


class FixedLengthTask:
    """Random token sequences of a fixed length T with Q read positions at the end (memory depends on shapes only)."""

    def __init__(self, vocab_size: int, seq_len: int, read_positions: int):
        self.vocab_size, self.seq_len, self.num_queries = vocab_size, seq_len, read_positions

    def sample(self, depth: int, n: int, seed: int, step: int = 0) -> Episode:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        T, Q = self.seq_len, self.num_queries
        return Episode(
            input_ids=torch.randint(0, self.vocab_size, (n, T), generator=gen),
            read_positions=torch.arange(T - Q, T),
            states=torch.randint(0, self.vocab_size, (n, depth, Q), generator=gen),
            depth=depth,
        )


class LiveTensorBytes(TorchDispatchMode):
    """Live bytes of tensor storages returned by ops while active, and their peak (plus ``track``-ed ones)."""

    def __init__(self):
        super().__init__()
        self._seen = WeakIdKeyDictionary()
        self.live = 0
        self.peak = 0

    def track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if storage in self._seen:
            return
        nbytes = storage.nbytes()
        self._seen[storage] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, nbytes)

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out


@dataclass
class Measurement:
    shape: str
    start_bytes: int
    """Live at the step's start: parameters, buffers, AdamW state."""
    peak_allocator: int
    """start + the profiler's peak running sum of CPU allocations."""
    peak_tensors: int | None
    """start + the dispatch-mode peak of live tensor storages (None when not measured)."""
    planned: int
    plan: dict = field(default_factory=dict)

    @property
    def error(self) -> float:
        """(planned - measured) / measured, against the allocator peak."""
        return (self.planned - self.peak_allocator) / self.peak_allocator


def _state_tensors(engine) -> list[torch.Tensor]:
    model, opt = engine.raw, engine.optimizer
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return [*model.parameters(), *model.buffers(), *state]


def _unique_bytes(tensors: list[torch.Tensor]) -> int:
    storages = {}
    for t in tensors:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _allocator_peak(run) -> int:
    """Peak of the running sum of CPU allocator events while ``run()`` executes (bytes above the start)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def measure(name: str, shape: Shape, cross_check: bool = True) -> Measurement:
    """Peak bytes of one steady-state training step of ``shape`` in float32 on CPU, and its plan."""
    torch.manual_seed(0)
    overrides = {k: v for k, v in (("num_hidden_layers", shape.num_layers), ("vocab_size", shape.vocab_size))
                 if v is not None}
    model = LoopedLM(backbones.load(shape.backbone, **overrides), split=shape.split)
    train_cfg = TrainConfig(steps=10, batch_size=shape.micro_batch, lr=1e-4, warmup_steps=0)
    engine = prepare(model, train_cfg, World())
    task = FixedLengthTask(model.config.vocab_size, shape.seq_len, shape.read_positions)
    task_cfg = TaskConfig(train_depth=shape.R, min_train_depth=shape.R)
    recipe = RecipeConfig(grad_window=shape.grad_window, max_iterations=shape.R)
    loss_fn = build_step_loss(recipe, task)

    def step(i: int):
        return lambda: train_step(engine, task, task_cfg, loss_fn, seed=0, step=i, global_batch=shape.micro_batch)

    step(0)()  # warm-up: creates the AdamW state, as in every later step
    gc.collect()
    start = _unique_bytes(_state_tensors(engine))
    peak_allocator = start + _allocator_peak(step(1))
    peak_tensors = None
    if cross_check:
        gc.collect()
        tracker = LiveTensorBytes()
        for t in _state_tensors(engine):
            tracker.track(t)
        with tracker:
            step(2)()
        peak_tensors = tracker.peak
    p = shape.plan()
    return Measurement(name, start, peak_allocator, peak_tensors, p.total,
                       {k: v for k, v in asdict(p).items() if isinstance(v, int) and not isinstance(v, bool)})


def r_sweep(shape: Shape = R_SWEEP_SHAPE, Rs: tuple[int, ...] = R_SWEEP) -> list[dict]:
    """Measured (allocator) and planned peak at each R with the window fixed; ratios to the first R."""
    rows = []
    for R in Rs:
        s = Shape(**{**asdict(shape), "R": R})
        m = measure(f"{shape.backbone} R={R}", s, cross_check=False)
        rows.append({"R": R, "grad_window": s.grad_window, "measured": m.peak_allocator, "planned": m.planned})
    for row in rows:
        row["measured_ratio"] = row["measured"] / rows[0]["measured"]
        row["planned_ratio"] = row["planned"] / rows[0]["planned"]
    return rows


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f}"


def build_parser() -> argparse.ArgumentParser:
    """This benchmark's argument parser, built without running anything (grouped flags, one example)."""
    ap = argparse.ArgumentParser(
        prog="python benchmarks/bench_memory.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure the peak memory of a training step on CPU against the memory planner, and vs R.",
        epilog="Prints per shape the measured peak (CPU allocator and live tensors) beside the planner's, then\n"
               "the peak against R at a fixed gradient window.\n"
               "\nexample:\n  python benchmarks/bench_memory.py --out memory.json")
    what = ap.add_argument_group("what to measure")
    what.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES), help="shapes to measure")
    what.add_argument("--skip-r-sweep", action="store_true", help="skip peak memory vs R")
    what.add_argument("--threads", type=int, default=1,
                      help="torch intra-op threads (memory does not depend on it; 1 is fastest on a shared machine)")
    out = ap.add_argument_group("output")
    out.add_argument("--out", help="write the results as JSON to this path")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables; ``--out`` writes them as JSON."""
    ap = build_parser()
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    results = []
    print(f"{'shape':<24}{'B':>3}{'T':>5}{'R':>4}{'win':>5}{'start MB':>10}{'alloc MB':>10}{'tensor MB':>11}"
          f"{'plan MB':>10}{'plan err':>10}", flush=True)
    for name in args.shapes:
        s = SHAPES[name]
        m = measure(name, s)
        results.append(m)
        print(f"{name:<24}{s.micro_batch:>3}{s.seq_len:>5}{s.R:>4}{s.grad_window:>5}{_mb(m.start_bytes):>10}"
              f"{_mb(m.peak_allocator):>10}{_mb(m.peak_tensors):>11}{_mb(m.planned):>10}{m.error:>+10.1%}", flush=True)

    sweep = []
    if not args.skip_r_sweep:
        s = R_SWEEP_SHAPE
        print(f"\npeak memory vs R ({s.backbone}, window {s.grad_window}, B {s.micro_batch}, T {s.seq_len})")
        print(f"{'R':>4}{'measured MB':>13}{'x R=' + str(R_SWEEP[0]):>9}{'plan MB':>10}{'x R=' + str(R_SWEEP[0]):>9}")
        sweep = r_sweep()
        for row in sweep:
            print(f"{row['R']:>4}{_mb(row['measured']):>13}{row['measured_ratio']:>9.3f}{_mb(row['planned']):>10}"
                  f"{row['planned_ratio']:>9.3f}")
        worst = max(row["measured_ratio"] for row in sweep)
        print(f"largest measured ratio to R={R_SWEEP[0]}: {worst:.3f} (bar: <= 1.3)")

    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shapes": [{**asdict(m), "error": m.error, "config": asdict(SHAPES[m.shape])}
                                  for m in results], "r_sweep": sweep}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
