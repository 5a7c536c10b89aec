"""The first GPU's measurements (issue 15), one JSON file: what a GPU run must check before anyone trusts a plan.

Sections, each timed, each in its own ``try``/``except`` (an error is recorded, the next section still runs), each
under an alarm so one hang cannot eat the rest, all under one global time budget; the JSON is rewritten after every
section, so a run killed from outside keeps what it measured:

``environment``      torch / CUDA / NCCL / DeepSpeed / transformers versions and the device.
``matmul_peak``      the measured bf16 matmul peak (fp32 on the CPU dry path): best ``torch.mm`` FLOP/s.
``throughput.qwen2`` random-init Qwen2.5-0.5B retrofit (qwen3: Qwen3-0.6B), full vocabulary, as the training loop
``throughput.qwen3`` runs it on a GPU (fp32 master weights, bf16 autocast): PAR steps at d = R = 32, window 8, batch
                     64; step time, tokens/s, FLOPs per step (``FlopCounterMode``) and MFU = FLOP/s ÷ the bf16 peak.
``memory.qwen2``     peak memory of one steady-state step at R = 8 and R = 32 with window 8
``memory.qwen3``     (``torch.cuda.max_memory_allocated``) against ``par_ray.planner.plan``'s figure for it.
``fsdp2``            the Qwen2.5-0.5B retrofit under FSDP2 (``fully_shard`` on a one-rank NCCL mesh) and under
``zero3``            DeepSpeed ZeRO-3 (one rank): a few steps, losses, step time, peak memory vs the plan.
``ray_train``        a 20-step paper-preset trial (random init; evaluation cut to d = 32) end to end through Ray Train
                     (``TorchTrainer``, one GPU worker, NCCL backend), with its reported metrics.

Without CUDA (or with ``--dry-run``) every section runs on the CPU at tiny shapes (tiny-qwen2 / tiny-qwen3, task
vocabulary, few steps, float32, gloo) and writes the same JSON schema: ``tests/test_benchmarks.py`` runs it in CI.

Usage: ``benchmarks/gpu_check.sh`` (sets the time limit, writes ``$OUT/gpu_check.json``) or
``python benchmarks/gpu_check.py --out X.json [--dry-run] [--budget-s 420] [--skip zero3 ray_train]``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

from par_ray import planner, presets
from par_ray.config import RecipeConfig, TaskConfig, TrainConfig, with_overrides
from par_ray.model import backbones
from par_ray.model.looped import LoopedLM
from par_ray.tasks import build_task
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Plan:
    """Sizes of one run of the check: the GPU plan, or the CPU dry plan with the same structure."""

    gpu: bool
    backbones: dict[str, str]
    """Family key (section suffix) -> registry name."""
    task_vocab: bool
    """Shrink the vocabulary to the task's (tiny shapes); ``False`` keeps the checkpoint's 151,936 tokens."""
    batch: int
    depth: int
    """d = R of the throughput steps."""
    memory_R: tuple[int, ...]
    window: int
    warmup: int
    steps: int
    peak_mm: int
    """Side of the square matmul that measures the peak."""
    ray_steps: int
    sections_s: dict[str, float]
    """Alarm per section kind, seconds."""


GPU_PLAN = Plan(gpu=True, backbones={"qwen2": "qwen2.5-0.5b", "qwen3": "qwen3-0.6b"}, task_vocab=False, batch=64,
                depth=32, memory_R=(8, 32), window=8, warmup=2, steps=5, peak_mm=8192, ray_steps=20,
                sections_s={"environment": 30, "matmul_peak": 30, "throughput": 60, "memory": 60, "fsdp2": 60,
                            "zero3": 90, "ray_train": 200})
DRY_PLAN = Plan(gpu=False, backbones={"qwen2": "tiny-qwen2", "qwen3": "tiny-qwen3"}, task_vocab=True, batch=8,
                depth=4, memory_R=(2, 4), window=2, warmup=1, steps=2, peak_mm=256, ray_steps=3,
                sections_s={"environment": 30, "matmul_peak": 10, "throughput": 30, "memory": 30, "fsdp2": 30,
                            "zero3": 150, "ray_train": 150})
SECTIONS = ("environment", "matmul_peak", "throughput.qwen2", "throughput.qwen3", "memory.qwen2", "memory.qwen3",
            "fsdp2", "zero3", "ray_train")


class SectionTimeout(Exception):
    """Raised by the alarm when a section overruns its time."""


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


def _model(plan: Plan, backbone: str, vocab: int) -> LoopedLM:
    """A random-init retrofit in float32 (the loop's master weights; bf16 comes from the engine's autocast)."""
    torch.manual_seed(0)
    overrides = {"vocab_size": vocab} if plan.task_vocab else {}
    return LoopedLM(backbones.load(backbone, **overrides))


def _stepper(plan: Plan, model: LoopedLM, depth: int, strategy: str = "ddp", zero_stage: int = 2):
    """(engine, run(i) -> StepResult, T, Q) for training steps of ``model`` at d = R = ``depth``."""
    world = World(rank=0, size=1, device=_device(plan))
    train_cfg = TrainConfig(steps=10_000, batch_size=plan.batch, lr=1e-4, warmup_steps=0, use_gpu=plan.gpu,
                            strategy=strategy, zero_stage=zero_stage)
    engine = prepare(model, train_cfg, world)
    task_cfg = TaskConfig(name="swap_s5", train_depth=depth, min_train_depth=depth)
    task = build_task(task_cfg)
    recipe = RecipeConfig(grad_window=plan.window, max_iterations=max(64, depth))
    loss_fn = build_step_loss(recipe, task)
    episode = task.sample(depth, 1, seed=0)
    T, Q = episode.input_ids.shape[1], len(episode.read_positions)

    def run(i: int):
        return train_step(engine, task, task_cfg, loss_fn, seed=0, step=i, global_batch=plan.batch)

    return engine, run, T, Q


def _timed_steps(plan: Plan, run, first: int = 0) -> tuple[list[float], list[float]]:
    """Warm-up then timed steps: (seconds per timed step, losses of all steps)."""
    device, losses, times = _device(plan), [], []
    for i in range(first, first + plan.warmup):
        losses.append(run(i).loss)
    for i in range(first + plan.warmup, first + plan.warmup + plan.steps):
        _sync(device)
        t0 = time.perf_counter()
        losses.append(run(i).loss)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times, losses


def _peak_bytes(plan: Plan, run, i: int, engine) -> int:
    """Peak memory of step ``i``: CUDA's max allocated; on CPU the allocator's running-sum peak plus live state."""
    if plan.gpu:
        _sync(_device(plan))
        torch.cuda.reset_peak_memory_stats()
        run(i)
        _sync(_device(plan))
        return int(torch.cuda.max_memory_allocated())
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_memory  # the CPU peak-memory method of benchmarks/bench_memory.py

    start = bench_memory._unique_bytes(bench_memory._state_tensors(engine))
    return start + bench_memory._allocator_peak(lambda: run(i))


def _free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextlib.contextmanager
def one_rank_group(device: torch.device):
    """A one-rank process group in this process (NCCL on CUDA, gloo on CPU), as a one-GPU Ray worker has."""
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
        pass  # kept for the next section: DeepSpeed holds the first group in module globals


# --------------------------------------------------------------------------------------------------------------------
# Sections

def _version_string(v) -> str:
    return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def environment(plan: Plan) -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
           "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    import transformers

    out["transformers"] = transformers.__version__
    with contextlib.suppress(Exception):
        import deepspeed

        out["deepspeed"] = deepspeed.__version__
    with contextlib.suppress(Exception):
        import ray

        out["ray"] = ray.__version__
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(device=props.name, capability=f"{props.major}.{props.minor}", memory_bytes=props.total_memory,
                   cuda=torch.version.cuda, nccl=_version_string(torch.cuda.nccl.version()),
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
    flops = 2 * n**3
    reps = 20 if plan.gpu else 5
    for _ in range(3):
        torch.mm(a, b)
    best = 0.0
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        _sync(device)
        best = max(best, reps * flops / (time.perf_counter() - t0))
    return {"dtype": str(dtype).removeprefix("torch."), "n": n, "peak_flops_per_s": best}


def throughput(plan: Plan, family: str, results: dict) -> dict:
    """PAR training steps at d = R = ``plan.depth``: time, tokens/s, FLOPs, MFU against the measured peak."""
    backbone = plan.backbones[family]
    vocab = build_task(TaskConfig(name="swap_s5", train_depth=plan.depth)).vocab_size
    model = _model(plan, backbone, vocab)
    engine, run, T, Q = _stepper(plan, model, plan.depth)
    with FlopCounterMode(display=False) as counter:
        first = run(0)
    flops = counter.get_total_flops()
    times, losses = _timed_steps(plan, run, first=1)
    seconds = statistics.median(times)
    peak = results.get("matmul_peak", {}).get("result", {}).get("peak_flops_per_s")
    out = {"backbone": backbone, "params": backbones.parameter_count(model), "batch": plan.batch, "seq_len": T,
           "read_positions": Q, "R": first.plan.R, "grad_window": plan.window,
           "attn_implementation": model.config._attn_implementation,
           "precision": "bf16 autocast, fp32 weights" if plan.gpu else "fp32",
           "flops_per_step": flops, "step_seconds": seconds, "step_seconds_all": times,
           "tokens_per_s": plan.batch * T * first.plan.R / seconds, "flops_per_s": flops / seconds,
           "mfu": flops / seconds / peak if peak else None, "losses": [first.loss, *losses]}
    del engine, model, run
    _free(_device(plan))
    return out


def memory(plan: Plan, family: str) -> dict:
    """Measured peak of one steady-state step at each R in ``plan.memory_R`` (window ``plan.window``) vs the plan."""
    backbone = plan.backbones[family]
    rows = []
    for R in plan.memory_R:
        vocab = build_task(TaskConfig(name="swap_s5", train_depth=R)).vocab_size
        model = _model(plan, backbone, vocab)
        engine, run, T, Q = _stepper(plan, model, R)
        run(0)  # creates the AdamW state, as every later step has it
        measured = _peak_bytes(plan, run, 1, engine)
        p = planner.plan(backbone, "ddp", 1, R, plan.window, plan.batch, T, dtype="bf16" if plan.gpu else "fp32",
                         read_positions=Q, vocab_size=vocab if plan.task_vocab else None)
        rows.append({"R": R, "grad_window": plan.window, "batch": plan.batch, "seq_len": T, "measured_bytes": measured,
                     "planned_bytes": p.total, "plan_error": (p.total - measured) / measured})
        del engine, model, run
        _free(_device(plan))
    return {"backbone": backbone, "rows": rows}


def sharded(plan: Plan, strategy: str, zero_stage: int = 2) -> dict:
    """A few steps of the qwen2 retrofit under ``strategy`` on a one-rank group, its peak memory and the plan."""
    device = _device(plan)
    backbone = plan.backbones["qwen2"]
    R = plan.memory_R[0]
    vocab = build_task(TaskConfig(name="swap_s5", train_depth=R)).vocab_size
    with one_rank_group(device) as backend:
        model = _model(plan, backbone, vocab)
        engine, run, T, Q = _stepper(plan, model, R, strategy=strategy, zero_stage=zero_stage)
        times, losses = _timed_steps(plan, run)
        measured = _peak_bytes(plan, run, plan.warmup + plan.steps, engine) if plan.gpu else None
        p = planner.plan(backbone, strategy, 1, R, plan.window, plan.batch, T, zero_stage=zero_stage,
                         dtype="bf16" if plan.gpu else "fp32", read_positions=Q,
                         vocab_size=vocab if plan.task_vocab else None)
        out = {"backbone": backbone, "strategy": strategy, "backend": backend, "R": R, "grad_window": plan.window,
               "batch": plan.batch, "seq_len": T, "losses": losses, "step_seconds": statistics.median(times),
               "measured_bytes": measured, "planned_bytes": p.total,
               "plan_error": (p.total - measured) / measured if measured else None}
        if strategy == "deepspeed":
            out["zero_stage"] = zero_stage
        del engine, model, run
    _free(device)
    return out


def ray_train(plan: Plan, storage: str) -> dict:
    """A short trial through Ray Train: the paper preset on one GPU with NCCL (dry: the local preset, gloo)."""
    from par_ray.train.trainer import MetricsLog, build_trainer, local_ray

    if plan.gpu:
        base = presets.paper_trial(plan.backbones["qwen2"])
        cfg = with_overrides(base, backbone={"pretrained": None},  # random init: the check machine has no hub access
                             train={"steps": plan.ray_steps, "num_workers": 1, "use_gpu": True,
                                    "eval_every": plan.ray_steps, "report_every": 5, "checkpoint_every": 0},
                             eval={"depths": (base.task.train_depth,), "num_sequences": 128, "batch_size": 128})
        ray_kwargs = {"num_cpus": 8, "num_gpus": 1}
    else:
        base = presets.local_trial(plan.backbones["qwen2"])
        cfg = with_overrides(base, train={"steps": plan.ray_steps, "num_workers": 1, "batch_size": plan.batch,
                                          "eval_every": plan.ray_steps, "report_every": 1, "checkpoint_every": 0,
                                          "threads_per_worker": 1},
                             eval={"depths": (base.task.train_depth,), "num_sequences": 16, "batch_size": 16})
        ray_kwargs = {"num_cpus": 2}
    log = MetricsLog(os.path.join(storage, "metrics.jsonl"))
    t0 = time.perf_counter()
    with local_ray(**ray_kwargs):
        result = build_trainer(cfg, "gpu_check", storage_path=storage, callbacks=[log]).fit()
    wall = time.perf_counter() - t0
    records = log.read()
    failures = [r["failure"] for r in records if "failure" in r]
    m = result.metrics or {}
    keep = ("step", "loss", "step_time_s", "tokens_per_s", "peak_memory_mb", "train_seconds", "G",
            f"acc_d{cfg.task.train_depth}")
    return {"backbone": cfg.backbone.name, "preset": "paper" if plan.gpu else "local", "backend":
            "nccl" if cfg.train.use_gpu else "gloo", "workers": cfg.train.num_workers, "steps": cfg.train.steps,
            "wall_seconds": wall, "error": repr(result.error) if result.error else None, "failures": failures,
            "reports": len([r for r in records if "metrics" in r]),
            "final": {k: m[k] for k in keep if k in m}}


# --------------------------------------------------------------------------------------------------------------------

def _write(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, default=str)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write (rewritten after every section)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes (automatic without CUDA)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="global time budget in seconds (default 420 on a GPU, 300 dry); sections that would start "
                         "past it are skipped")
    ap.add_argument("--skip", nargs="*", default=[], choices=SECTIONS, help="sections to leave out")
    args = ap.parse_args(argv)

    plan = DRY_PLAN if args.dry_run or not torch.cuda.is_available() else GPU_PLAN
    budget = args.budget_s if args.budget_s is not None else (420.0 if plan.gpu else 300.0)
    threads = torch.get_num_threads()
    if not plan.gpu:
        torch.set_num_threads(1)  # the dry path shares a CPU; timings are not its point
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    t_start = time.perf_counter()
    doc = {"schema": SCHEMA_VERSION, "dry_run": not plan.gpu,
           "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "budget_s": budget, "elapsed_s": 0.0, "sections": {}}
    sections = doc["sections"]
    storage = tempfile.mkdtemp(prefix="gpu_check_ray_")  # Ray checkpoints stay off $OUT (GBs on a GPU)

    current = {"name": None}

    def on_term(signum, frame):  # `timeout` (gpu_check.sh) or the machine ends us: keep what was measured
        if current["name"]:
            sections[current["name"]] = {"status": "killed", "error": f"signal {signum} during this section"}
        doc["elapsed_s"] = time.perf_counter() - t_start
        _write(args.out, doc)
        sys.exit(128 + signum)

    previous_term = signal.signal(signal.SIGTERM, on_term)
    jobs = {
        "environment": lambda: environment(plan),
        "matmul_peak": lambda: matmul_peak(plan),
        "throughput.qwen2": lambda: throughput(plan, "qwen2", sections),
        "throughput.qwen3": lambda: throughput(plan, "qwen3", sections),
        "memory.qwen2": lambda: memory(plan, "qwen2"),
        "memory.qwen3": lambda: memory(plan, "qwen3"),
        "fsdp2": lambda: sharded(plan, "fsdp"),
        "zero3": lambda: sharded(plan, "deepspeed", zero_stage=3),
        "ray_train": lambda: ray_train(plan, storage),
    }
    for name in SECTIONS:
        left = budget - (time.perf_counter() - t_start)
        if name in args.skip:
            sections[name] = {"status": "skipped", "reason": "--skip"}
        elif left < 5:
            sections[name] = {"status": "skipped", "reason": f"time budget of {budget:.0f} s spent"}
        else:
            limit = min(plan.sections_s[name.split(".")[0]], left)
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
    if dist.is_initialized():
        dist.destroy_process_group()
    shutil.rmtree(storage, ignore_errors=True)
    failed = [n for n, s in sections.items() if s["status"] in ("error", "timeout")]
    print(f"gpu_check: wrote {args.out}; {len(failed)} section(s) failed{': ' + ', '.join(failed) if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
