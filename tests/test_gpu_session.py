"""benchmarks/gpu_session.py, the one-call GPU session of issue 36: its refusals and its own checks (a part that did
nothing is a failure), a CPU dry run of the product's parts with this environment's packages (CI), and the whole dry
rehearsal with the carry bundle under Python 3.12 (where one is set up: ``PAR_RAY_REHEARSAL_PYTHON``)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _load():
    spec = importlib.util.spec_from_file_location("benchmarks_gpu_session", BENCH / "gpu_session.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _doc(out: Path) -> dict:
    return json.loads((out / "session.json").read_text())


def test_gpu_run_without_cuda_and_dry_run_with_cuda_are_refused(tmp_path, monkeypatch):
    """Never CPU numbers where the GPU's are expected: a GPU session without CUDA exits 3, a dry one where CUDA is
    available exits 4; neither runs a part."""
    session = _load()
    monkeypatch.setattr(session, "_cuda_device", lambda python, env: "")
    assert session.main(["--out", str(tmp_path / "a"), "--work", str(tmp_path / "w")]) == session.EXIT_NO_CUDA == 3
    doc = _doc(tmp_path / "a")
    assert "CUDA is not available" in doc["error"] and doc["parts"] == {} and doc["passed"] is False
    monkeypatch.setattr(session, "_cuda_device", lambda python, env: "H100")
    assert session.main(["--out", str(tmp_path / "b"), "--work", str(tmp_path / "w"), "--dry-run"]) == 4
    assert "--dry-run on a machine with CUDA" in _doc(tmp_path / "b")["error"]


def test_the_gpu_parts_ask_ray_for_the_card_the_machine_has(tmp_path):
    """The device tool lends an H100 or an H200: the CLI trial and the sweep name the card the probe found on the
    machine (a fixed ``H200`` left an H100's trial pending on a resource no node has), and the probe itself reads
    ``""`` on a machine without CUDA."""
    session = _load()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    assert session._cuda_device(sys.executable, env) == ""
    s = session.Session(dry=False, out=tmp_path, work=tmp_path, python=sys.executable, bundle=tmp_path / "b",
                        device_type="H100")
    argv, _ = session._cli_argv(s, "cli_paper")
    assert "train.accelerator_type=H100" in argv and not any("H200" in a for a in argv)
    from par_ray import hardware  # the MFU's denominator: the found card's datasheet peak, read without CUDA

    assert session._peak_flops(s) == hardware.DEVICES["H100"].peak_tflops * 1e12 > 0


def test_a_part_that_did_nothing_fails_and_parts_out_of_time_are_not_a_pass(tmp_path, monkeypatch):
    """``install`` without a bundle fails (no quiet pass), parts not asked for are listed as left out, and a part the
    budget leaves no time for fails the session (only the optional ``g4_timing`` may be left that way)."""
    session = _load()
    monkeypatch.setattr(session, "_cuda_device", lambda python, env: "")
    out = tmp_path / "out"
    argv = ["--dry-run", "--out", str(out), "--work", str(tmp_path / "w"), "--bundle", str(tmp_path / "none.tar.xz")]
    assert session.main([*argv, "--parts", "install"]) == 1
    doc = _doc(out)
    assert doc["parts"]["install"]["status"] == "failed" and "no bundle" in doc["parts"]["install"]["error"]
    assert {n for n, e in doc["parts"].items() if e["status"] == "left out"} == set(session.JOBS) - {"install"}
    assert doc["failed"] == ["install"] and doc["passed"] is False

    ran = []
    monkeypatch.setattr(session, "JOBS", {**session.JOBS, "gpu_check": lambda s, limit: ran.append(limit) or {}})
    assert session.main([*argv, "--parts", "gpu_check,g4_timing", "--budget-s", "10"]) == 1
    doc = _doc(out)
    assert ran == [] and doc["parts"]["gpu_check"]["status"] == "not run" and doc["failed"] == ["gpu_check"]
    assert doc["parts"]["g4_timing"]["status"] == "not run"  # optional: listed, not failed
    assert session.main([*argv, "--parts", "gpu_check", "--budget-s", "100"]) == 0
    assert len(ran) == 1 and 20 <= ran[0] <= 100 and _doc(out)["passed"] is True


def test_on_a_gpu_a_part_is_not_started_without_the_time_it_needs(tmp_path, monkeypatch):
    """On a GPU a part starts only with its ``gpu_min_s`` left (a part that cannot finish burns device seconds a
    rerun needs), and its entry reads ``running`` while it runs (what a run cut from outside leaves); DeepSpeed, the
    path least like ``cli_paper``, comes before FSDP (unsharded on one worker)."""
    session = _load()
    names = [p.name for p in session.PARTS]
    assert names == list(session.JOBS) and names.index("cli_deepspeed") < names.index("cli_fsdp")
    monkeypatch.setattr(session, "_cuda_device", lambda python, env: "H100")
    seen = []

    def job(s, limit):
        seen.append((limit, _doc(tmp_path / "out")["parts"]["cli_deepspeed"]["status"]))
        return {}

    monkeypatch.setattr(session, "JOBS", {**session.JOBS, "cli_deepspeed": job})
    argv = ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"), "--parts", "cli_deepspeed"]
    need = {p.name: p.gpu_min_s for p in session.PARTS}["cli_deepspeed"]
    assert session.main([*argv, "--budget-s", str(need - 5)]) == 1
    entry = _doc(tmp_path / "out")["parts"]["cli_deepspeed"]
    assert seen == [] and entry["status"] == "not run" and f"under the {need:.0f} s this part needs" in entry["reason"]
    assert session.main([*argv, "--budget-s", str(need + 5)]) == 0
    assert len(seen) == 1 and seen[0][1] == "running" and need < seen[0][0] <= need + 5


def test_the_install_reports_what_the_carried_packages_need_that_the_image_lacks(tmp_path):
    """The install's requirement check: a carried package's bound on a package the bundle does not carry, unmet by
    the image's version, is listed (pydantic's typing-extensions, googleapis' protobuf); met bounds, packages the
    bundle carries itself and other extras' requirements are not."""
    session = _load()
    site = tmp_path / "site"
    for name, requires in (("carried-a", ["packaging>=999", "pytest>=1", "carried-b>=999",
                                          'torch>=999; extra == "gpu"']),
                           ("carried-b", [])):
        info = site / f"{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir(parents=True)
        info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: " + name + "\nVersion: 1.0\n"
                                             + "".join(f"Requires-Dist: {r}\n" for r in requires))
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", session._UNMET.format(site=str(site))], env=env, capture_output=True,
                         text=True, timeout=60)
    import packaging

    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [f"carried-a needs packaging>=999, the image has {packaging.__version__}"]


def test_a_trial_without_its_result_or_export_fails_its_part(tmp_path):
    session = _load()
    s = session.Session(dry=True, out=tmp_path, work=tmp_path, python=sys.executable, bundle=tmp_path / "b")
    with pytest.raises(session.PartFailed, match="no result.json"):
        session._measure_trial(s, tmp_path, "", None)
    (tmp_path / "result.json").write_text(json.dumps({"step_time_s": 0.1, "tokens_per_s": 10.0}))
    with pytest.raises(session.PartFailed, match="no export"):
        session._measure_trial(s, tmp_path, "", None)
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(session.PartFailed, match="no evaluation FLOPs"):  # a trial that never evaluated
        session._measure_trial(s, tmp_path, "", None)


def test_a_part_over_its_time_limit_is_stopped(tmp_path):
    """``Session.run`` stops a command at its limit (TERM to its process group) and reports status 124."""
    session = _load()
    s = session.Session(dry=True, out=tmp_path, work=tmp_path, python=sys.executable, bundle=tmp_path / "b",
                        env=dict(os.environ))
    s.log = open(tmp_path / "log", "w")
    rc, text = s.run([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"], 2, "t")
    assert rc == 124 and "started" in text


def _session_sh(out: Path, python: str, *args: str, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "PYTHON": python}
    return subprocess.run(["bash", str(BENCH / "gpu_session.sh"), "--dry-run", "--work", str(out / "work"), *args],
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_dry_session_runs_the_cli_trial_through_the_session(tmp_path):
    """The CPU dry run of the ``cli_paper`` part with this environment's packages (no bundle: it is built for the
    device's Python 3.12): the exact Qwen2.5-0.5B checkpoint written with ``save_pretrained`` and resolved by the
    paper preset and loaded back through it (the path the GPU run trains from: tokenizer, weights, retrofit), the
    paper-preset CLI at a tiny shape, its result, export, timing, MFU inputs and memory plan."""
    proc = _session_sh(tmp_path, sys.executable, "--parts", "cli_paper", timeout=900)
    doc = _doc(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    part = doc["parts"]["cli_paper"]
    assert part["status"] == "ok" and doc["passed"] is True
    written = part["result"]["model_dir"]
    assert written["params"] == 494_032_768 and "tokenizer.json" in written["files"]
    assert "model.safetensors" in written["files"] and "config.json" in written["files"]
    # not trained on the CPU, so loaded back as the GPU run loads it: paper preset, tokenizer, weights, retrofit
    check = written["load_check"]
    assert check["pretrained"].endswith("Qwen/Qwen2.5-0.5B") and check["weights_equal"] is True
    assert check["logits_shape"] == [1, 1, 1, 151_936] and check["logits_finite"] is True
    trial = part["result"]["trial"]
    assert trial["steps_per_s"] > 0 and trial["tokens_per_s"] > 0 and trial["planned_bytes"] > 0
    assert trial["export_bytes"] > 0 and trial["eval_seconds"] > 0 and 0 < trial["eval_share"] < 1
    # the evaluation's FLOPs as it ran, at most the plan's worst case for adaptive sampling
    assert 0 < trial["eval_flops"] <= trial["eval_flops_planned"] and trial["eval_flops_per_s_model"] > 0
    assert [w["step"] for w in trial["windows"]] == [4, 8, 12]
    log = (tmp_path / "session.log").read_text()
    assert "accuracy by depth" in log


@pytest.mark.slow
@pytest.mark.full_only
def test_dry_rehearsal_with_the_bundle_under_python_3_12(tmp_path):
    """The whole session, ``--dry-run``, under a Python 3.12 that has only the device image's kind of packages (torch,
    transformers, …; no Ray, MLflow, Optuna, DeepSpeed): every part passes with those installed from the bundle
    alone. Set up by ``benchmarks/gpu_rehearsal.sh`` (``PAR_RAY_REHEARSAL_PYTHON``: its venv's python)."""
    python = os.environ.get("PAR_RAY_REHEARSAL_PYTHON")
    bundle = ROOT / ".whl" / "gpu_bundle.tar.xz"
    if not python or not bundle.is_file():
        pytest.skip("needs PAR_RAY_REHEARSAL_PYTHON (benchmarks/gpu_rehearsal.sh) and .whl/gpu_bundle.tar.xz "
                    "(benchmarks/gpu_bundle.sh)")
    proc = _session_sh(tmp_path, python, timeout=1800)
    doc = _doc(tmp_path)
    assert proc.returncode == 0, json.dumps(doc, indent=1)[-4000:]
    assert doc["passed"] is True and doc["left_out"] == []
    assert all(e["status"] == "ok" for e in doc["parts"].values()), doc["parts"]
    install = doc["parts"]["install"]["result"]
    assert install["versions"]["python"].startswith("3.12") and install["versions"]["ray"] == "2.60.0"
    assert (tmp_path / "gpu_check.json").is_file() and (tmp_path / "sweep_store.tar.gz").is_file()
