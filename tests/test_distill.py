"""Prefix self-distillation (par_ray/distill.py) on tiny shapes: the truncated prompt, the loss, the teacher (exact
truncated prompt, no gradient), the EMA update and its checkpoint, config validation, recipes, planner and sweep."""

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from par_ray.config import RecipeConfig, StageConfig, TaskConfig, TrainConfig, TrialConfig, with_overrides
from par_ray.distill import distilled_iterations, ema_update_, psd_loss, truncated_prompt
from par_ray.model.looped import build_looped
from par_ray.planner import plan
from par_ray.recipes import RECIPES, apply_recipe
from par_ray.tasks import build_task, get_task
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare
from par_ray.trial import resolve, validate

ROOT = Path(__file__).resolve().parents[1]
TASK = TaskConfig(name="s5", train_depth=4)
TRAIN = TrainConfig(batch_size=4, warmup_steps=0, lr=1e-2)


def psd_trial(recipe: str = "psd_ema", **train) -> TrialConfig:
    base = TrialConfig(task=TASK, recipe=RecipeConfig(grad_window=3, max_iterations=8),
                       train=dataclasses.replace(TRAIN, **train))
    return validate(apply_recipe(base, recipe))


def engine_for(cfg: TrialConfig):
    task = build_task(cfg.task)
    torch.manual_seed(0)
    model = build_looped(cfg.backbone, cfg.recipe, vocab_size=task.vocab_size)
    return prepare(model, cfg.train, World(), ema=resolve(cfg).ema), task


def run(engine, task, cfg, steps):
    return [train_step(engine, task, cfg.task, build_step_loss(cfg.recipe, task), 0, s, cfg.train.batch_size)
            for s in steps]


# --------------------------------------------------------------------------------------------------------------------
# The truncated prompt


def test_truncated_prompt_is_bos_first_ops_sep_queries():
    ep = get_task("swap_s5").sample(5, 3, seed=0)
    ids, reads = truncated_prompt(ep.input_ids, ep.read_positions, 5, 2, op_width=1)
    want = torch.cat([ep.input_ids[:, :3], ep.input_ids[:, 6:]], dim=1)  # [BOS, op_1, op_2, SEP, q_0 … q_4]
    assert torch.equal(ids, want)
    assert torch.equal(reads, ep.read_positions - 3)
    assert torch.equal(ids[:, reads], ep.input_ids[:, ep.read_positions])  # the same query tokens are read
    full, same = truncated_prompt(ep.input_ids, ep.read_positions, 5, 5, op_width=1)
    assert torch.equal(full, ep.input_ids) and torch.equal(same, ep.read_positions)


def test_truncated_prompt_of_multi_token_ops_and_recent_first():
    task = get_task("object_tracking")  # 3 tokens per operation
    ep = task.sample(4, 2, seed=1)
    ids, reads = truncated_prompt(ep.input_ids, ep.read_positions, 4, 1, op_width=3)
    assert torch.equal(ids[:, :4], ep.input_ids[:, :4])  # BOS + the first operation's 3 tokens
    assert torch.equal(ids[:, 4:], ep.input_ids[:, 13:]) and torch.equal(reads, ep.read_positions - 9)
    rf = build_task(TaskConfig(name="s5", op_order="recent_first")).sample(5, 2, seed=0)
    fw = get_task("s5").sample(5, 2, seed=0)
    ids_rf, _ = truncated_prompt(rf.input_ids, rf.read_positions, 5, 2, op_width=1, op_order="recent_first")
    ids_fw, _ = truncated_prompt(fw.input_ids, fw.read_positions, 5, 2, op_width=1)
    # recent first keeps the first two *applied* operations, listed op_2, op_1
    assert torch.equal(ids_rf[:, 1:3], ids_fw[:, 1:3].flip(1)) and torch.equal(ids_rf[:, 3:], ids_fw[:, 3:])


def test_truncated_prompt_refuses_bad_input():
    ep = get_task("s5").sample(3, 2, seed=0)
    with pytest.raises(ValueError, match="recipe.distill: the task has no serial"):
        truncated_prompt(ep.input_ids, ep.read_positions, 3, 1, op_width=None)
    with pytest.raises(ValueError, match=r"n_ops: must be in \[1, depth=3\]"):
        truncated_prompt(ep.input_ids, ep.read_positions, 3, 0, op_width=1)
    with pytest.raises(ValueError, match="task.op_order"):
        truncated_prompt(ep.input_ids, ep.read_positions, 3, 1, op_width=1, op_order="backward")


# --------------------------------------------------------------------------------------------------------------------
# The loss


def test_psd_loss_is_ce_on_the_final_answer_and_tempered_kl_before():
    torch.manual_seed(0)
    K, B, Q, V, d, c, T = 3, 2, 1, 7, 5, 2, 2.0  # iterations 1, 2, 3: c·k = 2, 4 < 5 get KL; k = 3 gets CE on z_5
    student = torch.randn(K, B, Q, V, requires_grad=True)
    teacher = {1: torch.randn(B, Q, V), 2: torch.randn(B, Q, V)}
    states = torch.randint(0, V, (B, d, Q))
    out = psd_loss(student, [1, 2, 3], teacher, states, c, T)
    assert distilled_iterations([1, 2, 3], d, c) == [1, 2]

    def kl(t, s):  # KL(teacher ‖ student) of the softened distributions, × T²
        p_t = F.softmax(t / T, -1)
        return (p_t * (p_t.log() - F.log_softmax(s / T, -1))).sum(-1).mean() * T * T

    want = [kl(teacher[1], student[0]), kl(teacher[2], student[1]),
            F.cross_entropy(student[2].flatten(0, 1), states[:, -1].flatten())]
    torch.testing.assert_close(out.per_iteration_K, torch.stack(want).detach())
    torch.testing.assert_close(out.loss, torch.stack(want).mean())
    out.loss.backward()
    assert student.grad.abs().sum() > 0
    # the teacher equal to the student: no KL
    same = psd_loss(student[:2].detach(), [1, 2], {1: student[0].detach(), 2: student[1].detach()}, states, c, T)
    assert same.loss.abs() < 1e-6
    with pytest.raises(ValueError, match=r"no teacher logits for distilled iterations \[2\]"):
        psd_loss(student, [1, 2, 3], {1: teacher[1]}, states, c, T)


# --------------------------------------------------------------------------------------------------------------------
# The teacher in a training step


@pytest.mark.parametrize("recipe", ["psd_ema", "psd_live"])
def test_teacher_reads_exactly_the_truncated_prompt_without_gradient(recipe, one_thread):
    cfg = psd_trial(recipe)
    engine, task = engine_for(cfg)
    calls = []
    teacher = engine.teacher

    def spy(kind):
        inner = teacher(kind)

        def run_teacher(ids_BT, reads_Q, R, stretch):
            out = inner(ids_BT, reads_Q, R, stretch)
            calls.append((ids_BT.clone(), reads_Q.clone(), R, out.requires_grad))
            return out
        return run_teacher

    engine.teacher = spy
    res = None
    for step in range(6):  # until a step with d >= 3 (several distilled iterations)
        calls.clear()
        res = run(engine, task, cfg, [step])[0]
        if res.plan.depth >= 3:
            break
    d = res.plan.depth
    ep = task.sample(d, cfg.train.batch_size, seed=0, step=step)
    want_k = [k for k in res.iterations if k < d]  # c = 1
    assert [R_t for _, _, R_t, _ in calls] == want_k  # R_teacher = ⌈c·k / c⌉ = k
    for (ids, reads, k, grad), k_want in zip(calls, want_k):
        # [BOS, op_1 … op_k, SEP, query]: built here by hand from the episode
        assert torch.equal(ids, torch.cat([ep.input_ids[:, : 1 + k], ep.input_ids[:, 1 + d:]], dim=1))
        assert torch.equal(reads, ep.read_positions - (d - k))
        assert not grad  # the teacher's logits carry no autograd history
    if engine.ema is not None:
        assert all(p.grad is None and not p.requires_grad for p in engine.ema.parameters())
        assert not any(p is q for p in engine.ema.parameters() for q in engine.optimizer.param_groups[0]["params"])


def test_ema_update_matches_its_formula(one_thread):
    cfg = psd_trial("psd_ema")
    decay = cfg.recipe.ema_decay
    engine, task = engine_for(cfg)
    assert all(torch.equal(e, s) for e, s in zip(engine.ema.parameters(), engine.raw.parameters()))  # starts equal
    before = [p.detach().clone() for p in engine.ema.parameters()]
    run(engine, task, cfg, [0])
    student = list(engine.raw.parameters())
    for old, new, s in zip(before, engine.ema.parameters(), student):
        torch.testing.assert_close(new, decay * old + (1 - decay) * s.detach(), rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(old, s) for old, s in zip(before, student))  # the student moved, so the test bites
    a, b = [torch.ones(3)], [torch.zeros(3)]
    ema_update_(a, b, 0.25)
    assert torch.equal(a[0], torch.full((3,), 0.25))
    with pytest.raises(ValueError, match=r"recipe.ema_decay: must be in \[0, 1\)"):
        ema_update_(a, b, 1.0)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ema_is_saved_and_a_resumed_run_continues_it(strategy, tmp_path, one_thread):
    cfg = psd_trial("psd_ema", strategy=strategy)
    straight, task = engine_for(cfg)
    want = [r.loss for r in run(straight, task, cfg, range(4))]
    first, _ = engine_for(cfg)
    got = [r.loss for r in run(first, task, cfg, range(2))]
    first.save(str(tmp_path), {"step": 2})
    resumed, _ = engine_for(cfg)
    assert not all(torch.equal(a, b) for a, b in zip(resumed.ema.parameters(), first.ema.parameters()))
    resumed.load(str(tmp_path))
    for a, b in zip(resumed.ema.parameters(), first.ema.parameters()):
        assert torch.equal(a, b)
    got += [r.loss for r in run(resumed, task, cfg, range(2, 4))]
    assert got == pytest.approx(want, abs=1e-6)
    for a, b in zip(resumed.ema.parameters(), straight.ema.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_resuming_without_the_ema_in_the_checkpoint_is_refused(tmp_path, one_thread):
    engine, _ = engine_for(psd_trial("psd_live"))
    engine.save(str(tmp_path), {"step": 0})
    ema_engine, _ = engine_for(psd_trial("psd_ema"))
    with pytest.raises(ValueError, match="holds no EMA teacher"):
        ema_engine.load(str(tmp_path))


# --------------------------------------------------------------------------------------------------------------------
# Config, recipes, planner, sweep


def test_bad_distill_fields_are_rejected_with_field_and_allowed_values():
    bad = with_overrides(TrialConfig(task=TASK), recipe=dict(distill="teacher", ema_decay=1.0,
                                                             distill_temperature=0.0))
    with pytest.raises(ValueError) as e:
        validate(bad)
    msg = str(e.value)
    assert "recipe.distill: 'teacher' is not one of ['none', 'ema', 'live']" in msg
    assert "recipe.ema_decay: must be in [0, 1), got 1.0" in msg
    assert "recipe.distill_temperature: must be > 0, got 0.0" in msg
    for decay in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"recipe.ema_decay: must be in \[0, 1\)"):
            validate(with_overrides(TrialConfig(), recipe=dict(ema_decay=decay)))
    with pytest.raises(ValueError, match="recipe.targets: 'progress' with recipe.distill='ema'"):
        validate(with_overrides(TrialConfig(), recipe=dict(distill="ema")))
    with pytest.raises(ValueError, match="recipe.distill: task 'reachability' has no serial"):
        validate(apply_recipe(TrialConfig(task=TaskConfig(name="reachability")), "psd_live"))
    with pytest.raises(ValueError, match="recipe.dense_targets: must be false with recipe.distill"):
        validate(with_overrides(apply_recipe(TrialConfig(), "psd_ema"), recipe=dict(dense_targets=True)))


@pytest.mark.parametrize("train", [dict(strategy="ddp", num_workers=2), dict(strategy="fsdp", num_workers=2),
                                   *(dict(strategy="deepspeed", num_workers=2, zero_stage=z) for z in (1, 2, 3))])
def test_psd_recipes_validate_under_every_strategy(train):
    for name in ("psd_ema", "psd_live", "final_answer"):
        cfg = psd_trial(name, **train)
        assert cfg.recipe.name == name and cfg.recipe.targets == "final"
        assert cfg.recipe.distill == {"psd_ema": "ema", "psd_live": "live", "final_answer": "none"}[name]
        assert resolve(cfg).ema == (name == "psd_ema")
    assert list(RECIPES)[-2:] == ["psd_ema", "psd_live"]
    staged = dataclasses.replace(psd_trial("par"), stages=(StageConfig(), StageConfig(steps=1, recipe="psd_ema")))
    assert staged.recipe.distill == "none" and resolve(staged).ema  # a stage's EMA teacher is kept from step 0


def test_planner_counts_the_ema_teacher_per_gpu():
    kw = dict(R=8, grad_window=4, micro_batch=2, seq_len=40, dtype="bf16")
    for strategy, n, stage in (("ddp", 2, 2), ("fsdp", 4, 2), ("deepspeed", 4, 3)):
        off = plan("qwen2.5-0.5b", strategy, n, zero_stage=stage, **kw)
        on = plan("qwen2.5-0.5b", strategy, n, zero_stage=stage, ema=True, **kw)
        per_gpu = 4 * (math.ceil(off.num_params / n) if strategy == "fsdp" else off.num_params)
        assert on.teacher == per_gpu and off.teacher == 0
        assert on.total - off.total == per_gpu


def test_label_free_dry_run_prints_the_plan_with_the_ema_teacher(tmp_path, write_model_dir):
    model_dir = write_model_dir(tmp_path / "models", ["qwen2.5-0.5b"])  # the weights are found: exit status 0
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run([sys.executable, str(ROOT / "sweeps/label_free.py"), "--dry-run", "--preset", "paper",
                        "--backbones", "qwen2.5-0.5b", "--seeds", "0,1", "--model-dir", model_dir],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ") and "| s5 |" in line]
    assert len(rows) == 4 * 2
    for recipe in ("par", "psd_ema", "psd_live", "final_answer"):
        assert sum(f"| {recipe} |" in row for row in rows) == 2
    assert all(("EMA teacher" in row) == ("| psd_ema |" in row) for row in rows)
    assert all(" GB (" in row for row in rows)


DEEPSPEED_SCRIPT = """
import sys, tempfile, torch
sys.path.insert(0, {root!r})
from tests.test_distill import engine_for, psd_trial, run
torch.set_num_threads(1)
cfg = psd_trial("psd_ema", strategy="ddp", lr=1e-2)
ddp, task = engine_for(cfg)
want = [r.loss for r in run(ddp, task, cfg, range(3))]
cfg = psd_trial("psd_ema", strategy="deepspeed", zero_stage=3, lr=1e-2)
ds, _ = engine_for(cfg)  # ZeRO-3: the update gathers each partitioned student parameter
got = [r.loss for r in run(ds, task, cfg, range(3))]
assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4, (got, want)
for (n, a), b in zip(ds.ema.named_parameters(), ddp.ema.parameters()):
    assert (a - b).abs().max() < 1e-5, n
with tempfile.TemporaryDirectory() as d:
    ds.save(d, {{"step": 3}})
    saved = [p.detach().clone() for p in ds.ema.parameters()]
    run(ds, task, cfg, [3])
    assert any(not torch.equal(a, b) for a, b in zip(saved, ds.ema.parameters()))
    ds.load(d)
    assert all(torch.equal(a, b) for a, b in zip(saved, ds.ema.parameters()))
print("ok")
"""


def test_deepspeed_zero3_ema_matches_ddp_and_round_trips():
    """In a fresh process: DeepSpeed runs once per process in Ray Train local mode (``strategies.deepspeed``)."""
    r = subprocess.run([sys.executable, "-c", DEEPSPEED_SCRIPT.format(root=str(ROOT))], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
