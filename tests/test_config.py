"""TrialConfig validation, flat round trip, and every shipped recipe and preset (litgpt test_config_hub style)."""

import dataclasses
import typing

import pytest

from par_ray import presets
from par_ray.config import TrialConfig, flat_value, from_flat, to_flat, with_overrides
from par_ray.recipes import RECIPES, apply_recipe
from par_ray.trial import pretrained_kind, validate


def test_default_config_is_valid():
    validate(TrialConfig())


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("backbone", presets.LOCAL_BACKBONES)
def test_every_recipe_on_local_preset_validates(recipe, backbone):
    cfg = validate(apply_recipe(presets.local_trial(backbone), recipe))
    assert cfg.recipe.name == recipe


@pytest.mark.parametrize("backbone", presets.PAPER_BACKBONES)
def test_paper_preset_validates_for_every_real_backbone(backbone):
    validate(presets.paper_trial(backbone))


def test_all_problems_reported_in_one_error():
    cfg = with_overrides(TrialConfig(), task={"name": "nope", "train_depth": 0},
                         backbone={"name": "gpt5", "split": (1, 1, 1)}, train={"strategy": "horovod"})
    with pytest.raises(ValueError) as e:
        validate(cfg)
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
        validate(with_overrides(TrialConfig(), **overrides))


def test_flat_round_trip_including_strings_from_mlflow():
    cfg = with_overrides(TrialConfig(), backbone={"split": (1, 4, 1)}, recipe={"anchoring": False},
                         eval={"depths": (8, 32)})
    flat = to_flat(cfg)
    assert flat["eval.depths"] == "8,32" and flat["backbone.split"] == "1,4,1"
    assert from_flat(flat) == cfg
    assert from_flat({k: str(v) for k, v in flat.items()}) == cfg  # MLflow hands params back as strings


def test_halt_rules_round_trip_through_the_flat_form_and_mlflow_strings():
    assert to_flat(TrialConfig())["eval.halt_rules"] == "none"  # MLflow params are never empty
    cfg = validate(with_overrides(TrialConfig(), recipe={"halting": True},  # the rules read the halting read-out
                                  eval={"halt_rules": ((4, 8, 0.5), (6, 8, 0.3), (1, 1, 0.5))}))
    flat = to_flat(cfg)
    assert flat["eval.halt_rules"] == "4/8/0.5,6/8/0.3,1/1/0.5"
    assert from_flat(flat) == cfg and from_flat({k: str(v) for k, v in flat.items()}) == cfg
    assert from_flat(to_flat(TrialConfig())) == TrialConfig()
    # the text a --set override or a sweep cell gives, with spaces, and "" / "none" for no extra rule
    assert from_flat({"eval.halt_rules": " 4/8/0.5 , 6/8/0.3,1/1/0.5"}).eval.halt_rules == cfg.eval.halt_rules
    assert from_flat({"eval.halt_rules": "none"}, base=cfg).eval.halt_rules == ()
    assert from_flat({"eval.halt_rules": ""}, base=cfg).eval.halt_rules == ()
    assert from_flat({"eval.halt_rules": [[4, 8, 0.5]]}).eval.halt_rules == ((4, 8, 0.5),)
    assert flat_value(((4, 8, 0.5),)) == "4/8/0.5" and flat_value((8, 16)) == "8,16"


@pytest.mark.parametrize("rules, words", [
    (((9, 8, 0.5),), "9/8/0.5 (k=9 not in [1, n=8])"),
    (((0, 8, 0.5),), "0/8/0.5 (k=0 not in [1, n=8])"),
    (((4, 0, 0.5),), "4/0/0.5 (k=4 not in [1, n=0])"),
    (((4, 8, 1.0),), "4/8/1.0 (tau=1.0 not in (0, 1))"),
    (((4, 8, 0.0),), "4/8/0.0 (tau=0.0 not in (0, 1))"),
    (((4, 8, float("nan")),), "4/8/nan (tau=nan not in (0, 1))"),
    (((6, 8, 0.5),), "6/8/0.5 (repeats the primary rule"),
    (((4, 8, 0.3), (4, 8, 0.3)), "4/8/0.3 (listed twice)"),
    (((4, 8, 0.5), (4, 8)), "expected tuple[tuple[int, int, float], ...]"),
    (((4, 8.0, 0.5),), "expected tuple[tuple[int, int, float], ...]"),
])
def test_bad_halt_rules_are_one_error_naming_the_field(rules, words):
    with pytest.raises(ValueError) as e:
        validate(with_overrides(TrialConfig(), eval={"halt_rules": rules}))
    lines = str(e.value).splitlines()[1:]
    assert len(lines) == 1 and lines[0].strip().startswith("- eval.halt_rules:") and words in lines[0], lines


def test_bad_halt_rules_list_every_bad_rule_in_one_line():
    cfg = with_overrides(TrialConfig(), eval={"halt_rules": ((9, 8, 0.5), (4, 8, 0.3), (4, 8, 1.5))})
    with pytest.raises(ValueError) as e:
        validate(cfg)
    lines = str(e.value).splitlines()[1:]
    assert len(lines) == 1 and "9/8/0.5 (k=9" in lines[0] and "4/8/1.5 (tau=1.5" in lines[0]
    assert "4/8/0.3" not in lines[0].split("bad:")[1]  # the good rule is not listed


@pytest.mark.parametrize("flat, field", [
    ({"eval.halt_rules": "4/8"}, "eval.halt_rules"),
    ({"eval.halt_rules": "4/8/0.5,,6/8/0.5"}, "eval.halt_rules"),
    ({"eval.halt_rules": "4/8/high"}, "eval.halt_rules"),
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


# --------------------------------------------------------------------------------------------------------------------
# Values of the right type that are not usable values (issue 14, item 1): every field of every section.

def _all_fields():
    """(section, field, declared type) of every field of every config section (the stages: see the next test)."""
    for section in dataclasses.fields(TrialConfig):
        cls = typing.get_type_hints(TrialConfig)[section.name]
        if not dataclasses.is_dataclass(cls):  # stages: a tuple of StageConfig
            continue
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            yield section.name, f, hints[f.name]


def _legal(section: str, name: str, value) -> bool:
    """The only field/value pairs of the walk below that are legal: -1 turns fault injection off."""
    return (section, name, value) == ("train", "fail_at_step", -1)


def _wrong_type(hint):
    """A value of another type: an int where a string is declared, else a string."""
    return 3 if str in (hint, *typing.get_args(hint)) else "x"


@pytest.mark.parametrize("kind", ["inf", "nan", "negative", "wrong_type"])
def test_every_field_rejects_unusable_values_with_one_error_naming_it(kind):
    checked = 0
    for section, f, hint in _all_fields():
        value = {"inf": float("inf"), "nan": float("nan"), "negative": -1, "wrong_type": _wrong_type(hint)}[kind]
        cfg = with_overrides(TrialConfig(), **{section: {f.name: value}})
        if _legal(section, f.name, value):
            validate(cfg)
            continue
        with pytest.raises(ValueError) as e:
            validate(cfg)
        lines = str(e.value).splitlines()[1:]
        name = f"{section}.{f.name}"
        assert lines[0].strip().startswith(f"- {name}:"), (name, value, lines)
        assert "Traceback" not in str(e.value)
        checked += 1
    assert checked >= 35  # every field of the five sections


@pytest.mark.parametrize("kind", ["inf", "nan", "negative", "wrong_type"])
def test_every_stage_field_rejects_unusable_values_with_one_error_naming_it(kind):
    from par_ray.config import StageConfig

    hints = typing.get_type_hints(StageConfig)
    for f in dataclasses.fields(StageConfig):
        value = {"inf": float("inf"), "nan": float("nan"), "negative": -1, "wrong_type": _wrong_type(hints[f.name])}[kind]
        cfg = dataclasses.replace(TrialConfig(), stages=(dataclasses.replace(StageConfig(), **{f.name: value}),))
        with pytest.raises(ValueError) as e:
            validate(cfg)
        first = str(e.value).splitlines()[1].strip()
        assert first.startswith(f"- stages[0].{f.name}:"), (f.name, value, first)


@pytest.mark.parametrize("steps", [0, -5])
def test_too_few_train_steps_is_one_error_not_one_about_the_stages_too(steps):
    """``--steps 0`` said also that "the stages' fixed steps (0) must leave at least one step of train.steps=0"."""
    with pytest.raises(ValueError) as e:
        validate(from_flat({"train.steps": steps}))
    assert str(e.value).splitlines()[1:] == [f"  - train.steps: must be >= 1, got {steps}"]


@pytest.mark.parametrize("field, value", [
    ("train.lr", "inf"), ("train.lr", "nan"), ("train.lr", "-inf"), ("train.seed", "-1"), ("eval.seed", "-3"),
    ("recipe.hold_lambda", "inf"), ("recipe.stretch_max", "nan"), ("train.grad_clip", "inf"),
    ("train.weight_decay", "nan"), ("train.collective_timeout_s", "0"), ("train.fail_at_step", "-2"),
])
def test_flat_overrides_of_unusable_values_are_rejected(field, value):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        validate(from_flat({field: value}))


def test_legal_edge_values_are_accepted():
    for flat in ({"train.fail_at_step": -1, "train.checkpoint_every": 0}, {"train.grad_clip": 0.0},
                 {"train.seed": 2**63 - 1}, {"recipe.hold_lambda": 0}, {"train.lr": 1}):
        validate(from_flat(flat))


def test_pretrained_rule_local_paths_must_exist_hub_ids_are_legal(tmp_path):
    ok = lambda v: validate(with_overrides(TrialConfig(), backbone={"pretrained": v}))  # noqa: E731
    for hub in ("Qwen/Qwen2.5-0.5B", "gpt2", "Qwen/Qwen3-0.6B"):
        assert pretrained_kind(hub) == "hub"
        ok(hub)
    for missing in (str(tmp_path / "nope"), "./nope", "~/definitely/not/here", "runs/x/final"):
        assert pretrained_kind(missing) == "local"
        with pytest.raises(ValueError, match="backbone.pretrained: local directory .* does not exist"):
            ok(missing)
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        ok(str(tmp_path / "ckpt"))
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    ok(str(tmp_path / "ckpt"))
    for junk in ("", "org/name with space", "a/b c"):
        with pytest.raises(ValueError, match="backbone.pretrained"):
            ok(junk)


# --------------------------------------------------------------------------------------------------------------------
# What the task itself cannot serve, refused at config time (before any worker builds the task).

@pytest.mark.parametrize("overrides, field, words", [
    ({"task": {"name": "reachability", "op_order": "recent_first"}}, "task.op_order",
     "'recent_first' needs a task with a serial [BOS, ops, SEP, queries] layout, one of ['swap_s5'"),
    ({"task": {"name": "reachability", "train_filler": 2}}, "task.train_filler",
     "must be 0 for task 'reachability', which has no serial"),
    ({"task": {"name": "reachability"}, "eval": {"depths": (8, 64, 256)}}, "eval.depths",
     "[256] exceed the max_depth=128 of task 'reachability'; test depths must be in [task.train_depth, 128]"),
    ({"task": {"name": "reachability", "train_depth": 129}, "eval": {"depths": (129,)},
      "recipe": {"max_iterations": 200}}, "task.train_depth", "must be in [1, 128], the max_depth of task"),
])
def test_task_shape_errors_name_the_field_and_allowed_values(overrides, field, words):
    with pytest.raises(ValueError) as e:
        validate(with_overrides(TrialConfig(), **overrides))
    lines = [line for line in str(e.value).splitlines() if line.strip().startswith(f"- {field}:")]
    assert len(lines) == 1 and words in lines[0], str(e.value)


def test_serial_options_and_depths_within_max_depth_stay_legal():
    validate(with_overrides(TrialConfig(), task={"name": "swap_s5", "op_order": "recent_first", "train_filler": 3}))
    validate(with_overrides(TrialConfig(), task={"name": "reachability"}, eval={"depths": (8, 128)}))


def test_accelerator_type_is_a_known_gpu_type_of_a_gpu_trial():
    gpu = validate(with_overrides(TrialConfig(), train={"use_gpu": True, "accelerator_type": "H100"}))
    assert TrialConfig().train.accelerator_type == ""  # any GPU (or CPU)
    assert from_flat(to_flat(gpu)) == gpu
    with pytest.raises(ValueError, match=r"train\.accelerator_type: 'L40' is not '' \(any GPU\) or one of \[.*'L40S'"):
        validate(with_overrides(gpu, train={"accelerator_type": "L40"}))
    with pytest.raises(ValueError, match=r"train\.accelerator_type: 'H100' selects GPU nodes, so it needs "
                                         r"train\.use_gpu=true"):
        validate(with_overrides(TrialConfig(), train={"accelerator_type": "H100"}))


def test_float32_matmul_precision_takes_torchs_names_or_the_device_default():
    assert TrialConfig().train.float32_matmul_precision == ""
    for value in ("highest", "high", "medium"):
        cfg = validate(from_flat({"train.float32_matmul_precision": value}))
        assert from_flat(to_flat(cfg)) == cfg and cfg.train.float32_matmul_precision == value
    with pytest.raises(ValueError, match=r"train\.float32_matmul_precision: 'low' is not one of \['', 'highest', "
                                         r"'high', 'medium'\]"):
        validate(from_flat({"train.float32_matmul_precision": "low"}))


def test_cpu_bf16_autocast_is_a_cpu_flag_of_ddp_and_fsdp():
    assert TrialConfig().train.cpu_bf16_autocast is False
    for strategy in ("ddp", "fsdp"):
        cfg = validate(from_flat({"train.cpu_bf16_autocast": "true", "train.strategy": strategy}))
        assert cfg.train.cpu_bf16_autocast is True and from_flat(to_flat(cfg)) == cfg
    with pytest.raises(ValueError, match=r"train\.cpu_bf16_autocast: is for CPU workers: GPU workers "
                                         r"\(train\.use_gpu=true\) always run bf16 autocast"):
        validate(from_flat({"train.cpu_bf16_autocast": True, "train.use_gpu": True}))
    with pytest.raises(ValueError, match=r"train\.cpu_bf16_autocast: must be false with "
                                         r"train\.strategy='deepspeed'.*use 'ddp' or 'fsdp'"):
        validate(from_flat({"train.cpu_bf16_autocast": True, "train.strategy": "deepspeed"}))


def test_compile_is_a_flat_bool_and_refused_with_the_cot_baseline():
    assert TrialConfig().train.compile is False
    cfg = validate(from_flat({"train.compile": "true"}))  # --set train.compile=true
    assert cfg.train.compile is True and to_flat(cfg)["train.compile"] is True
    assert from_flat(to_flat(cfg)) == cfg
    with pytest.raises(ValueError, match=r"train\.compile: cannot read 'sometimes' as bool \(expected true/false\)"):
        from_flat({"train.compile": "sometimes"})
    with pytest.raises(ValueError, match=r"train\.lr: cannot read 'abc' as float \("):  # the type's name, no repr
        from_flat({"train.lr": "abc"})
    cot = apply_recipe(presets.local_trial("tiny-qwen2"), "cot")
    with pytest.raises(ValueError, match=r"train\.compile: must be false with recipe\.cot: its greedy decoding"):
        validate(with_overrides(cot, train={"compile": True}))
    for recipe in sorted(set(RECIPES) - {"cot"}):  # every other recipe takes it
        validate(with_overrides(apply_recipe(presets.local_trial("tiny-qwen2"), recipe), train={"compile": True}))
