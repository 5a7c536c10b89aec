"""Memory planner: meta-device counts, ZeRO state accounting, monotonicity, GPU-count search (pure Python, like
torchtitan tests/unit_tests/test_parallel_dims.py), the CLI, and the plan against the measured peak of real training
steps on CPU (benchmarks/bench_memory.py), within 10 %."""

import dataclasses
import functools
import importlib.util
import sys
from pathlib import Path

import pytest

from par_ray import planner
from par_ray.model import backbones
from par_ray.model.backbones import BACKBONES
from par_ray.trial import validate

REAL = [name for name, spec in BACKBONES.items() if spec.hub_name]
WORKLOAD = dict(R=32, grad_window=8, micro_batch=4, seq_len=64)


@functools.cache
def _bench():
    """benchmarks/bench_memory.py (not a package), loaded by path: its measurement is what the plan is held to."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_memory.py"
    spec = importlib.util.spec_from_file_location("bench_memory", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


# --- parameter counts from the meta device --------------------------------------------------------------------------

@pytest.mark.parametrize("name", REAL)
def test_counts_are_the_parent_plus_the_adapter(name):
    shape = planner.model_shape(name)
    parent = backbones.load(name, device="meta")
    h = parent.config.hidden_size
    assert shape.total_params == backbones.parameter_count(parent) + 2 * h * h
    assert shape.layer_params == backbones.parameter_count(parent.model.layers[0])
    assert shape.total_params == shape.root_params + parent.config.num_hidden_layers * shape.layer_params
    assert (shape.lm_head_params == 0) == BACKBONES[name].fields["tie_word_embeddings"]


def test_untied_copies_multiply_the_core():
    tied = planner.model_shape("qwen2.5-0.5b")
    untied = planner.model_shape("qwen2.5-0.5b", tied=False, untied_copies=8)
    n_core = tied.split[1]
    assert untied.total_params == tied.total_params + 7 * n_core * tied.layer_params
    p_tied = planner.plan("qwen2.5-0.5b", "ddp", 1, **WORKLOAD)
    p_untied = planner.plan("qwen2.5-0.5b", "ddp", 1, tied=False, untied_copies=8, **WORKLOAD)
    assert p_untied.params == 4 * untied.total_params and p_untied.activations == p_tied.activations


# --- model states: ZeRO paper accounting ------------------------------------------------------------------------------

def _shard(n_params, n):
    return -(-n_params // n)


# bytes per parameter (param, grad, optimizer) and which of them ZeRO stage s shards
@pytest.mark.parametrize("strategy,stage,nbytes,sharded", [
    ("ddp", 2, (4, 4, 8), (False, False, False)),           # torch autocast over fp32 parameters
    ("deepspeed", 1, (2, 2, 12), (False, False, True)),     # bf16 module + fp32 master, m, v
    ("deepspeed", 2, (2, 2, 12), (False, True, True)),
    ("deepspeed", 3, (2, 2, 12), (True, True, True)),
    ("fsdp", 3, (4, 4, 8), (True, True, True)),             # fp32 shards, bf16 gathered units
])
def test_model_states_follow_zero(strategy, stage, nbytes, sharded):
    psi = planner.model_shape("qwen2.5-7b").total_params
    assert sum(nbytes) == 16  # the ZeRO paper's 2 + 2 + K, K = 12, however a strategy splits it
    for n in (1, 3, 8):
        p = planner.plan("qwen2.5-7b", strategy, n, zero_stage=stage, **WORKLOAD)
        expected = tuple(k * (_shard(psi, n) if s else psi) for k, s in zip(nbytes, sharded))
        assert (p.params, p.grads, p.optimizer) == expected
        assert p.num_params == psi


def test_offload_moves_optimizer_state_to_host():
    psi = planner.model_shape("qwen2.5-7b").total_params
    on_gpu = planner.plan("qwen2.5-7b", "deepspeed", 4, zero_stage=2, **WORKLOAD)
    off = planner.plan("qwen2.5-7b", "deepspeed", 4, zero_stage=2, offload=True, **WORKLOAD)
    assert off.optimizer == 0 and off.grads == 0 and off.host == 16 * _shard(psi, 4)
    assert off.total < on_gpu.total and on_gpu.host == 0


def test_fp32_is_sixteen_bytes_per_parameter_without_master_copy():
    p = planner.plan("tiny-qwen2", "ddp", 1, dtype="fp32", **WORKLOAD)
    assert (p.params, p.grads, p.optimizer) == (4 * p.num_params, 4 * p.num_params, 8 * p.num_params)


# --- monotonicity -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy,stage", [("fsdp", 3), ("deepspeed", 3), ("deepspeed", 2), ("deepspeed", 1)])
def test_more_workers_need_less_memory_per_gpu(strategy, stage):
    totals = [planner.plan("qwen2.5-7b", strategy, n, zero_stage=stage, **WORKLOAD).total for n in (1, 2, 4, 8, 64)]
    assert all(a > b for a, b in zip(totals, totals[1:])), totals


def test_ddp_replicates_everything():
    p1, p8 = (planner.plan("qwen2.5-1.5b", "ddp", n, **WORKLOAD) for n in (1, 8))
    assert (p1.params, p1.grads, p1.optimizer, p1.activations) == (p8.params, p8.grads, p8.optimizer, p8.activations)
    assert p8.buffers == p8.grads and p1.buffers == 0  # the reducer's bucket copy, only once DDP wraps the model


@pytest.mark.parametrize("name", ["qwen2.5-7b", "qwen3-4b", "tiny-qwen3"])
def test_memory_grows_with_the_window_not_with_R(name):
    by_R = [planner.plan(name, "fsdp", 8, R=R, grad_window=8, micro_batch=4, seq_len=64) for R in (8, 16, 32, 64, 512)]
    assert max(p.total for p in by_R) <= 1.01 * by_R[0].total
    assert len({p.activations for p in by_R[1:]}) == 1  # past the window, R changes nothing
    by_window = [planner.plan(name, "fsdp", 8, R=64, grad_window=w, micro_batch=4, seq_len=64) for w in (1, 2, 4, 8)]
    acts = [p.activations for p in by_window]
    assert all(a < b for a, b in zip(acts, acts[1:]))
    assert acts[3] - acts[2] == pytest.approx(2 * (acts[2] - acts[1]), rel=1e-9)  # linear in the window


def test_activations_scale_with_batch_and_sequence():
    base = planner.plan("qwen3-1.7b", "fsdp", 8, R=16, grad_window=4, micro_batch=2, seq_len=128)
    double_b = planner.plan("qwen3-1.7b", "fsdp", 8, R=16, grad_window=4, micro_batch=4, seq_len=128)
    double_t = planner.plan("qwen3-1.7b", "fsdp", 8, R=16, grad_window=4, micro_batch=2, seq_len=256)
    assert double_b.activations == pytest.approx(2 * base.activations, rel=0.01)
    assert 2 * base.activations < double_t.activations < 4 * base.activations  # linear terms + T² attention


# --- smallest GPU count (pure Python) ---------------------------------------------------------------------------------

def _fake_plan(single_gb, multi_gb, sharded_gb):
    """plan() stand-in: total = fixed + sharded / N GB; fixed = single_gb on one GPU, multi_gb on more (buckets)."""
    template = planner.plan("tiny-qwen2", "ddp", 1, R=1, grad_window=1, micro_batch=1, seq_len=8)

    def fake(backbone, strategy, world_size, **kwargs):
        fixed = single_gb if world_size == 1 else multi_gb
        return dataclasses.replace(template, params=round((fixed + sharded_gb / world_size) * 1e9), grads=0,
                                   optimizer=0, activations=0, backward_grads=0, backward_workspace=0,
                                   step_workspace=0, buffers=0)
    return fake


@pytest.mark.parametrize("single,multi,sharded,expected", [
    (10, 10, 60, 1),        # fits on one GPU
    (10, 10, 140, 2),       # 10 + 70 = 80: fits exactly
    (10, 10, 141, 3),
    (90, 70, 40, 4),        # 70 + 40/2 = 90 > 80, 70 + 40/4 = 80
    (79, 79, 1000, 1000),   # needs exactly max_gpus
    (79, 79, 1001, None),   # max_gpus is one short
    (81, 81, 0, None),      # the unsharded part alone is too big
    (70, 80.5, 0, 1),       # fits alone; with buckets it never would
])
def test_min_gpus_search(monkeypatch, single, multi, sharded, expected):
    monkeypatch.setattr(planner, "plan", _fake_plan(single, multi, sharded))
    assert planner.min_gpus("any", "fsdp", 80, max_gpus=1000) == expected
    brute = next((n for n in range(1, 1001) if planner.plan("any", "fsdp", n).fits(80)), None)
    assert brute == expected


def test_min_gpus_rejects_bad_arguments():
    with pytest.raises(ValueError, match="gpu_memory_gb"):
        planner.min_gpus("qwen2.5-7b", "fsdp", 0, **WORKLOAD)
    with pytest.raises(ValueError, match="max_gpus"):
        planner.min_gpus("qwen2.5-7b", "fsdp", 80, max_gpus=0, **WORKLOAD)


def test_min_gpu_table_is_consistent():
    table = planner.min_gpu_table(**WORKLOAD)
    assert set(table) == {80, 141}
    for gb, rows in table.items():
        assert set(rows) == set(REAL)
        for name, row in rows.items():
            for (strategy, stage, offload), n in zip(planner.TABLE_STRATEGIES, row.values()):
                if n is None:
                    continue
                assert planner.plan(name, strategy, n, zero_stage=stage, offload=offload, **WORKLOAD).fits(gb)
                if n > 1:
                    assert not planner.plan(name, strategy, n - 1, zero_stage=stage, offload=offload,
                                            **WORKLOAD).fits(gb)
            for column, n in row.items():  # a bigger GPU never needs more of them
                if gb == 80 and n is not None:
                    assert table[141][name][column] is not None and table[141][name][column] <= n
    assert table[80]["qwen2.5-0.5b"]["fsdp"] == 1
    assert table[80]["qwen2.5-7b"]["ddp"] is None  # 16 B/param of 7.6 B params alone exceed 80 GB


# --- validation and CLI -----------------------------------------------------------------------------------------------

def test_plan_collects_every_error():
    with pytest.raises(ValueError) as e:
        planner.plan("qwen9", "zero", 0, R=0, grad_window=8, micro_batch=4, seq_len=64, zero_stage=4, dtype="fp8",
                     offload=True)
    msg = str(e.value)
    for field in ("backbone:", "strategy:", "world_size:", "R:", "zero_stage:", "dtype:", "offload:"):
        assert field in msg
    assert "'ddp', 'fsdp', 'deepspeed'" in msg


def test_cli_prints_the_plan(capsys):
    assert planner.main(["--backbone", "qwen2.5-7b", "--strategy", "fsdp", "--world-size", "8", "--R", "32",
                         "--grad-window", "8", "--micro-batch", "4", "--seq-len", "64"]) == 0
    out = capsys.readouterr().out
    for row in ("parameters", "gradients", "optimizer state", "activations", "total (peak"):
        assert row in out
    assert "fits on a 80 GB GPU: yes" in out


@pytest.mark.parametrize("argv,flag", [
    (["--backbone", "qwen2.5-7b", "--strategy", "zero"], "--strategy"),
    (["--backbone", "qwen9", "--strategy", "ddp"], "--backbone"),
    (["--backbone", "qwen2.5-7b", "--strategy", "ddp", "--world-size", "0"], "--world-size"),
    (["--backbone", "qwen2.5-7b", "--strategy", "deepspeed", "--zero-stage", "4"], "--zero-stage"),
    (["--backbone", "qwen2.5-7b", "--strategy", "fsdp", "--offload"], "--offload"),
    (["--backbone", "qwen2.5-7b", "--strategy", "ddp", "--gpu-memory-gb", "-1"], "--gpu-memory-gb"),
    (["--strategy", "ddp"], "--backbone"),
    # a flag that would not change the plan is refused, not ignored
    (["--backbone", "qwen2.5-7b", "--strategy", "ddp", "--zero-stage", "3"], "--zero-stage"),
    (["--backbone", "qwen2.5-7b", "--strategy", "ddp", "--R", "4", "--grad-window", "8"], "--grad-window"),
    (["--table", "--backbone", "qwen2.5-7b"], "--backbone"),
])
def test_cli_bad_input_is_one_clear_error(capsys, argv, flag):
    with pytest.raises(SystemExit) as e:
        planner.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err


# --- against measurement ----------------------------------------------------------------------------------------------


def test_plan_is_within_10_percent_of_the_measured_peak(one_thread):
    """Real training steps (float32, CPU), peak from the allocator's events: tiny shapes (activations dominate) and
    one Qwen2.5-0.5B layer as the core (model states dominate). The benchmark runs bigger ones."""
    bench = _bench()
    shapes = {
        "tiny-qwen2": bench.Shape("tiny-qwen2", micro_batch=2, seq_len=16, R=3, grad_window=2),
        "tiny-qwen3": bench.Shape("tiny-qwen3", micro_batch=2, seq_len=16, R=3, grad_window=2),
        "qwen2.5-0.5b layer": bench.Shape("qwen2.5-0.5b", micro_batch=2, seq_len=32, R=2, grad_window=2,
                                          num_layers=1, split=(0, 1, 0), vocab_size=64),
    }
    errors = {name: bench.measure(name, shape, cross_check=False).error for name, shape in shapes.items()}
    assert all(abs(e) <= 0.10 for e in errors.values()), errors


def test_measured_peak_does_not_grow_with_R(one_thread):
    bench = _bench()
    rows = bench.r_sweep(bench.Shape("tiny-qwen2", micro_batch=1, seq_len=16, R=2, grad_window=2), (2, 10))
    assert rows[1]["measured_ratio"] <= 1.3 and rows[1]["planned_ratio"] <= 1.3


# ----------------------------------------------------------------------------------------------------------------------
# GPU types: the names Ray gives the cards, and the paper preset's choice of type and GPU count

def test_gpu_types_are_the_names_ray_gives_the_cards():
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager
    from ray.util.accelerators import accelerators

    ray_names = {v for k, v in vars(accelerators).items() if k.isupper() and isinstance(v, str)}
    assert set(planner.GPU_MEMORY_GB) <= ray_names
    # the node resource accelerator_type:<type> Ray 2.60 derives from each card's NVML device name
    for nvml_name, expected in [("NVIDIA L4", "L4"), ("NVIDIA A10G", "A10G"), ("NVIDIA L40S", "L40S"),
                                ("NVIDIA A100-SXM4-40GB", "A100"), ("NVIDIA A100-SXM4-80GB", "A100"),
                                ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200")]:
        assert NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(nvml_name) == expected
    assert planner.GPU_MEMORY_GB["A100"] == 40  # both A100 sizes read "A100": plan for the smaller one


def _fits_its_card(cfg) -> bool:
    from par_ray.presets import PAPER_HEADROOM

    return planner.plan_trial(cfg).fits(PAPER_HEADROOM * planner.GPU_MEMORY_GB[cfg.train.accelerator_type])


def test_paper_parallelism_takes_the_cheapest_gpu_type_that_fits():
    from par_ray import presets
    from par_ray.config import from_flat

    aws = ("L40S:4", "H100")  # cluster/aws.yaml: L40S nodes of at most 4 GPUs, then 8x H100
    small = presets.paper_parallelism("qwen2.5-0.5b", "swap_s5", gpu_types=aws)
    big = presets.paper_parallelism("qwen2.5-7b", "swap_s5", gpu_types=aws)
    assert small == {"train.strategy": "ddp", "train.num_workers": 1, "train.zero_stage": 2,
                     "train.accelerator_type": "L40S"}
    assert big["train.accelerator_type"] == "H100" and big["train.num_workers"] <= 8
    for backbone, choice in (("qwen2.5-0.5b", small), ("qwen2.5-7b", big)):
        assert _fits_its_card(from_flat(choice, base=presets.paper_trial(backbone)))
    # without the cap the 7B spreads over 8 L40S (two 4-GPU nodes) rather than move to the H100
    uncapped = presets.paper_parallelism("qwen2.5-7b", gpu_types=("L40S", "H100"))
    assert (uncapped["train.accelerator_type"], uncapped["train.num_workers"]) == ("L40S", 8)
    # no GPU types: planned for the default type (an 80 GB H100), which the trial then asks Ray for
    assert presets.paper_parallelism("qwen2.5-0.5b") == {"train.strategy": "ddp", "train.num_workers": 1,
                                                         "train.zero_stage": 2, "train.accelerator_type": "H100"}
    with pytest.raises(ValueError, match=r"backbone\.name: 'qwen2\.5-7b' .* on GPU types \['L4:1'\]"):
        presets.paper_parallelism("qwen2.5-7b", gpu_types=("L4:1",))
    with pytest.raises(ValueError, match=r"--gpu-types: GPU type 'L40' is not one of \[.*'L40S'"):
        presets.paper_parallelism("qwen2.5-0.5b", gpu_types=("L40",))
    with pytest.raises(ValueError, match=r"--gpu-types: 'H100:0': the GPU cap"):
        presets.paper_parallelism("qwen2.5-0.5b", gpu_types=("H100:0",))


def test_a_recipe_that_needs_more_memory_gets_more_or_bigger_gpus():
    """The choice plans the trial as it runs: the chain-of-thought baseline trains on prompt + trace (~62 GB on one
    GPU for Qwen2.5-0.5B, par ~38 GB), so it needs two L40S, or an H100 where L40S nodes have one GPU."""
    from par_ray import presets
    from par_ray.config import from_flat
    from par_ray.recipes import apply_recipe

    base = presets.paper_trial("qwen2.5-0.5b")
    par, cot = apply_recipe(base, "par"), apply_recipe(base, "cot")
    assert planner.plan_trial(cot).total > 48e9 > planner.plan_trial(par).total  # ddp on 1 GPU
    assert presets.fit_parallelism(par, ("L40S:1", "H100"))["train.accelerator_type"] == "L40S"
    one_gpu_l40s = presets.fit_parallelism(cot, ("L40S:1", "H100"))
    assert (one_gpu_l40s["train.accelerator_type"], one_gpu_l40s["train.num_workers"]) == ("H100", 1)
    four_gpu_l40s = presets.fit_parallelism(cot, ("L40S:4", "H100"))
    assert (four_gpu_l40s["train.accelerator_type"], four_gpu_l40s["train.num_workers"]) == ("L40S", 2)
    for choice in (one_gpu_l40s, four_gpu_l40s):
        assert _fits_its_card(validate(from_flat(choice, base=cot)))
    untied = presets.fit_parallelism(apply_recipe(presets.paper_trial("qwen2.5-7b"), "untied"), ("H100",))
    assert untied["train.strategy"] != "deepspeed"  # DeepSpeed cannot train untied copies (config check)


def test_evaluation_plan_streams_halting_and_keeps_the_training_state():
    """The paper preset's halting trial on Qwen2.5-0.5B (bf16, 128 sequences per evaluation batch, test prompts to
    d = 512, R_max = 1,024): stacking every iteration's read-out would take ~239 GB (the review's estimate); the
    streamed halting evaluation plans within 1 GB of plain evaluation, and a longer R_max adds only its 3 × B floats
    per iteration. Evaluation keeps the parameters and optimizer state resident."""
    import dataclasses

    from par_ray.planner import plan_evaluation
    from par_ray.presets import paper_trial
    from par_ray.recipes import apply_recipe

    cfg = apply_recipe(paper_trial("qwen2.5-0.5b"), "par_halt")
    ev, train = plan_evaluation(cfg), planner.plan_trial(cfg)
    assert ev.stacked_halting == pytest.approx(239e9, rel=0.01)
    assert 0 < ev.halting - ev.plain < 1e9 and ev.total < 0.1 * ev.stacked_halting
    assert ev.resident >= train.params + train.optimizer
    longer = plan_evaluation(dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, halt_max_iterations=2048)))
    assert longer.halting - ev.halting == 1024 * 3 * 128 * 4
    plain = plan_evaluation(paper_trial("qwen2.5-0.5b"))
    assert plain.halting == plain.stacked_halting == 0 and plain.probe > 0


def test_the_batched_read_out_is_planned_at_k_times_the_batch():
    """The window's K read-outs run as one batch of K·B sequences (``LoopedLM._read_stacked``): backward's largest
    activation gradients are the coda's at K·B (its workspace grows by 2·max(B·T·I·b, B·n_q·T²·4) per read-out
    beside the logits' gradients). The measured peaks (``test_plan_is_within_10_percent_of_the_measured_peak``) run
    the batched read-out too."""
    B, T, Q = 4, 64, 5
    shape = planner.model_shape("tiny-qwen2")
    plans = {w: planner.plan("tiny-qwen2", "ddp", 1, R=8, grad_window=w, micro_batch=B, seq_len=T, dtype="fp32",
                             read_positions=Q) for w in (2, 4)}
    largest = max(B * T * shape.intermediate * 4, B * shape.heads * T * T * 4)
    assert plans[4].backward_workspace - plans[2].backward_workspace == 2 * B * Q * shape.vocab * 8 + 2 * 2 * largest
