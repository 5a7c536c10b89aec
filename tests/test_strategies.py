"""Strategies in one process (no Ray): DeepSpeed config generation, checkpoint round trips, DeepSpeed's local path,
compiled decoder layers (``train.compile``).

The 2-worker behaviour of every strategy (parity with the single-process run, sharded checkpoints, faults) is in
tests/test_train_loop_ray.py.
"""

import dataclasses
import functools
import os

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from par_ray.config import BackboneConfig, RecipeConfig, TaskConfig, TrainConfig
from par_ray.model.looped import build_looped
from par_ray.tasks import build_task
from par_ray.train.step import build_step_loss, train_step
from par_ray.train import strategies
from par_ray.train.optim import ADAM_BETAS, lr_lambda
from par_ray.train.strategies import STRATEGY_WRAPPERS, World, deepspeed_config, prepare

TASK = TaskConfig(train_depth=4)
RECIPE = RecipeConfig(grad_window=2, max_iterations=8)
TRAIN = TrainConfig(steps=6, batch_size=4, warmup_steps=2, lr=1e-3, weight_decay=0.1, grad_clip=0.5)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread per module


def engine_for(strategy: str, **train):
    tc = dataclasses.replace(TRAIN, strategy=strategy, **train)
    task = build_task(TASK)
    torch.manual_seed(tc.seed)
    return prepare(build_looped(BackboneConfig(), RECIPE, vocab_size=task.vocab_size), tc, World()), task


def run_steps(engine, task, steps) -> list[float]:
    return [train_step(engine, task, TASK, build_step_loss(RECIPE, task), 0, s, TRAIN.batch_size).loss for s in steps]


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("offload", [False, True])
def test_deepspeed_config_follows_train_config(stage, offload):
    tc = dataclasses.replace(TRAIN, strategy="deepspeed", zero_stage=stage, zero_offload=offload, batch_size=8)
    cfg = deepspeed_config(tc, World(rank=0, size=2))
    assert cfg["train_batch_size"] == 8 and cfg["train_micro_batch_size_per_gpu"] == 4
    assert cfg["gradient_accumulation_steps"] == 1 and cfg["gradient_clipping"] == 0.5
    opt = cfg["optimizer"]
    assert opt["type"] == "AdamW"
    assert opt["params"]["betas"] == list(ADAM_BETAS) and opt["params"]["lr"] == 1e-3
    assert opt["params"]["weight_decay"] == 0.1
    # torch's AdamW unless offloaded (DeepSpeed insists on its CPU Adam for ZeRO-Offload)
    assert opt["params"].get("torch_adam", False) is (not offload)
    zero = cfg["zero_optimization"]
    assert zero["stage"] == stage
    assert ("offload_optimizer" in zero) is offload
    # ZeRO-3 keeps vectors whole and partitions every matrix, even at tiny shapes (DeepSpeed's default cut is 1e5)
    assert zero.get("stage3_param_persistence_threshold") == (None if stage < 3 else 1)
    assert deepspeed_config(tc, World(), largest_vector=128)["zero_optimization"].get(
        "stage3_param_persistence_threshold") == (None if stage < 3 else 129)
    assert cfg["bf16"]["enabled"] is False  # CPU world: fp32
    assert deepspeed_config(tc, World(device=torch.device("cuda", 0)))["bf16"]["enabled"] is True


def test_unknown_strategy_names_the_field():
    with pytest.raises(ValueError, match="train.strategy"):
        prepare(torch.nn.Linear(1, 1), dataclasses.replace(TRAIN, strategy="horovod"), World())
    assert set(STRATEGY_WRAPPERS) == {"ddp", "fsdp", "deepspeed"}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_checkpoint_round_trip_continues_identically(strategy, tmp_path):
    """Save after 3 steps, keep training; a fresh engine loaded from the save must produce the same next losses.

    ``fsdp`` without a process group is a plain module with torch.distributed.checkpoint files, the format its
    sharded runs write (resharding across world sizes is tested with Ray workers).
    """
    engine, task = engine_for(strategy)
    run_steps(engine, task, range(3))
    engine.save(str(tmp_path), {"step": 3, "train_seconds": 1.5})
    want = run_steps(engine, task, range(3, 6))

    fresh, _ = engine_for(strategy, seed=123)  # different init: everything must come from the checkpoint
    assert fresh.load(str(tmp_path)) == {"step": 3, "train_seconds": 1.5}
    assert fresh.lr == pytest.approx(lr_lambda(TRAIN)(3) * TRAIN.lr)
    assert run_steps(fresh, task, range(3, 6)) == pytest.approx(want, abs=1e-6)


def test_a_resumed_adamw_keeps_its_step_counters_on_the_host():
    """Loaded to a GPU (``map_location=engine.device``), AdamW's per-parameter ``step`` stays there, and torch's
    foreach AdamW then syncs on each one every step; ``steps_on_host`` puts them back on the CPU, where torch keeps
    them. A fake CUDA tensor stands in for the GPU (``FakeTensorMode``); fused / capturable groups are left alone."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from par_ray.train.checkpoint import steps_on_host

    plain, fused = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([{"params": [plain]}, {"params": [fused], "fused": True}])
    with FakeTensorMode(allow_non_fake_inputs=True):
        opt.state[plain]["step"] = torch.tensor(3.0, device="cuda")
        opt.state[fused]["step"] = torch.tensor(3.0, device="cuda")
        steps_on_host(opt)
        assert opt.state[plain]["step"].device.type == "cpu" and opt.state[fused]["step"].device.type == "cuda"


def test_deepspeed_refuses_the_untied_baseline():
    tc = dataclasses.replace(TRAIN, strategy="deepspeed")
    untied = build_looped(BackboneConfig(), dataclasses.replace(RECIPE, tied=False), vocab_size=8)
    with pytest.raises(ValueError, match="recipe.tied"):
        prepare(untied, tc, World())


@pytest.fixture
def own_process_group():
    """DeepSpeed's local path starts a one-rank group in this process; tear it down as Ray's local mode would."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_deepspeed_single_process_matches_ddp_and_round_trips(own_process_group, tmp_path):
    """Ray Train local mode has no process group; the deepspeed strategy makes a one-rank (here gloo) group for it.

    ZeRO-3, so that the checkpoint holds partitioned parameters (one partition on one rank).
    """
    ddp, task = engine_for("ddp")
    want = run_steps(ddp, task, range(6))
    ds, _ = engine_for("deepspeed", zero_stage=3)
    got = run_steps(ds, task, range(3))
    ds.save(str(tmp_path), {"step": 3})
    got += run_steps(ds, task, range(3, 6))
    assert got == pytest.approx(want, abs=1e-4)
    assert ds.lr == pytest.approx(ddp.lr)

    ds.load(str(tmp_path))  # back to step 3: the same three steps again
    assert run_steps(ds, task, range(3, 6)) == pytest.approx(want[3:], abs=1e-4)


def test_one_rank_group_is_nccl_for_a_cuda_model(own_process_group, monkeypatch):
    """DeepSpeed's local-mode group: gloo for a CPU model; NCCL, on the model's device, for a CUDA one (gloo runs
    only broadcast and all-reduce on CUDA tensors, and ZeRO-3 all-gathers and reduce-scatters them)."""
    from par_ray.train import strategies

    assert strategies.one_rank_group(torch.device("cpu")) == "gloo" == dist.get_backend()
    dist.destroy_process_group()
    calls = []
    monkeypatch.setattr(strategies.torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(strategies.dist, "init_process_group",
                        lambda backend, **kw: calls.append((backend, kw["rank"], kw["world_size"])))
    assert strategies.one_rank_group(torch.device("cuda", 0)) == "nccl"
    assert calls == [("set_device", torch.device("cuda", 0)), ("nccl", 0, 1)]


@pytest.fixture
def fresh_dynamo():
    """Compiled layers share their code across tests (and its recompile_limit): start and leave with none cached."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def check_compiled_matches_eager(tmp_path) -> None:
    """``train.compile`` trains like eager, reads out like eager and shares eager checkpoints.

    Steps 0-2 (R = 3, 1, 4 with a window of 2: layers with and without grad, all rows and the readout's ``rows_Q``)
    give the eager losses; a no-grad read-out of every iteration (evaluation's path) and the EMA teacher (compiled
    too) give the eager logits. Tolerance: 1e-5 relative on losses, 1e-5 absolute on logits, in float32 (inductor's
    fused kernels reorder sums; measured differences are ~1e-7). State-dict keys are the eager ones, and a
    checkpoint of either kind loads into the other and continues with the same loss.
    """
    eager, task = engine_for("ddp")
    want = run_steps(eager, task, range(3))
    tc = dataclasses.replace(TRAIN, compile=True)
    torch.manual_seed(tc.seed)
    compiled = prepare(build_looped(BackboneConfig(), RECIPE, vocab_size=task.vocab_size), tc, World(), ema=True)
    assert run_steps(compiled, task, range(3)) == pytest.approx(want, rel=1e-5)
    assert counters["stats"]["unique_graphs"] >= 2 and not counters["graph_break"]  # compiled, each layer whole

    ep = task.sample(4, 3, seed=1)
    reads = ep.read_positions
    with torch.no_grad():
        got = compiled.model(ep.input_ids, reads, 4, None, 1.0, "all").logits_KBQV
        assert torch.allclose(got, eager.model(ep.input_ids, reads, 4, None, 1.0, "all").logits_KBQV, atol=1e-5)
        reference = build_looped(BackboneConfig(), RECIPE, vocab_size=task.vocab_size)  # eager, the teacher's weights
        reference.load_state_dict(compiled.ema.state_dict())
        teacher = compiled.teacher("ema")(ep.input_ids, reads, 4, 1.0)
        assert torch.allclose(teacher, reference(ep.input_ids, reads, 4, None, 1.0, "last").logits_KBQV[0], atol=1e-5)

    for engine, name in ((eager, "eager"), (compiled, "compiled")):
        (tmp_path / name).mkdir()
        engine.save(str(tmp_path / name), {"step": 3})
    states = [torch.load(tmp_path / d / "state.pt", weights_only=True) for d in ("eager", "compiled")]
    assert list(states[0]["model"]) == list(states[1]["model"]) == list(eager.raw.state_dict())
    assert list(states[1]["ema"]) == list(states[0]["model"])
    then = run_steps(eager, task, [3])
    eager_from_compiled, _ = engine_for("ddp", seed=123)
    eager_from_compiled.load(str(tmp_path / "compiled"))
    compiled_from_eager, _ = engine_for("ddp", seed=123, compile=True)
    compiled_from_eager.load(str(tmp_path / "eager"))
    assert run_steps(eager_from_compiled, task, [3]) == pytest.approx(then, rel=1e-5)
    assert run_steps(compiled_from_eager, task, [3]) == pytest.approx(then, rel=1e-5)


def test_compiled_layers_train_like_eager_and_share_checkpoints(fresh_dynamo, tmp_path, monkeypatch):
    """The cheap form: ``aot_eager`` traces every layer call (dynamo, forward and backward graphs) as inductor
    would, but runs eager kernels, skipping the code generation that makes the real compile slow on CPU."""
    monkeypatch.setattr(strategies, "compile_layers", functools.partial(strategies.compile_layers,
                                                                        backend="aot_eager"))
    check_compiled_matches_eager(tmp_path)


def test_batched_readout_compiles_once_for_any_number_of_read_outs(fresh_dynamo):
    """The batched read-out runs the coda on K·B stacked states, and K changes from step to step (R, the window,
    ``read_every``). Layers compile with dynamic shapes (``compile_layers``), so after a first step that uses every
    layer variant (no-grad and grad core iterations, a read-out with autograd) the other K add no graph, no
    recompile and no graph break (``aot_eager``, which traces as inductor would)."""
    torch.manual_seed(0)
    model = strategies.compile_layers(build_looped(BackboneConfig(), RECIPE, vocab_size=32), backend="aot_eager")
    ids_BT, reads_Q = torch.randint(0, 32, (4, 10)), torch.tensor([9, 5])

    def step(R: int, window: int) -> int:
        out = model(ids_BT, reads_Q, R, window)
        out.logits_KBQV.sum().backward()
        return out.logits_KBQV.shape[0]

    assert step(R=3, window=2) == 2
    graphs, compiles = counters["stats"]["unique_graphs"], counters["frames"]["total"]
    assert graphs >= 2
    assert [step(R, window) for R, window in ((5, 3), (6, 4), (2, 1), (7, 5))] == [3, 4, 1, 5]
    # frames.total counts dynamo's compile attempts, i.e. cache misses: a recompile would add one
    assert (counters["stats"]["unique_graphs"], counters["frames"]["total"]) == (graphs, compiles)
    assert not counters["graph_break"]


def test_compile_layers_raises_the_recompile_limit_and_never_lowers_it(monkeypatch):
    """Inductor's size-range guards multiply the layers' compiled variants past torch's default of 8 (11 in a
    60-step probe of the local curriculum): beyond the limit dynamo would run new calls eagerly for the rest of the
    trial, so ``compile_layers`` raises it to ``RECOMPILE_LIMIT``, and leaves a higher one alone."""
    import torch._dynamo

    model = build_looped(BackboneConfig(), RECIPE, vocab_size=32)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)
    strategies.compile_layers(model, backend="aot_eager")
    assert torch._dynamo.config.recompile_limit == strategies.RECOMPILE_LIMIT >= 32
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1000)
    strategies.compile_layers(model, backend="aot_eager")
    assert torch._dynamo.config.recompile_limit == 1000


@pytest.mark.full_only
def test_inductor_compiled_layers_train_like_eager_and_share_checkpoints(fresh_dynamo, tmp_path):
    """The real compile (inductor's generated kernels): ~90 s of CPU on a cold compile cache on 2 cores, ~10x the
    wall time under load, hence the full form only; the default run keeps the ``aot_eager`` form above."""
    check_compiled_matches_eager(tmp_path)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed"])
def test_evaluation_runs_under_the_training_precision(strategy, monkeypatch):
    """Every forward of an evaluation (accuracy by depth, the probe) sees the autocast state and parameter dtype of
    the training step's forward, for every strategy (``loop.eval_metrics``: one rule).

    On CPU an engine's ``autocast()`` is a no-op unless ``train.cpu_bf16_autocast`` (which DeepSpeed refuses), so
    each strategy's engine class is given the GPU's rule here, bf16 autocast (on CPU). ddp and fsdp (a plain module without a process group) run a real training step;
    DeepSpeed's engine cannot start twice in one process (``test_deepspeed_single_process_matches_ddp...`` owns the
    one start), so its evaluation runs on a ``DeepSpeedEngine`` over the plain module and is compared with a forward
    under its ``autocast()``, the context its training step enters.
    """
    from par_ray.config import EvalConfig, TrialConfig
    from par_ray.train.loop import eval_metrics

    def bf16_autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16)

    for cls in (strategies.Engine, strategies.FSDPEngine, strategies.DeepSpeedEngine):
        monkeypatch.setattr(cls, "autocast", bf16_autocast)
    cfg = TrialConfig(task=TASK, recipe=RECIPE, train=dataclasses.replace(TRAIN, strategy=strategy),
                      eval=EvalConfig(depths=(4, 8), num_sequences=4, batch_size=2))
    if strategy == "deepspeed":
        plain, task = engine_for("ddp")
        engine = strategies.DeepSpeedEngine(plain.model, plain.raw, plain.optimizer, plain.scheduler, cfg.train,
                                            World())
    else:
        engine, task = engine_for(strategy)
    seen = []
    engine.raw.core[0].mlp.down_proj.register_forward_hook(  # a matmul's output: bf16 under autocast
        lambda module, args, out: seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                                               out.dtype)))
    if strategy == "deepspeed":
        ep = task.sample(4, 2, seed=0)
        with engine.autocast():
            engine.model(ep.input_ids, ep.read_positions, 2, None, 1.0, "last")
    else:
        run_steps(engine, task, [0])
    trained = set(seen)
    assert trained == {(True, torch.bfloat16, torch.bfloat16)}  # the GPU rule took hold in training
    seen.clear()
    metrics = eval_metrics(engine, task, cfg)
    assert len(seen) > 2 and set(seen) == trained
    assert {"acc_d4", "acc_d8", "loss_k1", "eval_seconds"} <= set(metrics) and metrics["eval_seconds"] > 0


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_cpu_bf16_autocast_runs_the_forward_in_bf16_over_float32_parameters(strategy):
    """``train.cpu_bf16_autocast``: a CPU engine's ``autocast()`` is bf16 autocast, so the training step's forward
    runs its matmuls in bf16 (the core's MLP down projection returns bf16; the state entering the core stays float32,
    ``tests/test_looped.py``) while parameters and the optimizer state (the moments of the gradients) stay float32;
    three steps' losses move from float32's, within bf16's round-off (2 %). Without the flag a CPU forward is float32
    throughout."""
    losses, seen = {}, {}
    for flag in (False, True):
        engine, task = engine_for(strategy, cpu_bf16_autocast=flag)
        seen[flag] = set()
        engine.raw.core[0].mlp.down_proj.register_forward_hook(
            lambda module, args, out, flag=flag: seen[flag].add((torch.is_autocast_enabled("cpu"), out.dtype)))
        losses[flag] = run_steps(engine, task, range(3))
        assert {p.dtype for p in engine.raw.parameters()} == {torch.float32}
        assert {v.dtype for state in engine.optimizer.state.values() for v in state.values()
                if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0} == {torch.float32}
    assert seen == {False: {(False, torch.float32)}, True: {(True, torch.bfloat16)}}
    assert losses[True] == pytest.approx(losses[False], rel=2e-2)
    assert losses[True] != losses[False]


def test_cpu_bf16_notes_say_where_the_flag_will_not_pay():
    """A CPU worker with ``train.cpu_bf16_autocast`` prints a note (and goes on) when the CPU has no bf16 dot
    products (bf16 emulated: slower than float32) and when attention is not eager (SDPA gains nothing in bf16); none
    without the flag, none for the paired setting on a CPU that has them, none on GPU (workers autocast anyway)."""
    on = TrainConfig(cpu_bf16_autocast=True)
    assert strategies.cpu_bf16_notes(TrainConfig(), "sdpa", native=False) == []
    assert strategies.cpu_bf16_notes(on, "eager", native=True) == []
    assert strategies.cpu_bf16_notes(dataclasses.replace(on, use_gpu=True), "sdpa", native=False) == []
    emulated, sdpa = strategies.cpu_bf16_notes(on, "sdpa", native=False)
    assert "without bf16 dot products" in emulated and "slower than float32" in emulated
    assert "backbone.attn_implementation='sdpa'" in sdpa and "'eager'" in sdpa
    assert strategies.cpu_bf16_notes(on, "eager", native=False) == [emulated]
    assert isinstance(strategies.cpu_has_bf16_dot_products(), bool)


def _medium_rounds_products_to_bf16() -> bool:
    """Whether this CPU computes float32 matmuls with bf16 products under ``medium``: the relative error of a
    (64, 256) × (256, 256) product against float64 at bf16's scale (~1e-3, AMX-BF16) rather than float32's (~1e-7).
    An AVX512-BF16 AMD EPYC without AMX kept float32's accuracy under ``medium`` (7.8e-7; oneDNN changed only which
    float32 kernel ran)."""
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(64, 256, generator=g), torch.randn(256, 256, generator=g)
    exact = a.double() @ w.double()
    try:
        torch.set_float32_matmul_precision("medium")
        error = ((a @ w).double() - exact).abs().max() / exact.abs().max()
    finally:
        torch.set_float32_matmul_precision("highest")
    return bool(error > 1e-5)


def test_medium_matmul_precision_rounds_the_products_only():
    """``train.float32_matmul_precision``: ``""`` is TF32 (``high``) on CUDA and IEEE float32 elsewhere; ``medium``
    trains with bf16 matmul products where the CPU computes them (oneDNN with AMX-BF16): parameters stay float32 and
    three steps' losses stay within 1 % of float32's, though not equal to them; where the CPU keeps float32 products
    under ``medium`` (:func:`_medium_rounds_products_to_bf16`) the losses stay within float32 round-off."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert strategies.matmul_precision(TRAIN, cpu) == "highest"
    assert strategies.matmul_precision(TRAIN, cuda) == "high"
    medium_cfg = dataclasses.replace(TRAIN, float32_matmul_precision="medium")
    assert strategies.matmul_precision(medium_cfg, cpu) == strategies.matmul_precision(medium_cfg, cuda) == "medium"
    losses = {}
    try:
        for precision in ("highest", "medium"):
            torch.set_float32_matmul_precision(precision)
            engine, task = engine_for("ddp")
            losses[precision] = run_steps(engine, task, range(3))
            assert {p.dtype for p in engine.raw.parameters()} == {torch.float32}
    finally:
        torch.set_float32_matmul_precision("highest")
    if _medium_rounds_products_to_bf16():  # the bf16 products ran: the numbers moved, within 1 %
        assert losses["medium"] == pytest.approx(losses["highest"], rel=1e-2)
        assert losses["medium"] != losses["highest"]
    else:
        assert losses["medium"] == pytest.approx(losses["highest"], rel=1e-5)


def test_bf16_products_on_cpu_raise_onednns_primitive_cache_unless_set(monkeypatch, onednn_cache_env):
    """``set_matmul_precision``: a CPU worker under ``medium`` asks oneDNN for a primitive cache of
    ``ONEDNN_PRIMITIVE_CACHE`` (one primitive per matmul shape); a value in the environment wins; other precisions
    and GPUs leave the environment alone."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    medium = dataclasses.replace(TRAIN, float32_matmul_precision="medium")
    key = onednn_cache_env
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda p: None)  # no CUDA state here
    for cfg, device, env, want in ((TRAIN, cpu, None, None), (medium, cuda, None, None),
                                   (medium, cpu, None, str(strategies.ONEDNN_PRIMITIVE_CACHE)),
                                   (medium, cpu, "512", "512")):
        os.environ.pop(key, None)
        if env is not None:
            os.environ[key] = env
        assert strategies.set_matmul_precision(cfg, device) == strategies.matmul_precision(cfg, device)
        assert os.environ.get(key) == want


def test_streamed_probe_equals_the_stacked_logits_computation():
    """``probe_metrics`` reduces each iteration's read-out to its loss as it is computed; its ``loss_k``/``rms_k``
    equal exactly those of the computation that stacked every iteration's logits first (the probe before
    streaming)."""
    from par_ray.config import EvalConfig, TrialConfig
    from par_ray.objectives import par_loss
    from par_ray.train.loop import probe_metrics

    engine, task = engine_for("ddp")
    run_steps(engine, task, [0, 1])
    cfg = TrialConfig(task=TASK, recipe=RECIPE, train=TRAIN, eval=EvalConfig(depths=(4,), num_sequences=6,
                                                                              batch_size=6))
    got = probe_metrics(engine, task, cfg)
    ep = task.sample(TASK.train_depth, 6, seed=cfg.eval.seed + 1, step=0)
    with torch.no_grad():
        out = engine.model(ep.input_ids, ep.read_positions, TASK.train_depth, None, 1.0, "all")
        lo = par_loss(out.logits_KBQV, out.iterations, ep.states, 1, RECIPE.targets)
    assert [got[f"loss_k{k}"] for k in out.iterations] == (lo.per_iteration_K.double() * 6 / 6).tolist()
    assert [got[f"rms_k{k}"] for k in out.iterations] == (out.state_rms_R.double() * 6 / 6).tolist()
