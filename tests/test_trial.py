"""par_ray.trial: one vocabulary layout and one set of read positions for the loop, checkpoint loading and planner.

For every shipped recipe (and the dense-target, given-prefix, CoT, halting and PSD variants) the training step is run
the way the loop runs it (model built with ``resolve(cfg).vocab.size``, the halting tokens, the dense class offset),
its forward inputs are recorded, its state is saved by the engine and loaded back with ``load_trained``, and the
planner's workload for the same config (``plan_trial``) is compared with what the step really fed the model. A
dense-target trial's planned peak is held against a measured CPU peak in a subprocess.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from par_ray import planner, presets
from par_ray.config import StageConfig, TrialConfig, to_flat, with_overrides
from par_ray.cot import CotTask, cot_tokens
from par_ray.halting import halt_tokens
from par_ray.model.looped import build_looped
from par_ray.recipes import RECIPES, apply_recipe
from par_ray.schedules import plan_step
from par_ray.tasks import build_task
from par_ray.train.checkpoint import load_trained
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare
from par_ray.trial import resolve, validate

ROOT = Path(__file__).resolve().parents[1]

TINY = dict(task={"train_depth": 3, "min_train_depth": 3}, eval={"depths": (3, 6), "num_sequences": 4,
                                                                     "batch_size": 4},
            train={"steps": 4, "batch_size": 4, "warmup_steps": 1})


def _trial(name: str, **overrides) -> TrialConfig:
    """The local preset with recipe ``name`` at tiny sizes, d_train = 3 at every step; ``overrides`` per section."""
    cfg = with_overrides(apply_recipe(presets.local_trial("tiny-qwen2"), name), **TINY)
    return validate(with_overrides(cfg, **overrides))


CONFIGS = {
    **{name: (name, {}) for name in RECIPES},
    "dense": ("par", {"recipe": {"dense_targets": True, "dense_pending": True, "fixed_point_weight": 0.1}}),
    "dense_halt": ("par_halt", {"recipe": {"dense_targets": True, "dense_pending": True}}),
    "given_filler": ("par", {"recipe": {"dense_targets": True}, "task": {"given_prefix": 2, "train_filler": 2}}),
}
"""Every shipped recipe, plus the dense-target variants (with halting; with a given prefix and fillers)."""


def _run_step_like_the_loop(cfg: TrialConfig, step: int):
    """One real training step set up as ``train_loop_per_worker`` sets it up; returns (engine, the student's forward
    inputs (T, Q), the stage recipe)."""
    trial = resolve(cfg)
    task = build_task(cfg.task)
    train_task = build_task(cfg.task, train=True)
    if cfg.recipe.cot:
        train_task = CotTask(train_task, cot_tokens(trial.vocab.cot_offset))
    halt = halt_tokens(task) if trial.halting else None  # random-init: compact ids
    torch.manual_seed(0)
    model = build_looped(cfg.backbone, cfg.recipe, vocab_size=trial.vocab.size)
    engine = prepare(model, cfg.train, World(), ema=trial.ema)
    seen = []
    engine.raw.register_forward_pre_hook(lambda m, args: seen.append((args[0].shape[1], args[1].shape[0])))
    stage = trial.stages[-1]  # the last stage: a halting or stretch stage reads the most
    loss_fn = build_step_loss(stage.recipe, train_task, halt=halt, dense_offset=trial.vocab.dense_offset,
                              op_order=cfg.task.op_order)
    train_step(engine, train_task, cfg.task, loss_fn, cfg.train.seed, step, cfg.train.batch_size)
    return engine, seen[-1], stage.recipe  # the student's forward comes after any teacher's


def _longest_step(cfg: TrialConfig) -> int:
    """A step whose training batch is the longest the config draws (the most given operations and fillers)."""
    task = build_task(cfg.task, train=True)
    lengths = [task.sample(plan_step(cfg.task, cfg.recipe, cfg.train.seed, s).depth, 1, cfg.train.seed, s)
               .input_ids.shape[1] for s in range(40)]
    return max(range(40), key=lambda s: lengths[s])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_loop_checkpoint_and_planner_agree_on_vocabulary_and_reads(name, tmp_path, monkeypatch):
    recipe, overrides = CONFIGS[name]
    if recipe in ("halt_readout", "stretch_ramp"):  # stage recipes: as the second stage of a par trial
        stages = (StageConfig(), StageConfig(steps=1, recipe=recipe))
        cfg = validate(dataclasses.replace(_trial("par"), stages=stages))
    else:
        cfg = _trial(recipe, **overrides)
    trial = resolve(cfg)
    engine, (T, Q), _ = _run_step_like_the_loop(cfg, _longest_step(cfg))

    # the loop's model: task | halting | CoT | dense classes
    rows = engine.raw.embed_tokens.weight.shape[0]
    assert rows == engine.raw.lm_head.out_features == trial.vocab.size
    assert trial.vocab.dense_offset + trial.vocab.dense == rows

    # checkpoint loading rebuilds the same model from the stored config (strict load_state_dict)
    engine.save(str(tmp_path), {"step": 1, "config": to_flat(cfg)})
    loaded = load_trained(str(tmp_path)).model
    assert loaded.embed_tokens.weight.shape[0] == rows
    assert torch.equal(loaded.embed_tokens.weight, engine.raw.embed_tokens.weight.detach())

    # the planner plans that vocabulary, the longest sequence and every read position of the step
    asked = {}
    real_plan = planner.plan
    monkeypatch.setattr(planner, "plan", lambda *a, **kw: asked.update(kw) or real_plan(*a, **kw))
    planner.plan_trial(cfg)
    assert planner.model_shape("tiny-qwen2", vocab_size=asked["vocab_size"]).vocab == rows
    assert (asked["seq_len"], asked["read_positions"]) == (T, Q) == (trial.reads().seq_len, trial.reads().total)
    if "dense" in name or "given" in name:
        assert trial.reads().dense == cfg.task.train_depth + cfg.task.given_prefix


def test_the_vocabulary_is_task_then_halting_then_cot_then_dense_classes():
    task = build_task(_trial("par").task)  # swap_s5
    dense = resolve(_trial("par_halt", recipe={"dense_targets": True, "dense_pending": True})).vocab
    assert (dense.task, dense.halting, dense.cot, dense.dense) == (task.vocab_size, 3, 0, task.num_states + 1)
    assert dense.halt_offset == task.vocab_size and dense.dense_offset == task.vocab_size + 3
    assert dense.pending_id == dense.size - 1 == task.vocab_size + 3 + task.num_states
    cot = resolve(_trial("cot")).vocab
    assert (cot.cot_offset, cot.size, cot.pending_id) == (task.vocab_size, task.vocab_size + 2, None)


def test_resolve_applies_each_stage_recipe_once(monkeypatch):
    import par_ray.recipes as recipes

    calls = []
    real = recipes.RECIPES["halt_readout"]
    monkeypatch.setitem(recipes.RECIPES, "halt_readout", lambda cfg: calls.append(1) or real(cfg))
    trial = resolve(apply_recipe(presets.local_trial(), "par_halt_posthoc"))
    assert len(calls) == 1 and trial.halting and not trial.ema and trial.stages[1].recipe.halting


def test_the_loop_exports_what_load_trained_and_the_planner_expect(tmp_path):
    """End to end through the real worker function (Ray Train local mode) for the richest layout: dense targets
    with the pending class and a halting stage."""
    from par_ray.train.trainer import build_trainer

    cfg = _trial("par_halt", recipe={"dense_targets": True, "dense_pending": True},
                 train={"steps": 2, "eval_every": 2, "report_every": 2, "checkpoint_every": 0})
    build_trainer(cfg, "trial-vocab", storage_path=str(tmp_path / "ray"), local=True,
                  export_dir=str(tmp_path / "final")).fit()
    model = load_trained(str(tmp_path / "final")).model
    assert model.embed_tokens.weight.shape[0] == resolve(cfg).vocab.size == planner.model_shape(
        "tiny-qwen2", vocab_size=resolve(cfg).vocab.size).vocab


# --------------------------------------------------------------------------------------------------------------------
# The planner's memory for a dense-target trial against a measured CPU peak

_MEASURE = """
import json, sys
import torch
from par_ray.config import from_flat
from par_ray.trial import resolve
sys.path.insert(0, sys.argv[2])
import bench_memory as bench
from par_ray.tasks import build_task
from par_ray.model.looped import build_looped
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare

torch.set_num_threads(1)
cfg = from_flat(json.loads(sys.argv[1]))
trial = resolve(cfg)
task = build_task(cfg.task, train=True)
torch.manual_seed(0)
engine = prepare(build_looped(cfg.backbone, cfg.recipe, vocab_size=trial.vocab.size), cfg.train, World())
loss_fn = build_step_loss(cfg.recipe, task, dense_offset=trial.vocab.dense_offset)
step = lambda i: lambda: train_step(engine, task, cfg.task, loss_fn, cfg.train.seed, i, cfg.train.batch_size)
step(0)()  # creates the AdamW state, as every later step has it
import gc; gc.collect()
start = bench._unique_bytes(bench._state_tensors(engine))
print(json.dumps({"peak": start + bench._allocator_peak(step(1))}))
"""


def test_dense_target_plan_is_within_10_percent_of_the_measured_peak():
    """A dense-target trial (every operation position read out over task + 121 dense classes) on CPU, float32: the
    allocator's peak over one real training step (``benchmarks/bench_memory.py``'s measurement, in a fresh process)
    against ``plan_trial``. The planner before ``par_ray.trial`` counted neither the dense classes nor the dense read
    rows."""
    cfg = _trial("par", task={"train_depth": 8, "min_train_depth": 8},
                 recipe={"dense_targets": True, "dense_pending": True, "grad_window": 4},
                 train={"batch_size": 16}, eval={"depths": (8, 16)})
    proc = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(to_flat(cfg)), str(ROOT / "benchmarks")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])["peak"]
    planned = planner.plan_trial(cfg).total
    assert abs(planned - measured) / measured <= 0.10, (planned, measured)
