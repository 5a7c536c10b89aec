"""build_trainer's checks, naming and export, and the MetricsLog callback, without starting a Ray cluster."""

import json

import pytest
import torch
from safetensors import safe_open

from par_ray import cost
from par_ray.config import EvalConfig, RecipeConfig, TaskConfig, TrainConfig, TrialConfig, to_flat, with_overrides
from par_ray.train.checkpoint import evaluate_trained, load_trained
from par_ray.train.loop import LockstepError, check_lockstep, resume_mismatch
from par_ray.train.strategies import World
from par_ray.train.trainer import (DASHBOARD_PORTS, MetricsLog, OncePerStep, build_trainer, fault_injection_errors,
                                   free_dashboard_port, run_name, torch_config)


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


def test_the_dashboard_port_is_the_first_free_one_below_the_ephemeral_range():
    """A local cluster's dashboard port comes from Ray's default 8265 up, never from the ephemeral range that the
    processes Ray starts bind from (a port drawn there was taken before the dashboard bound it); a port in use is
    skipped."""
    import socket

    first = free_dashboard_port()
    low, _ = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    assert first in DASHBOARD_PORTS and first < low
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        second = free_dashboard_port()
    assert second in DASHBOARD_PORTS and second > first


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


def test_local_run_exports_final_weights_only(tmp_path):
    """``export_dir`` gets the last step's weights only (model.safetensors + extra.json): no optimizer or scheduler
    state, which stays in the resumable checkpoints."""
    cfg = TrialConfig(task=TaskConfig(train_depth=4), recipe=RecipeConfig(grad_window=2, max_iterations=8),
                      train=TrainConfig(steps=3, batch_size=4, warmup_steps=1, threads_per_worker=1,
                                        checkpoint_every=0),
                      eval=EvalConfig(depths=(4,), num_sequences=4, batch_size=4))
    threads = torch.get_num_threads()
    build_trainer(cfg, None, str(tmp_path / "ray"), local=True, export_dir=str(tmp_path / "final")).fit()
    torch.set_num_threads(threads)
    assert json.loads((tmp_path / "final" / "extra.json").read_text())["step"] == 3
    assert sorted(p.name for p in (tmp_path / "final").iterdir()) == ["extra.json", "model.safetensors"]
    with safe_open(str(tmp_path / "final" / "model.safetensors"), "pt") as f:
        assert f.metadata()["par_ray.step"] == "3" and "embed_tokens.weight" in set(f.keys())


# --------------------------------------------------------------------------------------------------------------------
# Issue 14: run names from the whole config, resume checks, lockstep, divergence, exactly-once reports, loading.

def tiny(**train) -> TrialConfig:
    return TrialConfig(task=TaskConfig(train_depth=4), recipe=RecipeConfig(grad_window=2, max_iterations=8),
                       train=TrainConfig(**{"steps": 3, "batch_size": 4, "warmup_steps": 1, "threads_per_worker": 1,
                                            "checkpoint_every": 0, "eval_every": 2, **train}),
                       eval=EvalConfig(depths=(4, 8), num_sequences=8, batch_size=4))


def fit_local(cfg, tmp_path, export="final"):
    threads = torch.get_num_threads()
    try:
        return build_trainer(cfg, None, str(tmp_path / "ray"), local=True,
                             export_dir=str(tmp_path / export) if export else None).fit()
    finally:
        torch.set_num_threads(threads)


def test_local_mode_writes_no_checkpoint_it_would_discard(tmp_path, monkeypatch):
    """Ray Train's local mode keeps no checkpoint files, so the loop writes none (model and optimizer state: ~6 GB at
    Qwen2.5-0.5B, written to a temporary folder only to be deleted); the final report and the export stand."""
    from par_ray.train import loop

    saved = []
    monkeypatch.setattr(loop, "_report_with_checkpoint", lambda *args: saved.append(args))
    result = fit_local(tiny(checkpoint_every=1), tmp_path)
    assert saved == [] and result.metrics["step"] == 3 and "G" in result.metrics
    assert json.loads((tmp_path / "final" / "extra.json").read_text())["step"] == 3
    assert sorted(p.name for p in (tmp_path / "final").iterdir()) == ["extra.json", "model.safetensors"]


def test_run_name_hashes_the_whole_config_but_not_placement():
    cfg = TrialConfig()
    name = run_name(cfg)
    assert name.startswith("par-tiny-qwen2-swap_s5-seed0-ddp-") and name == run_name(TrialConfig())
    # where the run is placed resumes the same run; anything trained differently is another run
    for same in ({"num_workers": 4}, {"threads_per_worker": 2}, {"fail_at_step": 3}, {"collective_timeout_s": 60.0},
                 {"accelerator_type": "H100"}, {"compile": True}):
        assert run_name(with_overrides(cfg, train=same)) == name, same
    for other in ({"lr": 3e-4}, {"steps": 10}, {"strategy": "fsdp"}, {"seed": 1}, {"batch_size": 32}):
        assert run_name(with_overrides(cfg, train=other)) != name, other
    assert run_name(with_overrides(cfg, recipe={"anchoring": False})) != name
    assert run_name(with_overrides(cfg, eval={"num_sequences": 16})) != name


def test_resume_mismatch_names_fields_and_ignores_placement():
    a = to_flat(TrialConfig())
    b = to_flat(with_overrides(TrialConfig(), train={"lr": 3e-4, "steps": 10, "num_workers": 2}))
    assert resume_mismatch(a, b) == ["train.lr: 0.001 → 0.0003", "train.steps: 3000 → 10"]
    assert resume_mismatch(a, json.loads(json.dumps(a))) == []  # read back from extra.json / config.json
    # the GPU type is placement too; a checkpoint written before the field existed has none
    typed = to_flat(with_overrides(TrialConfig(), train={"use_gpu": True, "accelerator_type": "L40S"}))
    older = {k: v for k, v in to_flat(with_overrides(TrialConfig(), train={"use_gpu": True})).items()
             if k != "train.accelerator_type"}
    assert resume_mismatch(older, typed) == []
    # compiled layers train the same weights under the same names: a run resumes with compile on or off, and
    # checkpoints written before train.compile existed lack it
    compiled = to_flat(with_overrides(TrialConfig(), train={"compile": True}))
    assert resume_mismatch(a, compiled) == []
    assert resume_mismatch({k: v for k, v in a.items() if k != "train.compile"}, compiled) == []


def test_torch_config_times_collectives_out_after_the_configured_seconds():
    assert torch_config(TrialConfig()).timeout_s == 300
    assert torch_config(with_overrides(TrialConfig(), train={"collective_timeout_s": 12.5})).timeout_s == 13
    assert torch_config(TrialConfig()).backend == "gloo"


class _TwoRanks:
    """An engine stand-in on rank 0 of 2 whose all-reduce adds rank 1's row of the plan table."""

    def __init__(self, other_plan):
        self.world, self.device, self.other = World(rank=0, size=2), torch.device("cpu"), other_plan

    def all_reduce_sum(self, t):
        t[1] += torch.tensor(self.other, dtype=t.dtype)
        return t


def test_lockstep_check_names_the_ranks_that_disagree():
    check_lockstep(_TwoRanks([5, 3, 3]), step=5, depth=3, R=3)  # same plan: nothing
    with pytest.raises(LockstepError, match=r"step 6 \(rank 0: step 5 d=3 R=3, rank 1: step 5 d=3 R=4\)"):
        check_lockstep(_TwoRanks([5, 3, 4]), step=5, depth=3, R=3)


def test_once_per_step_drops_replayed_reports_and_keeps_failures(tmp_path):
    log = MetricsLog(str(tmp_path / "log.jsonl"))
    once = OncePerStep([log])
    for step in (1, 2, 3, 4, 5):  # checkpoint at 4, fault after 5: the restarted group replays 5
        once.after_report(None, [{"step": step}], None)
    once.after_exception(None, {0: RuntimeError("lost node")})
    for step in (5, 6, 7):
        once.after_report(None, [{"step": step}], None)
    records = log.read()
    assert [r["metrics"]["step"] for r in records if "metrics" in r] == [1, 2, 3, 4, 5, 6, 7]
    assert any("failure" in r for r in records)


def test_final_report_has_per_iteration_probe_and_checkpoint_holds_last_eval(tmp_path):
    result = fit_local(tiny(), tmp_path)
    m = result.metrics
    # the probe at d_train = 4, c = 1: R = 4 iterations, one forward pass, every k present
    assert sorted(k for k in m if k.startswith("loss_k")) == [f"loss_k{k}" for k in range(1, 5)]
    assert sorted(k for k in m if k.startswith("rms_k")) == [f"rms_k{k}" for k in range(1, 5)]
    # device-seconds, the actual side of par_ray.cost's plan: one worker, one stage
    assert m["gpu_seconds_train"] == m["train_seconds"] == m["gpu_seconds_stage0"] > 0
    assert m["gpu_seconds_eval"] == m["eval_seconds_total"] > 0
    # the FLOPs the two evaluations (steps 2 and 3) did: without adaptive sampling, exactly the plan's
    assert m["flops_eval"] > 0 and m["flops_eval"] == pytest.approx(cost.trial_flops(tiny()).eval, rel=1e-12)
    extra = json.loads((tmp_path / "final" / "extra.json").read_text())
    assert extra["step"] == 3 and extra["last_eval"]["acc_d4"] == m["acc_d4"] and extra["last_eval"]["G"] == m["G"]
    assert extra["config"] == json.loads(json.dumps(to_flat(tiny())))
    # the export loads with the project's own loader and evaluates to the run's own final numbers
    trained = load_trained(str(tmp_path))
    assert trained.format == "safetensors" and trained.step == 3 and trained.config == tiny()
    ev = evaluate_trained(trained)
    assert ev["acc"] == {4: m["acc_d4"], 8: m["acc_d8"]} and ev["G"] == m["G"]


def test_every_worker_sets_the_configured_float32_matmul_precision(tmp_path, monkeypatch, onednn_cache_env):
    """``train.float32_matmul_precision`` reaches ``torch.set_float32_matmul_precision`` on the worker before its
    first step (``strategies.matmul_precision``: ``""`` = ``highest`` on CPU), for training and evaluation alike."""
    seen = []
    set_precision = torch.set_float32_matmul_precision
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda p: (seen.append(p), set_precision(p)))
    try:
        for precision, want in (("medium", "medium"), ("", "highest")):
            seen.clear()
            fit_local(tiny(float32_matmul_precision=precision, steps=1, eval_every=1), tmp_path / (precision or "x"),
                      export=None)
            assert seen == [want]
    finally:
        set_precision("highest")


def test_diverging_trial_fails_at_once_naming_step_and_loss(tmp_path):
    with pytest.raises(Exception) as e:
        fit_local(tiny(lr=1e30, grad_clip=0.0, steps=6), tmp_path, export=None)
    chain, err = [], e.value
    while err is not None:
        chain.append(f"{type(err).__name__}: {err}")
        err = err.__cause__ or err.__context__
    text = " | ".join(chain)
    assert "diverged at step" in text and ("loss nan" in text or "loss inf" in text), text


def test_accelerator_type_reaches_ray_trains_scaling_config():
    """Every worker asks for the node's ``accelerator_type:<type>`` resource (Ray adds 0.001 per worker), so Ray
    places, and the autoscaler launches, only nodes of that GPU type; ``""`` asks for any GPU."""
    from par_ray import presets

    cfg = with_overrides(presets.paper_trial("qwen2.5-0.5b"), train={"num_workers": 2, "accelerator_type": "L40S"})
    scaling = build_trainer(cfg, "x", "/tmp/par_ray_unused").scaling_config
    assert scaling.accelerator_type == "L40S" and scaling.use_gpu
    assert scaling.total_resources == {"GPU": 2.0, "accelerator_type:L40S": pytest.approx(0.002)}
    assert build_trainer(presets.paper_trial("qwen2.5-0.5b"), "x", "/tmp/par_ray_unused").scaling_config \
        .accelerator_type is None
