"""Faults without a cluster: which errors Train retries, a failed trial's reason on its MLflow run and in the analysis,
the sweep's ``--set`` (applied, recorded, validated, checked by ``--resume``), SIGTERM closing the runs as Ctrl-C.

The same mechanisms end to end on a local Ray cluster: ``tests/test_faults_ray.py``.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from par_ray import presets, sweep, tracking, tracking_schema
from par_ray.sweep import Options, SweepConfigError, SweepSpec


def _cfg(seed=0):
    return presets.local_trial("tiny-qwen2", "swap_s5", seed)


def _worker_group_error(*errors):
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    return WorkerGroupError("x", {rank: UserExceptionWithTraceback(e, "traceback") for rank, e in enumerate(errors)})


def test_train_raises_errors_a_restart_cannot_fix_at_once_and_retries_lost_workers():
    import ray.train
    from ray.exceptions import RayActorError
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.execution.failure_handling import FailureDecision

    from par_ray.train.loop import LockstepError, NonFiniteLossError
    from par_ray.train.trainer import FailFastPolicy, build_trainer

    def policy():  # the sweep's own Train setting
        return FailFastPolicy(ray.train.FailureConfig(max_failures=sweep.TRAIN_MAX_FAILURES))

    for error in (NonFiniteLossError("training diverged at step 2: loss nan"), LockstepError("ranks disagree"),
                  ValueError("the checkpoint to resume was written under another config")):
        assert policy().make_decision(_worker_group_error(error)) == FailureDecision.RAISE, error
    # rank 0 diverges, rank 1 sees its collective aborted: still not worth a restart
    both = _worker_group_error(NonFiniteLossError("nan"), RuntimeError("Connection closed by peer"))
    assert policy().make_decision(both) == FailureDecision.RAISE
    lost = policy()
    worker_lost = WorkerGroupError("x", {0: RayActorError()})
    assert [lost.make_decision(worker_lost) for _ in range(sweep.TRAIN_MAX_FAILURES + 1)] == [
        FailureDecision.RETRY] * sweep.TRAIN_MAX_FAILURES + [FailureDecision.RAISE]
    assert type(build_trainer(_cfg(), "x", storage_path="/tmp/x")).__name__ == "Trainer"


def test_failure_reason_is_the_user_error_inside_rays_wrappers():
    from ray.exceptions import RayTaskError

    from par_ray.sweep.run import NotRetryableError, failure_reason
    from par_ray.train.loop import NonFiniteLossError

    inner = _worker_group_error(RuntimeError("collective aborted"), NonFiniteLossError("training diverged at step 2"))
    wrapped = RayTaskError("_trial_driver", "traceback", inner)
    assert failure_reason(wrapped) == ("NonFiniteLossError", "training diverged at step 2")
    assert failure_reason(_worker_group_error(OSError(28, "No space left on device"))) == (
        "OSError", "[Errno 28] No space left on device")
    again = RayTaskError("_trial_driver", "traceback", NotRetryableError("NonFiniteLossError", "diverged"))
    assert failure_reason(again) == ("NonFiniteLossError", "diverged")


def test_a_failed_trials_run_records_its_reason_and_the_analysis_shows_it(tmp_path):
    from mlflow.tracking import MlflowClient

    from analysis.load import load_sweep

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    t = tracking.SweepTracker.open("demo", str(tmp_path / "x"), uri)
    ok, bad = t.start_trial("ok", _cfg(0)), t.start_trial("bad", _cfg(1))
    t.finish_trial("ok", _cfg(0), {"step": 4}, "FINISHED")
    message = "training diverged at step 2: loss nan (gradient norm nan); lower train.lr or raise train.warmup_steps"
    t.finish_trial("bad", _cfg(1), {"step": 1}, "FAILED", error=("NonFiniteLossError", message))
    client = MlflowClient(uri)
    run = client.get_run(bad)
    assert run.info.status == "FAILED"
    assert run.data.tags[tracking.TAG_ERROR] == f"NonFiniteLossError: {message}"
    assert tracking.TAG_ERROR not in client.get_run(ok).data.tags
    assert tracking.ARTIFACT_ERROR in {a.path for a in client.list_artifacts(bad)}
    text = open(client.download_artifacts(bad, tracking.ARTIFACT_ERROR, str(tmp_path))).read()
    assert text == f"NonFiniteLossError: {message}\n"

    trials = load_sweep("par_ray/demo", t.parent_run_id, uri).trials
    errors = dict(zip(trials["run_id"], trials["error"]))
    assert errors == {ok: None, bad: f"NonFiniteLossError: {message}"}


# ----------------------------------------------------------------------------------------------------------------
# --set

def test_sweep_set_applies_to_every_trial_after_the_sweeps_and_smoke_values():
    opts = sweep.parse_args(SweepSpec(name="x"), ["--set", "train.lr=3e-4", "--set", "train.steps=6",
                                                  "--smoke-test", "--seeds", "0,1"])
    assert opts.overrides == {"train.lr": "3e-4", "train.steps": "6"}
    plan = sweep.build_plan(SweepSpec(name="x", overrides={"train.lr": 1e-3}), opts, "local")
    assert len(plan.trials) == 4
    assert {(cfg.train.lr, cfg.train.steps) for _, cfg in plan.trials} == {(3e-4, 6)}


@pytest.mark.parametrize("item,words", [
    ("train.lrr=1", "train.lrr: unknown config field"),
    ("train.lr=fast", "train.lr"),
    ("train.seed=3", "train.seed is a grid dimension (set it with --seeds)"),
    ("backbone.name=tiny-qwen3", "backbone.name is a grid dimension (set it with --backbones)"),
    ("train.batch_size=0", "train.batch_size"),
])
def test_sweep_set_is_validated_before_ray_starts(item, words, tmp_path, capsys):
    import ray

    assert sweep.main(SweepSpec(name="x"), ["--preset", "local", "--storage", str(tmp_path), "--set", item]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Traceback" not in err
    assert not ray.is_initialized() and not (tmp_path / "tune").exists()


def test_sweep_set_without_equals_is_a_flag_error(capsys):
    with pytest.raises(SystemExit) as e:
        sweep.parse_args(SweepSpec(name="x"), ["--set", "train.lr"])
    assert e.value.code == 2 and "--set: expected SECTION.FIELD=VALUE, got 'train.lr'" in capsys.readouterr().err


def test_sweep_set_is_recorded_in_the_parent_run_and_resume_must_repeat_it(tmp_path, monkeypatch, capsys):
    from par_ray.sweep.run import _sweep_params

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = SweepSpec(name="x")
    opts = Options(preset="local", storage=str(tmp_path), overrides={"train.lr": "3e-4"})
    plan = sweep.build_plan(spec, opts, "local")
    params = _sweep_params(plan, opts)
    assert params["set"] == "train.lr=3e-4"
    # a started sweep: its Tune state and its parent run with the --set it was started with
    exp_path = f"{tmp_path}/tune/x"
    os.makedirs(exp_path)
    open(f"{exp_path}/tuner.pkl", "wb").close()
    tracking.SweepTracker.open("x", exp_path, f"sqlite:///{tmp_path}/mlflow.db", params=params).finish("KILLED")
    with pytest.raises(SweepConfigError, match=r"--set: the sweep at .* was started with --set train.lr=3e-4; "
                                               r"--resume must repeat them \(got \(none\)\)"):
        sweep.run_sweep(spec, Options(preset="local", storage=str(tmp_path), resume=True))
    with pytest.raises(SweepConfigError, match=r"got train.lr=1e-3"):
        sweep.run_sweep(spec, Options(preset="local", storage=str(tmp_path), resume=True,
                                      overrides={"train.lr": "1e-3"}))
    assert sweep.main(spec, ["--preset", "local", "--storage", str(tmp_path), "--resume"]) == 2
    assert "error: --set: the sweep" in capsys.readouterr().err


def test_resume_must_repeat_the_flags_that_shape_the_trials(tmp_path, monkeypatch, capsys):
    """``--resume`` with other ``--seeds``, ``--backbones``, ``--smoke-test`` or ``--preset`` than the sweep was
    started with is one line naming each, exit 2, before Ray starts: Tune restores the stored trials and ignores the
    new flags, and the summary counted the new plan's trials (a fresh-user report: ``--seeds 0,1,2,3`` made every
    ``--resume`` say 2 trials did not start). ``--preset auto`` takes the stored preset."""
    from par_ray.sweep.run import _sweep_params

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    class Joined(Exception):
        pass

    def joined():
        raise Joined

    monkeypatch.setattr(sweep.run, "joined", joined)
    spec = SweepSpec(name="x", seeds=(0, 1))
    started = Options(preset="local", storage=str(tmp_path), smoke_test=True)
    exp_path = f"{tmp_path}/tune/x"
    os.makedirs(exp_path)
    open(f"{exp_path}/tuner.pkl", "wb").close()
    params = _sweep_params(sweep.build_plan(spec, started, "local"), started)
    tracking.SweepTracker.open("x", exp_path, f"sqlite:///{tmp_path}/mlflow.db", params=params).finish("FINISHED")
    flags = ["--storage", str(tmp_path), "--resume"]
    assert sweep.main(spec, [*flags, "--smoke-test", "--seeds", "0,1,2", "--backbones", "tiny-qwen3"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith(("20", "INFO"))]  # MLflow's
    assert err == [f"error: --resume: the sweep at {exp_path} was started with other settings (--backbones "
                   f"tiny-qwen2,tiny-qwen3 → tiny-qwen3; --seeds 0,1 → 0,1,2); --resume must repeat its flags; to "
                   f"change them, start a new sweep under another --storage"]
    assert sweep.main(spec, flags) == 2  # without --smoke-test
    assert "(--smoke-test True → False)" in capsys.readouterr().err
    with pytest.raises(Joined):  # the same flags, --preset auto: the stored preset's plan passes, Ray is joined next
        sweep.run_sweep(spec, Options(storage=str(tmp_path), resume=True, smoke_test=True))


def test_dry_run_shows_the_set_overrides(capsys):
    assert sweep.main(SweepSpec(name="x"), ["--preset", "local", "--dry-run", "--set", "train.lr=3e-4"]) == 0
    assert "every trial: " in (out := capsys.readouterr().out) and "train.lr=3e-4" in out


def test_a_smoke_dry_run_shows_the_values_its_trials_get(capsys):
    """The "every trial:" line of a smoke test's dry run said the sweep's own ``train.steps=1500`` over a table of
    4-step trials (a fresh-user report): it shows what the trials get, the smoke test's and ``--set``'s values."""
    spec = SweepSpec(name="x", overrides={"train.steps": 1500, "train.warmup_steps": 7})
    assert sweep.main(spec, ["--preset", "local", "--dry-run", "--smoke-test", "--set", "train.warmup_steps=5"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("every trial: ")]
    assert "train.steps=4" in line and "train.warmup_steps=5" in line and "1500" not in line, line


# ----------------------------------------------------------------------------------------------------------------
# SIGTERM

def test_sigterm_handler_calls_the_handler_then_restores_the_previous_one_and_skips_other_threads():
    import threading

    from par_ray.train.__main__ import _stop_as_ctrl_c
    from par_ray.train.trainer import sigterm_handler

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):  # the single-run CLI's handler: SIGTERM stops it as Ctrl-C does
        with sigterm_handler(_stop_as_ctrl_c):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs between bytecodes; never reached
    assert signal.getsignal(signal.SIGTERM) is before

    seen = []
    def other_thread():  # Python installs signal handlers only from the main thread: left as it is
        with sigterm_handler(lambda signum, frame: None):
            seen.append(signal.getsignal(signal.SIGTERM))
    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert seen == [before] and signal.getsignal(signal.SIGTERM) is before


def test_a_ctrl_c_while_ray_starts_or_stops_is_answered_once_it_has(monkeypatch):
    """``local_ray`` holds SIGINT and SIGTERM through ``ray.init`` and ``ray.shutdown``: a Ctrl-C in the middle of
    either lets it finish, then raises ``KeyboardInterrupt``; the block it guards never runs after a Ctrl-C at start.
    Unheld, the interrupt lands inside ``ray.init`` (a half-started node: the raylet's agents outlive the driver, or
    the interpreter crashes at exit)."""
    import ray

    from par_ray.train.__main__ import _stop_as_ctrl_c
    from par_ray.train.trainer import local_ray, sigterm_handler

    calls = []

    def init(**kwargs):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C while Ray starts its processes
        calls.append("init finished")

    def shutdown():
        signal.raise_signal(signal.SIGTERM)  # kill while Ray stops them (the CLI answers SIGTERM as Ctrl-C)
        calls.append("shutdown finished")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", shutdown)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with sigterm_handler(_stop_as_ctrl_c), local_ray(num_cpus=1):
            calls.append("the run")
    assert calls == ["init finished", "shutdown finished"]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_signals_held_passes_each_held_signal_on_once_and_a_second_one_at_once(capfd):
    """``signals_held``: a SIGINT and a SIGTERM that come in the block reach the handlers before it when it ends, never
    inside it, each with one line; a second SIGINT in the block reaches its handler at once (the user insists); the
    handlers are restored however the block ends."""
    from par_ray.train.trainer import signals_held

    seen = []

    def mine(signum, frame):
        seen.append(signum)

    previous = {signum: signal.signal(signum, mine) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        with signals_held("the test's block ends"):
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGTERM)
            assert seen == []
        assert seen == [signal.SIGINT, signal.SIGTERM]
        assert [line for line in capfd.readouterr().err.splitlines() if line] == [
            "SIGINT: stopping once the test's block ends (again to stop at once)",
            "SIGTERM: stopping once the test's block ends (again to stop at once)"]
        seen.clear()
        with signals_held("x"):
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            assert seen == [signal.SIGINT]  # the second: at once
        assert seen == [signal.SIGINT, signal.SIGINT]
        with pytest.raises(RuntimeError, match="the block's own error"), signals_held("x"):
            raise RuntimeError("the block's own error")
        assert signal.getsignal(signal.SIGINT) is mine and signal.getsignal(signal.SIGTERM) is mine
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # started in the background by a shell, or by nohup
        capfd.readouterr()
        with signals_held("x"):
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN and capfd.readouterr().err == ""
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_processes_ray_starts_ignore_ctrl_c_and_later_ones_do_not():
    """``signals_held(..., children_ignore_ctrl_c=True)``: a process started in the block as Ray starts its own (a
    ``subprocess.Popen`` with a ``preexec_fn``) ignores SIGINT, so a terminal's Ctrl-C reaches the driver only; one
    started after the block takes it as usual (``KeyboardInterrupt``)."""
    import subprocess
    import sys

    from par_ray.train.trainer import signals_held

    def child_sigint() -> str:
        code = "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              preexec_fn=lambda: None).stdout.strip()

    with signals_held("Ray has started", children_ignore_ctrl_c=True):
        during = child_sigint()
    assert (during, child_sigint()) == ("True", "False")


def test_a_ctrl_c_before_training_or_a_sweep_starts_is_one_line_and_status_130(monkeypatch, capsys):
    """Ctrl-C while the command still imports or validates (before Ray or Tune take it): one line, exit status 130,
    no traceback, for the single-run CLI and a sweep script."""
    import par_ray.sweep.cli
    import par_ray.train.__main__ as cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "config_from_args", interrupted)
    assert cli.main(["--train-depth", "4"]) == 130
    monkeypatch.setattr(par_ray.sweep.cli, "run_sweep", interrupted)
    assert sweep.main(SweepSpec(name="x"), ["--preset", "local"]) == 130
    assert capsys.readouterr().err.split() == ["interrupted", "interrupted"]


def test_sigterm_closes_every_open_run_then_stops_tune_as_ctrl_c(tmp_path):
    from par_ray.sweep.run import _sigterm_as_ctrl_c

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    t = tracking.SweepTracker.open("demo", str(tmp_path / "x"), uri)
    done, running = t.start_trial("a", _cfg(0)), t.start_trial("b", _cfg(1))
    t.finish_trial("a", _cfg(0), {"step": 4}, "FINISHED")
    stopped = []
    previous_int = signal.signal(signal.SIGINT, lambda signum, frame: stopped.append(signum))  # Tune's handler
    try:
        before = signal.getsignal(signal.SIGTERM)
        with _sigterm_as_ctrl_c(t):
            os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGINT, previous_int)
    assert stopped == [signal.SIGINT]
    status = {r: t.client.get_run(r).info.status for r in (done, running, t.parent_run_id)}
    assert status == {done: "FINISHED", running: "KILLED", t.parent_run_id: "KILLED"}


# ----------------------------------------------------------------------------------------------------------------
# A full disk: Train's snapshot and checkpoints cut short

def _checkpoint(run, name, step, extra=True, state=b"weights"):
    import json

    d = run / name
    d.mkdir(parents=True)
    (d / "state.pt").write_bytes(state)
    if extra:
        (d / "extra.json").write_text(json.dumps({"step": step, "report": {"step": step, "loss": 1.0 / step}}))
    return d


def test_a_truncated_snapshot_and_empty_checkpoint_files_fall_back_to_the_last_complete_checkpoint(tmp_path):
    import json

    import ray
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import _CheckpointManagerState

    from par_ray.train.trainer import SNAPSHOT_FILE, repair_run_storage

    run = tmp_path / "trial_x"
    _checkpoint(run, "checkpoint_a", 2)
    _checkpoint(run, "checkpoint_b", 4)
    _checkpoint(run, "checkpoint_c", 6, state=b"")  # ENOSPC: a 0-byte state.pt
    _checkpoint(run, "checkpoint_d", 8, extra=False)  # cut before extra.json
    (run / SNAPSHOT_FILE).write_bytes(b"")  # ENOSPC truncated Ray Train's snapshot
    notes = repair_run_storage(str(tmp_path), "trial_x")
    assert sorted(p.name for p in run.glob("checkpoint_*") if p.is_dir()) == ["checkpoint_a", "checkpoint_b"]
    assert any("removed incomplete checkpoint checkpoint_c" in n for n in notes)
    assert notes[-1].startswith(f"Ray Train's {SNAPSHOT_FILE} was unreadable (0 bytes): rebuilt from the 2 complete "
                                f"checkpoint(s); resuming from step 4 (checkpoint_b)")
    state = _CheckpointManagerState.model_validate(json.loads((run / SNAPSHOT_FILE).read_text()))  # Ray reads it
    assert state.latest_checkpoint_result.checkpoint_dir_name == "checkpoint_b"
    assert state.latest_checkpoint_result.metrics == {"step": 4, "loss": 0.25}
    assert json.loads((run / SNAPSHOT_FILE).read_text())["ray_version"] == ray.__version__
    assert repair_run_storage(str(tmp_path), "trial_x") == []  # whole again: nothing to do
    assert repair_run_storage(str(tmp_path), "no_such_run") == []


def test_a_checkpoint_file_cut_short_after_its_extra_json_arrived_is_incomplete(tmp_path):
    """Ray Train copies a checkpoint to storage file by file; on a full disk ``extra.json`` can arrive whole while
    ``state.pt`` stops mid-way (nonzero size). The manifest ``write_extra`` stores tells: that checkpoint is removed and
    the run resumes from the one before."""
    import json

    from par_ray.train.checkpoint import write_extra
    from par_ray.train.trainer import SNAPSHOT_FILE, repair_run_storage

    run = tmp_path / "trial_x"
    for name, step in (("checkpoint_a", 2), ("checkpoint_b", 4)):
        (run / name).mkdir(parents=True)
        (run / name / "state.pt").write_bytes(b"weights" * 100)
        write_extra(str(run / name), {"step": step, "report": {"step": step}}, rank=0)
    assert json.loads((run / "checkpoint_b" / "extra.json").read_text())["files"] == {"state.pt": 700}
    (run / "checkpoint_b" / "state.pt").write_bytes(b"weights")  # cut short
    (run / SNAPSHOT_FILE).write_text(json.dumps({"checkpoint_results": [
        {"checkpoint_dir_name": n, "metrics": {"step": s}} for n, s in (("checkpoint_a", 2), ("checkpoint_b", 4))]}))
    notes = repair_run_storage(str(tmp_path), "trial_x")
    assert sorted(p.name for p in run.glob("checkpoint_*") if p.is_dir()) == ["checkpoint_a"]
    assert notes[0] == "removed incomplete checkpoint checkpoint_b (empty, missing or cut-short files)"
    assert notes[-1].endswith("resuming from step 2 (checkpoint_a)")


def test_orphan_checkpoints_are_removed_by_the_retention_rule_on_resume(tmp_path):
    """Folders Train never registered (an interrupt between writing and registering) or had retired without deleting
    (between saving its snapshot and deleting the worst): complete, unlisted, never read or deleted by Train. The
    repair removes them and keeps every listed one; the snapshot is untouched."""
    import json

    from par_ray.train.trainer import SNAPSHOT_FILE, repair_run_storage

    run = tmp_path / "trial_x"
    for name, step in (("checkpoint_a", 2), ("checkpoint_b", 4), ("checkpoint_c", 6), ("checkpoint_d", 8)):
        _checkpoint(run, name, step)
    listed = [{"checkpoint_dir_name": n, "metrics": {"step": s}} for n, s in (("checkpoint_b", 4), ("checkpoint_c", 6))]
    snapshot = json.dumps({"checkpoint_results": listed})
    (run / SNAPSHOT_FILE).write_text(snapshot)
    notes = repair_run_storage(str(tmp_path), "trial_x")
    assert sorted(p.name for p in run.glob("checkpoint_*") if p.is_dir()) == ["checkpoint_b", "checkpoint_c"]
    assert [n.split(":")[0] for n in notes] == ["removed checkpoint checkpoint_a (step 2)",
                                                "removed checkpoint checkpoint_d (step 8)"]
    assert (run / SNAPSHOT_FILE).read_text() == snapshot
    assert repair_run_storage(str(tmp_path), "trial_x") == []

    bare = tmp_path / "trial_y"  # no snapshot: Train starts afresh and would never remove these
    _checkpoint(bare, "checkpoint_a", 2)
    assert len(repair_run_storage(str(tmp_path), "trial_y")) == 1 and not list(bare.glob("checkpoint_*"))


def test_a_checkpointed_report_tune_never_handed_over_is_logged_once_on_resume(tmp_path):
    """The window between Train registering a checkpoint and Tune's MLflow callback getting its report, made
    deterministic: the run's history stops at step 2 while the trial's Train folder holds checkpoints of steps 2
    and 4 (a sweep stopped in that window). The resumed trial's start logs step 4 from its checkpoint, once."""
    from types import SimpleNamespace

    from par_ray.sweep.run import _make_callback

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = tracking.SweepTracker.open("demo", str(tmp_path / "x"), uri)
    cfg = _cfg(0)
    params = {"preset": "local", "recipe": "par", "backbone.name": "tiny-qwen2", "task.name": "swap_s5",
              "train.seed": 0}
    trial = SimpleNamespace(trial_id="t0", config=params)
    run_id = tracker.start_trial("t0", cfg)
    tracker.log_metrics("t0", {"step": 2, "loss": 0.5}, 2)
    tracker.close_open_trials("KILLED")
    _checkpoint(tmp_path / "train" / "trial_t0", "checkpoint_a", 2)
    _checkpoint(tmp_path / "train" / "trial_t0", "checkpoint_b", 4)

    restored = tracking.SweepTracker.open("demo", str(tmp_path / "x"), uri)  # a new sweep driver: --resume
    callback = _make_callback(restored, {}, str(tmp_path / "train"))
    callback.on_trial_start(0, [trial], trial)
    callback.on_trial_start(0, [trial], trial)  # a Tune retry of the same trial: nothing twice
    history = restored.client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(2, 0.5), (4, 0.25)]
    assert restored.client.get_run(run_id).info.status == "RUNNING"


def test_a_trial_asha_stopped_ends_finished_and_resume_leaves_its_storage_alone(tmp_path, capsys):
    """Tune completes a trial ASHA stopped at step 2 of 4: the callback ends its run FINISHED with the
    ``par_ray.stopped_early`` tag (it ended KILLED, which reads as a crash and which ``--resume``'s summary never
    ran again). ``--resume`` then repairs only the storage of trials that run again: the stopped trial's checkpoint
    written after its last report (Train never registered it) stays, with no "the resumed run repeats its steps"
    line for a trial that never resumes; an interrupted trial's orphan is removed as before."""
    from types import SimpleNamespace

    from par_ray.sweep.run import _make_callback, _repair_trial_storage

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = tracking.SweepTracker.open("demo", str(tmp_path / "x"), uri)
    cfg = _cfg(0)
    params = {"preset": "local", "recipe": "par", "backbone.name": "tiny-qwen2", "task.name": "swap_s5",
              "train.seed": 0}
    stopped = SimpleNamespace(trial_id="t0", config=params, last_result={"step": 2, "loss": 0.5})
    callback = _make_callback(tracker, {}, str(tmp_path / "train"))
    callback.on_trial_start(0, [stopped], stopped)
    callback.on_trial_complete(0, [stopped], stopped)
    run = tracker.client.get_run(tracker.find_trial_run("t0"))
    assert run.info.status == "FINISHED"
    assert run.data.tags[tracking.TAG_STOPPED_EARLY] == f"step 2 of {cfg.train.steps}"
    tracker.start_trial("t1", cfg)
    tracker.close_open_trials("KILLED")  # an interrupted trial

    for tid in ("t0", "t1"):
        _checkpoint(tmp_path / "train" / f"trial_{tid}", "checkpoint_a", 4)  # complete, never registered
    _repair_trial_storage(str(tmp_path / "train"), tracking.SweepTracker.open("demo", str(tmp_path / "x"), uri))
    out = capsys.readouterr().out
    assert (tmp_path / "train" / "trial_t0" / "checkpoint_a").is_dir() and "trial_t0" not in out
    assert not (tmp_path / "train" / "trial_t1" / "checkpoint_a").exists()
    assert "resume: trial_t1: removed checkpoint checkpoint_a (step 4)" in out


def test_the_ui_never_serves_another_servers_store_from_a_busy_port():
    import socket

    from par_ray import mlflow_ui

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert mlflow_ui.port_in_use(port)
        with pytest.raises(RuntimeError, match=f"port {port} on 127.0.0.1 is in use"):
            with mlflow_ui.local_server("sqlite:///unused.db", "/tmp/unused", port=port):
                pass
    assert not mlflow_ui.port_in_use(port)


def test_an_oserror_reaching_the_sweep_driver_is_one_error_line(monkeypatch, capsys):
    from par_ray.sweep import cli

    def full_disk(spec, opts):
        raise OSError(28, "No space left on device", "/runs/x/tune/x/experiment_state.json")

    monkeypatch.setattr(cli, "run_sweep", full_disk)
    assert cli.main(SweepSpec(name="x"), ["--preset", "local"]) == 1
    assert capsys.readouterr().err == "error: No space left on device: /runs/x/tune/x/experiment_state.json\n"


# ----------------------------------------------------------------------------------------------------------------
# Issue 39: remote storage's analysis, a full tracking store, a damaged checkpoint of the right size

def _finished_trial(tracker, trial_id: str, seed: int = 0, seconds: tuple[float, float] = (30.0, 5.0)) -> None:
    """A child run as the sweep leaves a finished trial: its cost plan as params, its final report (measured device
    seconds of training and evaluation, ``seconds``, included), its artifacts."""
    from par_ray.sweep.run import _planned

    cfg = _cfg(seed)
    tracker.start_trial(trial_id, cfg, params=_planned(cfg, None))
    final = {"step": cfg.train.steps, "loss": 0.5, "G": 1.0, "G_censored": 1.0, "chance": 0.1,
             "gpu_seconds_train": seconds[0], "gpu_seconds_eval": seconds[1], "train_seconds": seconds[0],
             **{f"acc_d{d}": 1.0 for d in cfg.eval.depths}, **{f"acc_query_d{d}": 1.0 for d in cfg.eval.depths}}
    tracker.log_metrics(trial_id, final, cfg.train.steps)
    tracker.finish_trial(trial_id, cfg, final, "FINISHED")


def test_the_analysis_without_a_local_folder_prints_its_tables_and_logs_them(tmp_path, capsys):
    """Storage given as a URI (``--storage s3://…``): the analysis writes into a temporary folder, logs it to the
    parent run and prints its tables, the plan-vs-actual one included, before the folder is removed."""
    from par_ray.sweep.run import _run_analysis

    tracker = tracking.SweepTracker.open("demo", str(tmp_path / "x"), f"sqlite:///{tmp_path}/mlflow.db")
    _finished_trial(tracker, "a")
    assert _run_analysis("demo", tracker, None)
    out, err = capsys.readouterr()
    assert "Planned vs actual" in out or "wall error" in out, out
    assert "analysis failed" not in err and "error" not in err, err
    assert f"analysis: tables and figures logged to parent run {tracker.parent_run_id}" in out
    logged = {a.path for a in tracker.client.list_artifacts(tracker.parent_run_id, "analysis")}
    assert "analysis/plan_vs_actual.md" in logged


def test_a_smoke_tests_analysis_writes_no_measured_mfu_for_prices(tmp_path):
    """A smoke test's trials run a few steps, whose seconds are start-up: its measured MFU (train 0.19 where real trials
    reach 0.4) passed to --prices roughly doubled the next plan. Its analysis writes no price file (docs/cost.md says
    why; a console line about it read as a failure to a newcomer); a real sweep's does."""
    from analysis.report import analyze

    for smoke in (True, False):
        tracker = tracking.SweepTracker.open(f"demo{smoke}", str(tmp_path / f"x{smoke}"),
                                             f"sqlite:///{tmp_path}/mlflow.db",
                                             tags={tracking_schema.TAG_SMOKE_TEST: str(smoke).lower()})
        _finished_trial(tracker, "a", seconds=(1800.0, 600.0))  # an MFU in (0, 1]: a price file is written
        report = analyze(f"par_ray/demo{smoke}", tracker.parent_run_id, tracker.uri, tmp_path / f"out{smoke}",
                         log_artifacts=False, n_boot=10)
        assert (tmp_path / f"out{smoke}" / "cost_overrides.json").exists() is not smoke
        assert report["warnings"] == [], report["warnings"]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs at ``tmp_path / "disk"`` for one test (root only: skipped where tmpfs cannot be mounted)."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _fill(disk, leave: int) -> None:
    """Fill ``disk`` but ``leave`` bytes."""
    st = os.statvfs(disk)
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))


def test_a_full_tracking_store_is_one_oserror_and_the_runs_close_when_it_allows(small_tmpfs, capsys):
    """A SQLite MLflow store on its own small disk that fills mid-sweep ("database or disk is full" on a metrics
    insert): the tracker raises one ``OSError`` naming the store (no MLflow or SQLAlchemy traceback reaches the
    console), and closing the runs, which needs no new pages, still works."""
    import errno

    from par_ray.sweep.run import _close_runs

    uri = f"sqlite:///{small_tmpfs}/mlflow.db"
    tracker = tracking.SweepTracker.open("demo", str(small_tmpfs / "x"), uri)
    tracker.start_trial("a", _cfg(0))
    _fill(small_tmpfs, 96 * 1024)
    with pytest.raises(tracking.TrackingStoreError) as e:
        for step in range(2, 2000, 2):
            tracker.log_metrics("a", {"step": step, **{f"acc_d{d}": 0.5 for d in range(64)}}, step)
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOSPC
    assert e.value.filename == f"{small_tmpfs}/mlflow.db"
    assert e.value.strerror == "No space left on device (MLflow tracking store: database or disk is full)"
    assert e.value.__cause__ is None and e.value.__suppress_context__
    assert "Traceback" not in capsys.readouterr().err
    assert _close_runs(tracker) == "1 trial run(s) and the sweep run closed as KILLED"
    assert tracker.client.get_run(tracker.parent_run_id).info.status == "KILLED"


def test_runs_the_store_refuses_to_close_are_said_so_with_how_to_close_them():
    from par_ray.sweep.run import _close_runs

    class Refusing(tracking.SweepTracker):
        def close_open_trials(self, status="KILLED"):
            raise tracking.TrackingStoreError(28, "No space left on device (MLflow tracking store: database or disk "
                                                  "is full)", "/x/mlflow.db")

    import unittest.mock

    with unittest.mock.patch.object(tracking, "SweepTracker", Refusing):
        said = _close_runs(Refusing(uri="sqlite:////x/mlflow.db", experiment_id="1", parent_run_id="p"))
    assert said == ("the MLflow runs could not be closed (No space left on device (MLflow tracking store: database or "
                    "disk is full)); --resume closes them")


def test_a_tracking_store_error_inside_tunes_wrapping_is_what_the_sweep_reports(tmp_path):
    """Tune raises an error of its MLflow callback as a ``TuneError`` whose message is the whole traceback; the sweep
    finds the store error in its chain and reports that (one ``error:`` line from the command line)."""
    from ray.tune.error import TuneError

    from par_ray.sweep import cli
    from par_ray.sweep.run import stop_cause

    store = tracking.TrackingStoreError(28, "No space left on device (MLflow tracking store: database or disk is "
                                            "full)", "/x/mlflow.db")
    try:
        try:
            raise store
        except OSError:
            raise TuneError("Traceback (most recent call last):\n  ... 300 lines ...")
    except TuneError as wrapped:
        assert stop_cause(wrapped, str(tmp_path)) is store
    assert cli.os_error_line(store) == ("No space left on device (MLflow tracking store: database or disk is full): "
                                        "/x/mlflow.db")


def _checkpoints(run, steps):
    """Checkpoint folders as the loop writes them (``write_extra``: sizes and SHA-256 of each file) and Ray Train's
    snapshot listing them."""
    import json

    from par_ray.train.checkpoint import write_extra
    from par_ray.train.trainer import SNAPSHOT_FILE

    for i, step in enumerate(steps):
        d = run / f"checkpoint_{i}"
        d.mkdir(parents=True)
        (d / "state.pt").write_bytes(bytes([step]) * 4096)
        write_extra(str(d), {"step": step, "report": {"step": step}}, rank=0)
    (run / SNAPSHOT_FILE).write_text(json.dumps({"checkpoint_results": [
        {"checkpoint_dir_name": f"checkpoint_{i}", "metrics": {"step": s}} for i, s in enumerate(steps)]}))


def test_a_damaged_latest_checkpoint_of_the_right_size_is_set_aside_and_the_run_resumes_from_the_one_before(tmp_path):
    """Random bytes over the latest ``state.pt``, same size: the size manifest passes it, the checksum does not. The
    repair names it, moves it to ``damaged/`` and rebuilds Ray Train's snapshot to resume from the newest intact
    checkpoint, in one line; an older damaged one is never read (only the newest is checked)."""
    import json

    from par_ray.train.trainer import DAMAGED_DIR, SNAPSHOT_FILE, repair_run_storage

    run = tmp_path / "trial_x"
    _checkpoints(run, (2, 4, 6))
    (run / "checkpoint_2" / "state.pt").write_bytes(os.urandom(4096))
    notes = repair_run_storage(str(tmp_path), "trial_x")
    assert notes == [f"damaged checkpoint set aside in {DAMAGED_DIR}/: checkpoint_2 (step 6): state.pt does not "
                     f"match its SHA-256 in extra.json; resuming from step 4 (checkpoint_1)"]
    assert sorted(p.name for p in run.glob("checkpoint_*") if p.is_dir()) == ["checkpoint_0", "checkpoint_1"]
    assert (run / DAMAGED_DIR / "checkpoint_2" / "state.pt").is_file()
    snapshot = json.loads((run / SNAPSHOT_FILE).read_text())
    assert snapshot["latest_checkpoint_result"]["checkpoint_dir_name"] == "checkpoint_1"
    assert repair_run_storage(str(tmp_path), "trial_x") == []  # intact now: nothing to do

    both = tmp_path / "trial_y"  # the two newest damaged: both set aside, the run resumes from the first
    _checkpoints(both, (2, 4, 6))
    for name in ("checkpoint_1", "checkpoint_2"):
        (both / name / "state.pt").write_bytes(os.urandom(4096))
    (notes,) = repair_run_storage(str(tmp_path), "trial_y")
    assert "checkpoint_2 (step 6)" in notes and "checkpoint_1 (step 4)" in notes
    assert notes.endswith("resuming from step 2 (checkpoint_0)")


def test_a_damaged_state_file_is_named_without_suggesting_weights_only_false(tmp_path):
    """torch's own error for such a file says loading it with ``weights_only=False`` "will likely succeed"; that
    would run whatever the damaged bytes hold, so the loop's error names the file and the remedy instead."""
    import torch

    from par_ray.train.checkpoint import _torch_load

    path = tmp_path / "state.pt"
    torch.save({"model": {"w": torch.zeros(64)}}, path)
    size = path.stat().st_size
    rng = random.Random(0)  # random bytes fail in different places of the unpickler: many draws, each one named
    for _ in range(50):
        path.write_bytes(rng.randbytes(size))
        with pytest.raises(ValueError) as e:
            _torch_load(str(path))
        text = str(e.value)
        assert text.startswith(f"{path}: damaged") and "--resume" in text
        assert "weights_only" not in text and e.value.__cause__ is None and e.value.__suppress_context__


def test_a_damaged_checkpoint_on_object_storage_is_set_aside_there(s3_bucket, tmp_path):
    """The same repair on an S3 bucket (a local S3 server), which has no folder rename: the damaged folder is copied
    under ``damaged/`` and deleted."""
    import json

    import pyarrow.fs

    from par_ray.train.checkpoint import write_extra
    from par_ray.train.trainer import DAMAGED_DIR, SNAPSHOT_FILE, repair_run_storage

    fs, root = pyarrow.fs.FileSystem.from_uri(f"{s3_bucket}/train")
    local = tmp_path / "written"
    for i, step in enumerate((2, 4)):
        d = local / f"checkpoint_{i}"
        d.mkdir(parents=True)
        (d / "state.pt").write_bytes(bytes([step]) * 4096)
        write_extra(str(d), {"step": step, "report": {"step": step}}, rank=0)
        pyarrow.fs.copy_files(str(d), f"{root}/trial_x/checkpoint_{i}", destination_filesystem=fs)
    with fs.open_output_stream(f"{root}/trial_x/{SNAPSHOT_FILE}") as f:
        f.write(json.dumps({"checkpoint_results": [{"checkpoint_dir_name": f"checkpoint_{i}", "metrics": {"step": s}}
                                                   for i, s in enumerate((2, 4))]}).encode())
    with fs.open_output_stream(f"{root}/trial_x/checkpoint_1/state.pt") as f:
        f.write(os.urandom(4096))
    (note,) = repair_run_storage(f"{s3_bucket}/train", "trial_x")
    assert note.startswith(f"damaged checkpoint set aside in {DAMAGED_DIR}/: checkpoint_1 (step 4)")
    assert note.endswith("resuming from step 2 (checkpoint_0)")
    names = {i.path.removeprefix(f"{root}/trial_x/") for i in fs.get_file_info(
        pyarrow.fs.FileSelector(f"{root}/trial_x", recursive=True)) if i.type == pyarrow.fs.FileType.File}
    assert names == {SNAPSHOT_FILE, "checkpoint_0/state.pt", "checkpoint_0/extra.json",
                     f"{DAMAGED_DIR}/checkpoint_1/state.pt", f"{DAMAGED_DIR}/checkpoint_1/extra.json"}
