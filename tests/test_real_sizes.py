"""Real sizes on CPU: random-init checkpoints of the exact public configs (qwen2.5-0.5b, qwen3-0.6b from
``par_ray/model/registry.py``), written with ``save_pretrained`` — what a hub download leaves on disk — and loaded
through ``backbone.pretrained=DIR``, the path a hub checkpoint takes (``backbones.load`` → ``load_checkpoint``).

Full form only (``PAR_RAY_FULL=1``): each case needs several GB of RAM and minutes on 2 cores. Each prints its time
per step and peak memory (``pytest -s``) for docs/performance.md, and holds the memory planner's terms
(``par_ray.planner.plan_trial``: parameters, AdamW state, the step's peak) against what the step really allocated
(``benchmarks/bench_memory.py``'s measurement: live tensor storages, then the CPU allocator's peak during a step).
Run one size per process (``-k qwen2.5`` / ``-k qwen3``): peak RSS is the process's.
"""

from __future__ import annotations

import gc
import math
import os
import resource
import sys
import time
from pathlib import Path

import pytest
import torch

from par_ray import cost, planner
from par_ray.config import BackboneConfig, EvalConfig, RecipeConfig, TaskConfig, TrainConfig, TrialConfig, to_flat
from par_ray.evaluation import accuracy_by_depth
from par_ray.model import backbones
from par_ray.model.looped import build_looped
from par_ray.tasks import build_task
from par_ray.train.checkpoint import EXPORT_FILE, export_model, load_trained
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare

pytestmark = [pytest.mark.slow, pytest.mark.full_only]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_memory  # noqa: E402 - the benchmark's measurement, not a copy of it

EVAL_DEPTH = 256


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


@pytest.fixture(scope="module", params=["qwen2.5-0.5b", "qwen3-0.6b"])
def checkpoint(request, tmp_path_factory):
    """(registry name, directory) of a random-init checkpoint of the exact public config, saved in bf16 as the hub's."""
    directory = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    backbones.load(request.param, dtype=torch.bfloat16).save_pretrained(directory)
    gc.collect()
    return request.param, str(directory)


def test_one_iteration_reproduces_the_parent_at_real_size(checkpoint):
    from transformers import AutoModelForCausalLM

    name, directory = checkpoint
    parent = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, use_safetensors=True)
    looped = build_looped(BackboneConfig(name=name, pretrained=directory), RecipeConfig()).eval()
    ids = torch.randint(0, 1000, (1, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = parent(ids).logits
        got = looped(ids, torch.arange(128), 1, None, 1.0, "last").logits_KBQV[0]
    diff = (got - want).abs().max().item()
    print(f"{name}: R = 1 vs parent, max |logit difference| {diff:.2e} at T = 128")
    assert diff < 1e-4


def test_two_training_steps_and_an_evaluation_at_depth_256(checkpoint, tmp_path):
    """Three PAR steps (batch 2, d_train 4, window 2; the third under the memory profiler) and one test batch at
    d = 256 (R = 256 iterations) on the parent loaded from the checkpoint; losses finite, the planner's parameter +
    AdamW bytes within 1 % and its peak within 15 % of the measured ones, the state RMS anchored over all 256
    iterations; the export (``final/``) is 4 B per parameter and loads back bit for bit."""
    name, directory = checkpoint
    cfg = TrialConfig(backbone=BackboneConfig(name=name, pretrained=directory), task=TaskConfig(train_depth=4),
                      recipe=RecipeConfig(grad_window=2, max_iterations=8),
                      train=TrainConfig(steps=3, batch_size=2, lr=1e-5, warmup_steps=1))
    task_cfg, recipe = cfg.task, cfg.recipe
    task = build_task(task_cfg)
    torch.manual_seed(0)
    rss0 = _rss_gb()
    model = build_looped(cfg.backbone, recipe)
    engine = prepare(model, cfg.train, World())
    loss_fn = build_step_loss(recipe, task)
    seconds, results = [], []

    def step(i):
        results.append(train_step(engine, task, task_cfg, loss_fn, seed=0, step=i, global_batch=2))
        seconds.append(results[-1].seconds)

    step(0)  # creates the AdamW state, as every later step has it
    step(1)  # timed as a plain step
    gc.collect()
    state = bench_memory._unique_bytes(bench_memory._state_tensors(engine))  # parameters, buffers, AdamW m and v
    peak = state + bench_memory._allocator_peak(lambda: step(2))
    for res in results:
        assert math.isfinite(res.loss) and math.isfinite(res.grad_norm)
    plan = planner.plan_trial(cfg)
    gb = 1e9
    print(f"{name}: plan (fp32, ddp, 1 worker, R = {plan.R}, window {plan.grad_window}, B = {plan.micro_batch}, "
          f"T = {plan.seq_len}): parameters {plan.params / gb:.2f} GB + AdamW {plan.optimizer / gb:.2f} GB = "
          f"{(plan.params + plan.optimizer) / gb:.2f} GB vs {state / gb:.2f} GB live at the step's start; gradients "
          f"{plan.grads / gb:.2f} GB, activations {plan.activations / gb:.3f} GB; peak ({plan.peak_phase}) "
          f"{plan.total / gb:.2f} GB vs {peak / gb:.2f} GB measured (allocator)")
    assert abs(state - (plan.params + plan.optimizer)) <= 0.01 * state
    assert abs(peak - plan.total) <= 0.15 * peak, (peak, plan.total)
    outputs = []

    def model_fn(*args, **kwargs):  # the evaluation's own forward, kept for its state RMS per iteration
        outputs.append(engine.model(*args, **kwargs))
        return outputs[-1]

    t0 = time.perf_counter()
    acc = accuracy_by_depth(model_fn, task, EvalConfig(depths=(EVAL_DEPTH,), num_sequences=1, batch_size=1), 1,
                            torch.device("cpu"))
    eval_seconds = time.perf_counter() - t0
    rms = outputs[0].state_rms_R
    assert len(rms) == EVAL_DEPTH
    print(f"{name}: steps {seconds[0]:.1f} s, {seconds[1]:.1f} s, {seconds[2]:.1f} s (the last under the memory "
          f"profiler); evaluation at d = {EVAL_DEPTH} (1 sequence, R = {EVAL_DEPTH}) {eval_seconds:.1f} s; peak RSS {_rss_gb():.2f} GiB (before the build {rss0:.2f}); "
          f"state RMS k = 1 {rms[0]:.3f}, k = {EVAL_DEPTH} {rms[-1]:.3f}")
    assert 0.0 <= acc[EVAL_DEPTH]["acc"] <= 1.0
    assert torch.isfinite(rms).all() and torch.allclose(rms[-1], rms[0], rtol=1e-3)

    # the export a run leaves in final/: float32 weights only (was the full ddp state, ~11 B more per parameter)
    export_model(engine, str(tmp_path / "final"), {"step": 3, "config": to_flat(cfg)})
    size = os.path.getsize(tmp_path / "final" / EXPORT_FILE)
    print(f"{name}: export {size / 1e9:.2f} GB (planned {cost.export_bytes(cfg) / 1e9:.2f} GB: 4 B x "
          f"{plan.num_params:,} parameters)")
    assert 0 <= size - cost.export_bytes(cfg) < 1e6
    loaded = load_trained(str(tmp_path)).model.state_dict()
    for k, v in engine.raw.state_dict().items():
        assert torch.equal(loaded[k], v), k


def test_two_fsdp2_workers_on_gloo_at_0_5b(tmp_path):
    """The CLI on 2 Ray Train workers, FSDP2 over gloo, at the full qwen2.5-0.5b size: two PAR steps, one evaluation
    at d = 256 and the export, gathered from both ranks' shards, loading back; prints each worker's peak RSS (sampled
    once a second) against the planner's per-rank total."""
    import json
    import shutil
    import subprocess
    import threading

    import psutil

    from conftest import QWEN_TOKENIZER_DIR

    torch.manual_seed(0)
    backbones.load("qwen2.5-0.5b", dtype=torch.bfloat16).save_pretrained(tmp_path / "parent")
    for name in os.listdir(QWEN_TOKENIZER_DIR):  # the CLI checks a parent's tokenizer before it starts
        shutil.copy(os.path.join(QWEN_TOKENIZER_DIR, name), tmp_path / "parent")
    gc.collect()
    out = tmp_path / "run"
    overrides = ["train.batch_size=2", "train.lr=1e-5", "train.warmup_steps=1", "recipe.grad_window=2",
                 "recipe.max_iterations=8", "eval.num_sequences=2", "eval.batch_size=2", "train.eval_every=2"]
    peaks: dict[int, int] = {}
    done = threading.Event()

    def sample():
        while not done.wait(1.0):
            for proc in psutil.process_iter(["pid", "cmdline", "memory_info"]):
                if any("RayTrainWorker" in a for a in proc.info["cmdline"] or ()) and proc.info["memory_info"]:
                    peaks[proc.info["pid"]] = max(peaks.get(proc.info["pid"], 0), proc.info["memory_info"].rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "par_ray.train", "--backbone", "qwen2.5-0.5b", "--pretrained",
                            str(tmp_path / "parent"), "--workers", "2", "--strategy", "fsdp", "--steps", "2",
                            "--train-depth", "4", "--eval-depths", str(EVAL_DEPTH), "--out", str(out),
                            *[a for o in overrides for a in ("--set", o)]],
                           capture_output=True, text=True, timeout=1800, env={**os.environ, "RAY_ADDRESS": "local"})
    finally:
        done.set()
        sampler.join()
    wall = time.perf_counter() - t0
    print(r.stdout[-3000:], r.stderr[-3000:], sep="\n----- stderr -----\n")
    assert r.returncode == 0
    result = json.loads((out / "result.json").read_text())
    cfg = TrialConfig(backbone=BackboneConfig(name="qwen2.5-0.5b", pretrained=str(tmp_path / "parent")),
                      task=TaskConfig(train_depth=4), recipe=RecipeConfig(grad_window=2, max_iterations=8),
                      train=TrainConfig(steps=2, batch_size=2, num_workers=2, strategy="fsdp"))
    plan = planner.plan_trial(cfg)
    worker_peaks = sorted(peaks.values(), reverse=True)[:2]
    print(f"qwen2.5-0.5b, 2 FSDP2 workers on gloo: {wall:.0f} s wall (Ray start, build, 2 steps, evaluation at "
          f"d = {EVAL_DEPTH}, export; train {result['train_seconds']:.0f} s, evaluation {result['eval_seconds']:.0f} s); "
          f"peak RSS per worker {', '.join(f'{b / 2**30:.2f}' for b in worker_peaks)} GiB, planned "
          f"{plan.total / 2**30:.2f} GiB per rank")
    assert math.isfinite(result["final_loss"])
    loaded = load_trained(str(out))
    assert sum(p.numel() for p in loaded.model.parameters()) > 4e8
