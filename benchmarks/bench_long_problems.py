"""What a training step on a long problem costs, and what the no-autograd iterations before the gradient window save
(issue 22, part 2).

One PAR training step (``par_ray.train.step.train_step``: forward, loss, backward, clip + AdamW) of experiment 9's
recipe (dense progress targets with a pending class, fixed-point loss, prelude/core window 2, coda window 8; no given
prefix and no slack, so every step is the same work) on swap-S5 at a fixed depth d = R, for d = 8, 16, 32 and two
gradient windows: ``recipe.grad_window`` = 8 (iterations 1..R − 8 run under ``torch.no_grad``) and = R (every
iteration with autograd, the cost without the no-grad prefix). For each it prints and records:

- ``step_s``: median wall time of a step (after one warm-up step);
- from ``torch.profiler`` on one more step, the CPU time under ``LoopedLM.iterate``'s labels: ``no_grad_ms``
  (``par_ray.core_no_grad``, the iterations before the window), ``grad_ms`` (``par_ray.core_grad``), ``readout_ms``
  (``par_ray.readout``, coda + lm_head of the read iterations), ``prelude_ms``, and ``rest_ms`` = the profiled
  step less those (backward, optimizer, loss, data);
- ``saving``: 1 − step_s(window 8) / step_s(window R).

Usage::

    python benchmarks/bench_long_problems.py [--depths 8 16 32] [--steps 5] [--threads 1] [--out long.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from par_ray.config import BackboneConfig, EvalConfig, RecipeConfig, TaskConfig, TrainConfig, TrialConfig
from par_ray.model.looped import build_looped
from par_ray.tasks import build_task
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare
from par_ray.trial import resolve, validate

LABELS = ("par_ray.prelude", "par_ray.core_no_grad", "par_ray.core_grad", "par_ray.readout")


def measure(depth: int, grad_window: int, steps: int, backbone: str, batch: int) -> dict:
    """One row of the table (module docstring) for ``depth`` and ``grad_window``."""
    task_cfg = TaskConfig(train_depth=depth, min_train_depth=depth)
    recipe = RecipeConfig(dense_targets=True, dense_pending=True, fixed_point_weight=1.0, targets="done",
                          grad_window=grad_window, max_iterations=max(64, depth))
    cfg = validate(TrialConfig(task=task_cfg, recipe=recipe, eval=EvalConfig(depths=(depth,)),
                               backbone=BackboneConfig(name=backbone, adapter_alpha=0.1, attention_window=2,
                                                       coda_window=8)))
    vocab = resolve(cfg).vocab
    task = build_task(task_cfg, train=True)
    torch.manual_seed(0)
    model = build_looped(cfg.backbone, recipe, vocab_size=vocab.size)
    engine = prepare(model, TrainConfig(batch_size=batch, warmup_steps=0), World())
    loss_fn = build_step_loss(recipe, task, dense_offset=vocab.dense_offset)
    train_step(engine, task, task_cfg, loss_fn, 0, 0, batch)  # warm-up
    times = []
    for s in range(1, steps + 1):
        t0 = time.perf_counter()
        train_step(engine, task, task_cfg, loss_fn, 0, s, batch)
        times.append(time.perf_counter() - t0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        train_step(engine, task, task_cfg, loss_fn, 0, steps + 1, batch)
        profiled_ms = 1e3 * (time.perf_counter() - t0)
    ms = {e.key: e.cpu_time_total / 1e3 for e in prof.key_averages() if e.key in LABELS}
    labelled = sum(ms.values())
    return {
        "depth": depth, "R": depth, "grad_window": grad_window, "no_grad_iterations": max(depth - grad_window, 0),
        "step_s": statistics.median(times),
        "prelude_ms": ms.get("par_ray.prelude", 0.0), "no_grad_ms": ms.get("par_ray.core_no_grad", 0.0),
        "grad_ms": ms.get("par_ray.core_grad", 0.0), "readout_ms": ms.get("par_ray.readout", 0.0),
        "rest_ms": max(profiled_ms - labelled, 0.0), "profiled_step_ms": profiled_ms,
    }


def build_parser() -> argparse.ArgumentParser:
    """This benchmark's argument parser, built without running anything (grouped flags, one example)."""
    ap = argparse.ArgumentParser(
        prog="python benchmarks/bench_long_problems.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time one training step on a long problem, with and without no-grad iterations before the window.",
        epilog="Prints, per depth d = R and gradient window, the median step time and the profiler's CPU time\n"
               "under the model's labels (prelude, no-grad core, grad core, readout).\n"
               "\nexample:\n  python benchmarks/bench_long_problems.py --depths 8 16 32 --out long.json")
    shape = ap.add_argument_group("the step")
    shape.add_argument("--depths", type=int, nargs="+", default=[8, 16, 32], help="depths d = R (default 8 16 32)")
    shape.add_argument("--window", type=int, default=8, help="the gradient window of the no-grad arm (default 8)")
    shape.add_argument("--batch", type=int, default=64, help="sequences per step (default 64)")
    shape.add_argument("--backbone", default="tiny-qwen3", help="backbone registry name (default tiny-qwen3)")
    timing = ap.add_argument_group("timing and output")
    timing.add_argument("--steps", type=int, default=5, help="timed steps per row (median)")
    timing.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    timing.add_argument("--out", default=None, help="write the rows as JSON here")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its rows; ``--out`` writes them as JSON."""
    ap = build_parser()
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'d = R':>6} {'window':>6} {'no-grad it.':>11} {'step s':>7} {'prelude ms':>10} {'no-grad ms':>10} "
          f"{'grad ms':>8} {'readout ms':>10} {'rest ms':>8} {'saving':>7}")
    for d in args.depths:
        pair = [measure(d, w, args.steps, args.backbone, args.batch) for w in (min(args.window, d), d)]
        pair[0]["saving"] = 1.0 - pair[0]["step_s"] / pair[1]["step_s"]
        pair[1]["saving"] = 0.0
        for r in pair:
            print(f"{r['depth']:>6} {r['grad_window']:>6} {r['no_grad_iterations']:>11} {r['step_s']:>7.3f} "
                  f"{r['prelude_ms']:>10.1f} {r['no_grad_ms']:>10.1f} {r['grad_ms']:>8.1f} {r['readout_ms']:>10.1f} "
                  f"{r['rest_ms']:>8.1f} {r['saving']:>7.1%}")
        rows += pair
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"backbone": args.backbone, "batch": args.batch, "threads": args.threads, "rows": rows}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
