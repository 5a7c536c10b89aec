"""MLflow tracking of sweeps: one experiment per sweep kind, a parent run per sweep, a child run per trial.

What is written where (names: ``par_ray.tracking_schema``, which ``analysis/`` reads with; tags, never run names,
identify things):

- experiment ``par_ray/<sweep name>`` (e.g. ``par_ray/backbone_scaling``), tagged ``mlflow.experimentKind =
  "custom_model_development"`` (MLflow's "Machine learning" kind, as opposed to "GenAI apps & agents");
- parent run per sweep, tags ``par_ray.role = "sweep"``, ``par_ray.sweep = <name>`` and
  ``par_ray.experiment_path`` (the Tune experiment directory, which identifies the sweep on ``--resume``);
- child run per trial, tags ``mlflow.parentRunId``, ``par_ray.role = "trial"``, ``par_ray.trial_id``,
  ``par_ray.recipe``, ``par_ray.backbone``, ``par_ray.task``, ``par_ray.seed``, ``par_ray.git_commit``, and on a
  FAILED trial ``par_ray.error`` (``"<ErrorClass>: <message>"``, at most :data:`ERROR_TAG_CHARS` characters) with the
  artifact ``error.txt`` (the same, longer: :data:`ERROR_TEXT_CHARS`), both removed when ``--resume`` finishes it;
  a trial a search's scheduler (ASHA) stopped before ``train.steps`` ends FINISHED, as Ray's own MLflow callback
  ends it, tagged ``par_ray.stopped_early = "step S of N"`` (``TAG_STOPPED_EARLY``);
  params = ``par_ray.config.to_flat(cfg)`` without anything that looks like a secret (:func:`redact`);
  step metrics logged with ``step=`` the optimizer step, so the latest value of each is the final one (the loop's
  ``R`` and ``depth``, drawn afresh at every step, are logged as ``R_last_step`` and ``depth_last_step``: the values
  of the step just before the report, like ``loss_last_step``; see ``tracking_schema.METRIC_RENAMES``);
  the final accuracy-by-depth curve of a FINISHED trial as two more metrics whose *step is not an optimizer step*:
  ``acc_by_depth`` at step = test depth d, and ``acc_by_multiple`` at step = d / d_train for the depths that are
  integer multiples of d_train, so MLflow's line charts (x-axis "Step") overlay the curves of the selected runs;
  artifacts ``accuracy_by_depth.json``, ``accuracy_by_depth.csv``, ``accuracy_by_depth.png``, ``config.json``.

A restored sweep finds its parent run by ``par_ray.experiment_path`` and each trial's child run by
``par_ray.trial_id`` under that parent, so resuming never duplicates runs. Everything here runs in the sweep's
driver process (``par_ray.sweep`` calls it from a Tune callback); training workers never talk to MLflow. The MLflow
server and UI command (``python -m par_ray.tracking ui --storage runs/<sweep>``) are ``par_ray.mlflow_ui``.

Tracking URI: ``--mlflow-uri``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///<storage>/mlflow.db`` with artifacts
in ``<storage>/mlartifacts`` (:func:`tracking_uri`, :func:`artifact_root`).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import errno
import functools
import io
import json
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

from par_ray.config import TrialConfig, to_flat
from par_ray.tracking_schema import (ARTIFACT_ACCURACY_CSV, ARTIFACT_ACCURACY_JSON, ARTIFACT_ACCURACY_PNG,
                                     ARTIFACT_CONFIG, CURVE_BY_DEPTH, CURVE_BY_MULTIPLE, EXPERIMENT_KIND,
                                     INTERVAL_KINDS, METRIC_RENAMES, ROLE_SWEEP, ROLE_TRIAL, STOPPINGS, TAG_BACKBONE,
                                     TAG_EXPERIMENT_KIND, TAG_EXPERIMENT_PATH, TAG_GIT_COMMIT, TAG_PARENT, TAG_RECIPE,
                                     TAG_ROLE, TAG_SEED, TAG_SWEEP, TAG_TASK, TAG_TRIAL_ID, depth_metric,
                                     experiment_name, g_metric)
from par_ray.tracking_schema import (ARTIFACT_ERROR, ERROR_TAG_CHARS, ERROR_TEXT_CHARS,  # noqa: F401 - re-exported
                                     TAG_ERROR, TAG_STOPPED_EARLY)

_SECRET_KEY = re.compile(r"token|secret|passw(or)?d|passwd|credential|auth|api[_-]?key|access[_-]?key|private[_-]?key"
                         r"|(^|[._-])key($|[._-])", re.IGNORECASE)
_SECRET_VALUE = re.compile(r"^(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{16,}|AKIA[0-9A-Z]{16}"
                           r"|xox[abprs]-[A-Za-z0-9-]+)|://[^/\s:@]+:[^/\s@]+@")


def redact(values: typing.Mapping[str, typing.Any]) -> dict[str, typing.Any]:
    """``values`` without entries whose key looks like a token / key / secret / password, or whose value looks like a
    credential (``hf_…``, ``sk-…``, ``ghp_…``, ``AKIA…``, ``xox?-…`` tokens, ``scheme://user:password@`` URLs).
    """
    return {k: v for k, v in values.items()
            if not _SECRET_KEY.search(str(k)) and not (isinstance(v, str) and _SECRET_VALUE.search(v))}


class TrackingStoreError(OSError):
    """The MLflow tracking store refused a call of the sweep's driver: ``strerror`` says why (for a full disk under a
    SQLite store, ``No space left on device (MLflow tracking store: database or disk is full)``, errno ``ENOSPC``),
    ``filename`` names the store (the SQLite file, else the tracking URI). An ``OSError``, so a sweep reports it as one
    ``error:`` line, as it does a full storage disk."""

    @classmethod
    def of(cls, error: BaseException, uri: str) -> "TrackingStoreError":
        """The store error behind MLflow's ``error`` (an ``MlflowException``) at tracking URI ``uri``."""
        text = " ".join(str(getattr(error, "message", error)).split())
        # SQLAlchemy's text: "[(note)] (sqlite3.OperationalError) database or disk is full [SQL: …] …"
        driver = re.search(r"\((?:\w+\.)+\w+\) (.*?)(?: \[SQL:|$)", text)
        reason = (driver.group(1) if driver else text.split(" [SQL:")[0])[:300]
        store = sqlite_file(uri)
        where = str(store) if store is not None else shown_uri(uri)
        if "database or disk is full" in reason or "No space left on device" in reason:
            return cls(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (MLflow tracking store: {reason})", where)
        return cls(errno.EIO, f"MLflow tracking store: {reason}", where)


@contextlib.contextmanager
def store_errors(uri: str) -> typing.Iterator[None]:
    """Raise MLflow's errors (``MlflowException``) inside the block as :class:`TrackingStoreError` of the store at
    ``uri``: one line, not MLflow's and SQLAlchemy's chained tracebacks (MLflow's own ERROR record of a SQLAlchemy
    error it raises again is dropped: :data:`_RERAISED`)."""
    logging.getLogger("mlflow.store.db.utils").addFilter(_RERAISED)  # once: the same filter object
    try:
        yield
    except Exception as e:
        from mlflow.exceptions import MlflowException

        if not isinstance(e, MlflowException):
            raise
        raise TrackingStoreError.of(e, uri) from None


def _store_call(method):
    """A :class:`SweepTracker` method run under :func:`store_errors` of its tracking URI."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with store_errors(self.uri):
            return method(self, *args, **kwargs)
    return call


class _ReraisedStoreErrors(logging.Filter):
    """Drops MLflow's own ERROR record, with its traceback, of a SQLAlchemy error it raises again as an
    ``MlflowException`` (``mlflow.store.db.utils``): the caller reports that exception."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("SQLAlchemy database error")


_RERAISED = _ReraisedStoreErrors()


def tracking_uri(flag: str | None, storage: str) -> str:
    """``--mlflow-uri`` if given, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///<storage>/mlflow.db``.

    Raises ``ValueError`` naming ``--mlflow-uri`` when ``storage`` is a URI (``s3://`` …) and no URI is given.
    """
    if flag:
        return flag
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    if "://" in storage:
        raise ValueError(f"--mlflow-uri: required when --storage is a URI ({storage}); e.g. http://127.0.0.1:5000")
    return "sqlite:///" + str(Path(storage).expanduser().resolve() / "mlflow.db")


def shown_uri(uri: str) -> str:
    """``uri`` as it may be printed or logged: a password in it (``postgresql://user:PASSWORD@host/db``,
    ``https://user:PASSWORD@host``) replaced by ``***`` (SQLAlchemy's URL rendering); anything SQLAlchemy cannot
    parse as a URL (a path) is returned as it is, having no password to hide."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(uri)
    except (ArgumentError, ValueError):
        return uri
    return url.render_as_string(hide_password=True) if url.password else uri


SERVER_PROBE_S = 10.0
"""How long :func:`check_store` waits for an MLflow server's answer (seconds)."""


def check_store(uri: str, timeout_s: float = SERVER_PROBE_S) -> None:
    """Reach the tracking store at ``uri`` once, before anything starts, so that a wrong URI is one line at once
    (MLflow's client retries a server that does not answer for about 4 minutes, silently, and an unknown scheme is
    only found at the first call).

    - ``http(s)://``: the server must answer ``GET <uri>/health`` within ``timeout_s``, with 200 (an MLflow server)
      or 401 / 403 (one behind a login);
    - a path or ``file:`` URI: refused (MLflow's file store is retired; a store is ``sqlite:///<path>/mlflow.db``);
    - ``sqlite:///PATH``: a file that exists must be an MLflow store (one that does not exist is created by the
      caller);
    - any other scheme (a database server, Databricks): MLflow must know it and the store must answer one call.

    Raises ``ValueError`` with one sentence (no flag: the caller names its own) that shows ``uri`` with its password
    hidden (:func:`shown_uri`)."""
    from urllib.error import HTTPError
    from urllib.parse import urlparse, urlsplit, urlunsplit
    from urllib.request import urlopen

    scheme, shown = urlparse(uri).scheme, shown_uri(uri)
    if scheme in ("http", "https"):
        # the server's health check needs no login: user:password@ (MLflow's client logs in with it) is left out
        parts = urlsplit(uri)
        health = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])).rstrip("/") + "/health"
        try:
            with urlopen(health, timeout=timeout_s):
                return
        except HTTPError as e:
            if e.code in (401, 403):
                return
            raise ValueError(f"the server at {shown} is no MLflow server (GET {shown.rstrip('/')}/health: "
                             f"HTTP {e.code}); check the address") from None
        except (OSError, ValueError) as e:  # URLError, a timeout, a malformed address
            reason = getattr(e, "reason", e)
            raise ValueError(f"no MLflow server answers at {shown} ({reason}); start one (`python -m par_ray.tracking "
                             f"ui`, `mlflow server`) or check the address") from None
    if scheme in ("", "file"):
        path = urlparse(uri).path if scheme == "file" else uri
        raise ValueError(f"{uri} is a path, not a tracking URI (MLflow's file store is retired): a sweep's store is "
                         f"sqlite:///<its --storage>/mlflow.db"
                         + (f", e.g. sqlite:///{Path(path).expanduser().resolve()}" if path.endswith(".db") else ""))
    if (store := sqlite_file(uri)) is not None and not store.exists():
        return
    from mlflow.tracking import MlflowClient
    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException

    logging.getLogger("mlflow.store.db.utils").addFilter(_RERAISED)
    try:
        MlflowClient(uri).search_experiments(max_results=1)
    except UnsupportedModelRegistryStoreURIException:  # MLflow's registry knows no store of that scheme
        raise ValueError(f"{shown}: {scheme!r} is no tracking store scheme MLflow knows; use sqlite:///PATH/mlflow.db, "
                         f"an http(s):// MLflow server, or a database URI such as postgresql://") from None
    except Exception as e:  # noqa: BLE001 - MLflow's or SQLAlchemy's error of a store that does not open
        raise ValueError(f"the tracking store at {shown} does not open: {TrackingStoreError.of(e, uri).strerror}"
                         ) from None


def sqlite_file(uri: str) -> Path | None:
    """The database file of a SQLite store URI (``sqlite:///runs/x/mlflow.db`` → ``runs/x/mlflow.db``), else
    ``None``."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def artifact_root(uri: str) -> str | None:
    """Artifact location of new experiments: ``mlartifacts/`` beside a SQLite store (not the process's working
    directory, which under ``ray job submit`` is temporary); ``None`` (the server's or store's default) otherwise."""
    store = sqlite_file(uri)
    return None if store is None else (store.parent / "mlartifacts").resolve().as_uri()


def git_commit(cwd: str | None = None) -> str:
    """HEAD of the repository at ``cwd``, by default the checkout this package runs from (not the working
    directory: a driver may run elsewhere). ``PAR_RAY_GIT_COMMIT`` wins; ``"unknown"`` outside a git checkout."""
    if os.environ.get("PAR_RAY_GIT_COMMIT"):
        return os.environ["PAR_RAY_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or str(Path(__file__).resolve().parent), capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def trial_tags(cfg: TrialConfig, trial_id: str, parent_run_id: str, commit: str) -> dict[str, str]:
    """The child-run tags of one trial (see the module docstring)."""
    return {
        TAG_PARENT: parent_run_id,
        TAG_ROLE: ROLE_TRIAL,
        TAG_TRIAL_ID: trial_id,
        TAG_RECIPE: cfg.recipe.name,
        TAG_BACKBONE: cfg.backbone.name,
        TAG_TASK: cfg.task.name,
        TAG_SEED: str(cfg.train.seed),
        TAG_GIT_COMMIT: commit,
    }


def sweep_run_params(uri: str, sweep: str, experiment_path: str) -> dict[str, str] | None:
    """The params of the parent run of the sweep stored at ``experiment_path`` (``None`` if it has none yet)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment_name(sweep))
    if exp is None:
        return None
    found = client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`{TAG_ROLE}` = 'sweep' and tags.`{TAG_EXPERIMENT_PATH}` = "
                                           f"'{_quote(experiment_path)}'", max_results=1)
    return dict(found[0].data.params) if found else None


@dataclass
class SweepTracker:
    """MLflow handle of one sweep, used by the sweep driver only. Picklable (Tune pickles its callbacks). Every method
    raises :class:`TrackingStoreError` (an ``OSError``) when the store refuses a call (a full disk under a SQLite
    store, an unreachable server)."""

    uri: str
    """Tracking URI."""
    experiment_id: str
    parent_run_id: str
    git_commit: str = "unknown"
    _runs: dict[str, str] = field(default_factory=dict, repr=False)
    """trial id → child run id (a cache of the tag look-up)."""
    _last_step: dict[str, float] = field(default_factory=dict, repr=False)
    """child run id → highest step of a training report logged (a cache of the run's ``step`` metric)."""
    _client: typing.Any = field(default=None, repr=False)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    @property
    def client(self):
        if self._client is None:
            # MLflow prints "🏃 View run <name> at: <url>" per run it ends on an HTTP server: one line per trial
            # in the sweep's console, which names the runs itself
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    # -- parent run ----------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, sweep: str, experiment_path: str, uri: str, params: typing.Mapping[str, typing.Any] | None = None,
             tags: typing.Mapping[str, str] | None = None, commit: str | None = None) -> "SweepTracker":
        """Get or create the experiment ``par_ray/<sweep>`` (kind :data:`EXPERIMENT_KIND`, also set on an existing
        experiment without a kind) and the parent run of the sweep stored at ``experiment_path`` (an existing one is
        reused and set RUNNING again)."""
        from mlflow.tracking import MlflowClient

        with store_errors(uri):
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # see SweepTracker.client
            store = sqlite_file(uri)
            if store is not None and not store.exists():
                # a new store: its "Default" experiment gets the artifact folder beside it, as the sweep's does,
                # not ./mlruns of the working directory (a temporary folder under `ray job submit`)
                from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

                store.parent.mkdir(parents=True, exist_ok=True)
                SqlAlchemyStore(uri, artifact_root(uri)).engine.dispose()
            client = MlflowClient(tracking_uri=uri)
            name = experiment_name(sweep)
            exp = client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp else client.create_experiment(
                name, artifact_location=artifact_root(uri), tags={TAG_EXPERIMENT_KIND: EXPERIMENT_KIND})
            if exp is not None and TAG_EXPERIMENT_KIND not in exp.tags:  # made by an older version, or by hand
                client.set_experiment_tag(exp_id, TAG_EXPERIMENT_KIND, EXPERIMENT_KIND)
            commit = commit or git_commit()
            found = client.search_runs(
                [exp_id], filter_string=f"tags.`{TAG_ROLE}` = '{ROLE_SWEEP}' and tags.`{TAG_EXPERIMENT_PATH}` = "
                                        f"'{_quote(experiment_path)}'", max_results=1)
            if found:
                run_id = found[0].info.run_id
                client.update_run(run_id, status="RUNNING")
            else:
                all_tags = {TAG_ROLE: ROLE_SWEEP, TAG_SWEEP: sweep, TAG_EXPERIMENT_PATH: experiment_path,
                            TAG_GIT_COMMIT: commit, **redact(dict(tags or {}))}
                run_id = client.create_run(exp_id, tags=all_tags, run_name=sweep).info.run_id
                _log_params(client, run_id, params or {})
        return cls(uri=uri, experiment_id=exp_id, parent_run_id=run_id, git_commit=commit, _client=client)

    @_store_call
    def finish(self, status: str = "FINISHED") -> None:
        """End the parent run (``FINISHED``, ``FAILED`` or ``KILLED``)."""
        self.client.set_terminated(self.parent_run_id, status=status)

    @_store_call
    def log_sweep_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Upload the files of ``local_dir`` (tables, plots) to the parent run."""
        self.client.log_artifacts(self.parent_run_id, local_dir, artifact_path)

    # -- child runs ----------------------------------------------------------------------------------------------

    @_store_call
    def find_trial_run(self, trial_id: str) -> str | None:
        """The child run of ``trial_id`` under this sweep's parent, if one exists."""
        if trial_id in self._runs:
            return self._runs[trial_id]
        found = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{TAG_PARENT}` = '{self.parent_run_id}' and tags.`{TAG_TRIAL_ID}` = "
                          f"'{_quote(trial_id)}'",
            max_results=1)
        if found:
            self._runs[trial_id] = found[0].info.run_id
        return self._runs.get(trial_id)

    @_store_call
    def trial_status(self, trial_id: str) -> str | None:
        """The MLflow status of ``trial_id``'s child run (``RUNNING``, ``FINISHED``, ``FAILED``, ``KILLED``), or
        ``None`` when it has none."""
        run_id = self.find_trial_run(trial_id)
        return None if run_id is None else self.client.get_run(run_id).info.status

    @_store_call
    def start_trial(self, trial_id: str, cfg: TrialConfig, run_name: str | None = None,
                    params: typing.Mapping[str, typing.Any] | None = None) -> str:
        """Get or create the child run of ``trial_id`` and mark it RUNNING. A new run gets its tags and params: the
        flat config and ``params`` (the sweep's cost plan, ``par_ray.cost.TrialCost.params``)."""
        run_id = self.find_trial_run(trial_id)
        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        tags = redact(trial_tags(cfg, trial_id, self.parent_run_id, self.git_commit))
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=run_name or trial_id)
        run_id = self._runs[trial_id] = run.info.run_id
        _log_params(self.client, run_id, {**to_flat(cfg), **dict(params or {})})
        return run_id

    @_store_call
    def log_metrics(self, trial_id: str, metrics: typing.Mapping[str, typing.Any], step: int) -> None:
        """Numeric entries of ``metrics`` at optimizer step ``step`` (booleans and strings are skipped; keys in
        :data:`par_ray.tracking_schema.METRIC_RENAMES` are renamed).

        A training report (``metrics`` holds ``step``) is logged once per step: one at or below the highest step
        already logged to the run is dropped. Ray Train replays the steps after the last checkpoint when it restarts
        a worker group, and a resumed trial starts again from its checkpoint; the run's history keeps the first
        report of each step, so it is strictly increasing in step.
        """
        from mlflow.entities import Metric

        run_id = self._runs.get(trial_id) or self.find_trial_run(trial_id)
        if run_id is None:
            return
        if "step" in metrics:
            last = self._last_step.get(run_id)
            if last is None:  # a new driver (sweep --resume): the run's latest ``step`` is the highest logged
                last = self.client.get_run(run_id).data.metrics.get("step", -math.inf)
            if step <= last:
                return
            self._last_step[run_id] = step
        now = int(time.time() * 1000)
        batch = [Metric(METRIC_RENAMES.get(k, k), float(v), now, int(step)) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool)]
        self._log_batch(run_id, batch)

    def _log_batch(self, run_id: str, batch: list) -> None:
        for i in range(0, len(batch), 900):  # MLflow's per-request metric limit is 1,000
            self.client.log_batch(run_id, metrics=batch[i:i + 900])

    @_store_call
    def close_open_trials(self, status: str = "KILLED") -> int:
        """End every child run of this sweep that is still RUNNING (interrupted trials) with ``status``; returns how
        many. A resumed sweep sets them RUNNING again when their trials restart."""
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{TAG_PARENT}` = '{self.parent_run_id}' and "
                                                f"attributes.status = 'RUNNING'", max_results=10_000)
        for run in runs:
            self.client.set_terminated(run.info.run_id, status=status)
        return len(runs)

    @_store_call
    def finish_trial(self, trial_id: str, cfg: TrialConfig, final: typing.Mapping[str, typing.Any] | None,
                     status: str, error: tuple[str, str] | None = None) -> None:
        """Log the artifacts of a trial from its final metrics and end its run with ``status``.

        ``error``: (error class, message) of a trial that failed (:func:`par_ray.sweep.run.failure_reason`): the tag
        :data:`TAG_ERROR` and the artifact :data:`ARTIFACT_ERROR` record it, so the run says why it failed.

        A FINISHED trial whose last step (``final["step"]``) is short of ``cfg.train.steps`` was stopped early by a
        search's scheduler (ASHA: Tune completed it): its run gets :data:`TAG_STOPPED_EARLY` = ``"step S of N"``.

        A FINISHED trial that ran all its steps also gets its accuracy-by-depth curve as the metrics
        ``acc_by_depth`` / ``acc_by_multiple`` (:func:`curve_metrics`), once: a run that already has them (a resumed
        sweep re-finishing a trial) is left alone. Trials that end otherwise keep only their ``acc_d{D}`` step
        metrics: a curve from a partial run would overlay the finished ones as if it were final.
        """
        run_id = self._runs.get(trial_id) or self.find_trial_run(trial_id)
        if run_id is None:
            return
        final = dict(final or {})
        # d50 was not reached (of R = ⌈d/c⌉, or of a halting trial's other stoppings), or a bound of its 95 % interval
        # lies past the largest test depth: make the last value say so (an earlier evaluation may have logged one)
        unreached = {g_metric(kind, s): math.nan for s in STOPPINGS if final.get(g_metric("G_censored", s))
                     for kind in ("d50", "d50_interp")}
        unreached |= {g_metric(f"{kind}_{end}", s): math.nan for s in STOPPINGS
                      if final.get(g_metric("G_hi_censored", s)) for end in ("lo", "hi")
                      for kind in ("d50", "d50_interp") if g_metric(f"{kind}_{end}", s) not in final}
        if unreached and "step" in final:
            self.log_metrics(trial_id, unreached, int(final["step"]))
        stopped_at = int(final.get("step", 0))
        stopped_early = status == "FINISHED" and stopped_at < cfg.train.steps
        if status == "FINISHED":
            self._clear_error(run_id)
        if stopped_early:
            self.client.set_tag(run_id, TAG_STOPPED_EARLY, f"step {stopped_at} of {cfg.train.steps}")
        curve = curve_metrics(cfg, final) if status == "FINISHED" and not stopped_early else []
        if curve and not self.client.get_metric_history(run_id, CURVE_BY_DEPTH):
            self._log_batch(run_id, curve)
        with tempfile.TemporaryDirectory() as d:
            write_trial_artifacts(d, cfg, final)
            if error is not None:
                text = f"{error[0]}: {error[1]}"
                self.client.set_tag(run_id, TAG_ERROR, text[:ERROR_TAG_CHARS])
                Path(d, ARTIFACT_ERROR).write_text(text[:ERROR_TEXT_CHARS] + "\n")
            self.client.log_artifacts(run_id, d)
        self.client.set_terminated(run_id, status=status)

    def _clear_error(self, run_id: str) -> None:
        """A trial that failed and then finished (``--resume``): its run stops saying it failed, the tag
        :data:`TAG_ERROR` and the artifact :data:`ARTIFACT_ERROR` of the failed attempt removed (the trial's error
        file under ``--storage`` keeps that traceback). An artifact store that cannot delete keeps the file."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        run = self.client.get_run(run_id)
        if TAG_ERROR not in run.data.tags:
            return
        self.client.delete_tag(run_id, TAG_ERROR)
        with contextlib.suppress(NotImplementedError):
            get_artifact_repository(run.info.artifact_uri).delete_artifacts(ARTIFACT_ERROR)


def curve_metrics(cfg: TrialConfig, final: typing.Mapping[str, typing.Any]) -> list:
    """The accuracy-by-depth curve of ``final`` (full-state accuracy ``acc_d{d}``, a fraction in [0, 1]) as MLflow
    ``Metric`` entries: ``acc_by_depth`` at step d for every test depth d that was evaluated, and ``acc_by_multiple``
    at step d / d_train for the depths that are integer multiples of ``cfg.task.train_depth`` (MLflow steps are
    integers). Empty when nothing was evaluated."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    d_train = cfg.task.train_depth
    out = []
    for d in cfg.eval.depths:
        if depth_metric("acc", d) not in final:
            continue
        acc = float(final[depth_metric("acc", d)])
        out.append(Metric(CURVE_BY_DEPTH, acc, now, int(d)))
        if d % d_train == 0:
            out.append(Metric(CURVE_BY_MULTIPLE, acc, now, d // d_train))
    return out


def write_trial_artifacts(out_dir: str, cfg: TrialConfig, final: typing.Mapping[str, typing.Any]) -> list[str]:
    """Write ``config.json`` and, when the trial was evaluated, ``accuracy_by_depth.{json,csv,png}`` into ``out_dir``.

    Returns the file names written.
    """
    out = Path(out_dir)
    (out / ARTIFACT_CONFIG).write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    written = [ARTIFACT_CONFIG]
    depths = [d for d in cfg.eval.depths if depth_metric("acc", d) in final]
    if not depths:
        return written
    d_train = cfg.task.train_depth
    rows = [{"depth": d, "multiple": d / d_train, "acc": float(final[depth_metric("acc", d)]),
             "acc_lo": float(final.get(depth_metric("acc_lo", d), math.nan)),  # the 95 % Wilson interval
             "acc_hi": float(final.get(depth_metric("acc_hi", d), math.nan)),
             "sequences": float(final.get(depth_metric("sequences", d), math.nan)),
             "acc_query": float(final.get(depth_metric("acc_query", d), math.nan))} for d in depths]
    summary = {
        "task": cfg.task.name, "backbone": cfg.backbone.name, "recipe": cfg.recipe.name, "seed": cfg.train.seed,
        "train_depth": d_train, "chance": final.get("chance"), "d50": final.get("d50"), "G": final.get("G"),
        "G_censored": bool(final.get("G_censored", 0.0)), "d50_interp": final.get("d50_interp"),
        "G_interp": final.get("G_interp"),
        **{k: final.get(k) for k in INTERVAL_KINDS if k in final},  # 95 % intervals (G_lo, G_interp_hi, …)
        "by_depth": rows,
    }
    (out / ARTIFACT_ACCURACY_JSON).write_text(json.dumps(summary, indent=2))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["depth", "multiple", "acc", "acc_lo", "acc_hi", "sequences",
                                             "acc_query"])
    writer.writeheader()
    writer.writerows(rows)
    (out / ARTIFACT_ACCURACY_CSV).write_text(buf.getvalue())
    _plot_accuracy(out / ARTIFACT_ACCURACY_PNG, cfg, rows, final)
    return written + [ARTIFACT_ACCURACY_JSON, ARTIFACT_ACCURACY_CSV, ARTIFACT_ACCURACY_PNG]


def _plot_accuracy(path: Path, cfg: TrialConfig, rows: list[dict], final: typing.Mapping[str, typing.Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4), dpi=100)
    ax.plot([r["depth"] for r in rows], [r["acc"] for r in rows], "o-", label="full-state")
    if not any(math.isnan(r["acc_lo"]) for r in rows):
        ax.fill_between([r["depth"] for r in rows], [r["acc_lo"] for r in rows], [r["acc_hi"] for r in rows],
                        alpha=0.2, label="95 % interval")
    ax.plot([r["depth"] for r in rows], [r["acc_query"] for r in rows], "s--", label="per-query", alpha=0.7)
    if final.get("chance") is not None:
        chance = float(final["chance"])
        ax.axhline(chance, color="grey", lw=0.8, ls=":", label="chance")
        ax.axhline((chance + 1) / 2, color="grey", lw=0.8, ls="-.", label="midpoint (d50)")
    ax.axvline(cfg.task.train_depth, color="k", lw=0.8, label="d_train")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("test depth d")
    ax.set_ylabel("accuracy")
    G = final.get("G")
    ax.set_title(f"{cfg.task.name} · {cfg.backbone.name} · {cfg.recipe.name} · seed {cfg.train.seed}"
                 + (f" · G {'≥ ' if final.get('G_censored') else ''}{float(G):.2f}" if G is not None else ""),
                 fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _log_params(client, run_id: str, params: typing.Mapping[str, typing.Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, "None" if v is None else str(v)) for k, v in redact(params).items()]
    for i in range(0, len(items), 90):  # MLflow's per-request param limit is 100
        client.log_batch(run_id, params=items[i:i + 90])


def _quote(value: str) -> str:
    return value.replace("'", "\\'")


if __name__ == "__main__":  # ``python -m par_ray.tracking ui --storage runs/<sweep>``: par_ray.mlflow_ui's command
    from par_ray.mlflow_ui import main

    sys.exit(main(prog="python -m par_ray.tracking ui"))
