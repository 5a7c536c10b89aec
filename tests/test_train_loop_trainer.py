"""build_trainer's checks, naming and export, and the MetricsLog callback, without starting a Ray cluster."""

import json

import pytest
import torch

from par_ray.config import EvalConfig, RecipeConfig, TaskConfig, TrainConfig, TrialConfig, with_overrides
from par_ray.train.trainer import MetricsLog, build_trainer, fault_injection_errors, run_name


def test_run_name_is_deterministic_and_ignores_worker_count():
    cfg = TrialConfig()
    assert run_name(cfg) == run_name(TrialConfig()) == "par-tiny-qwen2-swap_s5-seed0-ddp"
    # a re-submitted job on another worker count resumes the same run; another strategy or seed is another run
    assert run_name(with_overrides(cfg, train={"num_workers": 4})) == run_name(cfg)
    assert run_name(with_overrides(cfg, train={"strategy": "fsdp"})) != run_name(cfg)
    assert run_name(with_overrides(cfg, train={"seed": 1})) != run_name(cfg)


@pytest.mark.parametrize("train,local,problem", [
    ({"fail_at_step": -1, "checkpoint_every": 0}, True, None),
    ({"fail_at_step": 4, "checkpoint_every": 2}, False, None),
    ({"fail_at_step": 4, "checkpoint_every": 4}, False, None),
    ({"fail_at_step": 4, "checkpoint_every": 5}, False, "needs a checkpoint before it"),
    ({"fail_at_step": 4, "checkpoint_every": 0}, False, "needs a checkpoint before it"),
    ({"fail_at_step": 4, "checkpoint_every": 2}, True, "local mode"),
])
def test_fault_injection_needs_workers_and_an_earlier_checkpoint(train, local, problem):
    cfg = with_overrides(TrialConfig(), train=train)
    errs = fault_injection_errors(cfg, local)
    if problem is None:
        assert errs == []
    else:
        assert len(errs) == 1 and problem in errs[0] and errs[0].startswith("train.fail_at_step")
        with pytest.raises(ValueError, match="train.fail_at_step"):
            build_trainer(cfg, None, "/tmp/par_ray_unused", local=local)


def test_metrics_log_appends_reports_and_failures(tmp_path):
    log = MetricsLog(str(tmp_path / "log.jsonl"))
    assert log.read() == []
    log.after_report(None, [{"step": 1, "loss": 2.0}, {"step": 1, "loss": 2.0}], checkpoint=None)
    log.after_exception(None, {0: RuntimeError("boom")})
    log.after_report(None, [{"step": 2, "loss": 1.5}], checkpoint=object())
    assert log.read() == [
        {"metrics": {"step": 1, "loss": 2.0}, "checkpoint": False},
        {"failure": {"0": "RuntimeError('boom')"}},
        {"metrics": {"step": 2, "loss": 1.5}, "checkpoint": True},
    ]


def test_local_run_exports_final_state(tmp_path):
    """``export_dir`` gets the last step's state in the strategy's format (ddp: state.pt + extra.json)."""
    cfg = TrialConfig(task=TaskConfig(train_depth=4), recipe=RecipeConfig(grad_window=2, max_iterations=8),
                      train=TrainConfig(steps=3, batch_size=4, warmup_steps=1, threads_per_worker=1,
                                        checkpoint_every=0),
                      eval=EvalConfig(depths=(4,), num_sequences=4, batch_size=4))
    threads = torch.get_num_threads()
    build_trainer(cfg, None, str(tmp_path / "ray"), local=True, export_dir=str(tmp_path / "final")).fit()
    torch.set_num_threads(threads)
    assert json.loads((tmp_path / "final" / "extra.json").read_text())["step"] == 3
    state = torch.load(tmp_path / "final" / "state.pt", weights_only=True)
    assert set(state) == {"model", "optimizer", "scheduler"} and state["scheduler"]["last_epoch"] == 3
