"""Step time of the Ray Train loop on 2 workers (DDP, gloo) vs the single-process loop, at the same global batch.

All runs execute the one training loop (``par_ray.train.loop.train_loop_per_worker``) on the CPU preset's trial
(tiny shapes, global batch 64, d_train 8, gradient window 8), for the same steps and seed:

=============  ==============================================  ===================
run            how                                             processes × threads
=============  ==============================================  ===================
local          Ray Train local mode, no Ray cluster running    1 × 2
local-1t       the same with one torch thread                  1 × 1
ray-1          Ray Train, 1 worker                             1 × 2
ray-ddp-2      Ray Train, 2 workers, DDP over gloo             2 × 1
=============  ==============================================  ===================

``ray-ddp-2 / local`` compares the same CPU budget (2 cores here) spent as two data-parallel processes or as one
process with two intra-op threads. ``local-1t`` separates the two effects in that ratio: how much the second
thread helps one process, and the scaling efficiency of DDP, ``t(local-1t) / (2 · t(ray-ddp-2))``, i.e. how close
two workers come to halving the one-thread step (gloo all-reduce of the gradients, Ray's per-worker overhead, two
half batches). Local runs happen with no Ray cluster up; the Ray runs share one cluster, started fresh per repeat
and given a few seconds to settle (its dashboard's start-up would otherwise compete with the first run).
Repeats are interleaved and the median is reported (the CI machine is shared: load from other jobs moves single
runs by tens of percent).

Step time is ``step_time_s`` of the final report: the mean of ``train_step`` (sample, forward, backward, clip, AdamW,
LR step) over the second half of the run (``report_every = steps / 2``), so start-up, first-step warm-up,
evaluation and checkpointing are outside it. Each run should train for at least ``--seconds`` (flagged otherwise).
The loss of every run is printed too: same global batch, same curve.

Usage::

    python benchmarks/bench_ray_train.py [--steps 160] [--repeats 3] [--out ray_train.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from par_ray import presets
from par_ray.config import with_overrides
from par_ray.train.trainer import build_trainer, local_ray

RUNS = {  # name: (local mode, workers, threads per worker)
    "local": (True, 1, 2),
    "local-1t": (True, 1, 1),
    "ray-1": (False, 1, 2),
    "ray-ddp-2": (False, 2, 1),
}
SETTLE_SECONDS = 5.0
TRAIN_DEPTH = 8
"""d_train of the benchmarked trial, fixed (not the local preset's): the recorded numbers
(docs/performance.md, docs/distributed.md) are for d_train 8."""


def trial(steps: int, workers: int, threads: int):
    cfg = presets.local_trial("tiny-qwen2", "swap_s5", seed=0)
    return with_overrides(
        cfg,
        task={"train_depth": TRAIN_DEPTH},
        train={"steps": steps, "num_workers": workers, "threads_per_worker": threads, "strategy": "ddp",
               "report_every": max(1, steps // 2), "eval_every": 10**9, "checkpoint_every": 0},
        eval={"depths": (TRAIN_DEPTH,), "num_sequences": 64, "batch_size": 64},
    )


def run(name: str, steps: int, storage: str) -> dict:
    local, workers, threads = RUNS[name]
    t0 = time.perf_counter()
    result = build_trainer(trial(steps, workers, threads), f"bench-{name}", storage, local=local).fit()
    m = result.metrics
    return {"run": name, "workers": workers, "threads_per_worker": threads, "steps": steps,
            "step_time_s": m["step_time_s"], "train_seconds": m["train_seconds"], "final_loss": m["loss"],
            "wall_seconds": time.perf_counter() - t0}


def build_parser() -> argparse.ArgumentParser:
    """This benchmark's argument parser, built without running anything (grouped flags, one example)."""
    p = argparse.ArgumentParser(
        prog="python benchmarks/bench_ray_train.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compare the step time of 2 Ray Train workers (DDP, gloo) with one process, same global batch.",
        epilog="Prints each run's median step time and loss, and the ratio of 2 workers to one process.\n"
               "\nexample (a few minutes on 2 cores):\n  python benchmarks/bench_ray_train.py --out ray_train.json")
    runs = p.add_argument_group("the runs")
    runs.add_argument("--steps", type=int, default=160,
                      help="steps per run (default 160: 22-35 s of training per run on 2 cores)")
    runs.add_argument("--seconds", type=float, default=20.0,
                      help="flag runs whose training took less than this (default 20)")
    runs.add_argument("--repeats", type=int, default=3,
                      help="repeat the runs, interleaved; report medians (default 3)")
    out = p.add_argument_group("output")
    out.add_argument("--out", default=None, help="write the results as JSON here")
    return p


def main(argv=None) -> int:
    """Run the benchmark and print its table; ``--out`` writes it as JSON."""
    p = build_parser()
    args = p.parse_args(argv)

    storage = tempfile.mkdtemp(prefix="bench_ray_train_")
    steps = args.steps
    rows = []

    def record(name: str, rep: int) -> None:
        row = run(name, steps, os.path.join(storage, f"rep{rep}"))
        row["repeat"] = rep
        rows.append(row)
        short = "  SHORTER THAN --seconds" if row["train_seconds"] < args.seconds else ""
        print(f"{name:>10}: {row['step_time_s'] * 1e3:7.1f} ms/step  (train {row['train_seconds']:.1f} s, "
              f"wall {row['wall_seconds']:.1f} s, loss {row['final_loss']:.5f}){short}", flush=True)

    for rep in range(args.repeats):
        for name in ("local", "local-1t"):
            record(name, rep)
        with local_ray(num_cpus=os.cpu_count(), log_to_driver=False):
            time.sleep(SETTLE_SECONDS)
            for name in ("ray-1", "ray-ddp-2"):
                record(name, rep)

    def median_step(name: str) -> float:
        return statistics.median(r["step_time_s"] for r in rows if r["run"] == name)

    base = median_step("local")
    summary = {name: {"step_time_ms": median_step(name) * 1e3, "ratio_vs_local": median_step(name) / base}
               for name in RUNS}
    efficiency = median_step("local-1t") / (2 * median_step("ray-ddp-2"))
    print(f"\nglobal batch 64, tiny-qwen2, {steps} steps, {os.cpu_count()} CPU cores, median of {args.repeats}")
    print("| run | processes × threads | step time (ms) | vs local |\n|---|---:|---:|---:|")
    for name, (_, workers, threads) in RUNS.items():
        s = summary[name]
        print(f"| {name} | {workers} × {threads} | {s['step_time_ms']:.1f} | {s['ratio_vs_local']:.3f} |")
    print(f"ray-ddp-2 / local = {summary['ray-ddp-2']['ratio_vs_local']:.3f};  "
          f"DDP scaling efficiency t(local-1t) / (2 t(ray-ddp-2)) = {efficiency:.2f}")
    print(f"final losses: { {r['run']: round(r['final_loss'], 6) for r in rows} }")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"steps": steps, "cpu_count": os.cpu_count(), "runs": rows, "summary": summary,
                       "ddp_scaling_efficiency": efficiency}, f, indent=2)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
