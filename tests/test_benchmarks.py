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
    """The CPU dry path of every section through gpu_check.sh: the MFU over the depth grid, memory vs the planner,
    the d = 512-style evaluation share extrapolated to 1,024 sequences, halting memory, one-rank FSDP2 on gloo."""
    gpu_check = _load("gpu_check")
    plan = gpu_check.DRY_PLAN
    assert sum(gpu_check.GPU_PLAN.sections_s.values()) <= 360  # well under gpu_check.sh's 450 s kill
    proc, doc = _run_gpu_check_sh(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["schema"] == gpu_check.SCHEMA_VERSION and doc["dry_run"] is True
    sections = doc["sections"]
    assert list(sections) == list(gpu_check.SECTIONS)
    assert all(s["status"] == "ok" for s in sections.values()), sections
    peak = sections["matmul_peak"]["result"]["peak_flops_per_s"]
    mfu = sections["train_mfu"]["result"]
    assert [r["depth"] for r in mfu["rows"]] == list(plan.mfu_depths) and all(r["flops_per_step"] > 0
                                                                               for r in mfu["rows"])
    flops, seconds = (sum(r[k] for r in mfu["rows"]) for k in ("flops_per_step", "step_seconds"))
    assert mfu["mfu_vs_measured_peak"] == pytest.approx(flops / seconds / peak)
    mem = sections["train_memory"]["result"]
    assert mem["R"] == plan.train_depth and mem["planned_bytes"] > 0 and mem["measured_bytes"] is None  # CPU
    ev = sections["eval_throughput"]["result"]
    assert ev["R"] == plan.eval_depth and ev["seconds_per_1024"] == pytest.approx(ev["seconds"] * 1024 / plan.eval_share)
    assert sections["halting_memory"]["result"]["R_max"] == 2 * plan.halt_depth
    assert sections["fsdp2"]["result"]["backend"] == "gloo"
    # its JSON is a --prices file (par_ray.hardware): as if it had run on an H200, the measured training MFU
    from par_ray import hardware

    as_gpu = {**doc, "dry_run": False}
    as_gpu["sections"]["environment"]["result"]["device"] = "NVIDIA H200"
    (tmp_path / "gpu.json").write_text(json.dumps(as_gpu))
    assert hardware.load_table(str(tmp_path / "gpu.json")).mfu_of("H200", "train") == pytest.approx(
        mfu["flops_per_s"] / (hardware.DEVICES["H200"].peak_tflops * 1e12))


def test_gpu_check_without_cuda_fails_loudly_unless_dry_run(tmp_path, monkeypatch):
    """A GPU run on a machine where CUDA is unavailable measures nothing and exits 3 with the reason in the JSON."""
    gpu_check = _load("gpu_check")
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    out = tmp_path / "g.json"
    assert gpu_check.main(["--out", str(out)]) == gpu_check.EXIT_NO_CUDA == 3
    doc = json.loads(out.read_text())
    assert "CUDA is not available" in doc["error"] and doc["sections"] == {} and doc["dry_run"] is False


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
    skip = [s for s in gpu_check.SECTIONS if s not in ("environment", "matmul_peak", "train_memory")]
    assert gpu_check.main(["--out", str(out), "--dry-run", "--skip", *skip]) == 1
    sections = json.loads(out.read_text())["sections"]
    assert sections["environment"]["status"] == "timeout"
    assert sections["matmul_peak"]["status"] == "error" and "no such device" in sections["matmul_peak"]["error"]
    assert sections["train_memory"]["status"] == "ok"


def test_gpu_check_budget_skips_what_does_not_fit(tmp_path):
    gpu_check = _load("gpu_check")
    out = tmp_path / "g.json"
    assert gpu_check.main(["--out", str(out), "--dry-run", "--budget-s", "0"]) == 0
    sections = json.loads(out.read_text())["sections"]
    assert all(s["status"] == "skipped" and "budget" in s["reason"] for s in sections.values())



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
