"""scripts/probe_depths.py as a user runs it: a tiny dense-target run, then the probe prints its rows and diagnosis."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_probe_prints_depth_curve_iterations_diagnosis_and_frontier(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "par_ray.train", "--train-depth", "3", "--steps", "2", "--eval-depths", "3",
                    "--set", "recipe.dense_targets=true", "--set", "recipe.dense_pending=true", "--out", str(out)],
                   check=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    probe = subprocess.run([sys.executable, "scripts/probe_depths.py", str(out), "--max-depth", "4",
                            "--iteration-depth", "4", "-n", "8", "--slack", "1,2"],
                           check=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    text = probe.stdout
    for line in ("depth:", "accuracy:", "does iteration k hold", "diagnosis:", "frontier:", "frontier speed:",
                 "test-time slack", "    f=1     f=2"):
        assert line in text, (line, text)
    assert len([ln for ln in text.splitlines() if ln.split()[:1] == ["24"]]) == 1  # d_train 3 × 8
    # the run has no halting read-out: halt_signals says so in one line (it was a traceback)
    r = subprocess.run([sys.executable, "scripts/halt_signals.py", str(out), "--depths", "3"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"error: {out}: trained without recipe.halting" in r.stderr


def test_halt_signals_tabulates_the_query_and_the_pending_signal(tmp_path):
    """scripts/halt_signals.py on a tiny joint-halting run with dense pending targets: one row per signal × rule ×
    depth, and the oracle column the same for both signals (they read the same forward pass)."""
    import json

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "par_ray.train", "--train-depth", "3", "--steps", "2", "--eval-depths", "3",
                    "--set", "recipe.dense_targets=true", "--set", "recipe.dense_pending=true",
                    "--set", "recipe.halting=true", "--out", str(out)],
                   check=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    rows_json = tmp_path / "rows.json"
    probe = subprocess.run([sys.executable, "scripts/halt_signals.py", str(out), "--depths", "3,6", "-n", "8",
                            "--out", str(rows_json)],
                           check=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    rows = json.loads(rows_json.read_text())
    assert len(rows) == 2 * 3 * 2  # signals × rules × depths
    assert {r["signal"] for r in rows} == {"query", "pending"} and {r["depth"] for r in rows} == {3, 6}
    for d in (3, 6):
        assert len({r["oracle_acc"] for r in rows if r["depth"] == d}) == 1
    assert all(0 <= r["never_halted"] <= 100 and abs(r["gap"] - (r["oracle_acc"] - r["halt_acc"])) < 1e-6
               for r in rows)
    assert probe.stdout.count("| pending |") == 6


def test_the_scripts_refuse_a_path_that_is_no_run_in_one_line(tmp_path):
    """A file (``checkpoint_*`` also matches ``checkpoint_manager_snapshot.json``) or a folder without a checkpoint:
    one ``error:`` line naming it, exit 2, no traceback."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    snapshot = tmp_path / "checkpoint_manager_snapshot.json"
    snapshot.write_text("{}")
    for script, extra in (("probe_depths.py", []), ("halt_signals.py", ["--depths", "3"])):
        r = subprocess.run([sys.executable, f"scripts/{script}", str(snapshot), *extra], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, (script, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and f"error: {snapshot}" in r.stderr, (script, r.stderr[-2000:])


def test_the_scripts_refuse_bad_values_in_one_line_before_loading_anything(tmp_path):
    """``-n 0``, ``--iteration-depth 0``, ``--slack 1,x``, ``--max-depth 0`` (an empty table), ``--depths 6,x``:
    argparse's one line naming the flag, exit 2 (they were tracebacks from the task sampler, or nothing at all)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    for script, args, flag in (("probe_depths.py", ["-n", "0"], "-n"),
                               ("probe_depths.py", ["--iteration-depth", "0"], "--iteration-depth"),
                               ("probe_depths.py", ["--max-depth", "0"], "--max-depth"),
                               ("probe_depths.py", ["--slack", "1,x"], "--slack"),
                               ("halt_signals.py", ["--depths", "6,x"], "--depths"),
                               ("halt_signals.py", ["-n", "-1"], "-n")):
        r = subprocess.run([sys.executable, f"scripts/{script}", str(tmp_path), *args], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (script, args, r.stderr[-2000:])
        assert f"error: argument {flag}" in r.stderr, (script, args, r.stderr[-2000:])
