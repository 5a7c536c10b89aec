"""Halting and stages on 2 CPU Ray Train workers: DDP and FSDP2 match the single-process run of a staged trial
(PAR, then the post-hoc halting read-out with all but the coda frozen), and a worker killed mid-stage resumes from a
checkpoint inside the second stage with the same final metrics (tests/test_train_loop_ray.py does the same for the
plain recipe)."""

import dataclasses
import math

import pytest

from par_ray.config import EvalConfig, RecipeConfig, StageConfig, TaskConfig, TrainConfig, TrialConfig
from par_ray.recipes import apply_recipe
from par_ray.train.loop import is_timing_metric
from par_ray.train.trainer import MetricsLog, build_trainer
from par_ray.trial import validate

pytestmark = pytest.mark.ray

STEPS = 6
LOSS_ATOL = 1e-4  # as tests/test_train_loop_ray.py: float32 reduction order, far below any real bug


def trial(**train) -> TrialConfig:
    train = {"num_workers": 2, "checkpoint_every": 3, "threads_per_worker": 1, **train}
    base = TrialConfig(
        task=TaskConfig(train_depth=3),
        recipe=RecipeConfig(grad_window=2, max_iterations=8),
        train=TrainConfig(steps=STEPS, batch_size=8, warmup_steps=2, report_every=1, eval_every=100, **train),
        eval=EvalConfig(depths=(3, 6), num_sequences=16, batch_size=8),
    )
    cfg = apply_recipe(base, "par_halt_posthoc")
    return validate(dataclasses.replace(cfg, stages=(StageConfig(), StageConfig(steps=3, recipe="halt_readout",
                                                                                frozen="all_but_coda"))))


@pytest.fixture(scope="module")
def reference(local_reports, tmp_path_factory):
    return local_reports(trial(num_workers=1), str(tmp_path_factory.mktemp("reference")))


def fit(cfg, tmp_path, name="run", max_failures=0):
    log = MetricsLog(str(tmp_path / f"{name}.jsonl"))
    result = build_trainer(cfg, name, str(tmp_path / "ray"), max_failures=max_failures, callbacks=[log]).fit()
    return result, [r["metrics"] for r in log.read() if "metrics" in r]


def assert_same(got_reports, want_reports, final_got, final_want):
    got = {r["step"]: r for r in got_reports}
    want = {r["step"]: r for r in want_reports}
    assert sorted(got) == list(range(1, STEPS + 1))
    for s in got:
        for key in ("loss", "halt_loss"):
            if key in want[s]:
                assert got[s][key] == pytest.approx(want[s][key], abs=LOSS_ATOL), (s, key)
        assert got[s]["stage"] == want[s]["stage"]
    keys = sorted(k for k in final_want if not is_timing_metric(k))
    assert sorted(k for k in final_got if not is_timing_metric(k)) == keys
    for k in keys:
        assert math.isclose(final_got[k], final_want[k], abs_tol=LOSS_ATOL), f"{k}: {final_got[k]} vs {final_want[k]}"


def test_reference_has_both_stages_and_halting_metrics(reference):
    assert [r["stage"] for r in reference] == [0, 0, 0, 1, 1, 1]
    assert "halt_loss" not in reference[2] and "halt_loss" in reference[3]
    assert {"halt_acc_d6", "oracle_acc_d6", "never_halted_d6", "halt_dR_mean_d6"} <= set(reference[-1])


@pytest.mark.parametrize("strategy", [pytest.param("ddp", marks=pytest.mark.full_only), "fsdp"])
def test_two_workers_match_single_process(ray_cluster, reference, tmp_path, strategy):
    result, reports = fit(trial(strategy=strategy), tmp_path)
    assert_same(reports, reference, result.metrics, reference[-1])


def test_killed_worker_resumes_mid_stage(ray_cluster, reference, tmp_path):
    # checkpoints at steps 2 and 4; the fault at step 5 resumes from step 4, one step into the halting stage
    result, reports = fit(trial(strategy="ddp", checkpoint_every=2, fail_at_step=5), tmp_path, max_failures=1)
    assert [r["step"] for r in reports if r["step"] >= 5][-2:] == [5, 6]
    assert_same([r for r in reports if r["step"] <= 4] + [r for r in reports if r["step"] > 4][-2:], reference,
                result.metrics, reference[-1])
