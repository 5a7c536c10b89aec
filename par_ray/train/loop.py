"""The training loop: one function for one rank or many, for a local run or a Ray cluster.

``train_loop_per_worker`` is what ``ray.train.torch.TorchTrainer`` runs on every worker (Ray Train V2). The
single-process trainer (``python -m par_ray.train``) runs the *same* function through Ray Train's local mode
(``ScalingConfig(num_workers=0)``), so there is exactly one loop (nanoGPT: "runs unchanged under python or torchrun").

Per step: plan (d, R, s) from (seed, step) → the rank's shard of the global batch → :func:`train_step`. Every
``report_every`` steps: metrics; every ``eval_every``: accuracy by depth, d50, G; every ``checkpoint_every``: a
checkpoint with the report. The last report always carries a checkpoint, so ``Result.metrics`` holds final metrics.
A trial is a list of stages (``par_ray.stages``): global step → (stage, step in stage) is pure, so the stage's recipe,
frozen parts and stretch ramp follow from the step alone, on a fresh run and on one resumed mid-stage.
Marked ``# ray`` lines are the only Ray calls.
"""

from __future__ import annotations

import os
import tempfile
import time

import ray.train  # ray
import torch

from par_ray.config import TrialConfig
from par_ray.evaluation import accuracy_by_depth, extrapolation, halting_by_depth, halting_metrics
from par_ray.halting import halt_tokens, model_vocab_size
from par_ray.model.looped import build_looped
from par_ray.objectives import dense_classes
from par_ray.tasks import build_task
from par_ray.schedules import stretch_cap
from par_ray.stages import frozen_parameters, resolve_stages, stage_at, uses_halting
from par_ray.train.step import train_step
from par_ray.train.strategies import World, prepare


class _Printer:
    """Rank-0 progress lines; other ranks get :class:`_Silent` (a null object, no scattered rank checks)."""

    def __call__(self, msg: str) -> None:
        print(msg, flush=True)


class _Silent:
    def __call__(self, msg: str) -> None:
        pass


def eval_metrics(engine, task, cfg: TrialConfig, recipe=None, halt=None) -> dict[str, float]:
    """Accuracy at every test depth (``acc_d{D}``, ``acc_query_d{D}``), ``chance``, ``d50``, ``G``, ``G_censored``.

    ``recipe``: the current stage's recipe (default ``cfg.recipe``); when it trains halting (and ``halt`` holds the
    halting tokens), also the halting-vs-oracle metrics of :func:`par_ray.evaluation.halting_metrics`.
    """
    world = engine.world
    recipe = recipe or cfg.recipe
    acc = accuracy_by_depth(engine.model, task, cfg.eval, recipe.ops_per_iteration, engine.device,
                            world.rank, world.size, engine.all_reduce_sum)
    ex = extrapolation({d: v["acc"] for d, v in acc.items()}, task.full_state_chance, cfg.task.train_depth)
    out = {"chance": task.full_state_chance, "G": ex.G, "G_censored": float(ex.censored)}
    if ex.d50 is not None:
        out["d50"] = float(ex.d50)
    for d, v in acc.items():
        out[f"acc_d{d}"] = v["acc"]
        out[f"acc_query_d{d}"] = v["acc_query"]
    if recipe.halting and halt is not None:
        res = halting_by_depth(engine.model, task, cfg.eval, recipe.ops_per_iteration, halt, engine.device,
                               world.rank, world.size, engine.all_reduce_sum)
        out.update(halting_metrics(res, recipe.ops_per_iteration))
    return out


def train_loop_per_worker(loop_config: dict) -> None:
    """Ray Train worker function. ``loop_config = {"trial": TrialConfig, "export_dir": str | None}``.

    ``export_dir``: also save the final state there, in the strategy's checkpoint format (ddp: ``state.pt``).
    """
    cfg: TrialConfig = loop_config["trial"]
    export_dir = loop_config.get("export_dir")
    tc = cfg.train
    ctx = ray.train.get_context()  # ray
    world = World(rank=ctx.get_world_rank(), size=ctx.get_world_size(),
                  device=ray.train.torch.get_device() if tc.use_gpu else torch.device("cpu"))  # ray
    if tc.threads_per_worker:
        torch.set_num_threads(tc.threads_per_worker)
    log = _Printer() if world.rank == 0 else _Silent()

    task = build_task(cfg.task)  # evaluation prompts
    train_task = build_task(cfg.task, train=True)  # the same, or with TaskConfig.train_filler separators
    stages = resolve_stages(cfg)
    halting = uses_halting(cfg)  # then the vocabulary gains the halting tokens from the start (par_ray.halting)
    halt = halt_tokens(task, cfg.backbone) if halting else None
    torch.manual_seed(tc.seed)  # identical init on every rank
    base_vocab = model_vocab_size(task, cfg.backbone, halting)  # task tokens (+ halting tokens)
    model = build_looped(cfg.backbone, cfg.recipe, vocab_size=base_vocab + dense_classes(task, cfg.recipe))
    engine = prepare(model, tc, world)

    start, train_seconds = 0, 0.0
    checkpoint = ray.train.get_checkpoint()  # ray
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            extra = engine.load(d)
        start, train_seconds = extra["step"], extra["train_seconds"]
        log(f"resumed from step {start}")

    last_eval: dict[str, float] = {}
    window = {"loss": 0.0, "seconds": 0.0, "tokens": 0, "n": 0}
    stage, frozen = None, []
    for step in range(start, tc.steps):
        if step == tc.fail_at_step and checkpoint is None:
            _kill_rank_zero(engine)  # fault injection, once: the restarted group resumes from a checkpoint
        now, in_stage = stage_at(stages, step)
        if now is not stage:
            stage, frozen = now, frozen_parameters(engine.raw, now.frozen)
            if len(stages) > 1:
                log(f"stage {stage.index}: steps {stage.start}..{stage.end}, recipe {stage.recipe.name}, "
                    f"frozen {stage.frozen}")
        s_max = stretch_cap(stage.recipe.stretch_max, in_stage, stage.steps) if stage.recipe.stretch_ramp else None
        res = train_step(engine, train_task, cfg.task, stage.recipe, tc.seed, step, tc.batch_size, world.rank,
                         world.size, halt=halt, stretch_max=s_max, frozen=frozen, dense_offset=base_vocab)
        train_seconds += res.seconds
        window["loss"] += res.loss
        window["seconds"] += res.seconds
        window["tokens"] += res.tokens
        window["n"] += 1
        done = step + 1
        is_last = done == tc.steps
        if done % tc.eval_every == 0 or is_last:
            last_eval = eval_metrics(engine, task, cfg, stage.recipe, halt)
        want_ckpt = is_last or (tc.checkpoint_every and done % tc.checkpoint_every == 0)
        if done % tc.report_every == 0 or is_last or want_ckpt:
            n = max(window["n"], 1)
            # Losses, accuracy and state RMS are means over this rank's rows; average them over ranks (equal
            # shards) so the report is the global batch's, whatever the world size.
            K = len(res.per_iteration)
            window_loss, last_loss, train_acc, *rest = _mean_over_ranks(
                engine, [window["loss"], res.loss, res.accuracy, *res.per_iteration, *res.state_rms])
            per_iteration, state_rms = rest[:K], rest[K:]
            halt_train = {}
            if res.halt_loss is not None:  # the same stage on every rank, so every rank joins this all-reduce
                halt_loss, halt_acc = _mean_over_ranks(engine, [res.halt_loss, res.halt_accuracy])
                halt_train = {"halt_loss": halt_loss, "halt_train_acc": halt_acc}
            metrics = {
                "step": done,
                "loss": window_loss / n,
                "loss_last_step": last_loss,
                **{f"loss_k{k}": v for k, v in zip(res.iterations, per_iteration)},
                **{f"rms_k{k}": v for k, v in enumerate(state_rms, start=1)},
                "train_acc": train_acc,
                "depth": res.plan.depth,
                "R": res.plan.R,
                "lr": engine.lr,
                "grad_norm": res.grad_norm,
                "step_time_s": window["seconds"] / n,
                "tokens_per_s": window["tokens"] * world.size / max(window["seconds"], 1e-9),
                "peak_memory_mb": _peak_memory_mb(world.device),
                "train_seconds": train_seconds,
                "stage": stage.index,
                **halt_train,
                **last_eval,
            }
            log(f"step {done:>6}/{tc.steps}  loss {metrics['loss']:.4f}  "
                f"{n / max(window['seconds'], 1e-9):.2f} steps/s"
                + (f"  acc_d{cfg.task.train_depth} {last_eval.get(f'acc_d{cfg.task.train_depth}', float('nan')):.3f}"
                   f"  G {last_eval['G']:.2f}" if last_eval else ""))
            window = {"loss": 0.0, "seconds": 0.0, "tokens": 0, "n": 0}
            if want_ckpt:
                extra = {"step": done, "train_seconds": train_seconds}
                with tempfile.TemporaryDirectory() as d:
                    engine.save(d, extra)
                    ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))  # ray
                if is_last and export_dir:  # a copy outside Ray's storage (local mode keeps no checkpoint files)
                    os.makedirs(export_dir, exist_ok=True)
                    engine.save(export_dir, extra)  # every rank: sharded strategies write their own part
            else:
                ray.train.report(metrics)  # ray


def _mean_over_ranks(engine, values: list[float]) -> list[float]:
    """Element-wise mean of ``values`` over ranks (one all-reduce; every rank calls it at the same step)."""
    t = torch.tensor(values, dtype=torch.float64, device=engine.device)
    return (engine.all_reduce_sum(t) / engine.world.size).tolist()


def _kill_rank_zero(engine) -> None:
    """Fault injection (``train.fail_at_step``): worker rank 0 dies with ``os._exit(1)``, like a lost node.

    A worker hands each report to Ray Train's controller through a one-slot queue that the controller polls every
    health-check interval (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s by default). A worker that dies right after
    reporting a checkpoint can take that report with it, unregistered; the restarted group then resumes from an
    older checkpoint, or from none and dies again. So every rank first waits until its queue is empty (the poll has
    taken the report), then one more interval for that poll's reply to reach the controller, and all ranks meet at
    a barrier before rank 0 exits. The other ranks carry on into the next step's collectives and are stopped by Ray.
    ``build_trainer`` refuses fault injection in local mode and unless a checkpoint precedes the fault step.
    """
    from ray.train.v2._internal.constants import (  # ray: no public "report consumed" API
        DEFAULT_HEALTH_CHECK_INTERVAL_S, HEALTH_CHECK_INTERVAL_S_ENV_VAR)
    from ray.train.v2._internal.execution.context import get_train_context  # ray

    get_train_context().get_result_queue().join()  # ray: returns once the controller's poll took our last report
    time.sleep(float(os.environ.get(HEALTH_CHECK_INTERVAL_S_ENV_VAR, DEFAULT_HEALTH_CHECK_INTERVAL_S)))
    engine.all_reduce_sum(torch.zeros(1, device=engine.device))  # barrier
    if engine.world.rank == 0:
        os._exit(1)


def _peak_memory_mb(device: torch.device) -> float:
    """Peak allocated memory on CUDA; peak resident set size of this process on CPU (MB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
