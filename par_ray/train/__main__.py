"""Single-process trainer: ``python -m par_ray.train --backbone tiny-qwen2 --task swap_s5 --recipe par ...``.

Runs the one training loop (``par_ray.train.loop``) in Ray Train's local mode, or on Ray workers: with ``--workers``
> 1 on a new local Ray instance, and always on a Ray cluster it finds (``RAY_ADDRESS``, as ``ray job submit`` sets it,
or a head started with ``ray start --head`` on this machine: ``par_ray.train.cluster.ray_address``). It
prints progress and, at the end, the accuracy-by-depth table and G, and writes ``OUT/result.json`` (accuracy, G, the
training and evaluation seconds, and the last report's step time, tokens/s and peak memory). Any other knob:
``--set section.field=value``. The final model is ``OUT/final``: its weights only, ``model.safetensors`` (float32)
+ ``extra.json`` (step and config), whatever the strategy; load it with ``par_ray.train.checkpoint.load_trained``,
or read it with ``safetensors.safe_open``. Optimizer state lives only in the resumable checkpoints under ``OUT/ray``.

``OUT/config.json`` records the config of the run in ``OUT``. A run on Ray workers keeps resumable checkpoints under
``OUT/ray`` (on a cluster of several nodes ``OUT`` must be a folder every node sees): rerunning with the same
``--out`` and the same config (workers and threads may change) continues it from its latest intact checkpoint. Local
mode keeps none: rerunning it starts afresh. Any other config is refused, naming the fields that differ, before
anything is written.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import logging
import os
import re
import shutil
import sys
import time

from par_ray import presets
from par_ray.config import from_flat, parse_overrides, to_flat
from par_ray.evaluation import extrapolation_from_metrics, format_G, format_interval
from par_ray.model.registry import BACKBONES
from par_ray.recipes import apply_recipe
from par_ray.train.checkpoint import trained_task
from par_ray.train.cluster import ClusterTokenError, check_fits, check_outlives_job, joined, ray_address
from par_ray.tracking_schema import FLOPS_EVAL, depth_metric, g_metric
from par_ray.trial import validate
from par_ray.weights import resolve_pretrained


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 8,16,32, got {text!r}") from None
    return values


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m par_ray.train`` argument parser, built without running anything (its flags in groups, one
    example in the epilog); ``tests/test_docs_commands.py`` parses the docs' commands with it."""
    from par_ray.config import STRATEGIES
    from par_ray.model.registry import BACKBONES
    from par_ray.recipes import RECIPES
    from par_ray.tasks import TASKS

    def one_of(names) -> str:
        return "{" + ",".join(names) + "}"

    # Names are listed, not enforced with argparse ``choices``: the config's own validation reports a wrong name as
    # one "error: <field>: ..." line, like every other bad value.
    p = argparse.ArgumentParser(
        allow_abbrev=False,  # a flag's prefix is an error, never another flag
        prog="python -m par_ray.train", formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [--backbone NAME] [--task NAME] [--recipe NAME] [--set SECTION.FIELD=VALUE] [options]",
        description="Train one looped model (one PAR trial) and print its accuracy by test depth and G.",
        epilog="Prints progress lines, then the accuracy-by-depth table and G; writes OUT/result.json and the\n"
               "model OUT/final/. Flags left out take the preset's values (par_ray/presets.py); any other config\n"
               "field: --set SECTION.FIELD=VALUE. The same command with the same --out continues an interrupted run\n"
               "from its latest checkpoint when it ran on Ray workers (--workers 2 or more, or a cluster); one\n"
               "worker on this machine keeps no checkpoints: rerunning it starts afresh.\n"
               "\nexample (12 minutes on 2 cores):\n"
               "  python -m par_ray.train --backbone tiny-qwen2 --task swap_s5 --recipe par --train-depth 8 \\\n"
               "      --steps 4000 --eval-depths 8,16,32,64 --seed 0 --out runs/par-s0")
    what = p.add_argument_group("what to train")
    what.add_argument("--preset", default="local", metavar=one_of(presets.PRESETS),
                      help="the base trial (par_ray/presets.py): local (default; CPU, tiny shapes, d_train 6, float32) "
                           "or paper (the paper's protocol: pretrained parent from --model-dir or the hub cache, the "
                           "task's paper depths, bf16 on GPUs, strategy and GPU count by the memory planner)")
    what.add_argument("--backbone", default=None, metavar=one_of(BACKBONES),
                      help="parent model shape from the backbone registry (par_ray/model/backbones.py; default "
                           "tiny-qwen2, the CPU shape, or qwen2.5-0.5b under --preset paper)")
    what.add_argument("--task", default="swap_s5", metavar=one_of(TASKS),
                      help="state-tracking task (par_ray/tasks/; default swap_s5)")
    what.add_argument("--recipe", default="par", metavar=one_of(RECIPES),
                      help="training recipe: PAR or one of its ablations / baselines (table in par_ray/recipes.py; "
                           "default par)")
    what.add_argument("--seed", type=int, default=0,
                      help="trial seed, a non-negative integer: model init, training batches and the per-step depth "
                           "and iteration draws (the test sets use eval.seed); default 0")
    what.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                      help="override any config field, e.g. --set train.lr=3e-4 (repeatable)")
    length = p.add_argument_group("training length and test depths")
    length.add_argument("--train-depth", type=int, default=None, metavar="D",
                        help="d_train, the longest composition trained on (default: the CPU preset's)")
    length.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the CPU preset's)")
    length.add_argument("--eval-depths", type=_ints, default=None, metavar="D1,D2,...",
                        help="comma-separated test depths, e.g. 8,16,32,64 (default: the preset's grid at d_train; "
                             "local: every depth to 2 x d_train, then steps of <= 1.25 x to 8 x d_train)")
    weights = p.add_argument_group("pretrained weights (nothing is downloaded)")
    weights.add_argument("--pretrained", default=None, metavar="DIR",
                         help="local checkpoint folder to load the parent's weights from (default: random init)")
    weights.add_argument("--model-dir", default=None, metavar="DIR",
                         help="where a pretrained parent's hub id is looked for before the hub cache ($HF_HOME): "
                              "DIR/<hub id> or a hub cache (par_ray/weights.py)")
    scale = p.add_argument_group("workers and output")
    scale.add_argument("--workers", type=int, default=1,
                       help=">1 starts Ray workers (DDP etc.); 1 = this process, or one Ray worker on a cluster "
                            "(RAY_ADDRESS)")
    scale.add_argument("--strategy", default=None, metavar=one_of(STRATEGIES),
                       help="data-parallel wrapping with --workers > 1 (default ddp)")
    scale.add_argument("--out", default="runs/train",
                       help="output directory (result.json, checkpoints, final/); absolute inside a Ray job")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse ``python -m par_ray.train``'s flags (:func:`build_parser`); argparse exits with status 2 on a bad one."""
    return build_parser().parse_args(argv)


def config_from_args(args):
    """TrialConfig from the CLI: preset (``--preset``; paper: with the planner's parallelism) → recipe → explicit
    flags → --set overrides; validated, a pretrained parent resolved to its local directory."""
    backbone = args.backbone or ("qwen2.5-0.5b" if args.preset == "paper" else "tiny-qwen2")
    cfg = presets.preset_trial(args.preset, backbone, args.task, args.seed)
    cfg = apply_recipe(cfg, args.recipe)
    by_flag = {flag: (field, value) for flag, (field, value) in {
        "--seed": ("train.seed", args.seed), "--pretrained": ("backbone.pretrained", args.pretrained),
        "--train-depth": ("task.train_depth", args.train_depth), "--steps": ("train.steps", args.steps),
        "--eval-depths": ("eval.depths", args.eval_depths),
        "--workers": ("train.num_workers", args.workers if args.workers != 1 else None),
        "--strategy": ("train.strategy", args.strategy)}.items() if value is not None}
    flat = dict(by_flag.values())
    if args.train_depth is not None and args.eval_depths is None:
        # the preset's grid at the new d_train: the local fine grid rebuilt to 8×, the paper's 1…16× multiples
        flat["eval.depths"] = presets.scaled_depths(cfg.eval.depths, cfg.task.train_depth, args.train_depth)
    overrides = parse_overrides(args.set)
    flat.update(overrides)
    try:
        cfg = validate(from_flat(flat, base=cfg))
    except ValueError as e:  # a field a flag set is named by its flag: "- --workers (train.num_workers): …"
        named = {field: flag for flag, (field, _) in by_flag.items() if field not in overrides}
        raise ValueError(re.sub(r"^(\s*- )([\w.]+):", lambda m: f"{m[1]}{named[m[2]]} ({m[2]}):" if m[2] in named
                                else m[0], str(e), flags=re.MULTILINE)) from None
    if cfg.backbone.pretrained is not None:  # offline first: resolved and checked before anything starts
        local = resolve_pretrained(cfg.backbone.pretrained, cfg.backbone.name, args.model_dir)
        cfg = from_flat({"backbone.pretrained": local}, base=cfg)
        trained_task(cfg)  # the task's words through the parent's tokenizer, one token each (raises ValueError)
    return cfg


def check_out_dir(out: str, flat: dict) -> None:
    """Raise ``ValueError`` if ``out`` cannot hold this run: a file, or a directory of a run with another config.

    ``OUT/config.json`` is the flat config of the run that ``out`` holds. Fields that may differ are those that do
    not change what is trained (``par_ray.train.loop.RESUME_FREE_FIELDS``: workers, threads, fault injection,
    compile).
    """
    from par_ray.train.loop import resume_mismatch  # noqa: PLC0415 - after validation: imports torch and Ray

    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out: {out} exists and is not a directory")
    stored_path = os.path.join(out, "config.json")
    if not os.path.isfile(stored_path):
        return
    with open(stored_path) as f:
        stored = json.load(f)
    differ = resume_mismatch(stored, flat)
    if differ:
        from par_ray.train.trainer import SNAPSHOT_FILE  # noqa: PLC0415 - imports Ray; after validation

        if glob.glob(os.path.join(out, "ray", "*", SNAPSHOT_FILE)):
            then = "rerunning there would continue it. Use another --out, or the same settings to resume it"
        else:  # one local worker's run, or one stopped before its first checkpoint: nothing to continue
            then = ("rerunning there would replace its results. Use another --out, or the same settings to run it "
                    "again")
        raise ValueError(f"--out: {out} holds a run with another config; {then}. Differing fields (stored → now):"
                         f"\n  - " + "\n  - ".join(differ))


def _failure_reason(error: BaseException) -> str:
    """The workers' own error messages inside Ray Train's ``TrainingFailedError`` (or the error itself), one line
    each, without Ray's tracebacks."""
    from par_ray.train.trainer import root_causes  # noqa: PLC0415 - imports Ray

    failures = getattr(error, "worker_failures", None)
    if failures:
        return "; ".join(f"rank {rank}: {type(c).__name__}: {_one_line(c)}" for rank, e in sorted(failures.items())
                         for c in root_causes(e))
    cause = error.__cause__ or error.__context__
    return f"{type(error).__name__}: {_one_line(error)}" + (
        f" (cause: {type(cause).__name__}: {_one_line(cause)})" if cause else "")


def _one_line(error: BaseException, limit: int = 2000) -> str:
    return " ".join(str(error).split())[:limit]


def _has_ray_checkpoints(storage: str, name: str) -> bool:
    """Whether Ray Train storage ``storage`` holds checkpoints of run ``name`` (its checkpoint manager's snapshot)."""
    from par_ray.train.trainer import SNAPSHOT_FILE  # noqa: PLC0415 - imports Ray; called after validation

    return os.path.isfile(os.path.join(storage, name, SNAPSHOT_FILE))


def g_summary_lines(ex, max_depth: int) -> list[str]:
    """The printed G lines: the paper's first-crossing G (the headline) and the interpolated G, each with d50 and,
    when measured, its 95 % interval (``par_ray.evaluation.format_interval``)."""
    def with_interval(interpolated: bool) -> str:
        text = format_interval(ex, interpolated)
        return f", 95 % interval {text}" if text else ""

    d50 = f"{ex.d50}" if ex.d50 is not None else f"> {max_depth}"
    lines = [f"G = {format_G(ex)}{with_interval(False)}   (d50 = {d50}: the first test depth below the midpoint, "
             "the paper's G)"]
    if ex.G_interp is not None:
        d50_interp = f"{ex.d50_interp:.1f}" if ex.d50_interp is not None else f"> {max_depth}"
        lines.append(f"G (interpolated) = {format_G(ex, interpolated=True)}{with_interval(True)}   (d50 = "
                     f"{d50_interp}, on the line between the test depths around the midpoint)")
    if ex.interval is not None:
        lines.append("95 % intervals: bootstrap over the test sequences of every depth (eval.bootstrap_resamples); "
                     "≥: past the largest test depth")
    return lines


def interval_result(ex) -> dict:
    """``result.json``'s intervals of d50, G and the interpolated G: ``{"d50_interval_95": [lo, hi], …,
    "G_interval_censored": [lo, hi]}`` (a censored bound: its d50 ``null``, its G max tested depth / d_train, a lower
    bound); empty without an interval."""
    iv = ex.interval
    if iv is None:
        return {}
    return {"d50_interval_95": [iv.d50_lo, iv.d50_hi], "G_interval_95": [iv.G_lo, iv.G_hi],
            "d50_interp_interval_95": [iv.d50_interp_lo, iv.d50_interp_hi],
            "G_interp_interval_95": [iv.G_interp_lo, iv.G_interp_hi],
            "G_interval_censored": [iv.lo_censored, iv.hi_censored]}


def stopping_summary(metrics: dict, depths) -> dict | None:
    """For a trial with a halting read-out (it logged ``halt_acc_d{D}``): full-state accuracy per test depth when the
    model stops itself (the primary rule), at R = ⌈d/c⌉ and at the oracle best fixed R, with the G of each (issue 22,
    part 3), as ``{"table": markdown text, "result": {stopping: {"acc": {d: fraction}, "G", "G_censored",
    "G_interp", and the 95 % intervals of :func:`interval_result` when logged}}}``; ``None`` for a trial without
    one."""
    columns = (("own halting", "halt", "halt_acc"), ("R = ⌈d/c⌉", "ceil", "acc"), ("best fixed R", "best", "best_acc"))
    if any(depth_metric("halt_acc", d) not in metrics for d in depths):
        return None
    result, rows = {}, []
    for label, stop, kind in columns:
        ex = extrapolation_from_metrics(metrics, stop)
        result[stop] = {"acc": {d: metrics.get(depth_metric(kind, d), float("nan")) for d in depths},
                        **{k: metrics.get(g_metric(k, stop)) for k in ("G", "G_censored", "G_interp")},
                        **(interval_result(ex) if ex is not None else {})}
    lines = ["", "stopping: " + ", ".join(
        f"{label} G = {format_G(ex)}" + (f" {format_interval(ex)}" if ex.interval else "")
        for label, stop, _ in columns if (ex := extrapolation_from_metrics(metrics, stop)) is not None),
        "| depth | own halting | R = ⌈d/c⌉ | best fixed R (R) |", "|---:|---:|---:|---:|"]
    for d in depths:
        best_R = metrics.get(depth_metric("best_iter", d))
        rows.append(f"| {d} | {result['halt']['acc'][d]:.3f} | {result['ceil']['acc'][d]:.3f} | "
                    f"{result['best']['acc'][d]:.3f} ({'?' if best_R is None else int(best_R)}) |")
    return {"table": "\n".join(lines + rows), "result": result}


def _stop_as_ctrl_c(signum, frame):
    """SIGTERM while training (``kill``, a scheduler's preemption notice) stops the run as Ctrl-C does: a
    ``KeyboardInterrupt`` in the main thread, so the Ray instance this process started is shut down on the way out
    (its raylet, dashboard and agents with it) and the run can be continued by rerunning the command."""
    raise KeyboardInterrupt


def main(argv=None) -> int:
    """``python -m par_ray.train``: exit status 0 trained, 1 training failed, 2 bad input, 130 interrupted (Ctrl-C
    or SIGTERM; one line, no traceback, wherever it lands)."""
    try:
        return _train(argv)
    except KeyboardInterrupt:  # before training (imports, validation) or after it: training's own is caught there
        print("\ninterrupted", file=sys.stderr)
        return 130


def _train(argv) -> int:
    args = parse_args(argv)
    try:
        cfg = config_from_args(args)
        out = os.path.abspath(args.out)
        check_outlives_job("--out", args.out)
        check_out_dir(out, to_flat(cfg))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    spec = BACKBONES[cfg.backbone.name]
    if spec.hub_name is not None and not cfg.backbone.pretrained:
        print(f"note: --backbone {cfg.backbone.name} without --pretrained: its weights are random (the {spec.hub_name} "
              f"shape trained from scratch); pass --pretrained with the model folder for the parent's weights",
              flush=True)
    import ray.exceptions  # noqa: PLC0415 - heavy imports after validation
    import ray.train  # noqa: PLC0415

    from par_ray.train.trainer import build_trainer, repair_run_storage, run_name, sigterm_handler

    logging.getLogger("ray.train").setLevel(logging.WARNING)  # local mode logs every report at INFO

    t0 = time.time()
    storage, name = os.path.join(out, "ray"), run_name(cfg)
    # A cluster to join, as the sweeps find one: RAY_ADDRESS (also what `ray job submit` sets), else a head started
    # on this machine (`ray start --head`); "local" when there is none.
    cluster = "local" if ray.is_initialized() else ray_address()
    # One worker runs in this process (Ray Train's local mode), which keeps no checkpoints, unless there is a cluster
    # (its worker then runs where the cluster has room, a GPU node for a GPU run, not on the head that runs this
    # process); a run that left Ray checkpoints in OUT (started on more workers) continues on one Ray worker instead,
    # from its latest checkpoint.
    for note in repair_run_storage(storage, name):
        print(f"resume: {note}", flush=True)
    resumed = _has_ray_checkpoints(storage, name)
    local = cfg.train.num_workers == 1 and cluster == "local" and not resumed
    if cfg.train.num_workers == 1 and resumed:
        print(f"resuming the run in {out} from its latest checkpoint on 1 Ray worker", flush=True)
    if local and os.path.isfile(os.path.join(out, "result.json")):
        print(f"note: {out} holds a finished run and one worker keeps no checkpoints: training it again from step 0; "
              f"its result.json and final/ are replaced at the end", flush=True)
    if local and cfg.train.strategy == "fsdp":
        print("note: --strategy fsdp on one worker trains in this process (Ray Train's local mode, no process group): "
              "the model is not sharded; its checkpoints are FSDP's sharded format (DCP) all the same; give --workers "
              "2 or more, or a cluster (RAY_ADDRESS), to shard it", flush=True)
    # The export is written beside final/ and swapped in when training ends: a run on fewer workers never leaves
    # another run's shard in final/, and a failed run leaves the previous export whole.
    final, partial = os.path.join(out, "final"), os.path.join(out, "final.partial")
    # Ray workers print through Train V2's print patch, which echoes each progress line a second time; Ray Train's
    # INFO lines (every report and checkpoint) stay in its log files (LoggingConfig), as in a sweep.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    if not (local or ray.is_initialized()) and cluster == "local":
        print(f"Ray: starting a local instance for {cfg.train.num_workers} workers", flush=True)
    # "Ray: joined ADDRESS" or "Ray: started a local cluster (N CPU, M GPU)"; a Ray this process started already is
    # used as it is
    ray_instance = contextlib.nullcontext() if local else joined(cluster)
    try:
        with sigterm_handler(_stop_as_ctrl_c), ray_instance:  # SIGTERM while Ray starts, too
            trainer = build_trainer(cfg, name, storage_path=storage, local=local, export_dir=partial,
                                    log_level="WARNING")
            if not local:  # workers Ray could never place would be waited for forever
                try:
                    check_fits(f"this run on {cfg.train.num_workers} worker(s)",
                               trainer.scaling_config.total_resources)
                except ValueError as e:
                    print(f"error: --workers: {e}; use fewer --workers, or join a larger cluster (RAY_ADDRESS); "
                          f"nothing was started", file=sys.stderr)
                    return 2
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "config.json"), "w") as f:
                json.dump(to_flat(cfg), f, indent=2)
            shutil.rmtree(partial, ignore_errors=True)
            result = trainer.fit()
    except ClusterTokenError as e:
        print(f"error: {e}; nothing was started", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        then = ("this process keeps no checkpoint (one worker, Ray Train's local mode): rerunning starts afresh"
                if local else f"rerun the same command to continue from the latest checkpoint in {out}"
                if _has_ray_checkpoints(storage, name) else "no checkpoint was written yet: rerunning starts afresh")
        print(f"\ninterrupted: {then}", file=sys.stderr)
        return 130
    except (ray.train.TrainingFailedError, ray.exceptions.RayError, FloatingPointError, ValueError, RuntimeError,
            OSError, ImportError) as e:
        print(f"error: training failed: {_failure_reason(e)}", file=sys.stderr)
        return 1
    if os.path.isdir(partial):
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
    else:  # rank 0 wrote it on its own node's disk
        print(f"warning: the final model was not written to {final}: its worker ran on another node, which does not "
              f"see {out}; on a cluster of several nodes give --out a folder every node sees", file=sys.stderr)
    m = result.metrics
    acc = {d: m[depth_metric("acc", d)] for d in cfg.eval.depths}
    ex = extrapolation_from_metrics(m)
    print(f"\naccuracy by depth ({cfg.task.name}, {cfg.recipe.name}, {cfg.backbone.name}, d_train={cfg.task.train_depth})")
    print("| depth | multiple | full-state acc | 95 % interval | sequences | per-query acc |\n"
          "|---:|---:|---:|---:|---:|---:|")
    for d in cfg.eval.depths:
        lo, hi = m.get(depth_metric("acc_lo", d), float("nan")), m.get(depth_metric("acc_hi", d), float("nan"))
        print(f"| {d} | {d / cfg.task.train_depth:.3g}× | {acc[d]:.3f} | {lo:.3f}–{hi:.3f} | "
              f"{m.get(depth_metric('sequences', d), float('nan')):.0f} | {m[depth_metric('acc_query', d)]:.3f} |")
    print("\n".join(g_summary_lines(ex, max(cfg.eval.depths))))
    print(f"train time {m['train_seconds']:.0f} s, evaluation {m.get('eval_seconds_total', float('nan')):.0f} s "
          f"(wall {time.time() - t0:.0f} s)")
    stopping = stopping_summary(m, cfg.eval.depths)
    if stopping:
        print(stopping["table"])
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"accuracy_by_depth": acc, **({"stopping": stopping["result"]} if stopping else {}),
                   "accuracy_by_depth_per_query": {d: m[depth_metric("acc_query", d)] for d in cfg.eval.depths},
                   "accuracy_interval_95": {d: [m.get(depth_metric("acc_lo", d)), m.get(depth_metric("acc_hi", d))]
                                            for d in cfg.eval.depths},
                   "sequences_by_depth": {d: m.get(depth_metric("sequences", d)) for d in cfg.eval.depths},
                   "d50": ex.d50, "G": ex.G, "G_censored": ex.censored, "d50_interp": ex.d50_interp,
                   "G_interp": ex.G_interp, **interval_result(ex), "chance": m["chance"],
                   "train_seconds": m["train_seconds"], "eval_seconds": m.get("eval_seconds_total"),
                   "eval_flops": m.get(FLOPS_EVAL),  # the evaluations' FLOPs as they ran (par_ray.cost)
                   "wall_seconds": time.time() - t0,
                   # the last report's window: mean step time (s), tokens/s, peak memory (MB; CUDA: allocated)
                   **{k: m.get(k) for k in ("step_time_s", "tokens_per_s", "peak_memory_mb")},
                   "final_loss": m["loss"], "config": to_flat(cfg)}, f, indent=2)
    print(f"wrote {os.path.join(out, 'result.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
