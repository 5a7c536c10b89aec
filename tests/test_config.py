"""TrialConfig validation, flat round trip, and every shipped recipe and preset (litgpt test_config_hub style)."""

import dataclasses

import pytest

from par_ray import presets
from par_ray.config import TrialConfig, from_flat, to_flat, with_overrides
from par_ray.recipes import RECIPES, apply_recipe


def test_default_config_is_valid():
    TrialConfig().validate()


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("backbone", presets.LOCAL_BACKBONES)
def test_every_recipe_on_local_preset_validates(recipe, backbone):
    cfg = apply_recipe(presets.local_trial(backbone), recipe).validate()
    assert cfg.recipe.name == recipe


@pytest.mark.parametrize("backbone", presets.PAPER_BACKBONES)
def test_paper_preset_validates_for_every_real_backbone(backbone):
    presets.paper_trial(backbone).validate()


def test_all_problems_reported_in_one_error():
    cfg = with_overrides(TrialConfig(), task={"name": "nope", "train_depth": 0},
                         backbone={"name": "gpt5", "split": (1, 1, 1)}, train={"strategy": "horovod"})
    with pytest.raises(ValueError) as e:
        cfg.validate()
    msg = str(e.value)
    for field in ("task.name", "task.train_depth", "backbone.name", "train.strategy"):
        assert field in msg
    assert "'swap_s5'" in msg and "'ddp'" in msg  # allowed values are named


@pytest.mark.parametrize("overrides, field", [
    ({"backbone": {"split": (2, 2, 3)}}, "backbone.split"),
    ({"backbone": {"split": (3, 0, 3)}}, "backbone.split"),
    ({"task": {"train_depth": -1}}, "task.train_depth"),
    ({"eval": {"depths": (4, 16)}}, "eval.depths"),
    ({"eval": {"depths": (16, 8)}}, "eval.depths"),
    ({"eval": {"depths": ()}}, "eval.depths"),
    ({"recipe": {"targets": "half"}}, "recipe.targets"),
    ({"task": {"op_order": "sideways"}}, "task.op_order"),
    ({"task": {"train_filler": -2}}, "task.train_filler"),
    ({"train": {"batch_size": 63, "num_workers": 2}}, "train.batch_size"),
    ({"train": {"strategy": "deepspeed"}, "recipe": {"tied": False}}, "train.strategy"),
])
def test_bad_fields_are_named(overrides, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        with_overrides(TrialConfig(), **overrides).validate()


def test_flat_round_trip_including_strings_from_mlflow():
    cfg = with_overrides(TrialConfig(), backbone={"split": (1, 4, 1)}, recipe={"anchoring": False},
                         eval={"depths": (8, 32)})
    flat = to_flat(cfg)
    assert flat["eval.depths"] == "8,32" and flat["backbone.split"] == "1,4,1"
    assert from_flat(flat) == cfg
    assert from_flat({k: str(v) for k, v in flat.items()}) == cfg  # MLflow hands params back as strings


@pytest.mark.parametrize("flat, field", [
    ({"train.nope": 1}, "train.nope"),
    ({"eval.depths": "8,,16"}, "eval.depths"),
    ({"train.steps": "many"}, "train.steps"),
    ({"recipe.anchoring": "maybe"}, "recipe.anchoring"),
])
def test_from_flat_rejects_unknown_and_malformed(flat, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        from_flat(flat)


def test_unknown_recipe_names_allowed_values():
    with pytest.raises(ValueError, match="recipe: 'magic' is not one of"):
        apply_recipe(TrialConfig(), "magic")


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrialConfig().task.train_depth = 3
