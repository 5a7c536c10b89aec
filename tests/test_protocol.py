"""The paper's protocol where the presets follow it: S5/A5 depths, S5 in the backbone and ablation sweeps under the
paper preset (swap-S5 locally), RLT's best R per depth, the GPU type each trial asks for, the CLI's --preset."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from par_ray import presets, sweep
from par_ray.evaluation import BEST_R_MULTIPLES, accuracy_by_depth
from par_ray.model.looped import LoopedOutput
from par_ray.recipes import apply_recipe
from par_ray.sweep import Options
from par_ray.tasks import PAPER_DEPTHS, get_task
from par_ray.config import EvalConfig

ROOT = Path(__file__).resolve().parents[1]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_s5_and_a5_train_to_16_and_test_to_256_as_the_paper():
    for name in ("s5", "a5"):
        d = PAPER_DEPTHS[name]
        assert (d.train_depth, d.test_depths) == (16, (16, 32, 64, 128, 256))
        cfg = presets.paper_trial("qwen2.5-0.5b", name)
        assert (cfg.task.train_depth, cfg.eval.depths, cfg.eval.num_sequences) == (16, (16, 32, 64, 128, 256), 1024)
    assert PAPER_DEPTHS["swap_s5"].test_depths[-1] == 16 * PAPER_DEPTHS["swap_s5"].train_depth


@pytest.mark.parametrize("script", ["backbone_scaling", "ablations"])
def test_backbone_and_ablation_sweeps_run_s5_under_paper_and_swap_s5_locally(script):
    module = _load(ROOT / f"sweeps/{script}.py")
    paper = sweep.build_plan(module.SPEC, Options(preset="paper"), "paper")
    local = sweep.build_plan(module.SPEC, Options(preset="local"), "local")
    assert {c.task.name for _, c in paper.trials} == {"s5"}
    assert {c.task.name for _, c in local.trials} == {"swap_s5"}
    assert {c.backbone.name for _, c in paper.trials} == set(presets.PAPER_BACKBONES)
    assert {(c.task.train_depth, c.eval.depths[-1]) for _, c in paper.trials} == {(16, 256)}
    assert {c.recipe.name for _, c in local.trials} <= {c.recipe.name for _, c in paper.trials}


def test_paper_trials_ask_ray_for_the_gpu_type_they_were_planned_for():
    cfg = presets.preset_trial("paper", "qwen2.5-0.5b")
    assert cfg.train.accelerator_type == presets.PAPER_GPU_TYPE == "H100"
    typed = presets.preset_trial("paper", "qwen2.5-0.5b", gpu_types=("L40S",))
    assert typed.train.accelerator_type == "L40S"
    assert presets.preset_trial("local", "tiny-qwen2").train.accelerator_type == ""


def test_rlt_is_evaluated_at_the_best_r_per_depth():
    assert apply_recipe(presets.local_trial(), "rlt").eval.best_r is True
    assert apply_recipe(presets.local_trial(), "par").eval.best_r is False
    task = get_task("parity")
    ev = EvalConfig(depths=(4, 8), num_sequences=8, batch_size=8)
    answers = {d: task.sample(d, 8, seed=ev.seed).states[:, -1, 0] for d in ev.depths}
    good_R = {4: 6, 8: 4}  # the only iteration at which the stub model answers right, per depth

    def model_fn(ids_BT, reads_Q, R, window, stretch, read):
        """Reads out the true answer after iteration good_R[d], the answer 1 - truth after every other."""
        depth = ids_BT.shape[1] - 3
        iterations = list(read) if isinstance(read, tuple) else [R]
        rows = [answers[depth] if k == good_R[depth] else 7 - answers[depth] for k in iterations]  # ids 3 / 4
        logits_KBQV = torch.stack([torch.nn.functional.one_hot(r, task.vocab_size)[:, None].float() for r in rows])
        return LoopedOutput(logits_KBQV, iterations, torch.zeros(R))

    plain = accuracy_by_depth(model_fn, task, ev, 1, torch.device("cpu"))
    best = accuracy_by_depth(model_fn, task, ev, 1, torch.device("cpu"), r_multiples=BEST_R_MULTIPLES)
    assert (best[4]["R"], best[4]["acc"], best[8]["R"], best[8]["acc"]) == (6, 1.0, 4, 1.0)
    assert set(best[4]["acc_by_R"]) == {max(1, round(m * 4)) for m in BEST_R_MULTIPLES}
    assert plain[4]["acc"] == plain[8]["acc"] == 0.0 and "R" not in plain[8]  # R = d reads a wrong iteration


def test_iterate_reads_a_tuple_of_iterations_as_the_rows_of_all():
    from par_ray.model import backbones
    from par_ray.model.looped import LoopedLM

    torch.manual_seed(0)
    model = LoopedLM(backbones.load("tiny-qwen2")).eval()
    ids = torch.randint(0, 32, (2, 9))
    reads = torch.tensor([7, 8])
    with torch.no_grad():
        every = model.iterate(ids, reads, 5, read="all")
        some = model.iterate(ids, reads, 5, read=(4, 2))
    assert some.iterations == [2, 4]
    torch.testing.assert_close(some.logits_KBQV, every.logits_KBQV[[1, 3]])
    with pytest.raises(ValueError, match="each in 1..R=5"):
        model.iterate(ids, reads, 5, read=(6,))


def test_the_training_cli_takes_the_paper_preset(tmp_path, write_model_dir):
    from par_ray.train.__main__ import config_from_args, parse_args

    model_dir = write_model_dir(tmp_path, ["qwen2.5-0.5b"])
    cfg = config_from_args(parse_args(["--preset", "paper", "--task", "s5", "--model-dir", model_dir]))
    assert cfg.backbone.name == "qwen2.5-0.5b" and cfg.backbone.pretrained == str(tmp_path / "Qwen/Qwen2.5-0.5B")
    assert cfg.train.use_gpu and cfg.train.lr == 1e-4 and cfg.train.accelerator_type == "H100"
    assert (cfg.task.train_depth, cfg.eval.depths) == (16, (16, 32, 64, 128, 256))
    deeper = config_from_args(parse_args(["--preset", "paper", "--task", "s5", "--model-dir", model_dir,
                                          "--train-depth", "8"]))
    assert deeper.eval.depths == (8, 16, 32, 64, 128)  # the preset's multiples (16×), not the local 8×
    local = config_from_args(parse_args([]))
    assert local == presets.local_trial()  # the default is unchanged
    with pytest.raises(ValueError, match="qwen2.5-0.5b weights 'Qwen/Qwen2.5-0.5B' not found"):
        config_from_args(parse_args(["--preset", "paper"]))
