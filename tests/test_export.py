"""The export (``par_ray.train.checkpoint.export_model``): ``final/`` holds the looped model's weights only, as
safetensors beside ``extra.json``, readable without par_ray and loaded by ``load_trained`` to the same bits as the
strategy's own checkpoint of the same step.

FSDP2 runs on a one-rank gloo group in this process, so its parameters are DTensor shards and the export goes through
``get_model_state_dict(full_state_dict=True)``; two-rank FSDP2 and DeepSpeed ZeRO exports are held against their
checkpoints in tests/test_train_loop_ray.py (``assert_export_loads``).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open

from par_ray import cost, presets
from par_ray.config import to_flat, with_overrides
from par_ray.model.looped import build_looped
from par_ray.tasks import build_task
from par_ray.train.checkpoint import EXPORT, EXPORT_FILE, export_model, load_trained, tied_aliases
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare
from par_ray.trial import resolve, validate


@pytest.fixture
def one_rank_group():
    """A one-rank gloo group in this process, so ``fsdp`` really shards (FSDP2 on a 1-rank mesh)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _trained_engine(strategy: str):
    """A tiny-qwen2 PAR trial after one real training step (so AdamW has state to leave out)."""
    cfg = validate(with_overrides(presets.local_trial("tiny-qwen2"), task={"train_depth": 3, "min_train_depth": 3},
                                  train={"steps": 1, "batch_size": 4, "warmup_steps": 1, "strategy": strategy}))
    trial = resolve(cfg)
    task = build_task(cfg.task, train=True)
    torch.manual_seed(0)
    model = build_looped(cfg.backbone, cfg.recipe, vocab_size=trial.vocab.size)
    engine = prepare(model, cfg.train, World())  # fsdp: shards when a process group exists
    loss_fn = build_step_loss(cfg.recipe, task, dense_offset=trial.vocab.dense_offset, op_order=cfg.task.op_order)
    train_step(engine, task, cfg.task, loss_fn, cfg.train.seed, 0, cfg.train.batch_size)
    return cfg, engine


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_export_is_the_weights_only_and_loads_bit_identical(strategy, tmp_path, request):
    if strategy == "fsdp":
        request.getfixturevalue("one_rank_group")
    cfg, engine = _trained_engine(strategy)
    if strategy == "fsdp":  # really sharded: DTensor parameters
        assert type(engine.raw.embed_tokens.weight).__name__ == "DTensor"
    extra = {"step": 1, "config": to_flat(cfg)}
    export_model(engine, str(tmp_path / "final"), extra)
    (tmp_path / "ckpt").mkdir()
    engine.save(str(tmp_path / "ckpt"), extra)  # the strategy's resumable checkpoint of the same step

    # weights and config only: no optimizer, scheduler or EMA state
    assert sorted(os.listdir(tmp_path / "final")) == ["extra.json", EXPORT_FILE]
    assert json.loads((tmp_path / "final" / "extra.json").read_text())["config"] == json.loads(json.dumps(extra["config"]))
    path = str(tmp_path / "final" / EXPORT_FILE)
    with safe_open(path, "pt") as f:  # safetensors alone, no par_ray
        keys, meta = set(f.keys()), f.metadata()
        dtypes = {f.get_tensor(k).dtype for k in keys}
    plain = build_looped(cfg.backbone, cfg.recipe, vocab_size=resolve(cfg).vocab.size)
    aliases = tied_aliases(plain)
    assert aliases == {"lm_head.weight": "embed_tokens.weight"}  # tiny-qwen2 ties its word embeddings
    assert json.loads(meta["par_ray.aliases"]) == aliases and meta["par_ray.strategy"] == strategy
    assert keys == set(plain.state_dict()) - set(aliases) and dtypes == {torch.float32}
    assert json.loads(meta["par_ray.config"]) == json.loads(json.dumps(extra["config"]))
    # size: 4 B per parameter (the planner's count, tied once) plus the JSON header
    size, want = os.path.getsize(path), cost.export_bytes(cfg)
    assert want == 4 * sum(p.numel() for p in plain.parameters())
    assert 0 <= size - want < 64 * 1024, (size, want)

    exported, checkpoint = load_trained(str(tmp_path)), load_trained(str(tmp_path / "ckpt"))
    assert exported.format == EXPORT and exported.step == 1 and exported.config == cfg
    assert checkpoint.format == strategy
    got, ref = exported.model.state_dict(), checkpoint.model.state_dict()
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert torch.equal(got[k], ref[k]), k
    assert exported.model.lm_head.weight is exported.model.embed_tokens.weight  # still tied after loading
    if strategy == "ddp":  # and the live weights themselves
        for k, v in engine.raw.state_dict().items():
            assert torch.equal(got[k], v), k
