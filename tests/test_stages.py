"""Stages (a trial as a list of stages), the positional-stretch ramp, the new config fields' validation, and that a
default single-stage run gives the same losses as the plain training step."""

import dataclasses

import pytest
import torch

from par_ray.config import (EvalConfig, RecipeConfig, StageConfig, TaskConfig, TrainConfig, TrialConfig, from_flat,
                            to_flat, with_overrides)
from par_ray.model.looped import build_looped
from par_ray.recipes import RECIPES, apply_recipe, stage_recipe
from par_ray.schedules import plan_step, stretch_cap
from par_ray.stages import resolve_stages, stage_at
from par_ray.tasks import build_task, get_task
from par_ray.trial import resolve, validate


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread per module


def _trial(steps=10, stages=(StageConfig(),), **sections):
    cfg = TrialConfig(train=TrainConfig(steps=steps), stages=stages)
    return with_overrides(cfg, **sections) if sections else cfg


# ---------------------------------------------------------------------------------------------------------------------
# global step -> (stage, step in stage)


def test_default_is_one_stage_of_the_trial_recipe():
    cfg = TrialConfig()
    (s,) = resolve_stages(cfg)
    assert (s.start, s.end, s.frozen, s.recipe) == (0, cfg.train.steps, "none", cfg.recipe)
    assert not resolve(cfg).halting


def test_stage_bounds_and_pure_step_mapping():
    cfg = validate(apply_recipe(_trial(steps=20), "par_halt_posthoc"))
    a, b = resolve_stages(cfg)
    assert (a.start, a.end, b.start, b.end) == (0, 18, 18, 20) and b.frozen == "all_but_coda"
    assert not a.recipe.halting and b.recipe.halting and resolve(cfg).halting
    assert b.recipe.depth_schedule == "hold"  # the stage recipe keeps the trial's method and adds halting
    assert [(stage_at([a, b], s)[0].index, stage_at([a, b], s)[1]) for s in (0, 17, 18, 19)] == [
        (0, 0), (0, 17), (1, 0), (1, 1)]
    # a resumed run recomputes the same mapping from the step alone
    assert stage_at(resolve_stages(cfg), 19)[1] == 1
    with pytest.raises(ValueError, match="step"):
        stage_at([a, b], 20)


def test_explicit_stage_steps_and_a_middle_rest_stage():
    cfg = validate(_trial(steps=10, stages=(StageConfig(steps=3), StageConfig(steps=0, recipe="stretch_ramp"),
                                            StageConfig(steps=2, recipe="par"))))
    assert [(s.start, s.end) for s in resolve_stages(cfg)] == [(0, 3), (3, 8), (8, 10)]
    assert resolve_stages(cfg)[1].recipe.stretch_ramp


def test_stage_recipe_of_the_shipped_staged_recipes():
    cfg = validate(apply_recipe(_trial(steps=100), "stretch"))
    assert cfg.recipe.name == "stretch" and cfg.recipe.stretch_max == 1.0  # no stretch before the stage
    r = stage_recipe(cfg, cfg.stages[1])
    assert (r.stretch_max, r.stretch_ramp) == (8.0, True)
    assert [(s.start, s.end) for s in resolve_stages(cfg)] == [(0, 90), (90, 100)]
    # the fine-tuning stage is a share of train.steps, so train.steps set after the recipe (--steps) still works
    short = validate(with_overrides(cfg, train={"steps": 7}))
    assert [(s.start, s.end) for s in resolve_stages(short)] == [(0, 6), (6, 7)]


# ---------------------------------------------------------------------------------------------------------------------
# positional stretch stage


def test_stretch_ramp_endpoints_and_linearity():
    assert stretch_cap(8.0, 0, 11) == 1.0
    assert stretch_cap(8.0, 10, 11) == 8.0
    assert stretch_cap(8.0, 5, 11) == pytest.approx(4.5)
    assert stretch_cap(8.0, 0, 1) == 8.0  # a one-step stage runs at the cap
    assert stretch_cap(1.0, 3, 11) == 1.0


def test_stretch_changes_only_the_stretch_of_the_plan():
    task_cfg, recipe = TaskConfig(train_depth=8), RecipeConfig(stretch_max=8.0, stretch_ramp=True)
    for step in range(20):
        ramped = plan_step(task_cfg, recipe, 0, step, stretch_max=stretch_cap(8.0, step, 20))
        plain = plan_step(task_cfg, RecipeConfig(), 0, step)
        assert (ramped.depth, ramped.R) == (plain.depth, plain.R)
        assert 1.0 <= ramped.stretch <= stretch_cap(8.0, step, 20)
    assert plan_step(task_cfg, recipe, 0, 0, stretch_max=1.0).stretch == 1.0


def test_stretch_multiplies_position_ids_and_changes_nothing_else():
    """Stretch s equals the unstretched model with position ids × s fed to the one rotary call shared by prelude,
    core and coda."""
    task = get_task("swap_s5")
    ep = task.sample(4, 2, seed=0)
    torch.manual_seed(0)
    model = build_looped(TrialConfig().backbone, RecipeConfig(), vocab_size=task.vocab_size)
    seen = []
    rotary = model.rotary_emb

    class Spy(torch.nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.scale = scale

        def forward(self, x, position_ids):
            seen.append(position_ids.clone())
            return rotary(x, position_ids * self.scale)

    stretched = model.iterate(ep.input_ids, ep.read_positions, 3, stretch=2.5, read="all").logits_KBQV
    model.rotary_emb = Spy(1.0)
    assert torch.equal(model.iterate(ep.input_ids, ep.read_positions, 3, stretch=2.5, read="all").logits_KBQV,
                       stretched)
    assert len(seen) == 1  # one call: the same positions in prelude, core and coda
    T = ep.input_ids.shape[1]
    assert torch.equal(seen[0][0], torch.arange(T, dtype=torch.float32) * 2.5)
    model.rotary_emb = Spy(2.5)  # unstretched call, position ids scaled by hand: the same logits
    by_hand = model.iterate(ep.input_ids, ep.read_positions, 3, stretch=1.0, read="all").logits_KBQV
    assert torch.allclose(by_hand, stretched, atol=1e-6)
    model.rotary_emb = rotary
    assert not torch.allclose(model.iterate(ep.input_ids, ep.read_positions, 3, read="all").logits_KBQV, stretched)


# ---------------------------------------------------------------------------------------------------------------------
# validation: each bad value gives one error naming its field


@pytest.mark.parametrize("cfg, field", [
    (_trial(eval={"halt_k": 9, "halt_n": 8}), "eval.halt_k"),
    (_trial(eval={"halt_k": 0}), "eval.halt_k"),
    (_trial(eval={"halt_n": 0, "halt_k": 0}), "eval.halt_n"),
    (_trial(eval={"halt_tau": 0.0}), "eval.halt_tau"),
    (_trial(eval={"halt_tau": 1.0}), "eval.halt_tau"),
    (_trial(eval={"halt_tau": -0.2}), "eval.halt_tau"),
    (_trial(eval={"halt_rules": ((4, 8, 0.5), (8, 4, 0.5))}), "eval.halt_rules"),
    (_trial(eval={"halt_max_iterations": 10}), "eval.halt_max_iterations"),
    (_trial(eval={"halt_max_iterations": -1}), "eval.halt_max_iterations"),
    (_trial(recipe={"stretch_max": 0.5}), "recipe.stretch_max"),
    (_trial(recipe={"halt_weight": 0.0}), "recipe.halt_weight"),
    (_trial(stages=()), "stages"),
    (_trial(stages=(StageConfig(recipe="magic"),)), "stages[0].recipe"),
    (_trial(stages=(StageConfig(), StageConfig(steps=2, frozen="most"))), "stages[1].frozen"),
    (_trial(stages=(StageConfig(steps=-1), StageConfig())), "stages[0].steps"),
    (_trial(stages=(StageConfig(), StageConfig(share=1.5))), "stages[1].share"),
    (_trial(stages=(StageConfig(), StageConfig(steps=2, share=0.2))), "stages[1].share"),
    (_trial(stages=(StageConfig(), StageConfig())), "stages"),
    (_trial(stages=(StageConfig(steps=4), StageConfig(steps=4))), "stages"),
    (_trial(stages=(StageConfig(steps=10), StageConfig())), "stages"),
    (_trial(stages=(StageConfig(), StageConfig(steps=2, recipe="no_anchor"))), "stages[1].recipe"),
    (_trial(stages=(StageConfig(), StageConfig(steps=2, frozen="all_but_coda")), train={"steps": 10,
                                                                                          "strategy": "deepspeed"}),
     "stages[1].frozen"),
])
def test_each_bad_value_is_one_clear_error(cfg, field):
    with pytest.raises(ValueError) as e:
        validate(cfg)
    lines = str(e.value).splitlines()[1:]
    assert len(lines) == 1, lines
    assert lines[0].strip().startswith(f"- {field}:"), lines[0]


def test_unknown_stage_recipe_lists_allowed_values():
    with pytest.raises(ValueError, match=r"stages\[0\]\.recipe: 'magic' is not one of \['', 'par'"):
        validate(_trial(stages=(StageConfig(recipe="magic"),)))


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_validates_with_stages_under_fsdp(recipe):
    cfg = validate(apply_recipe(_trial(steps=40, train={"steps": 40, "strategy": "fsdp"}), recipe))
    assert sum(s.end - s.start for s in resolve_stages(cfg)) == 40


def test_stages_flat_round_trip():
    cfg = apply_recipe(_trial(steps=50), "par_halt_posthoc")
    cfg = with_overrides(cfg, eval={"halt_k": 5, "halt_tau": 0.7}, recipe={"halt_weight": 0.25})
    flat = to_flat(cfg)
    assert flat["stages"] == "0::none:0.0,0:halt_readout:all_but_coda:0.1"
    assert from_flat(flat) == cfg
    assert from_flat({k: str(v) for k, v in flat.items()}) == cfg
    with pytest.raises(ValueError, match="stages"):
        from_flat({"stages": "5:par:none"})


# ---------------------------------------------------------------------------------------------------------------------
# a default single-stage run gives the losses of the plain training step


def test_default_single_stage_loop_matches_plain_train_step(tmp_path, local_reports):
    from par_ray.train.step import build_step_loss, train_step
    from par_ray.train.strategies import World, prepare

    cfg = TrialConfig(task=TaskConfig(train_depth=4), recipe=RecipeConfig(grad_window=2, max_iterations=8),
                      train=TrainConfig(steps=5, batch_size=4, warmup_steps=1, threads_per_worker=1, report_every=1,
                                        eval_every=5, checkpoint_every=0),
                      eval=EvalConfig(depths=(4,), num_sequences=4, batch_size=4))
    reports = local_reports(cfg, str(tmp_path / "ray"))  # conftest: the loop in local mode

    task = build_task(cfg.task)
    torch.manual_seed(cfg.train.seed)
    engine = prepare(build_looped(cfg.backbone, cfg.recipe, vocab_size=task.vocab_size), cfg.train, World())
    loss_fn = build_step_loss(cfg.recipe, task)
    want = [train_step(engine, task, cfg.task, loss_fn, cfg.train.seed, s, 4).loss for s in range(5)]
    assert [m["loss_last_step"] for m in reports] == want  # bit-identical
    assert all(m["stage"] == 0 and "halt_loss" not in m for m in reports)
    assert not any(k.startswith("halt_") for k in reports[-1])


def test_staged_loop_reports_stage_and_halting_metrics(tmp_path, local_reports):
    base = TrialConfig(task=TaskConfig(train_depth=3), recipe=RecipeConfig(grad_window=2, max_iterations=8),
                       train=TrainConfig(steps=6, batch_size=4, warmup_steps=1, threads_per_worker=1, report_every=1,
                                         eval_every=3, checkpoint_every=0),
                       eval=EvalConfig(depths=(3,), num_sequences=4, batch_size=4))
    cfg = dataclasses.replace(apply_recipe(base, "par_halt_posthoc"),
                              stages=(StageConfig(), StageConfig(steps=3, recipe="halt_readout",
                                                                 frozen="all_but_coda")))
    reports = local_reports(cfg, str(tmp_path / "ray"))  # conftest: the loop in local mode
    assert [m["stage"] for m in reports] == [0, 0, 0, 1, 1, 1]
    assert "halt_loss" not in reports[2] and "halt_acc_d3" not in reports[2]  # PAR stage: no halting yet
    last = reports[-1]
    assert {"halt_loss", "halt_acc_d3", "oracle_acc_d3", "halt_gap_d3", "halt_iter_d3", "halt_dR_mean_d3",
            "halt_dR_std_d3", "never_halted_d3", "halt_prob_k1"} <= set(last)
    assert 0.0 <= last["never_halted_d3"] <= 1.0 and 1 <= last["halt_iter_d3"] <= 6
