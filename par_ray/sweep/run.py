"""Running a sweep: Tune over Train V2, the MLflow callback, restore, and the end-of-sweep outcome.

Tune over Train V2 (ray doc/source/train/doc_code/train_tune_interop.py): each trial runs a driver function that
builds the trial's ``TorchTrainer`` with a deterministic name ``trial_<trial id>`` and ``TuneReportCallback()``;
``FailureConfig`` at both levels (Tune restarts a trial's driver; Train restarts its workers from the latest
checkpoint). ``--resume`` = ``Tuner.restore``: finished trials are kept, unfinished and errored ones continue from
their Train checkpoints.

MLflow (``par_ray.tracking``) from a Tune callback on the sweep driver: a parent run per sweep, a child run per trial,
reused on resume. Workers never log to MLflow. At the end: the trial counts (finished / failed / stopped early by
ASHA / unfinished / not started), the parent run's status, and ``analysis.analyze`` on the parent run (accuracy by
depth and G, mean ± std over seeds). A tracking store that refuses a call (a full disk under a SQLite store) stops
the sweep as a full storage disk does: one ``error:`` line, the runs closed where the store still allows it.

Console output: Tune's status table (its ``CLIReporter``: the varying parameters, step, loss, G and the interpolated
G with their 95 % intervals, and the search metric, every :data:`STATUS_EVERY_S`), the training loop's progress line at each report (rank 0), and worker
failures (:func:`_failure_lines`). The rest goes to log files in the Ray session directory: Ray Train's INFO lines
(every report and checkpoint, worker-group starts) to ``logs/train/`` (``LoggingConfig``, ``resources.joined``),
each trial driver's own output to its Tune working dir, ``artifacts/<run>/<sweep>/working_dirs/trial_<id>/stdout``
and ``stderr`` (``RunConfig(log_to_file=True)``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import sys
import time
import typing
import warnings

from par_ray.sweep.resources import (DRIVER_RESOURCES, autoscaler_limits_unknown, check_budget, cluster_capacity,
                                     cluster_has_gpu, cost_summary, exception_chain, joined, local_preset_guess,
                                     max_concurrent_trials, print_plan, reservation, sweep_cost, trial_resources)
from par_ray.cost import trial_cost
from par_ray.hardware import load_table
from par_ray.sweep.spec import (DEFAULT_STORAGE, PRESET_CHOICES, Options, Plan, Recipe, SweepConfigError, SweepSpec,
                                build_plan, cells_of, count_trials, missing_weights, resolve, trial_label)
from par_ray.train.cluster import check_outlives_job
from par_ray.tracking_schema import TAG_PRESET, TAG_SMOKE_TEST, cost_param, depth_metric, experiment_name

STATUS_EVERY_S = 300
"""Seconds between Tune's status tables (one also comes first and last); progress lines come at every report."""


# --------------------------------------------------------------------------------------------------------------------
# Tune: the per-trial driver and the MLflow callback

SIGTERM_BEFORE_LOGGING_STEP_ENV = "PAR_RAY_FAULT_SIGTERM_BEFORE_LOGGING_STEP"
"""Fault injection for tests (an environment variable of the sweep driver): when the MLflow callback is handed the
report of this step, the driver sends itself SIGTERM and drops that report, which is the window between Train
registering a checkpoint and Tune's callback logging its report, made deterministic."""

NOT_RETRYABLE_MARKER = "par_ray_not_retryable.json"
"""Written into a trial's Train run folder when the trial failed with an error no retry can fix
(``par_ray.train.trainer.NOT_RETRYABLE``); a restarted driver of that trial fails at once without training
(:class:`NotRetryableError`). ``--resume`` removes the markers, so it retries those trials (the cause fixed)."""


class NotRetryableError(RuntimeError):
    """The trial failed earlier with an error a retry cannot fix (``error_class``: ``error_message``); raised by a
    driver Tune restarted under its ``FailureConfig``, which retries every error alike."""

    def __init__(self, error_class: str, error_message: str):
        super().__init__(f"{error_class}: {error_message}")
        self.error_class, self.error_message = error_class, error_message

    def __reduce__(self):
        return (NotRetryableError, (self.error_class, self.error_message))


def failure_reason(error: BaseException) -> tuple[str, str]:
    """(error class, message) of the user error inside a failed trial's Ray error (``RayTaskError`` →
    ``WorkerGroupError`` → each rank's exception): the first not-retryable one, else the first rank's."""
    from par_ray.train.trainer import NOT_RETRYABLE, root_causes

    causes = root_causes(error)
    for c in causes:
        if isinstance(c, NotRetryableError):
            return c.error_class, c.error_message
    cause = next((c for c in causes if isinstance(c, NOT_RETRYABLE)), causes[0])
    return type(cause).__name__, str(cause).strip()


def _trial_driver(params: dict, train_storage: str, train_max_failures: int,
                  extra_recipes: typing.Mapping[str, Recipe] | None = None,
                  checkpoint_score: tuple[str, str] | None = None) -> None:
    """One trial (a Tune function trainable): build this trial's TorchTrainer and fit it; Train reports reach Tune.

    ``checkpoint_score``: (search metric, mode), so Train keeps the best checkpoints by it (``None`` for a grid).
    An error no retry can fix fails the trial once: Train's policy raises it at once
    (``par_ray.train.trainer.FailFastPolicy``), and Tune, whose ``FailureConfig`` retries every error, restarts a
    driver that finds :data:`NOT_RETRYABLE_MARKER` and raises :class:`NotRetryableError` without training.
    """
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from par_ray.train.trainer import build_trainer, is_retryable

    cfg = resolve(params, extra_recipes)
    name = f"trial_{ray.tune.get_context().get_trial_id()}"
    marker = f"{train_storage}/{name}/{NOT_RETRYABLE_MARKER}"
    earlier = _read_text(marker)
    if earlier is not None:
        record = json.loads(earlier)
        raise NotRetryableError(record["error_class"], record["message"])
    trainer = build_trainer(cfg, name=name, storage_path=train_storage, max_failures=train_max_failures,
                            callbacks=[TuneReportCallback(), _failure_lines(f"{name} ({trial_label(cfg)})")],
                            checkpoint_score=checkpoint_score, log_level="WARNING")
    try:
        trainer.fit()
    except Exception as e:
        if not is_retryable(e):
            error_class, message = failure_reason(e)
            _write_text(marker, json.dumps({"error_class": error_class, "message": message}))
        raise
    _wait_for_tune_to_take_the_last_report()


def _wait_for_tune_to_take_the_last_report(timeout_s: float = 60.0) -> None:
    """Return from the trial function only once Tune's trial actor has taken the last Train report.

    Ray 2.60: ``TuneReportCallback`` hands each report to the trial actor through a one-slot queue that the actor's
    main thread polls. If the function returns while the last report still sits there, the function's own
    end-of-training result fills the actor's one-slot result queue first, and the main thread then blocks forever
    putting that report behind it (seen as a smoke sweep whose trials all finished and whose driver never returned).
    Waiting until the queue is empty, then a moment for the main thread to pass the report on, closes that window.
    """
    from ray.train._internal.session import get_session

    session = get_session()
    queue = getattr(session, "_inter_actor_queue", None) if session else None
    if queue is None:
        return
    deadline = time.monotonic() + timeout_s
    while not queue.empty() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)


def _failure_lines(trial: str):
    """A Ray Train callback (it runs on the trial's Train controller, whose output reaches the console) that prints
    one line per failed worker: Train's own account of a worker-group failure and restart is an INFO line, which the
    sweep keeps off the console."""
    from ray.train import UserCallback

    from par_ray.train.trainer import is_retryable, root_causes

    class FailureLines(UserCallback):
        def after_exception(self, run_context, worker_exceptions):
            for rank, error in sorted(worker_exceptions.items()):
                cause = root_causes(error)[0]
                text = " ".join(str(cause).split())
                then = ("Train restarts the worker group from the latest checkpoint if its FailureConfig allows"
                        if is_retryable(error) else "a restart cannot fix this error: the trial fails now")
                sys.stderr.write(f"{trial}: Train worker rank {rank} failed: {type(cause).__name__}: {text[:1000]}; "
                                 f"{then}\n")
            sys.stderr.flush()

    return FailureLines()


def _trial_dirname(trial) -> str:
    return f"trial_{trial.trial_id}"


def checkpoint_reports(train_storage: str, name: str) -> list[dict]:
    """The report saved with each checkpoint of Train run ``name`` (``extra.json``'s ``report``), in step order.

    Train registers a checkpoint before Tune hands its report to the MLflow callback; a sweep stopped in between
    resumes after that checkpoint, and without these the step would be missing from the run's metric history."""
    import pyarrow.fs

    fs, run_dir = pyarrow.fs.FileSystem.from_uri(f"{train_storage.rstrip('/')}/{name}")
    reports = []
    for info in fs.get_file_info(pyarrow.fs.FileSelector(run_dir, allow_not_found=True)):
        if info.type != pyarrow.fs.FileType.Directory or not info.base_name.startswith("checkpoint_"):
            continue
        try:
            with fs.open_input_stream(f"{info.path}/extra.json") as f:
                report = json.loads(f.read().decode()).get("report")
        except (OSError, ValueError, AttributeError):
            continue  # incomplete: repair_run_storage removes it on --resume
        if isinstance(report, dict) and "step" in report:
            reports.append(report)
    return sorted(reports, key=lambda r: r["step"])


def _make_callback(tracker, extra_recipes, train_storage: str | None = None, table=None):
    from ray.tune import Callback
    from ray.tune.result import AUTO_RESULT_KEYS

    skip = set(AUTO_RESULT_KEYS) | {"done", "trial_id", "experiment_tag", "checkpoint_path", "should_checkpoint"}

    class MLflowTrials(Callback):
        """Trial → child run of the sweep's parent run (``par_ray.tracking``), on the sweep driver."""

        def __init__(self, tracker, extra_recipes, train_storage, table):
            self.tracker, self.extra_recipes, self.train_storage, self.table = (tracker, extra_recipes, train_storage,
                                                                                table)

        def on_trial_start(self, iteration, trials, trial, **info):
            cfg = resolve(trial.config, self.extra_recipes)
            resumed = self.tracker.find_trial_run(trial.trial_id) is not None
            self.tracker.start_trial(trial.trial_id, cfg, run_name=trial_label(cfg),
                                     params=_planned(cfg, getattr(self, "table", None)))
            storage = getattr(self, "train_storage", None)  # None: a sweep pickled before it was kept here
            if resumed and storage:  # the checkpoints' reports Tune never handed over (logged once: by step)
                for report in checkpoint_reports(storage, f"trial_{trial.trial_id}"):
                    self.tracker.log_metrics(trial.trial_id, report, int(report["step"]))

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if str(result.get("step")) == os.environ.get(SIGTERM_BEFORE_LOGGING_STEP_ENV):
                os.kill(os.getpid(), signal.SIGTERM)
                return
            metrics = {k: v for k, v in result.items() if k not in skip}
            self.tracker.log_metrics(trial.trial_id, metrics, int(result.get("step", result.get("training_iteration"))))

        def on_trial_complete(self, iteration, trials, trial, **info):
            # Tune completed the trial: all its steps, or a search's scheduler (ASHA) stopped it, which
            # finish_trial tags on the FINISHED run (as Ray's MLflowLoggerCallback, FINISHED either way)
            self.tracker.finish_trial(trial.trial_id, resolve(trial.config, self.extra_recipes),
                                      trial.last_result or {}, "FINISHED")

        def on_trial_error(self, iteration, trials, trial, **info):
            cfg = resolve(trial.config, self.extra_recipes)
            error = _trial_error(trial)
            sys.stderr.write(f"trial {trial_label(cfg)} ({trial.trial_id}) failed: {error[0]}: "
                             f"{' '.join(error[1].split())[:1000]} (traceback: {trial.error_file})\n")
            sys.stderr.flush()
            self.tracker.finish_trial(trial.trial_id, cfg, trial.last_result, "FAILED", error=error)

    return MLflowTrials(tracker, extra_recipes, train_storage, table)


def _trial_error(trial) -> tuple[str, str]:
    """(error class, message) of a Tune trial that errored, from the error Tune pickled beside it (its text trace
    when the error did not pickle)."""
    import cloudpickle

    try:
        if trial.pickled_error_file and os.path.exists(trial.pickled_error_file):
            with open(trial.pickled_error_file, "rb") as f:
                return failure_reason(cloudpickle.load(f))
    except Exception:  # noqa: BLE001 - an error that does not unpickle here: fall back to its text
        pass
    text = ""
    if trial.error_file and os.path.exists(trial.error_file):
        with open(trial.error_file) as f:
            text = f.read()
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("Failure #")]
    return "TrialError", lines[-1].strip() if lines else "no error recorded"


def _planned(cfg, table) -> dict[str, str]:
    """The trial's planned cost as MLflow params (``cost.*``, :meth:`par_ray.cost.TrialCost.params`); a trial the
    cost model cannot plan gets ``cost.error`` instead of failing the sweep."""
    try:
        return trial_cost(cfg, table).params()
    except Exception as e:  # noqa: BLE001 - bookkeeping must not stop a trial
        return {cost_param("error"): f"{type(e).__name__}: {e}"[:400]}


def _reporter(plan: Plan):
    """Tune's status table without per-trial config/result boxes: the legacy ``CLIReporter`` (``RAY_AIR_NEW_OUTPUT=0``
    selects it; the new output engine prints a box per trial start and end at any verbosity above 0)."""
    from ray.tune import CLIReporter

    short = {"task.name": "task", "backbone.name": "backbone", "train.seed": "seed"}
    # grid dimensions ({"grid_search": [...]}) and search domains vary; a single cell (any other dict) is fixed
    varying = {k: short.get(k, k) for k, v in plan.param_space.items()
               if (isinstance(v, dict) and "grid_search" in v)
               or not isinstance(v, (str, int, float, bool, type(None), dict))}
    # G with its 95 % interval, then the interpolated G with its own (par_ray.evaluation.extrapolation_metrics)
    metrics = {k: k for k in ("step", "loss", "G", "G_lo", "G_hi", "G_interp", "G_interp_lo", "G_interp_hi",
                              plan.metric) if k is not None}
    return CLIReporter(metric_columns=metrics, parameter_columns=varying, max_report_frequency=STATUS_EVERY_S,
                       print_intermediate_tables=True, max_column_length=24)  # metric, mode: from TuneConfig


# --------------------------------------------------------------------------------------------------------------------
# Running a sweep

def _require_weights(plan) -> None:
    """Raise :class:`SweepConfigError` listing every backbone whose weights do not resolve or whose tokenizer cannot
    render its task (``missing_weights``)."""
    missing = missing_weights(plan) if plan is not None else []
    if missing:
        raise SweepConfigError("pretrained parents missing or unusable (nothing was started):\n  - "
                               + "\n  - ".join(missing))


def _check_storage(spec: SweepSpec, opts: Options, raw: str, storage: str, experiment_path: str) -> str:
    """The checks of ``--storage`` (``raw``, resolved to ``storage``), ``--resume`` and the tracking store a sweep
    makes before Ray starts, writing nothing (a dry run makes them too): a path that outlives a Ray job, a folder, a
    sweep to resume or none in the way, a tracking store that answers. Returns the tracking URI.

    Raises :class:`SweepConfigError` naming the flag (or ``MLFLOW_TRACKING_URI``)."""
    from par_ray import tracking

    try:
        check_outlives_job("--storage", raw, buckets=True)
        uri = tracking.tracking_uri(opts.mlflow_uri, storage)
    except ValueError as e:
        raise SweepConfigError(str(e)) from None
    if "://" not in storage and os.path.exists(storage) and not os.path.isdir(storage):
        raise SweepConfigError(f"--storage: {storage} is a file, not a folder")
    if opts.resume and not _exists(f"{experiment_path}/tuner.pkl"):
        raise SweepConfigError(f"--resume: no sweep to resume at {experiment_path} (check --storage)")
    if not opts.resume and _exists(experiment_path):
        raise SweepConfigError(f"--storage: a sweep {spec.name!r} already exists at {experiment_path}; pass --resume "
                               f"to continue it or choose another --storage")
    try:  # a server that does not answer, an unknown scheme, a file that is no store: one line before Ray starts
        tracking.check_store(uri)
    except ValueError as e:
        flag = ("--mlflow-uri" if opts.mlflow_uri else "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI")
                else "--storage")
        raise SweepConfigError(f"{flag}: {e}; nothing was started") from None
    return uri


def run_sweep(spec: SweepSpec, opts: Options = Options()) -> int:
    """Run (or ``--dry-run`` / ``--resume``) the sweep ``spec``. Returns 0 when every trial finished, 1 otherwise.

    Raises :class:`SweepConfigError` on bad input, before any cluster resource is claimed.
    """
    from par_ray import tracking

    raw = opts.storage or DEFAULT_STORAGE.format(name=spec.name)
    remote = "://" in raw
    storage = raw.rstrip("/") if remote else os.path.abspath(os.path.expanduser(raw))
    experiment_path, train_storage = f"{storage}/tune/{spec.name}", f"{storage}/train/{spec.name}"
    preset = opts.preset
    if preset not in PRESET_CHOICES:
        raise SweepConfigError(f"--preset: {preset!r} is not one of {list(PRESET_CHOICES)}")
    if preset == "auto" and opts.gpu_types:
        preset = "paper"  # GPU types name GPUs: the preset that plans for them
    if preset == "auto" and (opts.dry_run or (opts.max_usd is not None and not os.environ.get("RAY_ADDRESS"))):
        # a budget is checked before anything starts: plan for the preset a new local cluster would choose; a
        # cluster to join (RAY_ADDRESS, as under `ray job submit`) is asked once joined, before any trial starts
        preset = local_preset_guess()
    try:
        table = load_table(opts.prices)
    except ValueError as e:
        raise SweepConfigError(str(e)) from None
    plan = build_plan(spec, opts, preset) if preset != "auto" else None
    if opts.dry_run:
        costs = sweep_cost(plan, table)
        print_plan(plan, train_storage, costs)
        # what a real run would refuse to start with, each named after the plan: the weights, the budget, --storage
        # and --resume, the tracking store (read, never written)
        errors = missing_weights(plan)
        for check in (lambda: check_budget(costs, opts.max_usd),
                      lambda: _check_storage(spec, opts, raw, storage, experiment_path)):
            try:
                check()
            except SweepConfigError as e:
                errors.append(str(e))
        for error in errors:
            print(f"error: {error}", file=sys.stderr)
        return 2 if errors else 0
    _require_weights(plan)
    if plan is not None and opts.max_usd is not None:
        check_budget(sweep_cost(plan, table), opts.max_usd)  # before the cluster: over budget starts nothing
    uri = _check_storage(spec, opts, raw, storage, experiment_path)
    if opts.resume:
        plan = _check_resume(spec, opts, experiment_path, uri, plan)

    from ray import tune

    # Ray is left before the last lines print (ray_session.close()), so the workers' forwarded output comes first
    with contextlib.ExitStack() as ray_session:
        context = ray_session.enter_context(joined())
        if context is not None:
            print(f"Ray: Train's logs (each report, checkpoint and worker-group event) in "
                  f"{context.address_info['session_dir']}/logs/train", flush=True)
        if plan is None:
            plan = build_plan(spec, opts, "paper" if cluster_has_gpu() else "local")
            _require_weights(plan)
            check_budget(sweep_cost(plan, table), opts.max_usd)  # joining claimed nothing yet
        needs = [(trial_label(cfg), trial_resources(cfg, train_storage)) for _, cfg in plan.trials]
        if autoscaler_limits_unknown():
            # Every trial at once: the worker groups of trials that do not fit yet are the demand the autoscaler adds
            # nodes for (a limit from the nodes running now would keep it from ever scaling up).
            concurrency = count_trials(plan)
            print(f"sweep {spec.name}: the cluster autoscales without publishing its limits; trials that do not fit "
                  f"the nodes running now wait for new ones (`ray status` shows the pending demand)", flush=True)
        else:
            concurrency = max_concurrent_trials(needs, cluster_capacity())
        largest = max((n for _, n in needs), key=lambda n: (n.get("GPU", 0), n.get("CPU", 0)))
        print(f"sweep {spec.name}: preset {plan.preset}, {count_trials(plan)} trials, up to {concurrency} at once "
              f"(largest trial: {reservation(largest)}); storage {storage}", flush=True)
        print(f"sweep {spec.name}: {cost_summary(sweep_cost(plan, table, concurrency))}", flush=True)

        tracker = tracking.SweepTracker.open(
            spec.name, experiment_path, uri, params=_sweep_params(plan, opts),
            tags={TAG_PRESET: plan.preset, TAG_SMOKE_TEST: str(opts.smoke_test).lower()})
        print(f"MLflow: {tracking.shown_uri(uri)} (experiment {tracking.experiment_name(spec.name)}, "
              f"parent run {tracker.parent_run_id})", flush=True)

        trainable = tune.with_resources(
            tune.with_parameters(_trial_driver, train_storage=train_storage, train_max_failures=spec.train_max_failures,
                                 extra_recipes=dict(spec.extra_recipes),
                                 checkpoint_score=checkpoint_score(plan)),
            dict(DRIVER_RESOURCES))
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # see _reporter
        # Tune logs each failed attempt of a trial with Ray's wrapped traceback (~40 lines); the sweep prints one line
        # per failed worker (_failure_lines) and per failed trial (MLflowTrials.on_trial_error), which names the trial's
        # error file for the traceback
        os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
        if opts.resume:
            tuner = tune.Tuner.restore(experiment_path, trainable, resume_unfinished=True, resume_errored=True)
        else:
            tuner = tune.Tuner(
                trainable,
                param_space=plan.param_space,
                tune_config=_tune_config(plan, concurrency),
                run_config=tune.RunConfig(
                    name=spec.name, storage_path=f"{storage}/tune",
                    failure_config=tune.FailureConfig(max_failures=spec.tune_max_failures),
                    callbacks=[_make_callback(tracker, dict(spec.extra_recipes), train_storage, table)], verbose=1,
                    progress_reporter=_reporter(plan), log_to_file=True),
            )
        if opts.resume:
            _clear_not_retryable_markers(train_storage)
            _repair_trial_storage(train_storage, tracker)
        try:
            with _sigterm_as_ctrl_c(tracker), _quiet_optuna_replays(), _without_tune_restore_advice():
                results = tuner.fit()
        except BaseException as e:
            closed = _close_runs(tracker)
            cause = None if isinstance(e, KeyboardInterrupt) else stop_cause(e, storage)
            with contextlib.suppress(Exception):  # the error being reported stays the one raised
                ray_session.close()
            what = ("the MLflow tracking store" if isinstance(cause, tracking.TrackingStoreError) else "a full disk"
                    if cause is not None else type(e).__name__)
            print(f"\nsweep {spec.name} stopped by {what}; {closed}. {RESUME_HINT}", file=sys.stderr, flush=True)
            if cause is not None and cause is not e:
                raise cause from e
            raise
        ray_session.close()
        return finish_sweep(results, plan, tracker, None if remote else f"{storage}/analysis")


def stop_cause(error: BaseException, storage: str) -> OSError | None:
    """What stopped the sweep behind ``error``, as an ``OSError`` the command line reports as one line, or ``None``:
    the tracking store refusing a call (``par_ray.tracking.TrackingStoreError``; Tune wraps an error of its MLflow
    callback in a ``TuneError`` whose message is the whole traceback), else a full disk (:func:`full_disk`)."""
    from par_ray.tracking import TrackingStoreError

    for e in exception_chain(error):
        if isinstance(e, TrackingStoreError):
            return e
    return full_disk(error, storage)


def full_disk(error: BaseException, storage: str) -> OSError | None:
    """The full disk behind ``error``, as an ``OSError`` (ENOSPC) naming its path, or ``None``.

    Either an ENOSPC in the exception's chain, or a local ``storage`` where 1 MiB cannot be written now: Tune can
    surface a full disk as another error (an ``EOFError`` from reading a trial's error file that ENOSPC cut to 0 bytes).
    """
    for e in exception_chain(error):
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return e
    if "://" in storage or not os.path.isdir(storage):
        return None
    probe = os.path.join(storage, ".par_ray_space_probe")
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * 2**20)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), storage) if e.errno == errno.ENOSPC else None
    finally:
        with contextlib.suppress(OSError):
            os.remove(probe)
    return None


def finish_sweep(results, plan: Plan, tracker, analysis_dir: str | None) -> int:
    """After ``Tuner.fit`` (which returns, not raises, on Ctrl-C): print the trial counts, close the MLflow runs
    (interrupted trials and the parent KILLED, so ``--resume`` reopens them; see :func:`sweep_status`), run the
    analysis and, when a trial failed or did not finish, print the ``--resume`` hint. Returns the exit status: 0
    when every trial finished or was stopped early by ASHA, 1 otherwise."""
    from par_ray.tracking import TrackingStoreError

    _, counts = print_summary(results, plan)
    failed = sum(counts.get(k, 0) for k in UNDONE)
    try:
        _close_finished_runs(results, plan, tracker)
        tracker.close_open_trials("KILLED")  # interrupted trials; --resume reopens their runs
        tracker.finish(sweep_status(counts))
    except TrackingStoreError as e:
        print(f"the MLflow runs could not be closed ({e.strerror}); --resume closes them once the store has room",
              file=sys.stderr, flush=True)
        raise
    _run_analysis(plan.spec.name, tracker, analysis_dir)
    if failed:
        print(f"{failed} trial(s) failed, did not finish or did not start; fix the cause and "
              f"{RESUME_HINT[0].lower()}{RESUME_HINT[1:]}", file=sys.stderr)
    return 1 if failed else 0


RESUME_HINT = "Rerun with --resume (same --storage and --set) to finish them."


def _close_finished_runs(results, plan: Plan, tracker) -> None:
    """End as FINISHED, with their artifacts, the runs of trials Tune completed (:func:`trial_outcome` ``finished``
    or ``stopped early``) whose run is not FINISHED: the MLflow callback's ``on_trial_complete`` did not get to close
    it (the tracking store refused the call, or the sweep stopped in between), and ``--resume`` does not run a
    completed trial again."""
    statuses = trial_statuses(results)
    for r in results:
        m = r.metrics or {}
        if (trial_outcome(r, plan, statuses.get(m.get("trial_id"))) in ("finished", "stopped early")
                and tracker.trial_status(m.get("trial_id")) not in (None, "FINISHED")):
            tracker.finish_trial(m["trial_id"], resolve(r.config, plan.spec.extra_recipes), m, "FINISHED")


def _close_runs(tracker) -> str:
    """Close every open child run of the sweep and its parent run as KILLED (``--resume`` reopens them); returns what
    was done, for the line that says why the sweep stopped: ``"<n> trial run(s) and the sweep run closed as KILLED"``,
    or, when the tracking store refused (a full disk under a SQLite store, an unreachable server), that the runs could
    not be closed, why, and that ``--resume`` closes them. A fresh MLflow client: this may run inside a signal
    handler, while the sweep's own client is mid-call."""
    from par_ray import tracking

    fresh = tracking.SweepTracker(uri=tracker.uri, experiment_id=tracker.experiment_id,
                                  parent_run_id=tracker.parent_run_id)
    try:
        closed = fresh.close_open_trials("KILLED")
        fresh.finish("KILLED")
    except Exception as e:  # noqa: BLE001 - closing is best effort; --resume reopens the runs either way
        why = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
        return f"the MLflow runs could not be closed ({' '.join(str(why).split())[:300]}); --resume closes them"
    return f"{closed} trial run(s) and the sweep run closed as KILLED"


@contextlib.contextmanager
def _sigterm_as_ctrl_c(tracker):
    """While Tune runs, SIGTERM (``ray job stop``, ``kill``, a scheduler's preemption notice) stops the sweep as
    Ctrl-C does: Tune's own SIGINT handler ends the run gracefully and ``run_sweep`` prints the summary and the
    ``--resume`` hint. The MLflow runs are closed as KILLED first, in the handler, which prints the ``--resume`` hint
    at once, because ``ray job stop`` sends SIGKILL 3 s later (``RAY_JOB_STOP_WAIT_TIME_S``), often before Tune has
    stopped. Ray's own driver handler (which
    raises ``SystemExit`` wherever the driver happens to be) is restored afterwards."""
    def stop(signum, frame):
        closed = _close_runs(tracker)
        # the hint goes with this line: the trial counts and the hint after them may not print before the SIGKILL
        print(f"\n{signal.Signals(signum).name} received: stopping the sweep as Ctrl-C does ({closed}). "
              f"{RESUME_HINT}", file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, previous)  # a second SIGTERM stops at once
        tune_stop = signal.getsignal(signal.SIGINT)
        if callable(tune_stop) and tune_stop is not signal.default_int_handler:
            tune_stop(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    from par_ray.train.trainer import sigterm_handler

    previous = signal.getsignal(signal.SIGTERM)
    with sigterm_handler(stop):
        yield


@contextlib.contextmanager
def _quiet_optuna_replays():
    """Without Optuna's warning "The reported value is ignored because this `step=N` is already reported". A resumed
    or retried trial runs its function again and Tune counts its reports from 1 anew (``OptunaSearch`` reports
    ``training_iteration`` as Optuna's step); Optuna keeps the value first reported at each count and warns about each
    later one. The search reads each trial's final value only (``OptunaSearch.on_trial_complete``; ASHA reads the
    trial's ``step``), so nothing it uses is dropped."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"The reported value is ignored because this `step=\d+` is "
                                                  r"already reported")
        yield


class _TuneRestoreAdvice(logging.Filter):
    """Drops Tune's warning on an interrupted experiment, "… Resume experiment with: Tuner.restore(path=…)": a sweep
    continues with ``--resume``, which its own hint names (``Tuner.restore`` alone would skip the checks of the flags,
    the MLflow runs and the checkpoint repairs ``--resume`` does)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Resume experiment with:" not in record.getMessage()


@contextlib.contextmanager
def _without_tune_restore_advice():
    """:class:`_TuneRestoreAdvice` on Tune's ``ray.tune.tune`` logger for the block."""
    log, advice = logging.getLogger("ray.tune.tune"), _TuneRestoreAdvice()
    log.addFilter(advice)
    try:
        yield
    finally:
        log.removeFilter(advice)


RESUME_FLAGS = {"preset": "--preset", "backbones": "--backbones", "seeds": "--seeds", "smoke_test": "--smoke-test",
                "gpu_types": "--gpu-types", "search.metric": "--metric", "search.mode": "--mode",
                "num_trials": "--num-samples"}
"""The parent run's params (:func:`_sweep_params`) that ``--resume`` checks against the flags given now, with their
flag; ``set`` (``--set``) too."""


def _check_resume(spec: SweepSpec, opts: Options, experiment_path: str, uri: str, plan: Plan | None) -> Plan | None:
    """``--resume`` continues the sweep as it was started: its ``--set`` overrides (the parent run's ``set`` param)
    and the flags that shape its trials (:data:`RESUME_FLAGS`) must be the ones given now, else one
    :class:`SweepConfigError` naming what differs (Tune would restore the stored trials and ignore the new flags, and
    the summary would count the new plan's trials). ``--preset auto`` takes the stored preset. Returns the plan, built
    for that preset where ``plan`` was ``None``."""
    from par_ray import tracking

    params = tracking.sweep_run_params(uri, spec.name, experiment_path)
    if params is None:
        return plan
    stored, now = params.get("set", ""), format_overrides(opts.overrides)
    if stored != now:
        raise SweepConfigError(f"--set: the sweep at {experiment_path} was started with --set {stored or '(none)'}; "
                               f"--resume must repeat them (got {now or '(none)'}); to change them, start a new sweep "
                               f"under another --storage")
    if plan is None and params.get("preset") in ("local", "paper"):
        plan = build_plan(spec, opts, params["preset"])
        _require_weights(plan)
    if plan is None:
        return plan
    current = _sweep_params(plan, opts)
    differ = [f"{flag} {params.get(key, '(none)')} → {current.get(key, '(none)')}"
              for key, flag in RESUME_FLAGS.items()
              if str(current.get(key, "")) != params.get(key, "") and (key != "num_trials" or plan.search)]
    if differ:
        raise SweepConfigError(f"--resume: the sweep at {experiment_path} was started with other settings "
                               f"({'; '.join(differ)}); --resume must repeat its flags; to change them, start a new "
                               f"sweep under another --storage")
    return plan


def format_overrides(overrides: typing.Mapping[str, str]) -> str:
    """``--set`` overrides as recorded in the parent run's ``set`` param: ``key=value`` joined by spaces, sorted."""
    return " ".join(f"{k}={v}" for k, v in sorted(overrides.items()))


def _repair_trial_storage(train_storage: str, tracker) -> None:
    """``--resume`` after a full disk or a killed node: the Train checkpoints of each trial that will run again made
    loadable again (``par_ray.train.trainer.repair_run_storage``), one line per repair. A trial whose MLflow run is
    FINISHED (it ran all its steps, or ASHA stopped it) never runs again: its storage is left as it is (a trial ASHA
    stopped can hold a checkpoint written after its last report, which Train never registered)."""
    import pyarrow.fs

    from par_ray.train.trainer import repair_run_storage

    fs, inner = pyarrow.fs.FileSystem.from_uri(train_storage)
    for info in fs.get_file_info(pyarrow.fs.FileSelector(inner, allow_not_found=True)):
        if (info.type == pyarrow.fs.FileType.Directory and info.base_name.startswith("trial_")
                and tracker.trial_status(info.base_name.removeprefix("trial_")) != "FINISHED"):
            for note in repair_run_storage(train_storage, info.base_name):
                print(f"resume: {info.base_name}: {note}", flush=True)


def _clear_not_retryable_markers(train_storage: str) -> None:
    """``--resume`` retries trials that failed with an error no retry could fix (the user fixed the cause): remove
    their :data:`NOT_RETRYABLE_MARKER` files."""
    import pyarrow.fs

    fs, inner = pyarrow.fs.FileSystem.from_uri(train_storage)
    for info in fs.get_file_info(pyarrow.fs.FileSelector(inner, allow_not_found=True)):
        if info.type == pyarrow.fs.FileType.Directory:
            marker = f"{info.path}/{NOT_RETRYABLE_MARKER}"
            if fs.get_file_info(marker).type == pyarrow.fs.FileType.File:
                fs.delete_file(marker)


def checkpoint_score(plan: Plan) -> tuple[str, str] | None:
    """(metric, mode) by which a search's trials keep their best ``train.keep_checkpoints`` checkpoints (plus the
    latest); ``None`` for a grid, whose trials keep their latest. A search's metric is in every checkpointed report
    (``spec.build_plan`` checks it), so every checkpoint has a score."""
    return (plan.metric, plan.mode) if plan.metric is not None else None


def _tune_config(plan: Plan, concurrency: int):
    from ray import tune

    search = plan.search
    common = dict(max_concurrent_trials=concurrency, trial_dirname_creator=_trial_dirname)
    if search is None:
        return tune.TuneConfig(**common)
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    cfg = plan.trials[0][1]
    steps = max(c.train.steps for _, c in plan.trials)
    return tune.TuneConfig(
        metric=plan.metric, mode=plan.mode, num_samples=count_trials(plan),
        search_alg=OptunaSearch(seed=search.seed),
        # stop_last_trials=False: a trial that reaches max_t ends on its own. Stopping it there would kill its driver
        # while Train is still closing its run, leaving the worker placement group to Ray Train's cleaner actor,
        # which cannot find the cluster on a host that runs several Ray instances (it then leaks the group).
        scheduler=ASHAScheduler(time_attr="step", max_t=steps, grace_period=search.grace_period or cfg.train.eval_every,
                                reduction_factor=search.reduction_factor, stop_last_trials=False),
        **common)


def _sweep_params(plan: Plan, opts: Options) -> dict[str, typing.Any]:
    """The parent run's params: the sweep's grid and search settings (never a config secret: tracking redacts)."""
    cfgs = [cfg for _, cfg in plan.trials]
    out = {
        "preset": plan.preset,
        "recipes": ",".join(plan.spec.recipes),
        "tasks": ",".join(plan.spec.tasks),
        "backbones": ",".join(dict.fromkeys(c.backbone.name for c in cfgs)),
        "seeds": ",".join(str(s) for s in dict.fromkeys(c.train.seed for c in cfgs)),
        "smoke_test": opts.smoke_test,
        "num_trials": count_trials(plan),
    }
    if opts.gpu_types:
        out["gpu_types"] = ",".join(opts.gpu_types)
    cells = cells_of(plan.spec, plan.preset)
    if cells:  # explicit (recipe, task, …) cells: the grid is not recipes × tasks
        out["cells"] = ";".join(",".join(f"{k}={v}" for k, v in c.items()) for c in cells)
    if opts.overrides:
        out["set"] = format_overrides(opts.overrides)
    if plan.search is not None:
        out.update({"search.metric": plan.metric, "search.mode": plan.mode,
                    "search.space": ",".join(plan.search.space)})
    return out


# --------------------------------------------------------------------------------------------------------------------
# End of sweep: the outcome and the analysis

def trial_outcome(result, plan: Plan, status: str | None = None) -> str:
    """``finished`` (all ``train.steps``, and Tune completed the trial, as the trial's MLflow run is FINISHED),
    ``failed`` (an error), ``stopped early`` (ASHA stopped it), ``not started`` (no report yet: a trial Tune had created
    but not started, or one stopped before its first report; its result holds only its trial id) or ``unfinished``
    (interrupted by Ctrl-C or a lost driver after its first report, also after its last step's report but before Tune
    completed it).

    Tune completed a trial when its ``status`` (:func:`trial_statuses`) is ``TERMINATED`` or its last result is
    ``done``. The status decides after ``--resume``: Tune saves a trial's state with its last report and may mark that
    result ``done`` only in memory, so a restored finished trial can lack it (2 of 6 in a smoke sweep)."""
    m = result.metrics or {}
    cfg = resolve(result.config, plan.spec.extra_recipes) if result.config else None
    if result.error is not None:
        return "failed"
    if "step" not in m:
        return "not started"
    completed = status == "TERMINATED" or bool(m.get("done"))
    if cfg is not None and int(m["step"]) >= cfg.train.steps and completed:
        return "finished"
    if plan.search is not None and completed:
        return "stopped early"
    return "unfinished"


def trial_statuses(results) -> dict[str, str]:
    """Tune's status of each trial of a ``ResultGrid`` by trial id (``TERMINATED``, ``ERROR``, ``PENDING`` …), from
    the experiment analysis the grid holds (``ResultGrid._experiment_analysis.trials`` in Ray 2.60: its results
    carry no status); empty where the grid carries none."""
    analysis = getattr(results, "_experiment_analysis", None)
    return {t.trial_id: t.status for t in getattr(analysis, "trials", None) or ()}


UNDONE = ("failed", "unfinished", "not started")
"""Outcomes that ``--resume`` continues (:func:`trial_outcome`); a sweep with any of them exits 1."""


def sweep_status(counts: typing.Mapping[str, int]) -> str:
    """The parent run's MLflow status from the trial counts: FAILED if any trial failed, else KILLED if any is
    unfinished or not started (``--resume`` continues it), else FINISHED (trials stopped early by ASHA count as
    done)."""
    return "FAILED" if counts.get("failed") else "KILLED" if any(counts.get(k) for k in UNDONE) else "FINISHED"


def print_summary(results, plan: Plan) -> tuple[list[dict[str, typing.Any]], dict[str, int]]:
    """Count the trials by :func:`trial_outcome` and print the counts and, for a search, the best trial. The plan's
    trials Tune had not created yet (an interrupted sweep; Tune creates trials as slots free up) count as
    ``not started``.

    Returns (one row per finished trial: ``task, recipe, backbone, seed, G, G_censored``, the 95 % intervals'
    ``G_lo, G_hi, G_interp, G_interp_lo, G_interp_hi, G_hi_censored`` where logged, ``acc_d{D}...``; the counts).
    """
    rows, counts, statuses = [], {}, trial_statuses(results)
    for r in results:
        m = r.metrics or {}
        kind = trial_outcome(r, plan, statuses.get(m.get("trial_id")))
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "finished" and "G" in m:
            cfg = resolve(r.config, plan.spec.extra_recipes)
            rows.append({"task": cfg.task.name, "recipe": cfg.recipe.name, "backbone": cfg.backbone.name,
                         "seed": cfg.train.seed, "G": float(m["G"]), "G_censored": float(m.get("G_censored", 0.0)),
                         **{k: float(m[k]) for k in ("G_lo", "G_hi", "G_interp", "G_interp_lo", "G_interp_hi",
                                                     "G_hi_censored") if k in m},
                         **{depth_metric("acc", d): float(m[depth_metric("acc", d)]) for d in cfg.eval.depths
                            if depth_metric("acc", d) in m}})
    never_created = count_trials(plan) - len(results)
    if never_created > 0:
        counts["not started"] = counts.get("not started", 0) + never_created
    print("\ntrials: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    if plan.metric is not None and rows:
        best = results.get_best_result(metric=plan.metric, mode=plan.mode, filter_nan_and_inf=True)
        if best is not None and best.metrics:
            print(f"\nbest {plan.metric} = {best.metrics.get(plan.metric)}: "
                  + ", ".join(f"{k}={best.config.get(k)}" for k in plan.search.space))
    return rows, counts


def _run_analysis(sweep: str, tracker, out_dir: str | None) -> bool:
    """``analysis.analyze`` on this sweep's parent run: prints its main table (accuracy by depth and G, mean ± std
    over seeds) and logs its tables and plots to the parent run. Never fails the sweep; False when it did not run."""
    rerun = f"python -m analysis --experiment {experiment_name(sweep)}"
    try:
        # analysis.report, not the package: a stale editable install can make `analysis` a namespace package
        from analysis.report import analyze
    except ImportError as e:
        if getattr(e, "name", None) not in ("analysis", "analysis.report"):
            print(f"analysis unavailable ({e}); rerun: {rerun}", file=sys.stderr)
        return False
    import tempfile

    # remote storage: the tables and figures go to the parent run only, through a folder removed afterwards
    folder = contextlib.nullcontext(out_dir) if out_dir is not None else tempfile.TemporaryDirectory(
        prefix="par_ray_analysis_")
    with folder as out:
        try:
            report = analyze(experiment_name(sweep), parent_run_id=tracker.parent_run_id, tracking_uri=tracker.uri,
                             out_dir=out)
            report = report if isinstance(report, dict) else {}
            if report.get("main_table"):
                print("\n" + str(report["main_table"]))
            if "plan_vs_actual" in report.get("tables", {}):  # read here: a temporary folder goes at the block's end
                print(report["tables"]["plan_vs_actual"]["md"].read_text(encoding="utf-8"))
        except Exception as e:  # noqa: BLE001 - the runs are tracked already; rerun with python -m analysis
            print(f"analysis failed ({type(e).__name__}: {e}); rerun: {rerun}", file=sys.stderr)
            return False
    for w in report.get("warnings", ()):
        print(f"analysis: {w}")
    where = f"in {out_dir}, " if out_dir is not None else ""
    print(f"analysis: tables and figures {where}logged to parent run {tracker.parent_run_id}")
    return bool(report.get("main_table"))


def _read_text(path: str) -> str | None:
    """A local file's or a storage URI's text (through pyarrow, as Ray's storage); ``None`` when it does not exist."""
    import pyarrow.fs

    fs, inner = pyarrow.fs.FileSystem.from_uri(path)
    if fs.get_file_info(inner).type != pyarrow.fs.FileType.File:
        return None
    with fs.open_input_stream(inner) as f:
        return f.readall().decode()


def _write_text(path: str, text: str) -> None:
    import pyarrow.fs

    fs, inner = pyarrow.fs.FileSystem.from_uri(path)
    fs.create_dir(inner.rpartition("/")[0], recursive=True)
    with fs.open_output_stream(inner) as f:
        f.write(text.encode())


def _exists(path: str) -> bool:
    """Whether a local path or a storage URI (``s3://``, ``gs://`` …; through pyarrow, as Ray's storage) exists."""
    if "://" not in path:
        return os.path.exists(path)
    import pyarrow.fs

    fs, inner = pyarrow.fs.FileSystem.from_uri(path)
    return fs.get_file_info(inner).type != pyarrow.fs.FileType.NotFound
