"""The benchmark scripts run and write their JSON: bench_throughput on the tiny shape, and gpu_check's CPU dry path
(the path CI can run; on a GPU the same script measures the real shapes). No timings are asserted."""

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _load(name: str):
    """Import ``benchmarks/{name}.py`` (not a package) as a module; registered so its dataclasses resolve."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _run_gpu_check_sh(out_dir: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "OUT": str(out_dir), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([str(BENCH / "gpu_check.sh"), "--dry-run", *args], env=env, capture_output=True, text=True,
                          timeout=600)
    return proc, json.loads((out_dir / "gpu_check.json").read_text())


def test_bench_throughput_tiny_writes_ratio(tmp_path):
    bench = _load("bench_throughput")
    out = tmp_path / "tp.json"
    assert bench.main(["--shapes", "tiny", "--depth", "2", "--steps", "1", "--warmup", "0", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["shapes"]
    assert row["shape"] == "tiny" and row["R"] == 2 and row["attn_implementation"] == "sdpa"
    assert doc["compile"] is False and row["compile"] is False and row["compile_seconds"] == 0.0
    # The reference counts the unoptimised step (full coda, eager attention); the model skips the coda's last layer
    # at non-read rows, so it executes fewer FLOPs.
    assert 0 < row["executed_flops"] < row["reference_flops"]
    for key in ("ratio", "ratio_executed", "ratio_shape_gemm"):
        assert row[key] > 0
    assert doc["machine_peak_flops_per_s"] > 0


def test_bench_throughput_cpu_bf16_autocast_counts_float32_flops(tmp_path):
    """``--cpu-bf16-autocast`` times the step under CPU bf16 autocast (``train.cpu_bf16_autocast``) and records it;
    FLOPs are counted on the float32 step, so they equal the float32 run's."""
    bench = _load("bench_throughput")
    args = ["--shapes", "tiny", "--depth", "2", "--steps", "1", "--warmup", "0", "--attn", "eager"]
    assert bench.main([*args, "--cpu-bf16-autocast", "--out", str(tmp_path / "bf16.json")]) == 0
    assert bench.main([*args, "--out", str(tmp_path / "fp32.json")]) == 0
    bf16_doc, fp32_doc = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("bf16", "fp32"))
    assert bf16_doc["cpu_bf16_autocast"] is True and fp32_doc["cpu_bf16_autocast"] is False
    (bf16,), (fp32,) = bf16_doc["shapes"], fp32_doc["shapes"]
    assert bf16["cpu_bf16_autocast"] is True and bf16["step_seconds"] > 0
    for key in ("reference_flops", "executed_flops"):
        assert bf16[key] == fp32[key], key


@pytest.mark.full_only
def test_bench_throughput_compile_times_steps_without_the_compile(tmp_path):
    """``--compile`` (inductor on CPU: a slow compile, hence full form only): the first compiled step is reported as
    ``compile_seconds``, not timed; FLOPs are counted eagerly, so they equal the eager run's."""
    bench = _load("bench_throughput")
    args = ["--shapes", "tiny", "--depth", "2", "--steps", "1", "--warmup", "0"]
    assert bench.main([*args, "--compile", "--out", str(tmp_path / "compiled.json")]) == 0
    assert bench.main([*args, "--out", str(tmp_path / "eager.json")]) == 0
    (compiled,) = json.loads((tmp_path / "compiled.json").read_text())["shapes"]
    (eager,) = json.loads((tmp_path / "eager.json").read_text())["shapes"]
    assert compiled["compile"] is True and compiled["compile_seconds"] > 0 and len(compiled["step_seconds_all"]) == 1
    for key in ("reference_flops", "executed_flops"):
        assert compiled[key] == eager[key], key


def test_gpu_check_dry_run_every_section(tmp_path):
    """The CPU dry path of every section through gpu_check.sh: the MFU over the depth grid (FLOPs counted and
    modelled), memory vs the planner, the d = 512-style evaluation share extrapolated to 1,024 sequences, the RoPE
    probe, halting memory, one-rank FSDP2 on gloo."""
    gpu_check = _load("gpu_check")
    plan = gpu_check.DRY_PLAN
    assert sum(gpu_check.GPU_PLAN.sections_s.values()) <= 360  # well under gpu_check.sh's 450 s kill
    proc, doc = _run_gpu_check_sh(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["schema"] == gpu_check.SCHEMA_VERSION and doc["dry_run"] is True
    assert doc["passed"] is True and doc["failed"] == [] and doc["left_out"] == []
    sections = doc["sections"]
    assert list(sections) == list(gpu_check.SECTIONS)
    assert all(s["status"] == "ok" for s in sections.values()), sections
    peak = sections["matmul_peak"]["result"]["peak_flops_per_s"]
    mfu = sections["train_mfu"]["result"]
    assert [r["depth"] for r in mfu["rows"]] == list(plan.mfu_depths)
    for row in mfu["rows"]:
        # counted under SDPA's math backend, attention included: the cost model's matmul FLOPs within 5 %
        assert row["flops_counted"] > 0 and row["count_error"] is None
        assert row["flops_per_step"] == row["flops_counted"]
        assert row["flops_counted"] == pytest.approx(row["flops_model"], rel=0.05)
    assert mfu["flops_source"] == "counted"
    flops, seconds = (sum(r[k] for r in mfu["rows"]) for k in ("flops_per_step", "step_seconds"))
    assert mfu["mfu_vs_measured_peak"] == pytest.approx(flops / seconds / peak)
    mem = sections["train_memory"]["result"]
    assert mem["R"] == plan.train_depth and mem["planned_bytes"] > 0 and mem["measured_bytes"] is None  # CPU
    ev = sections["eval_throughput"]["result"]
    assert ev["R"] == plan.eval_depth and ev["seconds_per_1024"] == pytest.approx(ev["seconds"] * 1024 / plan.eval_share)
    assert ev["flops_model"] > 0 and ev["planned_bytes"] > 0
    assert sections["halting_memory"]["result"]["R_max"] == 2 * plan.halt_depth
    assert sections["fsdp2"]["result"]["backend"] == "gloo"
    rope = sections["rope_tf32"]["result"]
    assert rope["positions"] >= 519 and rope["fp32"]["max_abs_error"] < 1e-3 and rope["tf32_corrupts_angles"] is False
    # its JSON is a --prices file (par_ray.hardware): as if it had run on an H200, the measured training MFU
    from par_ray import hardware

    as_gpu = {**doc, "dry_run": False}
    as_gpu["sections"]["environment"]["result"]["device"] = "NVIDIA H200"
    (tmp_path / "gpu.json").write_text(json.dumps(as_gpu))
    assert hardware.load_table(str(tmp_path / "gpu.json")).mfu_of("H200", "train") == pytest.approx(
        mfu["flops_per_s"] / (hardware.DEVICES["H200"].peak_tflops * 1e12))


def test_gpu_check_builds_one_model_for_every_section(tmp_path, monkeypatch):
    """Every section after ``model`` uses the model it built (not a throw-away model each, inside its alarm); a
    section whose model was not built fails at once, naming the ``model`` section."""
    gpu_check = _load("gpu_check")
    built = []
    real = gpu_check._model
    monkeypatch.setattr(gpu_check, "_model", lambda plan: built.append(1) or real(plan))
    out = tmp_path / "g.json"
    assert gpu_check.main(["--out", str(out), "--dry-run", "--skip", "fsdp2"]) == 0
    assert len(built) == 1
    doc = json.loads(out.read_text())
    assert doc["left_out"] == ["fsdp2"] and doc["passed"] is True
    assert doc["sections"]["model"]["result"]["vocab_size"] == doc["sections"]["halting_memory"]["result"]["vocab_size"]
    assert gpu_check.main(["--out", str(out), "--dry-run", "--skip", "model", "fsdp2"]) == 1
    sections = json.loads(out.read_text())["sections"]
    assert sections["train_mfu"]["status"] == "error" and "'model' section" in sections["train_mfu"]["error"]


def _gqa_sdpa_asserts_under_the_flop_counter(monkeypatch):
    """Make ``F.scaled_dot_product_attention`` behave as torch 2.11's on a GPU under ``FlopCounterMode``: with a fused
    backend enabled and fewer key/value than query heads, the counter's formula asserts."""
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def fused_or_math(query, key, value, *args, **kwargs):
        counting = any("FlopCounter" in type(m).__name__ for m in _get_current_dispatch_mode_stack())
        fused = (torch.backends.cuda.flash_sdp_enabled() or torch.backends.cuda.mem_efficient_sdp_enabled()
                 or torch.backends.cuda.cudnn_sdp_enabled())
        if counting and fused and query.shape[1] != key.shape[1]:
            raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", fused_or_math)


def test_gpu_check_counts_gqa_flops_where_torch_2_11_asserts(monkeypatch):
    """torch 2.11's ``FlopCounterMode`` asserts on grouped-query SDPA through a fused kernel (emulated here; Qwen has
    fewer key/value heads than query heads): the check counts its untimed step under the math backend, where the
    count works and includes attention, so it matches ``par_ray.cost`` within 5 %."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from par_ray.config import RecipeConfig

    gpu_check = _load("gpu_check")
    _gqa_sdpa_asserts_under_the_flop_counter(monkeypatch)
    plan = gpu_check.DRY_PLAN
    engine = gpu_check._engine(plan, gpu_check._model(plan))
    assert engine.raw.config.num_key_value_heads < engine.raw.config.num_attention_heads  # GQA, as Qwen
    run, recipe, T, Q = gpu_check._step_at(plan, engine, 3)
    with pytest.raises(AssertionError, match="sdpa_flop_count"), FlopCounterMode(display=False):
        run(0)  # what the check did before: the counter around a step with the default backends
    result, flops = gpu_check.count_flops(lambda: run(1))
    assert result.loss > 0 and flops == pytest.approx(gpu_check._model_flops(plan, recipe, 3, T, Q), rel=0.05)
    run(2)  # timed steps keep the default (fused) backends, outside the counter
    assert torch.backends.cuda.flash_sdp_enabled()
    assert RecipeConfig is not None


def test_gpu_check_plans_evaluation_memory_with_the_measured_vocabulary():
    """The GPU plan measures the checkpoint's 151,936-token vocabulary: its evaluation plan has that vocabulary's
    read-out (B·Q·V·(b + 4) bytes), not the task's (before: a spurious 21–28 % planner error at d = 512 /
    halting)."""
    from dataclasses import replace as dc_replace

    from par_ray import planner

    gpu_check = _load("gpu_check")
    plan = gpu_check.GPU_PLAN
    full = gpu_check._planned_eval(plan, "plain", plan.eval_depth, plan.eval_share)
    task_only = gpu_check._planned_eval(dc_replace(plan, task_vocab=True), "plain", plan.eval_depth, plan.eval_share)
    vocab = planner.model_shape(plan.backbone).vocab
    assert vocab == 151_936
    task = gpu_check._task(plan)
    Q = len(task.sample(plan.eval_depth, 1, seed=0).read_positions)
    readout_gap = plan.eval_share * Q * (vocab - (task.vocab_size + 3)) * (2 + 4)  # bf16 logits + an fp32 copy
    assert full - task_only >= readout_gap
    halting = gpu_check._planned_eval(plan, "halting", plan.halt_depth, plan.halt_batch)
    assert halting > gpu_check._planned_eval(dc_replace(plan, task_vocab=True), "halting", plan.halt_depth,
                                             plan.halt_batch)


def test_gpu_check_eval_alarm_leaves_room_at_a_third_of_the_assumed_mfu():
    """The d = 512 evaluation share runs within its alarm even at a third of the assumed evaluation MFU on an H200
    (``par_ray.hardware``), by ``par_ray.cost``'s FLOPs (before: 128 sequences, 8.8 PFLOP, seconds from its alarm)."""
    from par_ray import cost, hardware, planner

    gpu_check = _load("gpu_check")
    plan = gpu_check.GPU_PLAN
    ep = gpu_check._task(plan).sample(plan.eval_depth, 1, seed=0)
    T, Q = ep.input_ids.shape[1], len(ep.read_positions)
    assert T >= 519 and plan.rope_positions >= T
    flops = plan.eval_share * cost.forward_flops(planner.model_shape(plan.backbone), T, Q, plan.eval_depth, 1)
    rate = hardware.DEVICES["H200"].peak_tflops * 1e12 * hardware.Table().mfu_of("H200", "eval") / 3
    assert flops / rate <= plan.sections_s["eval_throughput"]


def test_gpu_check_memory_records_reserved_and_free_bytes(monkeypatch):
    """Every CUDA peak also records ``max_memory_reserved`` and ``mem_get_info`` (the 90 % headroom rule)."""
    import torch

    gpu_check = _load("gpu_check")
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (20 * gib, 140 * gib))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 130 * gib)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 100 * gib)
    mem = gpu_check._memory(torch.device("cuda", 0))
    assert mem == {"max_allocated_bytes": 100 * gib, "max_reserved_bytes": 130 * gib, "free_bytes": 20 * gib,
                   "total_bytes": 140 * gib, "reserved_share_of_total": 130 / 140, "within_headroom": False}
    assert gpu_check._memory(torch.device("cpu")) == {}


def test_gpu_check_rope_probe_finds_corrupted_angles(monkeypatch):
    """The RoPE probe compares cos/sin with TF32 allowed and not against float64: angles corrupted only under TF32
    (emulated: the fp32-matmul precision ``high``) past position 600 are found, with the first bad position."""
    import torch

    gpu_check = _load("gpu_check")
    plan = gpu_check.DRY_PLAN
    state = {"engine": gpu_check._engine(plan, gpu_check._model(plan))}
    rope = state["engine"].raw.rotary_emb
    forward = rope.forward

    def corrupted(x, position_ids):
        cos, sin = forward(x, position_ids)
        if torch.get_float32_matmul_precision() == "high":
            cos = cos + 0.01 * (position_ids[..., None] >= 600)
        return cos, sin

    monkeypatch.setattr(rope, "forward", corrupted)
    before = torch.get_float32_matmul_precision()
    out = gpu_check.rope_tf32(plan, state)
    assert torch.get_float32_matmul_precision() == before
    assert out["tf32_corrupts_angles"] is True and out["tf32"]["first_bad_position"] == 600
    assert out["fp32"]["first_bad_position"] is None and out["fp32"]["max_abs_error"] < 1e-3


def test_gpu_check_without_cuda_fails_loudly_unless_dry_run(tmp_path, monkeypatch):
    """A GPU run on a machine where CUDA is unavailable measures nothing and exits 3 with the reason in the JSON."""
    gpu_check = _load("gpu_check")
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    out = tmp_path / "g.json"
    assert gpu_check.main(["--out", str(out)]) == gpu_check.EXIT_NO_CUDA == 3
    doc = json.loads(out.read_text())
    assert "CUDA is not available" in doc["error"] and doc["sections"] == {} and doc["dry_run"] is False


def test_gpu_check_dry_run_on_a_gpu_machine_is_refused(tmp_path, monkeypatch):
    """``--dry-run`` where CUDA is available would pass with CPU numbers: it measures nothing and exits 4."""
    gpu_check = _load("gpu_check")
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    out = tmp_path / "g.json"
    assert gpu_check.main(["--out", str(out), "--dry-run"]) == gpu_check.EXIT_DRY_RUN_ON_GPU == 4
    doc = json.loads(out.read_text())
    assert "NVIDIA H200" in doc["error"] and doc["sections"] == {}


def test_gpu_check_records_errors_and_timeouts_and_goes_on(tmp_path, monkeypatch):
    """A failing section and an overrunning one are recorded; the sections after them still run."""
    gpu_check = _load("gpu_check")

    def boom(plan):
        raise RuntimeError("no such device")

    def hang(plan):
        import time
        time.sleep(30)

    monkeypatch.setattr(gpu_check, "environment", hang)
    monkeypatch.setattr(gpu_check, "matmul_peak", boom)
    monkeypatch.setattr(gpu_check, "DRY_PLAN", replace(gpu_check.DRY_PLAN, sections_s={
        **gpu_check.DRY_PLAN.sections_s, "environment": 1}))
    out = tmp_path / "g.json"
    skip = [s for s in gpu_check.SECTIONS if s not in ("environment", "matmul_peak", "model", "train_memory")]
    assert gpu_check.main(["--out", str(out), "--dry-run", "--skip", *skip]) == 1
    doc = json.loads(out.read_text())
    sections = doc["sections"]
    assert sections["environment"]["status"] == "timeout"
    assert sections["matmul_peak"]["status"] == "error" and "no such device" in sections["matmul_peak"]["error"]
    assert sections["train_memory"]["status"] == "ok"
    assert doc["failed"] == ["environment", "matmul_peak"] and doc["passed"] is False


def test_gpu_check_budget_skips_what_does_not_fit_and_fails(tmp_path):
    """Sections the time budget leaves out are recorded as skipped, and the run fails: a check that measured less
    than it should is not a pass (only sections left out with ``--skip`` are)."""
    gpu_check = _load("gpu_check")
    out = tmp_path / "g.json"
    assert gpu_check.main(["--out", str(out), "--dry-run", "--budget-s", "0"]) == gpu_check.EXIT_FAILED == 1
    doc = json.loads(out.read_text())
    assert all(s["status"] == "skipped" and "budget" in s["reason"] for s in doc["sections"].values())
    assert doc["failed"] == list(gpu_check.SECTIONS) and doc["passed"] is False


def test_bench_long_problems_splits_the_step_by_profiler_label(tmp_path):
    """Issue 22: a step at d = R = 4 with a gradient window of 2 has 2 iterations under ``par_ray.core_no_grad``;
    the full-window row has none."""
    bench = _load("bench_long_problems")
    out = tmp_path / "long.json"
    assert bench.main(["--depths", "4", "--window", "2", "--steps", "1", "--batch", "4", "--out", str(out)]) == 0
    assert bench.main(["--depths", "12", "--window", "8", "--steps", "1", "--batch", "2"]) == 0  # above eval's default
    short, full = json.loads(out.read_text())["rows"]
    assert (short["grad_window"], short["no_grad_iterations"], full["grad_window"]) == (2, 2, 4)
    assert short["no_grad_ms"] > 0 and full["no_grad_ms"] == 0 and short["grad_ms"] > 0 and full["grad_ms"] > 0
    assert short["step_s"] > 0 and full["saving"] == 0.0


def test_a_section_overrunning_inside_its_own_except_exception_is_still_stopped():
    """The alarm's ``SectionTimeout`` passes a section's own ``except Exception`` (``train_mfu`` falls back to the
    modelled FLOPs when the counter fails): caught there, the section ran on with the one-shot timer spent, bounded
    only by the session's kill, and the later sections were lost."""
    import time

    gpu_check = _load("gpu_check")
    t0 = time.perf_counter()
    with pytest.raises(gpu_check.SectionTimeout):
        with gpu_check.alarm(0.2):
            try:
                time.sleep(5)
            except Exception:  # noqa: BLE001 - what a section's fallback does
                time.sleep(5)
    assert time.perf_counter() - t0 < 2


def test_the_gpu_checks_model_is_built_on_the_plans_device(monkeypatch):
    """The parent goes where the plan says (on a GPU: initialised there, not on the host and moved): the meta device
    stands in for CUDA; ``backbones.load`` placed it on the CPU whatever the caller's device context."""
    gpu_check = _load("gpu_check")
    monkeypatch.setattr(gpu_check, "_device", lambda plan: torch.device("meta"))
    model = gpu_check._model(gpu_check.DRY_PLAN)
    assert {p.device.type for p in model.parameters()} == {"meta"}

