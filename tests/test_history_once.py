"""MLflow history holds each training step once (issue 14): the tracker drops a report at a step already logged,
as Ray Train replays the steps after the last checkpoint when it restarts a worker group, and a resumed sweep
(a new driver, a new tracker) starts again from a checkpoint."""

from mlflow.tracking import MlflowClient

from par_ray import tracking
from par_ray.config import TrialConfig


def test_replayed_reports_are_logged_once_also_by_a_new_tracker(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    t = tracking.SweepTracker.open("once", str(tmp_path / "tune"), uri, commit="test")
    run_id = t.start_trial("t0", TrialConfig())
    for step in (1, 2, 3, 4, 5, 5, 6, 3):  # a fault after step 5 (checkpoint at 4), then a stray old report
        t.log_metrics("t0", {"step": step, "loss": 1.0 / step}, step)
    # a resumed sweep: a new tracker learns the highest logged step from MLflow itself
    t2 = tracking.SweepTracker.open("once", str(tmp_path / "tune"), uri, commit="test")
    for step in (5, 6, 7, 8):
        t2.log_metrics("t0", {"step": step, "loss": 1.0 / step}, step)
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(run_id, "loss")
    assert [m.step for m in history] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [m.value for m in history] == [1.0 / s for s in range(1, 9)]
    # values logged without a step key (final artifacts' d50 marker) are not training reports: always logged
    t2.log_metrics("t0", {"d50": float("nan")}, 8)
    assert [m.step for m in client.get_metric_history(run_id, "d50")] == [8]
