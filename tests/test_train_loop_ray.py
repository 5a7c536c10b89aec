"""The training loop on 2 CPU Ray Train workers (gloo): DDP, FSDP2 and DeepSpeed ZeRO-2/3/Offload against the
single-process run, fault tolerance, and an FSDP checkpoint resharded from 2 workers to 1.

One Ray cluster for the module. Every run trains the same tiny trial (tiny-qwen2, R up to 4 with a gradient window of
2, so the weight-tied core runs twice without and twice with autograd per step) at the same global batch; the
single-process reference runs in Ray Train's local mode. Losses are the global batch's (the loop averages them over
ranks), one report per step.
"""

import math
import sys

import pytest
import ray
import torch

from par_ray.config import EvalConfig, RecipeConfig, TaskConfig, TrainConfig, TrialConfig, with_overrides
from par_ray.train.checkpoint import load_trained
from par_ray.train import loop
from par_ray.train.checkpoint import evaluate_trained
from par_ray.train.strategies import build_deepspeed_ops
from par_ray.train.trainer import MetricsLog, build_trainer, torch_config

pytestmark = pytest.mark.ray
# The MLflow callback and the worker function defined below run in Ray's processes, which cannot import a test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS = 6
# Float32 on CPU: a different reduction order (two half-batch gradients summed by all-reduce, sharded clipping norms)
# moves the loss in the 7th significant digit; this bound is ~100x what was measured and far below any real bug.
LOSS_ATOL = 1e-4


def trial(**train) -> TrialConfig:
    # One torch thread per process: 2 workers on 2 cores, and no oversubscribed OpenMP threads in the local run.
    train = {"num_workers": 2, "checkpoint_every": 3, "threads_per_worker": 1, "eval_every": 100, "steps": STEPS,
             **train}
    return TrialConfig(
        task=TaskConfig(train_depth=4),
        recipe=RecipeConfig(grad_window=2, max_iterations=8),
        train=TrainConfig(batch_size=8, warmup_steps=2, report_every=1, **train),
        eval=EvalConfig(depths=(4, 8), num_sequences=16, batch_size=8),
    )


@pytest.fixture(scope="module")
def reference(local_reports, tmp_path_factory):
    """Per-step metrics of the single-process run (local mode: this process, no workers)."""
    return local_reports(trial(num_workers=1), str(tmp_path_factory.mktemp("reference")))


def fit(cfg, tmp_path, name="run", max_failures=0, callbacks=()):
    log = MetricsLog(str(tmp_path / f"{name}.jsonl"))
    result = build_trainer(cfg, name, str(tmp_path / "ray"), max_failures=max_failures, callbacks=[log, *callbacks],
                           export_dir=str(tmp_path / "final")).fit()
    return result, log.read()


def assert_export_loads(tmp_path, result, fmt, like=None, atol=1e-3):
    """The final export (weights only, safetensors) of a run with strategy ``fmt`` loads on this process (no process
    group) with ``load_trained``, bit for bit the weights of the run's last checkpoint in ``fmt``'s own format
    (optimizer state included); it evaluates to the run's own final accuracies (within one test sequence: 2 ranks
    and 1 process batch rows differently) and, given ``like`` (another export of the same trial), holds the same
    weights."""
    trained = load_trained(str(tmp_path))
    assert trained.format == "safetensors" and trained.step == STEPS and trained.config.train.strategy == fmt
    with result.checkpoint.as_directory() as d:
        checkpoint = load_trained(d)
    assert checkpoint.format == fmt and checkpoint.step == STEPS
    want = checkpoint.model.state_dict()
    assert sorted(trained.model.state_dict()) == sorted(want)
    for k, v in trained.model.state_dict().items():
        assert torch.equal(v, want[k]), k
    ev = evaluate_trained(trained)
    for d, acc in ev["acc"].items():
        assert abs(acc - result.metrics[f"acc_d{d}"]) <= 1 / 16 + 1e-9, (d, acc, result.metrics[f"acc_d{d}"])
    if like is not None:
        want = load_trained(str(like)).model.state_dict()
        got = trained.model.state_dict()
        assert sorted(got) == sorted(want)
        for k in want:
            torch.testing.assert_close(got[k], want[k], atol=atol, rtol=0, msg=k)
    return trained


def losses(reports) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in reports}


def assert_same_curve(got_reports, want_reports, steps=range(1, STEPS + 1)) -> float:
    """Per-step losses equal within LOSS_ATOL; returns the largest difference (printed with ``pytest -s``)."""
    got, want = losses(got_reports), losses(want_reports)
    assert sorted(got) == list(steps)
    for s in steps:
        assert got[s] == pytest.approx(want[s], abs=LOSS_ATOL), f"step {s}: {got[s]} vs {want[s]}"
    diff = max(abs(got[s] - want[s]) for s in steps)
    print(f"max |loss difference| over steps {steps.start}..{steps.stop - 1}: {diff:.2e}")
    return diff


def assert_same_final(got: dict, want: dict, abs_tol: float = LOSS_ATOL):
    keys = sorted(k for k in want if not loop.is_timing_metric(k))
    assert sorted(k for k in got if not loop.is_timing_metric(k)) == keys
    for k in keys:
        assert math.isclose(got[k], want[k], abs_tol=abs_tol), f"{k}: {got[k]} vs {want[k]}"


@pytest.fixture(scope="module")
def ddp_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ddp")


@pytest.fixture(scope="module")
def ddp_run(ray_cluster, ddp_dir):
    result, log = fit(trial(strategy="ddp"), ddp_dir)
    return result, [r["metrics"] for r in log if "metrics" in r]


@ray.remote(num_cpus=1)
def _threads_of_a_one_cpu_worker() -> tuple[int, int]:
    import torch  # first, as a trial's unpickled function does: torch has read its thread count before the loop runs

    from par_ray.train.loop import assigned_cpus

    return assigned_cpus(), torch.get_num_threads()


def test_a_cpu_worker_uses_the_cpus_ray_reserved_for_it(ray_cluster):
    """The loop sets torch's threads to the worker's Ray reservation (train.threads_per_worker = 0): 1 for a 1-CPU
    worker, whatever torch had already read; the driver (local mode) keeps torch's default."""
    cpus, _ = ray.get(_threads_of_a_one_cpu_worker.remote())
    assert cpus == 1
    assert loop.assigned_cpus() == 0


def test_ddp_two_workers_match_single_process(ddp_run, reference, ddp_dir):
    result, reports = ddp_run
    assert_same_curve(reports, reference)
    assert_same_final(result.metrics, reference[-1])
    assert_export_loads(ddp_dir, result, "ddp")


def test_fsdp_two_workers_match_ddp(ray_cluster, ddp_run, ddp_dir, tmp_path):
    result, log = fit(trial(strategy="fsdp"), tmp_path)
    reports = [r["metrics"] for r in log if "metrics" in r]
    assert_same_curve(reports, ddp_run[1])
    assert_same_final(result.metrics, ddp_run[0].metrics)
    assert_export_loads(tmp_path, result, "fsdp", like=ddp_dir)


@pytest.fixture(scope="module")
def deepspeed_ops():
    """Compile (first run: minutes) or load DeepSpeed's CPU ops here, once, before two workers need them."""
    build_deepspeed_ops()


@pytest.mark.parametrize("zero_stage,zero_offload", [pytest.param(1, False, marks=pytest.mark.full_only),
                                                     pytest.param(2, False, marks=pytest.mark.full_only), (3, False),
                                                     pytest.param(2, True, marks=pytest.mark.full_only)],
                         ids=["zero1", "zero2", "zero3", "zero2-offload"])
def test_deepspeed_two_workers_match_ddp(ray_cluster, deepspeed_ops, ddp_run, ddp_dir, tmp_path, zero_stage,
                                         zero_offload):
    result, log = fit(trial(strategy="deepspeed", zero_stage=zero_stage, zero_offload=zero_offload), tmp_path)
    reports = [r["metrics"] for r in log if "metrics" in r]
    assert_same_curve(reports, ddp_run[1])
    assert_same_final(result.metrics, ddp_run[0].metrics)
    assert_export_loads(tmp_path, result, "deepspeed", like=ddp_dir)


@pytest.mark.parametrize("strategy,zero_stage,abs_tol",
                         [("ddp", 2, 1e-6), pytest.param("deepspeed", 3, LOSS_ATOL, marks=pytest.mark.full_only)],
                         ids=["ddp", "deepspeed-zero3"])
def test_killed_worker_resumes_from_checkpoint_with_same_final_metrics(ray_cluster, deepspeed_ops, ddp_run, tmp_path,
                                                                        strategy, zero_stage, abs_tol):
    # Checkpoints after steps 2 and 4; rank 0 dies right after reporting the step-4 checkpoint, before step 5 (the
    # case where an unconsumed report would die with the worker). Both ranks then load the merged checkpoint:
    # ddp's full copy, or every rank's ZeRO-3 partitions written by DeepSpeed's save_checkpoint.
    cfg = trial(strategy=strategy, zero_stage=zero_stage, checkpoint_every=2, fail_at_step=4)
    result, log = fit(cfg, tmp_path, max_failures=1)
    failures = [r for r in log if "failure" in r]
    assert len(failures) == 1 and "0" in failures[0]["failure"], log
    steps = [r["metrics"]["step"] for r in log if "metrics" in r]
    assert steps == [1, 2, 3, 4, 5, 6], steps  # nothing lost, nothing repeated: resumed from the step-4 checkpoint
    assert_same_final(result.metrics, ddp_run[0].metrics, abs_tol=abs_tol)  # ddp: bit-for-bit resumption


@pytest.mark.full_only
def test_fsdp_checkpoint_from_two_workers_resumes_on_one(ray_cluster, reference, tmp_path):
    # 2 workers write sharded checkpoints at steps 3 (and would at 6); rank 0 dies at step index 4 with no retries.
    two = trial(strategy="fsdp", fail_at_step=4)
    with pytest.raises(ray.train.TrainingFailedError):
        fit(two, tmp_path, name="reshard")
    # Same run name and storage, one worker: Ray Train V2 hands it the step-3 checkpoint; DCP reshards it.
    one = with_overrides(two, train={"num_workers": 1})
    result, log = fit(one, tmp_path, name="reshard")
    reports = [r["metrics"] for r in log if "metrics" in r]
    assert [r["step"] for r in reports][-3:] == [4, 5, 6]
    assert_same_curve(reports[-3:], reference, steps=range(4, STEPS + 1))
    assert_same_final(result.metrics, reference[-1])


# --------------------------------------------------------------------------------------------------------------------
# Issue 14: exactly one report per step in MLflow after a fault at any offset from the last checkpoint; resuming
# only the same config; collectives that time out.

class _ToMLflow(ray.train.UserCallback):
    """What the sweep's Tune callback does with each report: log it to the trial's MLflow child run."""

    def __init__(self, tracker, trial_id):
        self.tracker, self.trial_id = tracker, trial_id

    def after_report(self, run_context, metrics, checkpoint):
        self.tracker.log_metrics(self.trial_id, metrics[0], int(metrics[0]["step"]))


@pytest.mark.parametrize("fail_at_step", [pytest.param(3, marks=pytest.mark.full_only), 4,
                                          pytest.param(5, marks=pytest.mark.full_only)],
                         ids=["offset0", "offset1", "offset2"])
def test_fault_at_every_offset_from_checkpoint_logs_each_step_once(ray_cluster, ddp_run, tmp_path, fail_at_step):
    # Checkpoint and evaluation at step 3 (and 6); rank 0 dies before training step fail_at_step + 1, i.e. 0, 1 or 2
    # reports after the checkpoint. The restarted group resumes at 3 and replays those steps.
    from mlflow.tracking import MlflowClient

    from par_ray import tracking

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = tracking.SweepTracker.open("faults", str(tmp_path / "tune"), uri, commit="test")
    cfg = trial(strategy="ddp", checkpoint_every=3, eval_every=3, fail_at_step=fail_at_step)
    run_id = tracker.start_trial("t0", cfg)
    result, log = fit(cfg, tmp_path, max_failures=1, callbacks=[_ToMLflow(tracker, "t0")])
    assert len([r for r in log if "failure" in r]) == 1
    reports = [r["metrics"] for r in log if "metrics" in r]
    assert [r["step"] for r in reports] == list(range(1, STEPS + 1))
    # the first report after the resume carries the last evaluation (stored in the checkpoint)
    for r in reports[2:]:
        assert "acc_d4" in r and "G" in r, r["step"]
    assert_same_final(result.metrics, ddp_run[0].metrics, abs_tol=1e-6)
    client = MlflowClient(tracking_uri=uri)
    for key in client.get_run(run_id).data.metrics:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert steps == sorted(set(steps)), (key, steps)  # strictly increasing
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == list(range(1, STEPS + 1))
    assert [m.step for m in client.get_metric_history(run_id, "acc_d4")] == list(range(3, STEPS + 1))


@pytest.mark.full_only
def test_rerun_with_another_config_is_refused_and_the_same_config_resumes(ray_cluster, ddp_run, ddp_dir):
    # Same run name and storage as the finished ddp run, another learning rate and step count: refused before any
    # state is loaded, naming the fields.
    other = trial(strategy="ddp", lr=3e-4, steps=8)
    with pytest.raises(ray.train.TrainingFailedError) as e:
        fit(other, ddp_dir, name="run")
    assert "train.lr: 0.001 → 0.0003" in str(e.value) and "train.steps: 6 → 8" in str(e.value)
    # The same config again: the finished run resumes at its last step and reports its final metrics again.
    result, _ = fit(trial(strategy="ddp"), ddp_dir, name="run")
    assert_same_final(result.metrics, ddp_run[0].metrics, abs_tol=0.0)


def _mismatched_collective(config):
    import torch.distributed as dist

    if dist.get_rank() == 0:  # rank 1 skips the collective, as a rank out of step would
        dist.all_reduce(torch.zeros(1))


def test_rank_mismatch_fails_within_the_collective_timeout(ray_cluster, tmp_path):
    from ray.train.torch import TorchTrainer

    cfg = trial(collective_timeout_s=3.0)
    trainer = TorchTrainer(_mismatched_collective, torch_config=torch_config(cfg),
                           scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                           run_config=ray.train.RunConfig(name="mismatch", storage_path=str(tmp_path)))
    with pytest.raises(ray.train.TrainingFailedError):
        trainer.fit()  # with Ray's default timeout (TorchConfig.timeout_s = 1800) this would wait 30 minutes


def test_diverging_trial_fails_at_once_on_workers_naming_step_and_loss(ray_cluster, tmp_path):
    # What a sweep's trial driver sees: TrainingFailedError with the worker's reason, so Tune errors this trial
    # (its MLflow child run FAILED) and runs the others.
    with pytest.raises(ray.train.TrainingFailedError, match=r"diverged at step \d+: loss (nan|inf)"):
        fit(trial(strategy="ddp", lr=1e30, grad_clip=0.0), tmp_path)
