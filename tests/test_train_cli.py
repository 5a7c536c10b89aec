"""The single-process trainer: bad input gives one clear error; a short run learns (loss falls) and writes result.json.

The full learning benchmark (≥ 95 % full-state accuracy at d = 8 within 20 minutes) is not a test: see
docs/results.md and docs/experiments.md. This is its short form.
"""

import json
import subprocess
import sys

import pytest

from par_ray.train.__main__ import main

PY = sys.executable


@pytest.mark.parametrize("argv, field", [
    (["--backbone", "gpt-5"], "backbone.name"),
    (["--task", "chess"], "task.name"),
    (["--recipe", "magic"], "recipe"),
    (["--train-depth", "0"], "task.train_depth"),
    (["--train-depth", "8", "--eval-depths", "4,16"], "eval.depths"),
    (["--set", "backbone.split=1,1,1"], "backbone.split"),
    (["--set", "train.lr"], "--set"),
    (["--set", "train.nope=3"], "train.nope"),
    # right type, unusable value (issue 14): rejected before --out is created or a model is built
    (["--seed", "-1"], "--seed (train.seed): "),  # a field a flag set is named by the flag
    (["--workers", "0"], "--workers (train.num_workers): must be >= 1"),
    (["--steps", "0"], "--steps (train.steps): "),
    (["--set", "train.num_workers=0"], "- train.num_workers: must be >= 1"),  # set by --set: named as set
    (["--pretrained", "/nonexistent/qwen-checkpoint"], "backbone.pretrained"),
    (["--pretrained", "./no/such/dir"], "backbone.pretrained"),
    (["--set", "train.lr=inf"], "train.lr"),
    (["--set", "train.lr=nan"], "train.lr"),
    (["--set", "recipe.hold_lambda=-inf"], "recipe.hold_lambda"),
    (["--set", "eval.seed=-5"], "eval.seed"),
    (["--set", "eval.halt_rules=9/8/0.5"], "eval.halt_rules"),
    (["--set", "eval.halt_rules=4/8"], "eval.halt_rules"),
    # issue 39: an empty value, settings that would silently do nothing or mislead
    (["--set", "backbone.pretrained="], "backbone.pretrained: empty"),
    (["--pretrained", ""], "--pretrained (backbone.pretrained): empty"),
    (["--set", "task.curriculum=3", "--set", "task.curriculum_steps=100", "--steps", "100"], "task.curriculum"),
    (["--set", "recipe.position_offset=4096"], "recipe.position_offset"),
    (["--set", "recipe.position_offset=8", "--set", "backbone.position_scheme=none"], "recipe.position_offset"),
    (["--set", "eval.halt_rules=4/8/0.5"], "eval.halt_rules"),
])
def test_bad_input_is_one_clear_error(argv, field, capsys, tmp_path):
    out = tmp_path / "never-created"
    assert main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and field in err and "Traceback" not in err
    assert not out.exists()


def _unreadable_checkpoints(root, write_checkpoint):
    """Checkpoint folders of tiny-qwen2 that are each broken one way: config.json not JSON, weights not safetensors, a
    tokenizer that renders no task word as one token (every word is its unknown token, dropped)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    not_json = write_checkpoint(root / "not_json", "tiny-qwen2")
    (root / "not_json" / "config.json").write_text("<html>rate limited</html>")
    not_safetensors = write_checkpoint(root / "not_safetensors", "tiny-qwen2")
    (root / "not_safetensors" / "model.safetensors").write_bytes(b"PK\x03\x04 a zip, not safetensors" * 8)
    no_words = write_checkpoint(root / "no_words", "tiny-qwen2", tokenizer=False)
    tokenizer = Tokenizer(models.WordLevel(vocab={"<unk>": 0}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(root / "no_words" / "tokenizer.json"))
    return {"not_json": (not_json, [f"{not_json}/config.json is not JSON", "tiny-qwen2"]),
            "not_safetensors": (not_safetensors, [f"{not_safetensors}/model.safetensors is not a safetensors file",
                                                  "tiny-qwen2"]),
            "no_words": (no_words, ["task.name: 'swap_s5' does not render through backbone.pretrained's tokenizer"])}


@pytest.mark.parametrize("broken", ["not_json", "not_safetensors", "no_words"])
def test_a_checkpoint_that_cannot_load_is_refused_naming_the_file_before_out_is_created(broken, tmp_path, capsys,
                                                                                       write_checkpoint):
    path, words = _unreadable_checkpoints(tmp_path, write_checkpoint)[broken]
    out = tmp_path / "never-created"
    assert main(["--pretrained", path, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: backbone.pretrained: " if broken != "no_words" else "error: task.name: ")
    assert all(w in err for w in words) and err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_set_reads_extra_halting_rules():
    from par_ray.train.__main__ import config_from_args, parse_args

    cfg = config_from_args(parse_args(["--recipe", "par_halt", "--set", "eval.halt_rules=4/8/0.5,6/8/0.3"]))
    assert cfg.eval.halt_rules == ((4, 8, 0.5), (6, 8, 0.3))


BASE = ["--train-depth", "4", "--eval-depths", "4,8", "--set", "eval.num_sequences=8", "--set", "train.batch_size=8",
        "--set", "train.eval_every=100", "--set", "train.warmup_steps=1"]


def test_rerun_in_same_out_with_other_config_is_refused_naming_fields(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(BASE + ["--steps", "2", "--out", str(out)]) == 0
    before = (out / "result.json").read_text()
    capsys.readouterr()
    assert main(BASE + ["--steps", "3", "--set", "train.lr=3e-4", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "train.steps: 2 → 3" in err and "train.lr: 0.001 → 0.0003" in err and "another --out" in err
    # one worker in this process keeps no checkpoints: there is nothing to continue, only results to replace
    assert "rerunning there would replace its results" in err and "continue" not in err
    assert (out / "result.json").read_text() == before  # nothing touched
    # the same config again is accepted: in local mode it retrains identically, and says so
    assert main(BASE + ["--steps", "2", "--out", str(out)]) == 0
    assert "holds a finished run and one worker keeps no checkpoints: training it again from step 0" in (
        capsys.readouterr().out)


def test_a_relative_out_inside_a_ray_job_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """``ray job submit`` runs the command in a temporary copy of its working directory, which Ray deletes later or
    hands to the next job of the same code (a resubmitted run then resumed the old one, seen): a relative ``--out``
    (the default ``runs/train`` too) is one error line naming the flag; the sweeps' ``--storage`` likewise
    (``check_outlives_job``, also ``tests/test_sweep.py``)."""
    from par_ray.train.cluster import check_outlives_job

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # what Ray sets in a job's driver
    for out in (["--out", "run"], []):
        assert main(BASE + ["--steps", "2", *out]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        raw = out[1] if out else "runs/train"
        assert line == (f"error: --out: {raw!r} is a relative path, and this Ray job runs in a temporary copy of its "
                        f"working directory ({tmp_path / raw}), which Ray deletes, or reuses for the next job of the "
                        f"same code; give an absolute path every node sees")
    assert not any(tmp_path.iterdir())
    assert main(BASE + ["--steps", "2", "--out", str(tmp_path / "run")]) == 0  # an absolute one is taken
    for raw in (str(tmp_path / "run"), "~/runs/x", "s3://bucket/runs"):
        check_outlives_job("--storage", raw, buckets=True)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    check_outlives_job("--out", "run")  # outside a job the working directory is the user's


def test_a_final_model_written_on_another_node_is_named_in_a_warning(tmp_path, capsys, monkeypatch):
    """On a cluster of several nodes rank 0 writes the export on its own node; an ``--out`` the driver's node does not
    share then has no ``final/``: one warning says so and what to do (here rank 0's folder is moved aside)."""
    from par_ray.train import trainer

    build, elsewhere = trainer.build_trainer, tmp_path / "another-node"
    monkeypatch.setattr(trainer, "build_trainer",
                        lambda *a, export_dir=None, **kw: build(*a, export_dir=str(elsewhere), **kw))
    out = tmp_path / "run"
    assert main(BASE + ["--steps", "2", "--out", str(out)]) == 0
    assert (elsewhere / "model.safetensors").is_file() and not (out / "final").exists()
    assert (f"warning: the final model was not written to {out / 'final'}: its worker ran on another node"
            in capsys.readouterr().err)


def test_fsdp_on_one_worker_says_the_model_is_not_sharded(tmp_path, capsys):
    """One worker is Ray Train's local mode, where FSDP2 has no process group and leaves the model plain: the run
    says so at its start instead of recording fsdp silently."""
    assert main(BASE + ["--steps", "2", "--strategy", "fsdp", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "note: --strategy fsdp on one worker" in out and "not sharded" in out
    assert json.loads((tmp_path / "run" / "result.json").read_text())["config"]["train.strategy"] == "fsdp"


def test_diverging_run_fails_naming_step_and_loss(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(BASE + ["--steps", "6", "--set", "train.lr=1e30", "--set", "train.grad_clip=0", "--out",
                        str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: training failed") and "diverged at step" in err and "loss" in err
    assert not (out / "result.json").exists()


def test_malformed_list_is_rejected_by_argparse_without_traceback():
    proc = subprocess.run([PY, "-m", "par_ray.train", "--eval-depths", "8,x"], capture_output=True, text=True)
    assert proc.returncode == 2 and "comma-separated integers" in proc.stderr and "Traceback" not in proc.stderr


def test_short_run_learns_and_writes_result(tmp_path):
    out = tmp_path / "run"
    argv = ["--steps", "60", "--train-depth", "4", "--eval-depths", "4,8", "--seed", "1", "--out", str(out),
            "--set", "train.eval_every=60", "--set", "train.report_every=20", "--set", "train.lr=3e-3",
            "--set", "train.warmup_steps=10", "--set", "eval.num_sequences=64"]
    assert main(argv) == 0
    result = json.loads((out / "result.json").read_text())
    assert set(result["accuracy_by_depth"]) == {"4", "8"}
    for key in ("d50", "G", "train_seconds", "config", "G_interp", "sequences_by_depth"):
        assert key in result
    # the last report's window (steps 41-60): what a benchmark reads as the steady state
    assert result["step_time_s"] > 0 and result["tokens_per_s"] > 0 and result["peak_memory_mb"] > 0
    # issue 37: G's and the interpolated G's 95 % intervals (a bootstrap, on by default)
    assert all(lo <= hi for lo, hi in (result["G_interval_95"], result["G_interp_interval_95"]))
    assert sum(result["sequences_by_depth"].values()) >= 2 * 64  # the first pass, then more near the crossing
    assert result["config"]["task.train_depth"] == 4
    # loss falls well below its start (ln 5 ≈ 1.61 per query at chance, ~3.1 at init over the 23-token vocab)
    assert result["final_loss"] < 1.3


def test_help_lists_the_registries(capsys):
    from par_ray.model.backbones import BACKBONES
    from par_ray.recipes import RECIPES
    from par_ray.tasks import TASKS

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "``" not in out
    for flag, names in (("--task", TASKS), ("--recipe", RECIPES), ("--backbone", BACKBONES)):
        assert f"{flag} {{{','.join(names)}}}" in out
    assert "--seed SEED" in out and "non-negative" in out


def test_a_halting_trial_prints_accuracy_and_g_for_each_stopping():
    """Issue 22 part 3: own halting beside R = ⌈d/c⌉ and the oracle best fixed R, with the G of each; nothing for a
    trial without a halting read-out."""
    from par_ray.train.__main__ import stopping_summary

    m = {"acc_d8": 0.9, "acc_d16": 0.2, "halt_acc_d8": 0.88, "halt_acc_d16": 0.3, "best_acc_d8": 0.92,
         "best_acc_d16": 0.35, "best_iter_d8": 9.0, "best_iter_d16": 20.0, "G": 2.0, "G_censored": 0.0,
         "G_interp": 1.5, "G_halt": 2.0, "G_halt_censored": 0.0, "G_halt_interp": 1.6, "G_best": 2.0,
         "G_best_censored": 1.0, "G_best_interp": 2.0}
    out = stopping_summary(m, (8, 16))
    assert "own halting G = 2.00" in out["table"] and "best fixed R G = ≥ 2.00" in out["table"]
    assert "| 16 | 0.300 | 0.200 | 0.350 (20) |" in out["table"]
    assert out["result"]["halt"] == {"acc": {8: 0.88, 16: 0.3}, "G": 2.0, "G_censored": 0.0, "G_interp": 1.6}
    assert stopping_summary({"acc_d8": 1.0}, (8,)) is None
