"""Real sizes on CPU: random-init checkpoints of the exact public configs (qwen2.5-0.5b, qwen3-0.6b from
``par_ray/model/registry.py``), written with ``save_pretrained`` — what a hub download leaves on disk — and loaded
through ``backbone.pretrained=DIR``, the path a hub checkpoint takes (``backbones.load`` → ``load_checkpoint``).

Full form only (``PAR_RAY_FULL=1``): each case needs several GB of RAM and minutes on 2 cores. Each prints its time
per step and peak memory (``pytest -s``) for the README's performance section.
"""

from __future__ import annotations

import gc
import math
import resource
import time

import pytest
import torch

from par_ray.config import BackboneConfig, EvalConfig, RecipeConfig, TaskConfig, TrainConfig
from par_ray.evaluation import accuracy_by_depth
from par_ray.model import backbones
from par_ray.model.looped import build_looped
from par_ray.tasks import build_task
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare

pytestmark = [pytest.mark.slow, pytest.mark.full_only]

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


def test_two_training_steps_and_an_evaluation_at_depth_256(checkpoint):
    """Two PAR steps (batch 2, d_train 4, window 2) and one test batch at d = 256 (R = 256 iterations) on the parent
    loaded from the checkpoint; losses finite, the state RMS anchored over all 256 iterations."""
    name, directory = checkpoint
    task_cfg = TaskConfig(train_depth=4)
    recipe = RecipeConfig(grad_window=2, max_iterations=8)
    task = build_task(task_cfg)
    torch.manual_seed(0)
    rss0 = _rss_gb()
    model = build_looped(BackboneConfig(name=name, pretrained=directory), recipe)
    engine = prepare(model, TrainConfig(steps=2, batch_size=2, lr=1e-5, warmup_steps=1), World())
    loss_fn = build_step_loss(recipe, task)
    seconds = []
    for step in range(2):
        res = train_step(engine, task, task_cfg, loss_fn, seed=0, step=step, global_batch=2)
        seconds.append(res.seconds)
        assert math.isfinite(res.loss) and math.isfinite(res.grad_norm)
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
    print(f"{name}: steps {seconds[0]:.1f} s, {seconds[1]:.1f} s; evaluation at d = {EVAL_DEPTH} (1 sequence, "
          f"R = {EVAL_DEPTH}) {eval_seconds:.1f} s; peak RSS {_rss_gb():.2f} GiB (before the build {rss0:.2f}); "
          f"state RMS k = 1 {rms[0]:.3f}, k = {EVAL_DEPTH} {rms[-1]:.3f}")
    assert 0.0 <= acc[EVAL_DEPTH]["acc"] <= 1.0
    assert torch.isfinite(rms).all() and torch.allclose(rms[-1], rms[0], rtol=1e-3)
