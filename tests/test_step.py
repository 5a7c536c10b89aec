"""The training step's loss, built once per stage from the recipe (par_ray.train.step.build_step_loss), and its
batched read-out of the gradient window against one read-out per iteration."""

import types

import pytest
import torch

from par_ray.config import RecipeConfig, from_flat
from par_ray.halting import halt_tokens, task_halt_tokens
from par_ray.model.backbones import causal_mask
from par_ray.model.looped import build_looped
from par_ray.presets import LOCAL_LOOP_OPTIONS, LOCAL_PROGRESS_OPTIONS, local_trial
from par_ray.recipes import apply_recipe
from par_ray.tasks import build_task, get_task
from par_ray.train.step import build_step_loss, train_step
from par_ray.train.strategies import World, prepare
from par_ray.trial import resolve


def _terms(loss) -> list[str]:
    return [t.__qualname__.split(".")[0] for t in loss.extras]


@pytest.mark.parametrize("recipe, terms, reads", [
    (RecipeConfig(), [], dict(halt_query=None, read_ops=False, state_change=False)),
    (RecipeConfig(halting=True), ["halting_term"], dict(read_ops=False, state_change=False)),
    (RecipeConfig(dense_targets=True), ["dense_term"], dict(halt_query=None, read_ops=True, state_change=False)),
    (RecipeConfig(dense_targets=True, fixed_point_weight=0.1, halting=True),
     ["halting_term", "dense_term", "fixed_point_term"], dict(read_ops=True, state_change=True)),
])
def test_terms_follow_the_recipe_in_a_fixed_order(recipe, terms, reads):
    task = get_task("swap_s5")
    halt = task_halt_tokens(task.vocab_size)
    loss = build_step_loss(recipe, task, halt=halt)
    assert _terms(loss) == terms
    for field, want in reads.items():
        assert getattr(loss, field) == want
    if recipe.halting:
        assert loss.halt_query == halt.query
    assert loss.state_offset == task.vocab_size  # default: dense class 0 right after the task's tokens


def test_halting_without_tokens_is_refused_when_the_loss_is_built():
    with pytest.raises(ValueError, match="recipe.halting"):
        build_step_loss(RecipeConfig(halting=True), get_task("swap_s5"))


# --- the batched read-out (LoopedLM._read_stacked) against one read-out per iteration --------------------------------

def _read_one_by_one(self, states, read_positions_Q, pos):
    """The reference read-out of the window's states: one ``readout`` call per iteration, with the coda mask
    ``iterate`` builds for B sequences."""
    mask = self._local(causal_mask(self.config, states[0]), states[0], self.coda_window)
    return torch.stack([self.readout(s_BTH, read_positions_Q, pos, mask) for s_BTH in states])


def _losses_and_grads(cfg, steps, one_by_one: bool):
    """Run training steps ``steps`` of ``cfg`` (built as the training loop builds it) and return each step's loss and
    the gradient of every parameter at each step (taken just before the optimizer step)."""
    trial = resolve(cfg)
    task = build_task(cfg.task, train=True)
    halt = halt_tokens(task, None) if trial.halting else None
    torch.manual_seed(cfg.train.seed)
    model = build_looped(cfg.backbone, cfg.recipe, vocab_size=trial.vocab.size)
    if one_by_one:
        model._read_stacked = types.MethodType(_read_one_by_one, model)
    engine = prepare(model, cfg.train, World(), ema=trial.ema)
    loss_fn = build_step_loss(cfg.recipe, task, halt=halt, dense_offset=trial.vocab.dense_offset,
                              op_order=cfg.task.op_order)
    grads, engine_step = [], engine.step

    def step_keeping_grads():
        grads.append({n: None if p.grad is None else p.grad.clone() for n, p in engine.raw.named_parameters()})
        return engine_step()

    engine.step = step_keeping_grads
    results = [train_step(engine, task, cfg.task, loss_fn, cfg.train.seed, s, cfg.train.batch_size) for s in steps]
    return results, grads


BATCHED_READOUT_RECIPES = {
    # the local sweeps' recipe: dense targets with a pending class, the fixed-point loss, a given prefix, state noise,
    # attention windows (the coda's too), every other window iteration read out, R past the window
    "local": {**LOCAL_LOOP_OPTIONS, **LOCAL_PROGRESS_OPTIONS, "recipe.state_noise": 0.1, "recipe.read_every": 2,
              "recipe.grad_window": 4},
    "par": {"recipe.grad_window": 3},
    "par read_every 2": {"recipe.grad_window": 5, "recipe.read_every": 2},
    "final_answer": {"recipe.grad_window": 3},
    "par_halt": {"recipe.grad_window": 3},
    "psd_live": {"recipe.grad_window": 3},
    "psd_ema": {"recipe.grad_window": 3, "recipe.ema_decay": 0.5},
}


@pytest.mark.parametrize("backbone", ["tiny-qwen2", "tiny-qwen3"])
@pytest.mark.parametrize("name", list(BATCHED_READOUT_RECIPES))
def test_batched_readout_equals_one_readout_per_iteration(name, backbone, one_thread):
    """The training step reads its K supervised iterations out in one coda call over the K·B stacked states; its loss,
    per-iteration losses and every parameter's gradient equal those of one read-out per iteration, at 3 steps of
    each recipe that reads out (R up to 7 with windows of 3-5: iterations before the window, K = 1..5 read-outs).
    The learning rate is 0, so every step compares gradients at the same parameters (AdamW would amplify a
    round-off difference in a near-zero gradient into the next step's parameters). Tolerance (float32): 1e-5
    relative on losses, gradients within 1e-5 of the largest gradient of their tensor (the K·B batch changes only
    the summation order of the coda's weight gradients)."""
    recipe = "par" if name.startswith("par ") or name == "local" else name
    cfg = apply_recipe(local_trial(backbone), recipe)
    cfg = from_flat({"task.train_depth": 7, "train.batch_size": 4, "train.steps": 3, "train.warmup_steps": 1,
                     "train.lr": 0.0, **BATCHED_READOUT_RECIPES[name]}, base=cfg)
    steps = range(3)
    got, got_grads = _losses_and_grads(cfg, steps, one_by_one=False)
    want, want_grads = _losses_and_grads(cfg, steps, one_by_one=True)
    assert [r.iterations for r in got] == [r.iterations for r in want]
    assert max(len(r.iterations) for r in got) > 1  # some step reads out more than one iteration
    for g, w, g_grads, w_grads in zip(got, want, got_grads, want_grads):
        assert g.loss == pytest.approx(w.loss, rel=1e-5)
        assert g.per_iteration == pytest.approx(w.per_iteration, rel=1e-5, abs=1e-7)
        assert g_grads.keys() == w_grads.keys()
        for n, want_grad in w_grads.items():
            if want_grad is None:
                assert g_grads[n] is None, n
                continue
            scale = want_grad.abs().max().item()
            assert (g_grads[n] - want_grad).abs().max().item() <= 1e-5 * max(scale, 1e-6), n
