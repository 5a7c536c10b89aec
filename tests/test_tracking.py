"""par_ray.tracking against a SQLite MLflow store: the schema analysis/ reads, secret redaction, reuse on resume."""

from __future__ import annotations

import json

import pytest

from par_ray import mlflow_ui, tracking
from par_ray.config import from_flat, to_flat
from par_ray.presets import local_trial
from par_ray.recipes import apply_recipe
from par_ray.tracking_schema import ARTIFACTS, TAG_EXPERIMENT_KIND


def _cfg(seed: int = 0, backbone: str = "tiny-qwen2"):
    return apply_recipe(local_trial(backbone, seed=seed), "par")


def test_redact_drops_secret_like_keys_and_values():
    params = {
        "train.lr": 1e-3, "backbone.name": "tiny-qwen2", "recipe.grad_window": 8, "train.zero_stage": 2,
        "hf_token": "x", "HF_TOKEN": "x", "api_key": "x", "aws.secret_access_key": "x", "db.password": "x",
        "key": "x", "auth.header": "x", "credentials": "x",
        "backbone.pretrained": "hf_" + "a" * 30, "openai": "sk-" + "b" * 30, "gh": "ghp_" + "c" * 30,
        "aws": "AKIA" + "D" * 16, "store": "postgresql://user:hunter2@db:5432/mlflow",
    }
    kept = tracking.redact(params)
    assert kept == {"train.lr": 1e-3, "backbone.name": "tiny-qwen2", "recipe.grad_window": 8, "train.zero_stage": 2}
    # every real config field survives
    flat = to_flat(_cfg())
    assert tracking.redact(flat) == flat


def test_tracking_uri_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.tracking_uri(None, str(tmp_path)) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.tracking_uri(None, str(tmp_path)) == "http://127.0.0.1:5000"
    assert tracking.tracking_uri("sqlite:///x.db", str(tmp_path)) == "sqlite:///x.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with pytest.raises(ValueError, match="--mlflow-uri"):
        tracking.tracking_uri(None, "s3://bucket/par_ray")


def test_sweep_and_trial_runs_follow_the_schema_and_are_reused(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exp_path = str(tmp_path / "tune" / "demo")
    t = tracking.SweepTracker.open("demo", exp_path, uri, params={"seeds": "0,1", "hf_token": "x"}, commit="abc123")
    cfgs = {"t0": _cfg(0), "t1": _cfg(1, "tiny-qwen3")}
    d1, d2 = cfgs["t0"].eval.depths[:2]  # the preset's first two test depths
    final = {"step": 4, "loss": 2.0, "G": 2.0, "G_censored": 1.0, "chance": 1 / 120, f"acc_d{d1}": 0.9,
             f"acc_query_d{d1}": 0.95, f"acc_d{d2}": 0.8, f"acc_query_d{d2}": 0.9,
             "G_halt": 2.0, "G_halt_censored": 1.0, "G_best": 1.0, "G_best_censored": 0.0, "d50_best": 8.0,
             # 95 % interval (issue 37): the lower bound crossed, the upper one lies past the largest depth
             "G_lo": 1.5, "G_hi": 2.0, "G_interp_lo": 1.4, "G_interp_hi": 2.0, "G_hi_censored": 1.0, "d50_lo": 12.0,
             "d50_interp_lo": 11.2}
    for tid, cfg in cfgs.items():
        t.start_trial(tid, cfg, run_name=f"run-{tid}")
        t.log_metrics(tid, {"step": 2, "loss": 3.0, "d50": 16.0, "d50_halt": 16.0, "d50_hi": 16.0, "done": True,
                            "note": "x"}, step=2)
        t.log_metrics(tid, final, step=4)
        t.finish_trial(tid, cfg, final, "FINISHED")
    t.finish()

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("par_ray/demo")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("par_ray.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("par_ray.role") == "trial"]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.data.tags["par_ray.sweep"] == "demo" and parent.data.tags["par_ray.experiment_path"] == exp_path
    assert parent.data.params == {"seeds": "0,1"}  # the secret-looking one is gone
    for run in children:
        tags = run.data.tags
        cfg = cfgs[tags["par_ray.trial_id"]]
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert (tags["par_ray.recipe"], tags["par_ray.backbone"], tags["par_ray.task"], tags["par_ray.seed"],
                tags["par_ray.git_commit"]) == ("par", cfg.backbone.name, "swap_s5", str(cfg.train.seed), "abc123")
        assert from_flat(run.data.params, base=cfg) == cfg  # params round-trip to the trial config
        assert run.data.params.keys() == to_flat(cfg).keys()
        assert run.data.metrics["G"] == 2.0 and run.data.metrics[f"acc_d{d2}"] == 0.8
        assert run.data.metrics["d50"] != run.data.metrics["d50"]  # censored at the end: the last d50 is NaN
        assert run.data.metrics["d50_halt"] != run.data.metrics["d50_halt"]  # own halting's, the same
        assert run.data.metrics["d50_best"] == 8.0 and run.data.metrics["G_halt"] == 2.0  # the best R's crossed
        assert run.data.metrics["d50_hi"] != run.data.metrics["d50_hi"]  # the upper bound censored at the end: NaN
        assert run.data.metrics["d50_lo"] == 12.0 and run.data.metrics["G_interp_hi"] == 2.0
        assert "done" not in run.data.metrics and "note" not in run.data.metrics
        assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [2, 4]
        assert run.info.status == "FINISHED"
        files = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert files == set(ARTIFACTS)
        summary = json.loads(open(client.download_artifacts(run.info.run_id, "accuracy_by_depth.json")).read())
        assert [r["depth"] for r in summary["by_depth"]] == [d1, d2] and summary["G_censored"] is True
        assert (summary["G_lo"], summary["G_hi"], summary["G_hi_censored"]) == (1.5, 2.0, 1.0)

    # A restored sweep: same parent (found by experiment path), same child runs (found by trial id), no duplicates.
    again = tracking.SweepTracker.open("demo", exp_path, uri, params={"seeds": "0,1"})
    assert again.parent_run_id == parent.info.run_id
    run_id = again.start_trial("t0", cfgs["t0"])
    assert run_id == next(r.info.run_id for r in children if r.data.tags["par_ray.trial_id"] == "t0")
    assert client.get_run(run_id).info.status == "RUNNING"
    assert len(client.search_runs([exp.experiment_id])) == 3
    # A different sweep of the same kind gets its own parent in the same experiment.
    other = tracking.SweepTracker.open("demo", str(tmp_path / "elsewhere"), uri)
    assert other.parent_run_id != parent.info.run_id and other.experiment_id == exp.experiment_id


def test_a_new_store_keeps_every_experiments_artifacts_beside_it(tmp_path, monkeypatch):
    """Under `ray job submit` the working directory is a temporary copy Ray deletes: a new store's "Default"
    experiment (MLflow makes it with the store) gets ``mlartifacts/`` beside the store, as the sweep's does, not
    ``./mlruns`` of the working directory."""
    from mlflow.tracking import MlflowClient

    (tmp_path / "job_dir").mkdir()
    monkeypatch.chdir(tmp_path / "job_dir")
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    tracking.SweepTracker.open("demo", str(tmp_path / "tune" / "demo"), uri)
    client = MlflowClient(uri)
    root = tracking.artifact_root(uri)
    locations = {e.name: e.artifact_location for e in client.search_experiments()}
    assert set(locations) == {"Default", "par_ray/demo"}
    assert all(loc.startswith(root) for loc in locations.values()), locations
    assert not (tmp_path / "job_dir" / "mlruns").exists()


def test_interrupted_trials_are_closed_and_reopened_on_resume(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    t = tracking.SweepTracker.open("demo", str(tmp_path / "x"), uri)
    run_a = t.start_trial("a", _cfg(0))
    t.finish_trial("a", _cfg(0), {"step": 1}, "FINISHED")
    run_b = t.start_trial("b", _cfg(1))  # still running when the driver stops
    assert t.close_open_trials("KILLED") == 1
    assert t.client.get_run(run_b).info.status == "KILLED" and t.client.get_run(run_a).info.status == "FINISHED"
    resumed = tracking.SweepTracker.open("demo", str(tmp_path / "x"), uri)
    assert resumed.start_trial("b", _cfg(1)) == run_b and resumed.client.get_run(run_b).info.status == "RUNNING"


def test_a_failed_trial_that_resume_finishes_no_longer_says_it_failed(tmp_path):
    """The failed attempt's ``par_ray.error`` tag and ``error.txt`` go when the trial finishes (its run is FINISHED:
    they read as the reason of a failure there was no longer); a trial that fails keeps them."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    t = tracking.SweepTracker.open("demo", str(tmp_path / "x"), uri)
    runs = {tid: t.start_trial(tid, _cfg(0)) for tid in ("a", "b")}
    for tid in runs:
        t.finish_trial(tid, _cfg(0), {"step": 2}, "FAILED", error=("RuntimeError", "worker died"))
    resumed = tracking.SweepTracker.open("demo", str(tmp_path / "x"), uri)
    resumed.start_trial("a", _cfg(0))
    resumed.finish_trial("a", _cfg(0), {"step": 4}, "FINISHED")
    artifacts = {tid: {a.path for a in t.client.list_artifacts(run)} for tid, run in runs.items()}
    assert tracking.ARTIFACT_ERROR not in artifacts["a"] and tracking.ARTIFACT_ERROR in artifacts["b"]
    assert tracking.TAG_ERROR not in t.client.get_run(runs["a"]).data.tags
    assert t.client.get_run(runs["b"]).data.tags[tracking.TAG_ERROR] == "RuntimeError: worker died"


def test_tracker_pickles_without_its_client(tmp_path):
    import pickle

    t = tracking.SweepTracker.open("demo", str(tmp_path / "x"), f"sqlite:///{tmp_path}/mlflow.db")
    t2 = pickle.loads(pickle.dumps(t))
    assert t2.parent_run_id == t.parent_run_id and t2._client is None
    assert t2.client.get_run(t.parent_run_id).info.status == "RUNNING"


def test_trial_artifacts_without_evaluation_hold_only_the_config(tmp_path):
    cfg = _cfg()
    assert tracking.write_trial_artifacts(str(tmp_path), cfg, {"step": 1, "loss": 3.0}) == ["config.json"]
    assert json.loads((tmp_path / "config.json").read_text())["backbone"]["name"] == "tiny-qwen2"


def test_experiment_kind_curve_metrics_and_renamed_draws(tmp_path):
    """The experiment is a model-training experiment; the final accuracy curve is logged with step = test depth and
    step = multiple of d_train (FINISHED trials only, once); the loop's per-step draws R / depth are renamed."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    old = client.create_experiment("par_ray/old", artifact_location=(tmp_path / "a").as_uri())  # made without a kind
    t = tracking.SweepTracker.open("demo", str(tmp_path / "x"), uri, commit="abc")
    assert client.get_experiment(t.experiment_id).tags[TAG_EXPERIMENT_KIND] == "custom_model_development"
    tracking.SweepTracker.open("old", str(tmp_path / "y"), uri, commit="abc")
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"

    cfg = from_flat({"task.train_depth": 4, "eval.depths": "4,6,8,16", "train.steps": 4}, base=_cfg())
    final = {"step": 4, "acc_d4": 1.0, "acc_d6": 0.75, "acc_d8": 0.5, "acc_d16": 0.25, "R": 3, "depth": 2}
    for tid, status in (("done", "FINISHED"), ("failed", "FAILED")):
        run_id = t.start_trial(tid, cfg)
        t.log_metrics(tid, {"loss": 1.0, "R": 5, "depth": 4}, step=2)
        t.log_metrics(tid, final, step=4)
        t.finish_trial(tid, cfg, final, status)
        t.finish_trial(tid, cfg, final, status)  # a resumed sweep finishing it again logs no second curve
        run = client.get_run(run_id)
        assert "R" not in run.data.metrics and "depth" not in run.data.metrics
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, "R_last_step")] == [(2, 5.0), (4, 3.0)]
        assert run.data.metrics["depth_last_step"] == 2.0
        by_depth = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "acc_by_depth"))
        by_multiple = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "acc_by_multiple"))
        if status == "FINISHED":
            assert by_depth == [(4, 1.0), (6, 0.75), (8, 0.5), (16, 0.25)]
            assert by_multiple == [(1, 1.0), (2, 0.5), (4, 0.25)]  # 6 = 1.5 × d_train is not an integer step
        else:  # a partial run's curve would overlay the finished ones as if it were final
            assert by_depth == [] and by_multiple == []


def test_ui_url_opens_the_machine_learning_workflow():
    assert mlflow_ui.ui_url("http://127.0.0.1:5000", "3") == \
        "http://127.0.0.1:5000/#/experiments/3?workflowType=machine_learning"
    assert mlflow_ui.ui_url("http://h:1") == "http://h:1/#/experiments?workflowType=machine_learning"


def test_ui_command_refuses_a_missing_store(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        mlflow_ui.main(["ui", "--storage", str(tmp_path / "nothing")])
    assert e.value.code == 2 and "--storage: no MLflow store" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["99999", "-1", "0", "http"])
def test_ui_command_refuses_a_port_that_is_none(tmp_path, capsys, port):
    """``--port`` out of 1-65535 was an ``OverflowError`` traceback from the port probe (a fresh-user report)."""
    (tmp_path / "mlflow.db").touch()
    with pytest.raises(SystemExit) as e:
        mlflow_ui.main(["ui", "--storage", str(tmp_path), f"--port={port}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --port: " in err and "is not a port number (1-65535)" in err


def test_ui_command_says_in_one_line_why_the_server_did_not_start(tmp_path, capsys):
    """A ``mlflow.db`` that is not a database: the server exits at once; one ``error:`` line with the reason from its
    log, not a ``RuntimeError`` traceback followed by SQLAlchemy's."""
    (tmp_path / "mlflow.db").write_text("not a database")
    assert mlflow_ui.main(["ui", "--storage", str(tmp_path), "--port", str(mlflow_ui.free_port())]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: mlflow server did not start on http://127.0.0.1:"), err
    assert err[0].endswith("file is not a database"), err


def test_ui_command_stops_its_server_on_sigterm(tmp_path):
    """`kill`, `timeout` or a closed terminal (SIGTERM, SIGHUP) must not orphan the mlflow server the command starts
    in its own session (a fresh-user report: the server kept serving after the wrapper was killed)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    import mlflow

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.MlflowClient(store).create_experiment("par_ray/x", artifact_location=str(tmp_path / "mlartifacts"))
    port = mlflow_ui.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "par_ray.tracking", "ui", "--storage", str(tmp_path),
                             "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if "Ctrl-C to stop" in line:
                break
        else:
            pytest.fail(f"ui exited early with {proc.wait()}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        time.sleep(1)
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)


def test_ui_command_interrupted_while_its_server_starts_is_one_line(tmp_path):
    """Ctrl-C in the seconds before the links print (the server starting, the experiments listed): the server is
    stopped, one line, exit 130; no KeyboardInterrupt traceback (a fresh-user report)."""
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    import mlflow

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.MlflowClient(store).create_experiment("par_ray/x", artifact_location=str(tmp_path / "mlartifacts"))
    port = mlflow_ui.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "par_ray.tracking", "ui", "--storage", str(tmp_path),
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "starting mlflow server" in proc.stdout.readline()
        time.sleep(1)  # the server is being started: its /health does not answer yet
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        err = proc.stderr.read()
        assert "Traceback" not in err and "interrupted while the server started; it is stopped" in err, err
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_schema_builds_and_parses_every_metric_name_analysis_reads():
    from par_ray import tracking_schema as ts

    assert ts.depth_metric("acc", 8) == "acc_d8"
    assert ts.depth_metric("halt_acc", 32, (4, 8, 0.3)) == "halt_acc_d32_k4n8t0.3"
    assert ts.depth_metric("halt_acc", 32, (6, 8, 1e-5), pending=True) == "halt_acc_d32_k6n8t1e-05_pending"
    assert ts.iteration_metric("rms", 3) == "rms_k3"
    assert ts.parse_metric("acc_query_d16") == {"kind": "acc_query", "depth": 16, "pending": False}
    assert ts.parse_metric("halt_acc_d32_k6n8t1e-05_pending") == {"kind": "halt_acc", "depth": 32, "pending": True,
                                                                  "rule": (6, 8, 1e-5)}
    assert ts.parse_metric("never_halted_d4_pending") == {"kind": "never_halted", "depth": 4, "pending": True}
    assert ts.parse_metric("halt_prob_k2") == {"kind": "halt_prob", "k": 2}
    for other in ("loss", "acc_by_depth", "oracle_acc_d4_pending", "acc_d8_k1n2t0.5", "G", "best_acc_d8_pending"):
        assert ts.parse_metric(other) is None
    assert ts.parse_metric("best_acc_d8") == {"kind": "best_acc", "depth": 8, "pending": False}
    assert ts.parse_metric("best_iter_d48") == {"kind": "best_iter", "depth": 48, "pending": False}


def test_extrapolation_metric_names_of_every_stopping():
    from par_ray import tracking_schema as ts

    assert [ts.g_metric(k) for k in ts.G_KINDS] == ["G", "G_censored", "G_interp", "d50", "d50_interp"]
    assert [ts.g_metric(k, "halt") for k in ts.G_KINDS] == ["G_halt", "G_halt_censored", "G_halt_interp", "d50_halt",
                                                            "d50_halt_interp"]
    assert (ts.g_metric("G", "best"), ts.g_metric("G_interp", "best")) == ("G_best", "G_best_interp")
    assert ts.g_metric("G", "halt_pending") == "G_halt_pending"
    assert len({ts.g_metric(k, s) for k in ts.G_KINDS for s in ts.STOPPINGS}) == len(ts.G_KINDS) * len(ts.STOPPINGS)
    with pytest.raises(ValueError, match="stopping 'oracle' is not one of"):
        ts.g_metric("G", "oracle")
    with pytest.raises(ValueError, match="kind 'G_std' is not one of"):
        ts.g_metric("G_std")


def test_a_trial_stopped_early_ends_finished_and_says_where_it_stopped(tmp_path):
    """ASHA stopped the trial at step 2 of its steps: its run is FINISHED (Tune completed it; as Ray's own MLflow
    callback ends it) with ``par_ray.stopped_early = "step 2 of N"``, and no final curve (a partial run's curve would
    overlay the finished ones); a trial that ran all its steps has neither the tag nor a missing curve."""
    t = tracking.SweepTracker.open("demo", str(tmp_path / "x"), f"sqlite:///{tmp_path}/mlflow.db")
    cfg = _cfg(0)
    accs = {f"acc_d{d}": 1.0 for d in cfg.eval.depths}
    runs = {tid: t.start_trial(tid, cfg) for tid in ("stopped", "done")}
    t.finish_trial("stopped", cfg, {"step": 2, **accs}, "FINISHED")
    t.finish_trial("done", cfg, {"step": cfg.train.steps, **accs}, "FINISHED")
    stopped, done = (t.client.get_run(runs[k]) for k in ("stopped", "done"))
    assert (stopped.info.status, done.info.status) == ("FINISHED", "FINISHED")
    assert stopped.data.tags[tracking.TAG_STOPPED_EARLY] == f"step 2 of {cfg.train.steps}"
    assert tracking.TAG_STOPPED_EARLY not in done.data.tags
    assert not t.client.get_metric_history(runs["stopped"], tracking.CURVE_BY_DEPTH)
    assert t.client.get_metric_history(runs["done"], tracking.CURVE_BY_DEPTH)


def test_check_store_names_what_is_wrong_with_a_tracking_uri_at_once(tmp_path):
    """A wrong tracking URI is one sentence before anything starts, never MLflow's minutes of silent retries: a
    server that refuses, one that answers but is no MLflow server, a path, an unknown scheme, a file that is no
    SQLite store; an MLflow server, one behind a login, a SQLite store or one still to be created pass."""
    import http.server
    import socket
    import threading

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the handler's API
            self.send_response({"/health": 200, "/login/health": 401}.get(self.path, 404))
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    (tmp_path / "junk.db").write_bytes(bytes(range(256)) * 16)
    try:
        tracking.check_store(url)
        tracking.check_store(f"{url}/login")
        tracking.check_store(url.replace("http://", "http://user:s3cret@"))  # MLflow's client logs in with it
        tracking.check_store(f"sqlite:///{tmp_path}/new/mlflow.db")
        assert not (tmp_path / "new").exists()
        for uri, words in ((f"http://127.0.0.1:{closed}", f"no MLflow server answers at http://127.0.0.1:{closed}"),
                           (f"{url}/elsewhere", f"the server at {url}/elsewhere is no MLflow server (GET "
                                                f"{url}/elsewhere/health: HTTP 404)"),
                           (str(tmp_path / "mlflow.db"), f"e.g. sqlite:///{tmp_path}/mlflow.db"),
                           (f"file://{tmp_path}", "is a path, not a tracking URI"),
                           ("bogus://x", "'bogus' is no tracking store scheme MLflow knows"),
                           (f"sqlite:///{tmp_path}/junk.db", "does not open: MLflow tracking store: file is not a "
                                                             "database")):
            with pytest.raises(ValueError) as e:
                tracking.check_store(uri, timeout_s=5)
            assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    finally:
        httpd.shutdown()


def test_a_password_in_a_tracking_uri_is_never_shown():
    """A database or server URI with a password (``postgresql://user:PASSWORD@host/db``) is printed with ``***`` in
    its place: in check_store's errors and the sweep's ``MLflow:`` line, which a Ray job's log keeps on the cluster."""
    assert tracking.shown_uri("postgresql://user:s3cret@db:5432/mlflow") == "postgresql://user:***@db:5432/mlflow"
    assert tracking.shown_uri("https://user:s3cret@mlflow.example") == "https://user:***@mlflow.example"
    for unchanged in ("sqlite:////tmp/a@b/mlflow.db", "runs/x/mlflow.db", "https://mlflow.example", "databricks"):
        assert tracking.shown_uri(unchanged) == unchanged
    for uri in ("postgresql://user:s3cret@127.0.0.1:9/mlflow", "http://user:s3cret@127.0.0.1:9"):
        with pytest.raises(ValueError) as e:
            tracking.check_store(uri, timeout_s=5)
        assert "s3cret" not in str(e.value) and "user:***@127.0.0.1:9" in str(e.value), str(e.value)


def test_ui_command_refuses_a_path_as_backend_store_uri(tmp_path, capsys):
    """A path (MLflow would take it for its retired file store and print its "maintenance mode" notice) is refused
    with the URI to use instead."""
    with pytest.raises(SystemExit) as e:
        mlflow_ui.main(["ui", "--backend-store-uri", str(tmp_path / "mlflow.db")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"is a path, not a store URI; a sweep's store is sqlite:///{tmp_path}/mlflow.db" in err
