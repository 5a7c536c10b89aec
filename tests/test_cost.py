"""The compute / time / money model (``par_ray.cost``, ``par_ray.hardware``) and the sweeps' cost plan.

The FLOP model is held to ``torch.utils.flop_counter.FlopCounterMode`` within 5 % (issue 24): one training step and
one evaluation of every recipe family on tiny-qwen2 (CPU, the real ``train_step`` and ``eval_metrics``), and on the
Qwen2.5-0.5B and Qwen3-0.6B shapes on the meta device (the model's own forward, backward and decoding calls: meta
tensors cannot run the loss's ``.item()``). Eager attention: the counter has no formula for CPU SDPA's kernel, while
GPU SDPA kernels are counted as QKᵀ + P·V, the eager matmuls.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from par_ray import cost, hardware
from par_ray.config import with_overrides
from par_ray.presets import local_trial, paper_trial
from par_ray.recipes import apply_recipe
from par_ray.trial import validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ("par", "final_answer", "par_halt", "psd_ema", "cot", "dense")
"""Recipe families: PAR, final-answer targets, learned halting (hold schedule + halting query), prefix
self-distillation with an EMA teacher, chain-of-thought, dense progress targets (with the pending class)."""
TOLERANCE = 0.05


def family(name: str, base):
    if name == "dense":
        return with_overrides(apply_recipe(base, "par"), recipe=dict(dense_targets=True, dense_pending=True))
    return apply_recipe(base, name)


def close(plan: float, counted: float) -> bool:
    return abs(plan - counted) <= TOLERANCE * counted


# ----------------------------------------------------------------------------------------------------------------------
# tiny-qwen2 on CPU: the real training step and evaluation

def _engine(cfg):
    from par_ray.model.looped import build_looped
    from par_ray.tasks import build_task
    from par_ray.train.strategies import World, prepare
    from par_ray.trial import resolve

    trial = resolve(cfg)
    torch.manual_seed(0)
    model = build_looped(cfg.backbone, cfg.recipe, vocab_size=trial.vocab.size)
    return prepare(model, cfg.train, World(), ema=trial.ema), build_task(cfg.task)


def _tiny(name: str):
    cfg = family(name, local_trial())
    return validate(with_overrides(cfg, train=dict(batch_size=4), backbone=dict(attn_implementation="eager"),
                                   eval=dict(depths=(6, 12), num_sequences=8, batch_size=8, bracket_max_sequences=24,
                                             bracket_min_sequences=16, bracket_block=8)))


@pytest.mark.parametrize("name", FAMILIES)
def test_training_step_flops_match_the_counter_on_tiny_qwen2(name):
    from par_ray.cot import CotTask, cot_tokens
    from par_ray.halting import halt_tokens
    from par_ray.tasks import build_task
    from par_ray.train.step import build_step_loss, train_step
    from par_ray.trial import resolve

    cfg = _tiny(name)
    engine, task = _engine(cfg)
    data = build_task(cfg.task, train=True)
    if cfg.recipe.cot:
        data = CotTask(data, cot_tokens(resolve(cfg).vocab.cot_offset))
    halt = halt_tokens(task) if resolve(cfg).halting else None  # random-init: compact ids
    shape = cost.trial_shape(cfg)
    loss_fn = build_step_loss(cfg.recipe, data, halt=halt, dense_offset=resolve(cfg).vocab.dense_offset)
    for step in (0, 2):  # two draws of (d, R)
        with FlopCounterMode(display=False) as counter:
            res = train_step(engine, data, cfg.task, loss_fn, 0, step, cfg.train.batch_size)
        lengths = cost._lengths(cfg.task, cfg.recipe.cot, res.plan.depth, 0, 1)[0]
        planned = cost.step_flops(cfg, cfg.recipe, shape, res.plan.depth, res.plan.R, lengths, data.op_width)
        assert close(planned, counter.get_total_flops()), (name, res.plan, planned, counter.get_total_flops())


@pytest.mark.parametrize("name", FAMILIES)
def test_evaluation_flops_match_the_counter_on_tiny_qwen2(name):
    from par_ray.halting import halt_tokens
    from par_ray.train.loop import eval_metrics
    from par_ray.trial import resolve

    cfg = _tiny(name)
    engine, task = _engine(cfg)
    halt = halt_tokens(task) if resolve(cfg).halting else None  # random-init: compact ids
    with FlopCounterMode(display=False) as counter:
        m = eval_metrics(engine, task, cfg, cfg.recipe, halt)  # accuracy (or CoT decoding), halting, probe
    # adaptive sampling added blocks near the crossing (at least eval.bracket_min_sequences there): those it added
    added = {d: round(m[f"sequences_d{d}"]) - cfg.eval.sequences_at(d) for d in cfg.eval.depths}
    assert sum(added.values()) >= 8
    planned = cost.eval_flops(cfg, cfg.recipe, cost.trial_shape(cfg), added=added)
    assert close(planned, counter.get_total_flops()), (name, planned, counter.get_total_flops())
    # what the training loop logs as flops_eval reads the same sequences off the evaluation's metrics
    assert cost.eval_flops_done(cfg, cfg.recipe, cost.trial_shape(cfg), m) == planned
    # the plan (no run to read): the worst case adaptive sampling allows, never less than what ran
    assert cost.eval_flops(cfg, cfg.recipe, cost.trial_shape(cfg)) >= counter.get_total_flops()


# ----------------------------------------------------------------------------------------------------------------------
# Real shapes on the meta device

REAL = ("qwen2.5-0.5b", "qwen3-0.6b")


@pytest.fixture(scope="module", params=REAL)
def real(request):
    from par_ray.model import backbones
    from par_ray.model.looped import LoopedLM

    parent = backbones.load(request.param, device="meta", attn_implementation="eager")
    return request.param, LoopedLM(parent)


@pytest.mark.parametrize("name", ("par", "cot", *(pytest.param(n, marks=pytest.mark.full_only)
                                                  for n in ("final_answer", "par_halt", "psd_ema"))))
def test_flops_match_the_counter_on_real_shapes(real, name):
    """One training step (d = 6; R = 6, or 10 on the hold schedule) and one evaluation batch per family, with the
    checkpoint's full vocabulary (dense targets need a random-init parent: tiny shapes only). CI's short form runs
    two families (~30 s); the other three (~95 s on 2 cores) run in the full form (every family on tiny shapes runs
    in both)."""
    from par_ray.cot import CotTask, cot_tokens
    from par_ray.distill import teacher_logits
    from par_ray.evaluation import halt_max_iterations
    from par_ray.halting import with_halt_query
    from par_ray.tasks import build_task
    from transformers import DynamicCache

    backbone, model = real
    cfg = validate(with_overrides(family(name, paper_trial(backbone)), task=dict(train_depth=8, min_train_depth=1),
                                  train=dict(batch_size=2), eval=dict(depths=(8, 16), num_sequences=2)))
    rc, shape = cfg.recipe, cost.trial_shape(cfg)
    task = build_task(cfg.task, train=True)
    data = CotTask(task, cot_tokens(task.vocab_size)) if rc.cot else task
    d, R = 6, (1 if rc.cot else 10 if rc.depth_schedule == "hold" else 6)
    ep = data.sample(d, 2, seed=0)
    if rc.halting:
        ep = with_halt_query(ep, 5)
    ids, reads = ep.input_ids.to("meta"), ep.read_positions
    with FlopCounterMode(display=False) as counter:  # train_step's model calls: teacher, forward, backward
        if rc.distill != "none":
            K = min(rc.grad_window, R)
            with torch.no_grad():
                teacher_logits(lambda i, q, k, s: model(i, q, k, None, s, "last").logits_KBQV[0], ids,
                               reads[:len(reads) - int(rc.halting)], range(R - K + 1, R + 1), d, 1, task.op_width)
        model(ids, reads, R, rc.grad_window, 1.0, rc.supervise).logits_KBQV.float().sum().backward()
    lengths = cost._lengths(cfg.task, rc.cot, d, cfg.train.seed, 1)[0]
    planned = cost.step_flops(cfg, rc, shape, d, R, lengths, task.op_width) / cfg.train.batch_size * 2
    assert close(planned, counter.get_total_flops()), (backbone, name, planned, counter.get_total_flops())

    # one evaluation batch at test depth 16 (two sequences)
    test = build_task(cfg.task).sample(16, 2, seed=0)
    T, Q = test.input_ids.shape[1], test.read_positions.numel()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        if rc.cot:  # prefill + 3 decoded tokens
            cache = DynamicCache()
            model(test.input_ids.to("meta"), cache=cache)
            for _ in range(3):
                model(torch.zeros(2, 1, dtype=torch.long, device="meta"), cache=cache)
            planned = 2 * cost.decode_flops(shape, T, 4)
        elif rc.halting:  # every iteration read out up to R_max, with the halting query
            R_max = halt_max_iterations(cfg.eval, 1)
            q = with_halt_query(test, 5)
            model(q.input_ids.to("meta"), q.read_positions, R_max, None, 1.0, "all")
            planned = 2 * cost.forward_flops(shape, T + 1, Q + 1, R_max, R_max)
        else:
            model(test.input_ids.to("meta"), test.read_positions, 16, None, 1.0, "last")
            planned = 2 * cost.forward_flops(shape, T, Q, 16, 1)
    assert close(planned, counter.get_total_flops()), (backbone, name, "eval", planned, counter.get_total_flops())


# ----------------------------------------------------------------------------------------------------------------------
# The trial-level sums

def test_step_expectation_follows_the_schedules_draws():
    cfg = validate(apply_recipe(local_trial(), "par_hold"))
    pmfs = cost._schedule(cfg.task, cfg.recipe)
    assert [d for d, _ in pmfs] == list(range(cfg.task.min_train_depth, cfg.task.train_depth + 1))
    for _, pmf in pmfs:  # R = 1 + Poisson(λ) capped at max_iterations: a distribution with mean ≈ 1 + λ
        assert sum(pmf.values()) == pytest.approx(1.0)
        assert sum(R * p for R, p in pmf.items()) == pytest.approx(1 + cfg.recipe.hold_lambda, rel=1e-3)
    forced = cost._schedule(cfg.task, local_trial().recipe)
    assert all(pmf == {d: 1.0} for d, pmf in forced)  # c = 1: R = d


def test_the_plan_charges_adaptive_sampling_its_worst_case():
    from par_ray.config import EvalConfig

    ev = EvalConfig(depths=(16, 20, 32, 64), num_sequences=128, num_sequences_fine=32, bracket_max_sequences=512,
                    bracket_block=128)
    per_sequence = {16: 1.0, 20: 1.5, 32: 4.0, 64: 16.0}
    # 2 × 512 / 128 = 8 blocks, costliest depths first: 64 and 32 take (512 − 128) / 128 = 3 each, 20 (a fine depth:
    # 32 in the first pass, room for 3) the last 2
    assert cost.bracket_worst_case(ev, per_sequence) == {64: 384, 32: 384, 20: 256}
    assert cost.bracket_worst_case(EvalConfig(depths=(16,)), {16: 1.0}) == {}  # off


def test_trial_flops_add_stages_and_evaluations():
    cfg = validate(apply_recipe(local_trial(), "par_halt_posthoc"))  # PAR stage, then a halting read-out stage
    fl = cost.trial_flops(cfg)
    assert len(fl.stages) == 2 and fl.train == pytest.approx(sum(fl.stages))
    assert len(fl.eval_once) == 3  # 3000 steps, every 1000
    assert fl.eval_once[-1] > fl.eval_once[0]  # the last evaluation is in the halting stage: R_max iterations read
    assert fl.checkpoint_bytes == 6 * 16 * cost.trial_shape(cfg).total_params  # every 500 steps, ddp fp32


def test_cost_turns_flops_into_hours_and_dollars():
    cfg = validate(paper_trial("qwen2.5-0.5b"))
    table = hardware.load_table()
    c = cost.trial_cost(cfg, table)
    peak = hardware.DEVICES["H100"].peak_tflops * 1e12
    assert c.device == "H100" and c.count == cfg.train.num_workers  # any GPU: costed as the 80 GB H100
    assert c.train_gpu_hours == pytest.approx(c.flops.train / (peak * table.mfu["gpu"]["train"]) / 3600)
    assert c.eval_gpu_hours == pytest.approx(c.flops.eval / (peak * table.mfu["gpu"]["eval"]) / 3600)
    assert c.usd == pytest.approx(c.gpu_hours * 55.04 / 8) and c.node == "p5.48xlarge"
    assert set(c.params()) >= {"cost.planned_flops", "cost.planned_gpu_hours", "cost.planned_usd"}


def test_each_trial_holds_its_devices_through_its_start_up(tmp_path):
    """Beside its steps and evaluations a trial spends its start-up (worker group, model, MLflow run, checkpoints)
    holding its devices: in its wall time once and in its device-hours on each device; a price file's measured
    ``startup_s`` replaces the assumed one, and a negative one is refused naming the field."""
    table = hardware.load_table()
    gpu = cost.trial_cost(validate(paper_trial("qwen2.5-0.5b")), table)
    assert gpu.startup_hours * 3600 == hardware.DEFAULT_STARTUP_S["gpu"]
    assert gpu.gpu_hours == pytest.approx(gpu.train_gpu_hours + gpu.eval_gpu_hours + gpu.count * gpu.startup_hours)
    assert gpu.wall_hours == pytest.approx((gpu.train_gpu_hours + gpu.eval_gpu_hours) / gpu.count + gpu.startup_hours)
    assert gpu.usd == pytest.approx(gpu.gpu_hours * 55.04 / 8)
    cpu = cost.trial_cost(validate(local_trial()), table)
    assert cpu.startup_hours * 3600 == hardware.DEFAULT_STARTUP_S["cpu"]
    assert cpu.params()["cost.planned_startup_hours"] == f"{30 / 3600:.6g}"
    assert any("start-up 30 s per trial (assumed)" in line for line in cost.assumptions([cpu], table))
    prices = tmp_path / "p.json"
    prices.write_text(json.dumps({"devices": {"CPU": {"startup_s": 45}}}))
    measured = cost.trial_cost(validate(local_trial()), hardware.load_table(str(prices)))
    assert measured.wall_hours - cpu.wall_hours == pytest.approx(15 / 3600)
    prices.write_text(json.dumps({"devices": {"CPU": {"startup_s": -1}}}))
    with pytest.raises(ValueError, match=r"devices.CPU.startup_s: expected seconds >= 0, got -1"):
        hardware.load_table(str(prices))


def test_compiled_cpu_training_is_planned_at_its_own_mfu(tmp_path):
    """The local sweeps compile their layers (``presets.LOCAL_CURRICULUM``) and reach ~0.7 of the CPU peak, not the
    eager trials' 0.38: a compiled trial plans at ``train_compiled``, evaluation and GPUs (no such key) keep theirs."""
    table = hardware.load_table()
    eager = validate(local_trial())
    compiled = with_overrides(eager, train=dict(compile=True))
    assert not eager.train.compile
    plans = {c.train.compile: cost.trial_cost(c, table) for c in (eager, compiled)}
    assert plans[False].mfu_train == table.mfu["cpu"]["train"] == 0.38
    assert plans[True].mfu_train == table.mfu["cpu"]["train_compiled"] == 0.70
    assert plans[True].mfu_eval == plans[False].mfu_eval == table.mfu["cpu"]["eval"]
    assert plans[True].train_gpu_hours == pytest.approx(plans[False].train_gpu_hours * 0.38 / 0.70)
    assert table.mfu_of("H100", "train", compiled=True) == table.mfu["gpu"]["train"]
    # a price file may set it; a device's measured MFU wins over both assumptions
    path = tmp_path / "prices.toml"
    path.write_text('[mfu.cpu]\ntrain_compiled = 0.5\n')
    assert hardware.load_table(str(path)).mfu_of("CPU", "train", compiled=True) == 0.5
    path.write_text('[devices.CPU]\nmfu_train = 0.6\n')
    assert hardware.load_table(str(path)).mfu_of("CPU", "train", compiled=True) == 0.6
    path.write_text('[mfu.cpu]\ntrain_fast = 0.5\n')
    with pytest.raises(ValueError, match=r"mfu.cpu.train_fast: expected mfu.gpu\|cpu.train\|train_compiled\|"
                                         r"train_medium\|train_compiled_medium\|train_bf16\|train_compiled_bf16\|"
                                         r"eval\|eval_medium\|eval_bf16 in \(0, 1\]"):
        hardware.load_table(str(path))


def test_bf16_product_trials_are_planned_at_their_own_mfu(tmp_path):
    """``train.float32_matmul_precision='medium'`` (bf16 products on a CPU with AMX, opt-in) plans at the kind's
    ``_medium`` MFUs, which on CPU are against the float32 peak and may pass 1; a kind without them (GPUs) falls back
    to its plain ones."""
    table = hardware.load_table()
    compiled = with_overrides(validate(local_trial()), train=dict(compile=True))
    medium = with_overrides(compiled, train=dict(float32_matmul_precision="medium"))
    plan = cost.trial_cost(medium, table)
    assert plan.mfu_train == table.mfu["cpu"]["train_compiled_medium"] != table.mfu["cpu"]["train_compiled"]
    assert plan.mfu_eval == table.mfu["cpu"]["eval_medium"]
    assert cost.trial_cost(compiled, table).mfu_train == table.mfu["cpu"]["train_compiled"]
    assert table.mfu_of("H100", "train", compiled=True, medium=True) == table.mfu["gpu"]["train"]
    path = tmp_path / "prices.toml"
    path.write_text('[mfu.cpu]\ntrain_compiled_medium = 1.2\n')
    assert hardware.load_table(str(path)).mfu_of("CPU", "train", compiled=True, medium=True) == 1.2
    for bad in ("train_compiled_medium = 5.0", "train_compiled = 1.2"):
        path.write_text(f"[mfu.cpu]\n{bad}\n")
        with pytest.raises(ValueError, match=r"a _medium or _bf16 one in \(0, 4\]"):
            hardware.load_table(str(path))


def test_cpu_bf16_autocast_trials_are_planned_at_their_own_mfu(tmp_path):
    """``train.cpu_bf16_autocast`` (bf16 matmuls on a CPU, opt-in) plans at the CPU's ``_bf16`` MFUs, against the
    float32 peak, so above ``train_compiled``'s; a price file may set them above 1."""
    table = hardware.load_table()
    compiled = with_overrides(validate(local_trial()), train=dict(compile=True))
    bf16 = with_overrides(compiled, train=dict(cpu_bf16_autocast=True))
    plan, fp32 = cost.trial_cost(bf16, table), cost.trial_cost(compiled, table)
    assert plan.mfu_train == table.mfu["cpu"]["train_compiled_bf16"] > table.mfu["cpu"]["train_compiled"]
    assert plan.mfu_eval == table.mfu["cpu"]["eval_bf16"] > table.mfu["cpu"]["eval"]
    assert plan.train_gpu_hours < fp32.train_gpu_hours and plan.flops == fp32.flops
    both = with_overrides(bf16, train=dict(float32_matmul_precision="medium"))  # autocast's matmuls are bf16
    assert cost.trial_cost(both, table).mfu_train == table.mfu["cpu"]["train_compiled_bf16"]
    path = tmp_path / "prices.toml"
    path.write_text('[mfu.cpu]\ntrain_compiled_bf16 = 1.5\neval_bf16 = 0.9\n')
    assert cost.trial_cost(bf16, hardware.load_table(str(path))).mfu_train == 1.5
    path.write_text('[mfu.cpu]\neval_bf16 = 4.5\n')
    with pytest.raises(ValueError, match=r"mfu\.cpu\.eval_bf16: .*a _medium or _bf16 one in \(0, 4\]"):
        hardware.load_table(str(path))


def test_cost_names_come_from_the_tracking_schema():
    from analysis import cost as plan_cost
    from par_ray import tracking_schema as schema
    from par_ray.train.loop import gpu_seconds, is_timing_metric

    params = cost.trial_cost(validate(local_trial())).params()
    assert set(params) == {schema.cost_param(f) for f in schema.COST_FIELDS if f != "error"}
    assert set(plan_cost.PARAMS.values()) <= set(params)  # the reader reads what the writer writes
    with pytest.raises(ValueError, match="cost param field 'flops'"):
        schema.cost_param("flops")
    used = gpu_seconds(10.0, 2.0, [4.0, 6.0], world_size=2)
    assert used == {"gpu_seconds_train": 20.0, "gpu_seconds_eval": 4.0, "gpu_seconds_stage0": 8.0,
                    "gpu_seconds_stage1": 12.0}
    assert all(schema.is_gpu_seconds_metric(k) and is_timing_metric(k) for k in used)
    assert not any(schema.is_gpu_seconds_metric(k) for k in ("gpu_seconds_stage", "gpu_seconds_stagex", "loss"))
    assert is_timing_metric("step_time_s") and not is_timing_metric("acc_d6")


def test_sweep_wall_time_fills_free_slots_in_order():
    assert cost.sweep_wall_hours([1, 1, 1, 1], 2) == 2
    assert cost.sweep_wall_hours([3, 1, 1, 1], 2) == 3
    assert cost.sweep_wall_hours([1, 2], 8) == 2
    assert cost.sweep_wall_hours([], 2) == 0


# ----------------------------------------------------------------------------------------------------------------------
# The device table

def test_every_gpu_node_type_of_the_cluster_configs_has_a_dated_price():
    nodes = set()
    for name in ("aws.yaml", "gcp.yaml"):
        with open(os.path.join(ROOT, "cluster", name)) as f:
            config = yaml.safe_load(f)
        for node_name, t in config["available_node_types"].items():
            if t["resources"].get("GPU"):
                nodes.add((t["node_config"].get("InstanceType") or t["node_config"]["machineType"],
                           next(k.split(":")[1] for k in t["resources"] if k.startswith("accelerator_type:")),
                           t["resources"]["GPU"]))
    for machine, gpu, count in nodes:
        price = hardware.NODE_PRICES[machine]
        assert price.gpus == count and price in hardware.DEVICES[gpu].nodes, machine
        assert price.date and price.source and price.on_demand > price.spot > 0, machine


def test_planner_reads_gpu_memory_from_the_device_table():
    from par_ray.planner import GPU_MEMORY_GB

    assert GPU_MEMORY_GB == {k: hardware.DEVICES[k].memory_gb for k in hardware.GPU_TYPES}


def test_price_file_overrides_prices_peaks_and_mfu(tmp_path):
    path = tmp_path / "prices.toml"
    path.write_text('[mfu.gpu]\ntrain = 0.5\n[devices.H100]\nmfu_eval = 0.2\n'
                    '[[devices.H100.nodes]]\nnode = "x"\ncloud = "c"\ngpus = 8\non_demand = 8.0\nspot = 4.0\n'
                    'region = "r"\ndate = "2026-12"\nsource = "test"\n')
    table = hardware.load_table(str(path))
    assert table.mfu_of("H100", "train") == 0.5 and table.mfu_of("H100", "eval") == 0.2
    assert table.devices["H100"].price(1).on_demand == 8.0
    c = cost.trial_cost(validate(paper_trial("qwen2.5-0.5b")), table)
    assert c.usd_per_gpu_hour == 1.0 and c.usd_spot_per_gpu_hour == 0.5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"devices": {"H100": {"peak": 1}}, "mfu": {"gpu": {"train": 2}}}))
    with pytest.raises(ValueError,
                       match=r"(?s)--prices .*mfu.gpu.train: .*devices.H100: unknown field\(s\) \['peak'\]"):
        hardware.load_table(str(bad))
    yaml = tmp_path / "prices.yaml"  # neither .toml nor JSON: the error says how it was read
    yaml.write_text("devices:\n  H100: {}\n")
    with pytest.raises(ValueError, match=r"as JSON \(a file not named \.toml is read as JSON\)"):
        hardware.load_table(str(yaml))
    # a measured MFU without its source reads "(measured)", not "(measured: )"
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps({"devices": {"H100": {"mfu_train": 0.31}}}))
    table = hardware.load_table(str(measured))
    line = cost.assumptions([cost.trial_cost(validate(paper_trial("qwen2.5-0.5b")), table)], table)[0]
    assert "MFU train 0.31, eval 0.15 (measured);" in line


def test_max_usd_names_every_unpriced_trial_it_counts(tmp_path):
    """``--max-usd`` on a sweep with unpriced trials: the count of them and the first three, not three alone."""
    from par_ray.sweep import SweepSpec, build_plan
    from par_ray.sweep.resources import check_budget, sweep_cost
    from par_ray.sweep.spec import Options, SweepConfigError

    unpriced = tmp_path / "noprice.json"
    unpriced.write_text(json.dumps({"devices": {"H100": {"nodes": []}}}))
    table = hardware.load_table(str(unpriced))
    plan = build_plan(SweepSpec(name="x", seeds=(0, 1, 2, 3)), Options(backbones=("qwen2.5-0.5b",)), "paper")
    with pytest.raises(SweepConfigError, match=r"no price or peak for 4 trial\(s\), \[.*\] and 1 more"):
        check_budget(sweep_cost(plan, table), float("inf"))


@pytest.mark.parametrize("entry, field", [
    ({"nodes": [{"on_demand": -8.0}]}, "devices.H100.nodes[0].on_demand"),
    ({"nodes": [{"spot": float("inf")}]}, "devices.H100.nodes[0].spot"),
    ({"nodes": [{"gpus": 0}]}, "devices.H100.nodes[0].gpus"),  # a price per GPU of 0 GPUs: a ZeroDivisionError
    ({"nodes": [{"gpus": 8.5}]}, "devices.H100.nodes[0].gpus"),
    ({"nodes": [{"region": 3}]}, "devices.H100.nodes[0].region"),
    ({"memory_gb": -80}, "devices.H100.memory_gb"),
    ({"memory_gb": "80GB"}, "devices.H100.memory_gb"),
    ({"peak_tflops": True}, "devices.H100.peak_tflops"),
    ({"mfu_train": 0}, "devices.H100.mfu_train"),
])
def test_every_field_of_a_price_file_is_checked_in_one_line_naming_the_file(entry, field, tmp_path, capsys):
    """A price file is a user's input like any other: a bad field is one ``error:`` line naming the file and the
    field, before anything starts; the sweep is never costed with it."""
    node = {"node": "x", "cloud": "c", "gpus": 8, "on_demand": 8.0, "spot": 4.0, "region": "r", "date": "2026-12",
            "source": "test"}
    if "nodes" in entry:
        entry = {"nodes": [{**node, **entry["nodes"][0]}]}
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"devices": {"H100": entry}}))
    with pytest.raises(ValueError) as e:
        hardware.load_table(str(path))
    assert str(e.value).startswith(f"--prices {path}: {field}: expected ") and "\n" not in str(e.value)

    from par_ray.sweep import SweepSpec, main

    storage = tmp_path / "storage"
    assert main(SweepSpec(name="x"), ["--preset", "local", "--storage", str(storage), "--prices", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --prices {path}: {field}") and err.count("\n") == 1
    assert not storage.exists()


def test_gpu_check_json_sets_the_measured_training_mfu(tmp_path):
    """The check's own schema (``benchmarks/gpu_check.py`` SCHEMA_VERSION): its train_mfu FLOP/s over the table's
    H200 peak (989.4 TFLOP/s) is the training MFU."""
    doc = {"schema": 2, "dry_run": False, "started": "2026-12-02T05:00:00+00:00",
           "sections": {"environment": {"status": "ok", "result": {"device": "NVIDIA H200"}},
                        "train_mfu": {"status": "ok", "result": {"flops_per_s": 0.25 * 989.4e12}}}}
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps(doc))
    table = hardware.load_table(str(path))
    assert table.mfu_of("H200", "train") == pytest.approx(0.25)
    assert table.mfu_of("H200", "eval") == table.mfu["gpu"]["eval"]  # evaluation: still assumed
    path.write_text(json.dumps({**doc, "dry_run": True}))
    with pytest.raises(ValueError, match="--prices: .* without a measured GPU MFU"):
        hardware.load_table(str(path))


# ----------------------------------------------------------------------------------------------------------------------
# The sweeps: dry-run table, --max-usd

def test_measured_cpu_peak_becomes_the_cpu_workers_peak(tmp_path, capsys):
    out = tmp_path / "runs" / "cpu.json"  # docs/cost.md's command in a fresh clone: runs/ does not exist yet
    assert hardware.main(["--measure-cpu", "--workers", "1", "--seconds", "0.05", "--out", str(out)]) == 0
    assert "GFLOP/s per core with 1 busy" in capsys.readouterr().out
    table = hardware.load_table(str(out))
    cpu = table.devices["CPU"]
    assert cpu.peak_tflops > 0 and "with 1 core(s) busy" in cpu.peak_source
    c = cost.trial_cost(validate(local_trial()), table)
    assert c.peak_flops == pytest.approx(cpu.peak_tflops * 1e12)  # one thread per worker
    with pytest.raises(ValueError, match="workers: must be in 1"):
        hardware.measure_cpu_peak(workers=0)
    with pytest.raises(SystemExit) as e:  # a folder: refused before measuring, not an IsADirectoryError after it
        hardware.main(["--measure-cpu", "--workers", "1", "--seconds", "0.05", "--out", str(tmp_path)])
    assert e.value.code == 2 and f"--out: {tmp_path} is a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # a folder still to be made, named with its slash: the same line
        hardware.main(["--measure-cpu", "--workers", "1", "--seconds", "0.05", "--out", f"{tmp_path}/new/"])
    assert e.value.code == 2 and f"--out: {tmp_path}/new/ is a folder" in capsys.readouterr().err
    for flag, value in (("--workers", "0"), ("--seconds", "0")):  # the error names the flag typed
        with pytest.raises(SystemExit) as e:
            hardware.main(["--measure-cpu", flag, value])
        assert e.value.code == 2 and f"error: {flag}: must be" in capsys.readouterr().err


def test_dry_run_prints_the_cost_table(capsys, tmp_path):
    from par_ray.sweep import main
    from sweeps.backbone_scaling import SPEC

    assert main(SPEC, ["--preset", "local", "--seeds", "0", "--dry-run", "--storage", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "What it costs" in out and "| 0 | par-tiny-qwen2-swap_s5-seed0 | 1 × CPU |" in out
    assert "| total | 2 trials |" in out and "MFU train" in out


def test_max_usd_refuses_an_over_budget_sweep_before_anything_starts(capsys, tmp_path):
    import ray

    from par_ray.sweep import main
    from sweeps.backbone_scaling import SPEC

    prices = tmp_path / "cpu_prices.json"  # price this machine's cores, so the local preset costs money
    prices.write_text(json.dumps({"devices": {"CPU": {"nodes": [
        {"node": "big-cpu", "cloud": "test", "gpus": 1, "on_demand": 1000.0, "spot": 500.0, "region": "r",
         "date": "2026-12", "source": "test"}]}}}))
    storage = tmp_path / "sweep"
    args = ["--preset", "local", "--seeds", "0", "--storage", str(storage), "--prices", str(prices)]
    assert not ray.is_initialized()
    assert main(SPEC, [*args, "--max-usd", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-usd: the sweep is planned at $" in err and "nothing was started" in err
    assert not ray.is_initialized() and not storage.exists()  # no cluster, no storage, no MLflow run
    assert main(SPEC, [*args, "--max-usd", "1", "--dry-run"]) == 2  # the dry run prints the plan, then refuses
    assert "What it costs" in capsys.readouterr().out
    assert main(SPEC, [*args, "--max-usd", "1e9", "--dry-run"]) == 0


def test_max_usd_under_a_cluster_to_join_joins_it_once(capsys, tmp_path, monkeypatch):
    """``ray job submit -- python sweeps/… --max-usd N`` (RAY_ADDRESS set, the default preset ``auto``): the sweep
    joins the cluster once, asks it for GPUs and checks the budget there, before any trial starts (it joined once more
    before, only to guess the preset). Ray is faked: the test counts the joins and stops at the first step after the
    check."""
    import contextlib

    from par_ray.sweep import main, resources, run
    from sweeps.backbone_scaling import SPEC

    class Joined(Exception):
        pass

    joins = []

    @contextlib.contextmanager
    def joined():
        joins.append(os.environ["RAY_ADDRESS"])
        yield None

    def after_the_budget():
        raise Joined

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    for module in (run, resources):
        monkeypatch.setattr(module, "joined", joined)
        monkeypatch.setattr(module, "cluster_has_gpu", lambda: False)
    monkeypatch.setattr(run, "autoscaler_limits_unknown", after_the_budget)
    prices = tmp_path / "cpu_prices.json"
    prices.write_text(json.dumps({"devices": {"CPU": {"nodes": [
        {"node": "big-cpu", "cloud": "test", "gpus": 1, "on_demand": 1000.0, "spot": 500.0, "region": "r",
         "date": "2026-12", "source": "test"}]}}}))
    args = ["--seeds", "0", "--storage", str(tmp_path / "sweep"), "--prices", str(prices)]
    with pytest.raises(Joined):
        main(SPEC, [*args, "--max-usd", "1e9"])
    assert joins == ["127.0.0.1:6379"]
    joins.clear()
    assert main(SPEC, [*args, "--max-usd", "1"]) == 2
    assert joins == ["127.0.0.1:6379"] and "--max-usd: the sweep is planned at $" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------------
# After the fact: plan vs actual (analysis)

def test_plan_vs_actual_table_and_measured_mfu(tmp_path):
    import types

    import polars as pl

    from analysis import cost as plan_cost

    plan = cost.trial_cost(validate(local_trial())).params()
    runs = {"a": plan, "b": plan, "c": {"train.seed": "0"}}  # c: a run from before cost plans were logged
    client = types.SimpleNamespace(get_run=lambda rid: types.SimpleNamespace(data=types.SimpleNamespace(
        params=runs[rid])))
    planned = plan_cost.planned_frame(client, ["a", "b", "c"])
    assert planned["run_id"].to_list() == ["a", "b"]
    hours = float(plan["cost.planned_train_gpu_hours"])
    trials = pl.DataFrame({"run_id": ["a", "b", "c"], "status": ["FINISHED", "FAILED", "FINISHED"],
                           "recipe": ["par"] * 3, "backbone": ["tiny-qwen2"] * 3, "task": ["swap_s5"] * 3,
                           "seed": [0, 1, 2], "duration_s": [2 * hours * 3600 + 60.0 + 40.0, 1.0, 1.0],
                           "gpu_seconds_train": [2 * hours * 3600, 1.0, 1.0], "gpu_seconds_eval": [60.0, 1.0, 1.0]})
    frame = plan_cost.joined(trials, planned)
    assert frame["run_id"].to_list() == ["a"]  # finished and planned only
    table = plan_cost.plan_vs_actual(frame)
    row = table.frame.row(0, named=True)
    assert row["devices"] == "1 × CPU" and row["MFU train"] == f"{float(plan['cost.mfu_train']) / 2:.3f}"
    # a run without flops_eval (it predates the metric): the evaluation MFU against the plan's FLOPs
    peak, eval_planned = float(plan["cost.peak_flops"]), float(plan["cost.planned_eval_flops"])
    assert row["MFU eval"] == f"{eval_planned / (60.0 * peak):.3f}"
    # with it, against the FLOPs the evaluations did (the plan counts adaptive sampling's worst case)
    did = trials.with_columns(pl.Series("flops_eval", [eval_planned / 2, None, None]))
    did_frame = plan_cost.joined(did, planned)
    assert plan_cost.plan_vs_actual(did_frame).frame.row(0, named=True)["MFU eval"] == \
        f"{eval_planned / 2 / (60.0 * peak):.3f}"
    assert plan_cost.measured_overrides(did_frame, "test")["devices"]["CPU"]["mfu_eval"] == \
        pytest.approx(eval_planned / 2 / (60.0 * peak), rel=1e-5)
    assert (row["start-up: plan"], row["start-up: actual"]) == ("30 s", "40 s")  # 40 s of wall beside steps and eval
    overrides = plan_cost.measured_overrides(frame, "test")
    # params hold 6 significant digits (cost.planned_train_gpu_hours too): the MFU read back agrees to ~1e-6
    assert overrides["devices"]["CPU"]["mfu_train"] == pytest.approx(float(plan["cost.mfu_train"]) / 2, rel=1e-5)
    path = plan_cost.write_overrides(overrides, tmp_path)  # read back as a price file: the next plan's MFU
    assert hardware.load_table(str(path)).mfu_of("CPU", "train") == pytest.approx(float(plan["cost.mfu_train"]) / 2,
                                                                                rel=1e-5)
    assert overrides["devices"]["CPU"]["startup_s"] == pytest.approx(40.0, abs=0.1)
    assert hardware.load_table(str(path)).startup_s_of("CPU") == pytest.approx(40.0, abs=0.1)
