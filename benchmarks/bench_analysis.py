"""Benchmark of analysis.aggregate on a synthetic sweep: 10,000 trials × 20 test depths (no MLflow).

    python benchmarks/bench_analysis.py [--trials 10000] [--depths 20] [--seeds 5] [--n-boot 1000] [--out bench.json]

Trials are grouped into configurations of ``--seeds`` seeds each (10,000 trials → 2,000 configurations → 40,000
(configuration, depth) groups to bootstrap). 2 % of trials are FAILED. Accuracy curves are logistic in log2 depth
with per-trial noise, so about a third of the seeds are censored. Prints one line per stage (best of ``--repeat``
runs, seconds) and the total against the 2 s target; ``--out`` writes the same numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import polars as pl

from analysis import aggregate, tables
from analysis.load import SweepFrames, halting_frame

TARGET_S = 2.0


def synthetic_frames(n_trials: int, n_depths: int, n_seeds: int, seed: int = 0) -> SweepFrames:
    """``SweepFrames`` with ``acc`` (n_trials × n_depths rows, halting metrics on every trial, the primary rule only,
    unknown: no ``eval.halt_*`` params), ``halting`` from it, and ``trials``."""
    rng = np.random.default_rng(seed)
    d_train = 8
    depths = d_train * 2 ** np.linspace(0, 6, n_depths)  # 1× … 64×
    depths = np.unique(np.round(depths).astype(np.int64))
    n_depths = depths.size
    config = np.arange(n_trials) // n_seeds
    task = np.array(["swap_s5", "s5", "a5", "swap_a5"])[config % 4]
    backbone = np.array(["tiny-qwen2", "tiny-qwen3", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen3-0.6b"])[(config // 4) % 5]
    recipe = np.array([f"recipe_{i:03d}" for i in range(1 + config.max() // 20)])[config // 20]
    status = np.where(rng.random(n_trials) < 0.02, "FAILED", "FINISHED")
    half = rng.uniform(1.5, 8.0, n_trials)  # log2 multiple where accuracy halves
    acc_td = 1.0 / (1.0 + np.exp(3.0 * (np.log2(depths[None, :] / d_train) - half[:, None])))
    acc_td = np.clip(acc_td + rng.normal(0.0, 0.02, acc_td.shape), 0.0, 1.0)
    halt_td = np.clip(acc_td - rng.uniform(0.0, 0.05, acc_td.shape), 0.0, 1.0)
    trials = pl.DataFrame({
        "run_id": [f"run{i:06d}" for i in range(n_trials)],
        "status": status,
        "task": task,
        "backbone": backbone,
        "recipe": recipe,
        "seed": np.arange(n_trials) % n_seeds,
        "train_depth": np.full(n_trials, d_train),
        "chance": np.full(n_trials, 1 / 120),
        "anchoring": np.full(n_trials, "True"),
        "targets": np.full(n_trials, "progress"),
    }).with_columns(pl.col("seed", "train_depth").cast(pl.Int64))
    ids = trials.select("run_id", "status", "task", "backbone", "recipe", "seed", "train_depth", "chance")
    acc = ids.select(pl.all().repeat_by(n_depths).list.explode()).with_columns(
        pl.Series("depth", np.tile(depths, n_trials)),
        pl.Series("acc", acc_td.ravel()),
        pl.Series("acc_query", np.sqrt(acc_td).ravel()),
        pl.Series("halt_acc", halt_td.ravel()),
        pl.Series("oracle_acc", acc_td.ravel()),
        pl.Series("halt_iter", np.tile(depths, n_trials).astype(np.float64)),
    )
    empty_iter = pl.DataFrame(schema={**ids.schema, "k": pl.Int64, "rms": pl.Float64, "halt_prob": pl.Float64})
    return SweepFrames(trials=trials, acc=acc, halting=halting_frame(trials, acc), by_iteration=empty_iter)


def _best(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def build_parser() -> argparse.ArgumentParser:
    """This benchmark's argument parser, built without running anything (grouped flags, one example)."""
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench_analysis.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time the analysis (seed statistics, bootstrap CIs, d50, G, tables) on a synthetic sweep.",
        epilog="Prints one line per stage (best of --repeat runs, seconds) and the total against the 2 s target.\n"
               "\nexample (about 5 s):\n  python benchmarks/bench_analysis.py --out bench_analysis.json")
    sweep = parser.add_argument_group("the synthetic sweep")
    sweep.add_argument("--trials", type=int, default=10_000, help="trials (default 10000)")
    sweep.add_argument("--depths", type=int, default=20, help="test depths per trial (default 20)")
    sweep.add_argument("--seeds", type=int, default=5, help="seeds per configuration (default 5)")
    timing = parser.add_argument_group("timing and output")
    timing.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (default 1000)")
    timing.add_argument("--repeat", type=int, default=3, help="runs per stage; the best is reported (default 3)")
    timing.add_argument("--out", type=Path, default=None, help="write the timings as JSON here")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark: print each stage's time and the total; ``--out`` writes them as JSON."""
    parser = build_parser()
    args = parser.parse_args(argv)

    frames = synthetic_frames(args.trials, args.depths, args.seeds)
    stages: dict[str, float] = {}
    stages["accuracy_stats (mean/std + bootstrap CI)"], acc = _best(
        lambda: aggregate.accuracy_stats(frames.acc, n_boot=args.n_boot), args.repeat)
    stages["extrapolation_per_seed (d50, G)"], per_seed = _best(
        lambda: aggregate.extrapolation_per_seed(frames.acc), args.repeat)
    stages["g_summary"], _ = _best(lambda: aggregate.g_summary(per_seed, frames.trials), args.repeat)
    stages["halting_gap"], _ = _best(lambda: aggregate.halting_gap(frames.halting), args.repeat)
    stages["summarize (all of the above + checks)"], summary = _best(
        lambda: aggregate.summarize(frames, n_boot=args.n_boot), args.repeat)
    stages["build_tables"], _ = _best(lambda: tables.build_tables(summary), args.repeat)
    total = stages["summarize (all of the above + checks)"]

    n_groups = acc.height
    print(f"analysis benchmark: {args.trials} trials × {frames.acc.get_column('depth').n_unique()} depths "
          f"= {frames.acc.height} rows, {n_groups} (configuration, depth) groups, B = {args.n_boot}, "
          f"best of {args.repeat}")
    width = max(len(k) for k in stages)
    print(f"{'stage':<{width}}  seconds")
    for name, sec in stages.items():
        print(f"{name:<{width}}  {sec:7.3f}")
    verdict = "ok" if total < TARGET_S else "OVER TARGET"
    print(f"aggregate total {total:.3f} s (target < {TARGET_S:.0f} s): {verdict}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "trials": args.trials, "rows": frames.acc.height, "groups": n_groups, "n_boot": args.n_boot,
            "repeat": args.repeat, "seconds": stages, "aggregate_total_s": total, "target_s": TARGET_S,
            "polars": pl.__version__, "numpy": np.__version__, "machine": platform.platform(),
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
