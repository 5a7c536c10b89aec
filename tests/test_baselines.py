"""The baselines of issue 12 (fixed_depth, more_iterations, rlt, untied, cot): configs under every strategy, forward and
loss on tiny shapes, evaluation at their R, and the chain-of-thought trace, cached decoding and greedy evaluation."""

import dataclasses
import math

import pytest
import ray
import torch
from transformers import DynamicCache

from par_ray import presets
from par_ray.config import BackboneConfig, RecipeConfig, STRATEGIES, with_overrides
from par_ray.cot import (CotTask, cot_accuracy_by_depth, cot_tokens, final_state, format_trace,
                         greedy_decode, parse_trace, trace_length)
from par_ray.evaluation import accuracy_by_depth
from par_ray.model.looped import build_looped
from par_ray.recipes import MORE_ITERATIONS_FACTOR, UNTIED_CORE_MULTIPLE, apply_recipe
from par_ray.schedules import iterations_at, plan_step
from par_ray.tasks import TASKS, build_task
from par_ray.train.loop import eval_metrics
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare
from par_ray.trial import resolve, validate

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread per module

BASELINES = ("fixed_depth", "more_iterations", "rlt", "untied", "cot")
D_TRAIN = 4


def tiny_trial(recipe: str, backbone: str = "tiny-qwen2", **sections):
    cfg = with_overrides(presets.local_trial(backbone), task=dict(train_depth=D_TRAIN),
                         train=dict(steps=4, batch_size=4, warmup_steps=1),
                         eval=dict(depths=(4, 8), num_sequences=6, batch_size=4))
    cfg = apply_recipe(cfg, recipe)
    return with_overrides(cfg, **sections) if sections else cfg


def expected_R(recipe: str, depth: int) -> int:
    return {"fixed_depth": 1, "cot": 1, "more_iterations": MORE_ITERATIONS_FACTOR * D_TRAIN, "rlt": depth,
            "untied": UNTIED_CORE_MULTIPLE}[recipe]


# ---------------------------------------------------------------------------------------------------------------------
# configs


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("recipe", BASELINES)
def test_every_baseline_validates_under_every_strategy_or_is_refused_by_name(recipe, strategy):
    cfg = with_overrides(tiny_trial(recipe), train=dict(strategy=strategy))
    if recipe == "untied" and strategy == "deepspeed":
        with pytest.raises(ValueError, match=r"train\.strategy: 'deepspeed' cannot train the untied baseline"):
            validate(cfg)
        return
    assert validate(cfg).recipe.name == recipe
    assert cfg.recipe.supervise == "last" and cfg.recipe.targets == "final"


def test_baselines_set_the_iteration_count_each_documents():
    for recipe in BASELINES:
        r = tiny_trial(recipe).recipe
        for d in (1, D_TRAIN, 3 * D_TRAIN):
            assert iterations_at(d, r.ops_per_iteration, r.fixed_iterations) == expected_R(recipe, d), recipe
    untied = tiny_trial("untied").recipe
    assert not untied.tied and untied.max_iterations == UNTIED_CORE_MULTIPLE  # 4 copies, every one runs
    assert tiny_trial("cot").recipe.cot and not tiny_trial("rlt").recipe.cot


@pytest.mark.parametrize("overrides, field", [
    ({"recipe": {"depth_schedule": "hold"}}, "recipe.depth_schedule"),
    ({"recipe": {"extra_iterations": 2}}, "recipe.extra_iterations"),
    ({"recipe": {"halting": True}}, "recipe.halting"),
    ({"recipe": {"max_iterations": 3}}, "recipe.max_iterations"),
    ({"recipe": {"supervise": "first"}}, "recipe.supervise"),
    ({"recipe": {"fixed_iterations": -1}}, "recipe.fixed_iterations"),
])
def test_fixed_iterations_refuses_what_needs_r_to_follow_depth(overrides, field):
    cfg = with_overrides(tiny_trial("more_iterations"), **overrides)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        validate(cfg)


@pytest.mark.parametrize("overrides, field", [
    ({"recipe": {"fixed_iterations": 2}}, "recipe.fixed_iterations"),
    ({"recipe": {"supervise": "window"}}, "recipe.supervise"),
    ({"recipe": {"dense_targets": True}}, "recipe.dense_targets"),
    ({"backbone": {"position_scheme": "conv"}}, "backbone.position_scheme"),
    ({"backbone": {"attention_window": 4}}, "backbone.attention_window"),
])
def test_cot_refuses_what_cached_decoding_cannot_serve(overrides, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        validate(with_overrides(tiny_trial("cot"), **overrides))


def test_plan_step_runs_the_fixed_r_at_every_depth():
    for recipe in ("more_iterations", "rlt"):
        cfg = tiny_trial(recipe)
        for step in range(6):
            plan = plan_step(cfg.task, cfg.recipe, 0, step)
            assert plan.R == expected_R(recipe, plan.depth)


# ---------------------------------------------------------------------------------------------------------------------
# forward, loss and evaluation of each baseline


def engine_and_tasks(cfg):
    task, vocab = build_task(cfg.task), resolve(cfg).vocab
    train_task = CotTask(task, cot_tokens(vocab.cot_offset)) if cfg.recipe.cot else task
    torch.manual_seed(0)
    model = build_looped(cfg.backbone, cfg.recipe, vocab_size=vocab.size)  # CoT: + STEP/END
    return prepare(model, cfg.train, World()), task, train_task


@pytest.mark.parametrize("recipe", BASELINES)
def test_baseline_forward_and_loss_train_only_the_last_iteration(recipe):
    cfg = tiny_trial(recipe)
    engine, task, train_task = engine_and_tasks(cfg)
    res = train_step(engine, train_task, cfg.task, build_step_loss(cfg.recipe, train_task), 0, 0,
                     cfg.train.batch_size)
    assert res.plan.R == expected_R(recipe, res.plan.depth)
    assert res.iterations == [res.plan.R]  # only the answer after the last iteration is supervised
    assert math.isfinite(res.loss) and res.loss > 0 and res.grad_norm > 0
    if recipe == "untied":  # each of the 4 core copies ran once, in the gradient window: all got gradients
        engine.optimizer.zero_grad(set_to_none=True)
        model = engine.raw
        ep = task.sample(D_TRAIN, 2, seed=0)
        out = model(ep.input_ids, ep.read_positions, UNTIED_CORE_MULTIPLE, cfg.recipe.grad_window, 1.0, "last")
        out.logits_KBQV.sum().backward()
        for layers in (model.core, *model.untied):
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layers.parameters())
        assert len(model.untied) == UNTIED_CORE_MULTIPLE - 1


@pytest.mark.parametrize("recipe", ["fixed_depth", "more_iterations", "rlt", "untied"])
def test_evaluation_runs_each_baseline_at_its_r(recipe):
    cfg = tiny_trial(recipe)
    engine, task, _ = engine_and_tasks(cfg)
    seen = []

    def spy(ids, reads, R, *args):
        seen.append(R)
        return engine.model(ids, reads, R, *args)

    accuracy_by_depth(spy, task, cfg.eval, cfg.recipe.ops_per_iteration, engine.device,
                      fixed_iterations=cfg.recipe.fixed_iterations)
    assert sorted(set(seen)) == sorted({expected_R(recipe, d) for d in cfg.eval.depths})
    metrics = eval_metrics(engine, task, cfg)  # the loop's evaluation, probe included
    assert {f"acc_d{d}" for d in cfg.eval.depths} <= set(metrics)
    assert f"loss_k{expected_R(recipe, D_TRAIN)}" in metrics and not any(k.startswith("cot_") for k in metrics)


# ---------------------------------------------------------------------------------------------------------------------
# chain of thought: trace format, cached decoding, greedy evaluation


@pytest.mark.parametrize("name", sorted(TASKS))
def test_trace_round_trips_and_teacher_forcing_lines_up(name):
    task = TASKS[name]
    tokens = cot_tokens(task.vocab_size)
    depth = 3
    ep = task.sample(depth, 5, seed=1, step=2)
    B, _, Q = ep.states.shape
    trace_BL = format_trace(ep.states, tokens)
    assert trace_BL.shape == (B, trace_length(depth, Q))
    for b in range(B):
        assert parse_trace(trace_BL[b], tokens) == [tuple(z) for z in ep.states[b].tolist()]
        assert final_state(trace_BL[b], tokens) == tuple(ep.states[b, -1].tolist())
    cot = CotTask(task, tokens).sample(depth, 5, seed=1, step=2)
    T = ep.input_ids.shape[1]
    assert torch.equal(cot.input_ids[:, :T], ep.input_ids)  # the prompt unchanged, then the trace
    assert torch.equal(cot.states[:, -1], trace_BL) and cot.read_positions[0] == T - 1
    # the token after each read position (but the last) is the target it was trained on: next-token prediction
    assert torch.equal(cot.input_ids[:, cot.read_positions[:-1] + 1], trace_BL[:, :-1])
    assert cot.input_ids.shape[1] == T + trace_BL.shape[1] - 1


def test_parse_trace_without_end_or_with_junk_after_it():
    tokens = cot_tokens(10)
    assert parse_trace([1, 2, tokens.step, 3, 4], tokens) is None
    assert final_state([1, 2, tokens.step, 3, 4, tokens.end, 7, 7], tokens) == (3, 4)
    assert final_state([tokens.end], tokens) == ()


@pytest.mark.parametrize("backbone", presets.LOCAL_BACKBONES)
@pytest.mark.parametrize("position_scheme", ["rope", "none"])
def test_cached_decode_equals_the_full_forward_at_r1(backbone, position_scheme):
    torch.manual_seed(0)
    model = build_looped(BackboneConfig(name=backbone, position_scheme=position_scheme), RecipeConfig(),
                         vocab_size=20).eval()
    ids = torch.randint(0, 20, (3, 11))
    with torch.no_grad():
        full = model.iterate(ids, torch.arange(11), 1, read="last").logits_KBQV[-1]
        cache = DynamicCache()
        steps = [model(ids[:, :6], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(6, 11)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="one token per call"):
        model(ids[:, :2], cache=cache)


def test_oracle_decoder_scores_one_and_pays_the_trace_length():
    """A scripted model_fn that emits the true trace: accuracy 1, cost L(d) = d (Q + 1) tokens per sequence."""
    task = TASKS["swap_s5"]
    tokens = cot_tokens(task.vocab_size)
    cfg = tiny_trial("cot").eval
    V = task.vocab_size + 2

    class Oracle:
        def __call__(self, ids, cache):
            B, T = ids.shape
            if cache.get_seq_length() == 0:  # prefill: find the test set this prompt belongs to
                self.trace, self.i = self.traces[T], 0
            cache.update(torch.zeros(B, 1, T, 1), torch.zeros(B, 1, T, 1), 0)
            logits = torch.full((B, T, V), -1.0)
            logits[:, -1].scatter_(1, self.trace[self.rows, self.i][:, None], 1.0)
            self.i += 1
            return logits

    oracle = Oracle()
    oracle.traces = {}
    for d in cfg.depths:
        ep = task.sample(d, cfg.num_sequences, seed=cfg.seed, step=0)
        oracle.traces[ep.input_ids.shape[1]] = format_trace(ep.states, tokens)
    oracle.rows = slice(None)
    # one chunk: the oracle's rows are all rows; no adaptive sampling (the local preset's eval.bracket_*): the oracle
    # knows the first pass's test sets only, and its accuracy of 1 never crosses the midpoint anyway
    chunked = dataclasses.replace(cfg, batch_size=cfg.num_sequences, bracket_max_sequences=0, bracket_min_sequences=0)
    res = cot_accuracy_by_depth(oracle, task, chunked, tokens, torch.device("cpu"))
    Q = 5
    n = float(cfg.num_sequences)
    assert res == {d: {"acc": 1.0, "acc_query": 1.0, "tokens": float(trace_length(d, Q)), "right": n, "n": n}
                   for d in cfg.depths}


def test_cot_greedy_decoding_equals_teacher_forced_argmax_on_a_trained_toy():
    cfg = tiny_trial("cot", task=dict(name="swap_s5", train_depth=2, min_train_depth=1),
                     train=dict(steps=40, batch_size=16, warmup_steps=5, lr=3e-3),
                     eval=dict(depths=(2, 3), num_sequences=8, batch_size=8))
    validate(cfg)
    engine, task, train_task = engine_and_tasks(cfg)
    losses = [train_step(engine, train_task, cfg.task, build_step_loss(cfg.recipe, train_task), 0, s,
                         cfg.train.batch_size).loss
              for s in range(cfg.train.steps)]
    assert losses[-1] < 0.7 * losses[0]  # it learned something: the argmax is not a coin toss
    model, tokens = engine.raw.eval(), cot_tokens(task.vocab_size)
    prompt = task.sample(3, 8, seed=cfg.eval.seed).input_ids
    gen_BN, lengths_B = greedy_decode(model, prompt, tokens, max_new=trace_length(3, 5))
    T, N = prompt.shape[1], gen_BN.shape[1]
    with torch.no_grad():  # teacher forcing on the greedy tokens: the argmax at every position is the next token
        tf = model.iterate(torch.cat([prompt, gen_BN[:, :-1]], 1), torch.arange(T - 1, T - 1 + N), 1, read="last")
    assert torch.equal(tf.logits_KBQV[-1].argmax(-1), gen_BN)
    ended = (gen_BN == tokens.end).any(1)
    first_end = (gen_BN == tokens.end).long().argmax(1) + 1
    assert torch.equal(lengths_B, torch.where(ended, first_end, torch.full_like(first_end, N)))
    metrics = eval_metrics(engine, task, cfg)  # the loop's evaluation of a CoT trial
    for d in cfg.eval.depths:
        assert 0.0 <= metrics[f"acc_d{d}"] <= 1.0 and 1 <= metrics[f"cot_tokens_d{d}"] <= trace_length(d, 5)
    assert "loss_k1" in metrics  # the probe reads the teacher-forced trace loss


@pytest.fixture
def one_rank_group():
    """A one-rank gloo group in this process, so ``fsdp`` really shards (FSDP2 on a 1-rank mesh)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_cot_decoding_through_fsdp2_equals_the_plain_model(one_rank_group):
    """Greedy decoding goes through the wrapper's forward (``cache=``), so FSDP2 gathers each unit's parameters."""
    cfg = with_overrides(tiny_trial("cot"), train=dict(strategy="fsdp"))
    plain, task, _ = engine_and_tasks(with_overrides(cfg, train=dict(strategy="ddp")))
    sharded, _, _ = engine_and_tasks(cfg)
    assert type(sharded.model) is not type(plain.raw)  # fully_shard swapped in its FSDP class
    tokens = cot_tokens(task.vocab_size)
    prompt = task.sample(4, 3, seed=5).input_ids
    want = greedy_decode(plain.raw, prompt, tokens, max_new=12)
    got = greedy_decode(sharded.model, prompt, tokens, max_new=12, reduce_sum=sharded.all_reduce_sum)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("recipe", ["cot", "untied"])
def test_baseline_trains_through_the_loop_and_its_export_loads(recipe, tmp_path):
    """The real worker function in Ray Train's local mode: training, evaluation (CoT: greedy, with its token cost),
    the final export, and ``load_trained`` rebuilding the same vocabulary (CoT: + STEP/END)."""
    from par_ray.train.checkpoint import load_trained
    from par_ray.train.trainer import build_trainer

    cfg = tiny_trial(recipe, train=dict(steps=3, batch_size=4, warmup_steps=1, eval_every=3, report_every=3))
    result = build_trainer(cfg, f"baseline-{recipe}", storage_path=str(tmp_path / "ray"), local=True,
                           export_dir=str(tmp_path / "final")).fit()
    m = result.metrics
    assert not ray.is_initialized()  # local mode runs in this process and must not start a Ray instance
    assert m["step"] == 3 and {f"acc_d{d}" for d in cfg.eval.depths} <= set(m)
    assert ({f"cot_tokens_d{d}" for d in cfg.eval.depths} <= set(m)) is (recipe == "cot")
    trained = load_trained(str(tmp_path / "final"))
    task = build_task(cfg.task)
    assert trained.model.lm_head.out_features == task.vocab_size + (2 if recipe == "cot" else 0)
    assert trained.config.recipe == cfg.recipe


def test_a_halting_stage_is_refused_on_a_fixed_r_baseline():
    from par_ray.config import StageConfig

    cfg = tiny_trial("fixed_depth")
    cfg = dataclasses.replace(cfg, stages=(StageConfig(), StageConfig(share=0.25, recipe="halt_readout")))
    with pytest.raises(ValueError, match=r"stages\[1\]\.recipe: 'halt_readout' trains learned halting"):
        validate(cfg)
