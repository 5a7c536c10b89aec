"""Build the Ray Train ``TorchTrainer`` that runs one trial: the only place that sets Train's scaling and run config.

``num_workers=0`` is Ray Train's local mode: the loop runs in this process with ``ray.train.report`` working as
usual and no Ray cluster started, which is how ``python -m par_ray.train`` trains on a laptop.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import socket
import threading

import ray
import ray.train
from ray.train import UserCallback
from ray.train.torch import TorchConfig, TorchTrainer
from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy, FailureDecision

from par_ray.config import TrialConfig, to_flat
from par_ray.train.checkpoint import CHECKSUM_KEY, MANIFEST_KEY, sha256_of
from par_ray.train.loop import RESUME_FREE_FIELDS, LockstepError, NonFiniteLossError, train_loop_per_worker
from par_ray.trial import validate

NOT_RETRYABLE = (NonFiniteLossError, LockstepError, ValueError)
"""Errors a restart cannot fix: a diverged loss (the resumed run reaches the same step from the same checkpoint),
ranks out of lockstep (the schedule is a function of the code) and bad config (``ValueError``, e.g. a checkpoint
written under another config). A trial that raises one fails at once, whatever ``FailureConfig`` allows; a lost
worker or node (``RayActorError``, a collective timeout, an ``OSError``) is retried."""


DASHBOARD_PORTS = range(8265, 8365)
"""Ports a private local cluster's dashboard may take: Ray's default, 8265, and up. They lie below the OS's ephemeral
range (Linux: 32768–60999), which every process Ray starts draws from when it binds port 0, so none of them can take
the chosen port between :func:`free_dashboard_port`'s check and the dashboard's own bind (a port drawn from the
ephemeral range was taken that way: "address already in use", and the sweep failed before its first trial)."""


def free_dashboard_port() -> int:
    """The first port of :data:`DASHBOARD_PORTS` free on 127.0.0.1.

    Raises: RuntimeError when all are in use (100 dashboards on one machine), naming the range.
    """
    for port in DASHBOARD_PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port for the Ray dashboard in {DASHBOARD_PORTS.start}..{DASHBOARD_PORTS.stop - 1} "
                       "on 127.0.0.1: stop a local Ray instance (ray stop) or set RAY_API_SERVER_ADDRESS")


QUIET_ENV = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
"""Environment of every Ray worker of a sweep or a single run (:func:`worker_runtime_env`). Train V2's print patch
routes a worker's ``print`` through a logger that also echoes it, so each progress line would reach the console
twice."""
LOCAL_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "1"}
"""Added on a local cluster this process starts (:func:`local_ray`): its machine is never
drained for preemption, and Train's watcher actor logs a core-worker error line per trial ("constructor arguments in
the object store and max_restarts > 0"); and Ray's C++ failure-signal handler, which prints "*** SIGTERM received …"
and a stack dump from every worker process Ray stops at a trial's end (Python's own traceback of a crash still reaches
the trial's error and log files). A cluster keeps both: its workers may be preempted, and a segfault's C++ stack is
worth its lines there."""


def quiet_worker_logging() -> None:
    """Ray ``worker_process_setup_hook`` of the workers of a sweep or a single run: Ray Train V2 logs every report
    (its metrics and checkpoint, ``Reporting training result N: TrainingReport(...)``) at INFO from a logger named by
    its file path, not ``ray.train.*``, so the trial's ``LoggingConfig`` misses it; it still reaches Train's log files
    at WARNING. Also keeps the autoscaling coordinator's transient "Failed to send resource request" traceback off the
    console."""
    import logging

    try:
        from ray.train.v2._internal.execution import context
    except ImportError:  # another Ray version: nothing to quiet
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)
    # Train's controller asks Ray's autoscaling coordinator for its workers' resources with a 5 s timeout; on a busy
    # machine the coordinator actor is still starting, and Train logs a WARNING with a full traceback that says "safe
    # to ignore" (it retries every 20 s; a trial whose resources never come stays PENDING in Tune's table). A filter,
    # not a level: Train's dictConfig resets the levels of the ``ray.train.*`` loggers that exist when it runs.
    logging.getLogger("ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client").addFilter(
        lambda record: record.levelno >= logging.ERROR)


def worker_runtime_env(local: bool) -> dict:
    """The ``runtime_env`` of a Ray job this project starts (a sweep, or a single run on a local cluster):
    :func:`quiet_worker_logging` in every worker, :data:`QUIET_ENV` and, on a local cluster (``local``),
    :data:`LOCAL_ENV`; a variable already set in this process (by the user, or by the Ray job) is left to it."""
    env = {k: v for k, v in {**QUIET_ENV, **(LOCAL_ENV if local else {})}.items() if k not in os.environ}
    return {"worker_process_setup_hook": quiet_worker_logging, **({"env_vars": env} if env else {})}


@contextlib.contextmanager
def local_ray(num_cpus: int | None = None, **init_kwargs):
    """A private Ray instance on this machine (``num_cpus``: default all of them) for the block; yields its
    ``RayContext`` and shuts it down after the block. Every new local cluster of this project starts here: a sweep's
    and the CLI's (``par_ray.train.cluster.joined``), the tests' and the benchmarks'.

    Ray Train V2 starts a ``PlacementGroupCleaner`` that asks the State API whether the run's controller is still
    alive and, if told it is gone, removes the worker group's placement group, which kills live workers. With no
    address configured the State API client auto-detects "the" local Ray instance; on a machine that runs several
    independent instances (CI beside other jobs) it may ask another instance, hear "no such actor" and kill this
    run mid-training (seen on the shared CI machine). So the dashboard (which serves the State API) is bound to a
    known port (:func:`free_dashboard_port`) and ``RAY_API_SERVER_ADDRESS`` points at it before Ray starts, so every
    Ray process inherits it. A Ctrl-C or SIGTERM while Ray starts or stops is held until it has, and the processes
    it starts ignore Ctrl-C, which reaches this driver only (:func:`signals_held`). The workers' ``runtime_env`` is
    :func:`worker_runtime_env` unless ``init_kwargs`` names one. Always a new instance (``address="local"``), never
    one that ``RAY_ADDRESS`` or a ``ray_current_cluster`` file names (which ``ray.init()`` would join, or retry for
    ever when its head has died).
    """
    port = free_dashboard_port()
    previous = os.environ.get("RAY_API_SERVER_ADDRESS")
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
    init_kwargs.setdefault("runtime_env", worker_runtime_env(local=True))
    try:
        with signals_held("Ray has started", children_ignore_ctrl_c=True):
            context = ray.init(address="local", num_cpus=num_cpus, include_dashboard=True,
                               dashboard_host="127.0.0.1", dashboard_port=port, **init_kwargs)
        yield context
    finally:
        try:
            with signals_held("Ray has stopped"):
                ray.shutdown()
        finally:
            if previous is None:
                os.environ.pop("RAY_API_SERVER_ADDRESS", None)
            else:
                os.environ["RAY_API_SERVER_ADDRESS"] = previous


_children_ignore_ctrl_c = False
"""Set by :func:`signals_held` while Ray starts its processes: each child forked meanwhile ignores SIGINT."""


def _ignore_ctrl_c_in_child() -> None:
    if _children_ignore_ctrl_c:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


os.register_at_fork(after_in_child=_ignore_ctrl_c_in_child)  # in the child of a fork that returns to Python:
# os.fork, and subprocess.Popen with a preexec_fn, which Ray passes for every process it starts


@contextlib.contextmanager
def signals_held(what: str, *, children_ignore_ctrl_c: bool = False):
    """While the block runs, the first SIGINT (Ctrl-C) and the first SIGTERM are held, not acted on: one line on
    stderr says so; when the block ends, however it ends, the handlers installed before are restored and each held
    signal goes to its handler (Python's SIGINT handler raises ``KeyboardInterrupt`` there; SIGTERM's default action
    ends the process). A second one of the same kind goes to that handler at once: the user insists.

    ``what``: what the block does, for the line (``"Ray has started"``). Wraps Ray starting and stopping its
    processes (``ray.init``, ``ray.shutdown``: a few seconds each). A ``KeyboardInterrupt`` raised inside
    ``ray.init`` leaves a half-started node, whose ``ray.shutdown`` misses the raylet's dashboard and runtime-env
    agents (alive up to a minute after the driver exits) or crashes the interpreter at exit (SIGSEGV); one inside
    ``ray.shutdown`` leaves the rest of the instance running. Outside the main thread, where Python runs no signal
    handlers, nothing is held; a signal this process ignores stays ignored.

    ``children_ignore_ctrl_c``: the processes started in the block (by ``ray.init`` of a local instance: GCS,
    raylet, dashboard, ...) ignore SIGINT, and so do theirs (an ignored signal stays ignored across ``exec``, and
    Python then installs no ``KeyboardInterrupt`` handler). A terminal sends Ctrl-C to its whole foreground process
    group: Ray blocks it in the processes it starts, but the dashboard's module processes (forked from a
    multiprocessing forkserver) took it as their own ``KeyboardInterrupt``; one that came while they started kept
    ``ray.init`` waiting 60 s for the dashboard. Ignoring it, the Ctrl-C reaches this driver only, which stops them in
    order (``ray.shutdown``).
    """
    global _children_ignore_ctrl_c
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum, frame):
        held.append(signum)
        signal.signal(signum, previous[signum])  # a second one is not held
        name = signal.Signals(signum).name
        os.write(2, f"\n{name}: stopping once {what} (again to stop at once)\n".encode())  # no buffered I/O here

    # a signal this process ignores (started in the background by a non-interactive shell, or by nohup) stays ignored
    previous = {signum: signal.signal(signum, hold) for signum in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(signum) != signal.SIG_IGN}
    _children_ignore_ctrl_c = children_ignore_ctrl_c
    try:
        yield
    finally:
        _children_ignore_ctrl_c = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in held:
            if callable(previous[signum]):
                previous[signum](signum, None)
            elif previous[signum] == signal.SIG_DFL:
                signal.raise_signal(signum)


@contextlib.contextmanager
def sigterm_handler(handler):
    """While the block runs, SIGTERM (``kill``, ``ray job stop``, a scheduler's preemption notice) calls
    ``handler(signum, frame)``; the handler installed before is restored on the way out, however the block ends.
    Outside the main thread, where Python installs no signal handlers, SIGTERM is left as it is. Used by the
    single-run CLI and the sweeps to stop as Ctrl-C does (``python -m par_ray.train``, ``par_ray.sweep.run``)."""
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class MetricsLog(UserCallback):
    """Append every report's rank-0 metrics, and every worker failure, to a JSON-lines file.

    ``Result.metrics`` only keeps reports that carried a checkpoint; this keeps the whole curve (per-step losses
    with ``report_every=1``, step times for benchmarks). Lines: ``{"metrics": {...}, "checkpoint": bool}`` or
    ``{"failure": {rank: "error"}}``. A Ray Train callback runs on the controller, on the driver's node, so ``path``
    is a path there. Local mode (``num_workers=0``) runs no callbacks.
    """

    def __init__(self, path: str):
        self.path = path

    def _append(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def after_report(self, run_context, metrics, checkpoint):
        self._append({"metrics": metrics[0], "checkpoint": checkpoint is not None})

    def after_exception(self, run_context, worker_exceptions):
        self._append({"failure": {str(rank): repr(e)[:500] for rank, e in worker_exceptions.items()}})

    def read(self) -> list[dict]:
        """All records so far, oldest first (empty if none)."""
        try:
            with open(self.path) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []


class OncePerStep(UserCallback):
    """Forward each report to ``callbacks`` once per step: only when its ``step`` is past the last one forwarded.

    Ray Train V2 restarts a failed worker group from the latest checkpoint, so the reports made between that
    checkpoint and the fault are made again (at-least-once delivery). This controller-side filter turns them into
    exactly-once for everything downstream (Tune's result stream, MLflow, :class:`MetricsLog`) within one
    ``fit()``; the replayed step trains the same batch from the same state, so the report already forwarded stands
    for it. Checkpoints are registered by Train itself, before callbacks run, so dropping a replayed report loses
    none. Worker failures are always forwarded. Reports without a ``step`` pass through.
    """

    def __init__(self, callbacks: list):
        self.callbacks = list(callbacks)
        self.last_step = -math.inf

    def after_report(self, run_context, metrics, checkpoint):
        step = metrics[0].get("step") if metrics else None
        if step is not None:
            if step <= self.last_step:
                return
            self.last_step = step
        for cb in self.callbacks:
            cb.after_report(run_context, metrics, checkpoint)

    def after_exception(self, run_context, worker_exceptions):
        for cb in self.callbacks:
            cb.after_exception(run_context, worker_exceptions)


def root_causes(error: BaseException) -> list[BaseException]:
    """The user exceptions inside a Ray error: a ``RayTaskError``'s cause, a Train ``WorkerGroupError``'s per-rank
    failures (rank order), a ``ControllerError``'s failure, Train's ``UserExceptionWithTraceback`` wrapper's
    exception; ``[error]`` when it wraps nothing."""
    from ray.exceptions import RayTaskError
    from ray.train import ControllerError, WorkerGroupError

    if isinstance(error, RayTaskError) and error.cause is not None and error.cause is not error:
        return root_causes(error.cause)
    if isinstance(error, WorkerGroupError) and error.worker_failures:
        return [c for _, e in sorted(error.worker_failures.items()) for c in root_causes(e)]
    if isinstance(error, ControllerError) and error.controller_failure is not None:
        return root_causes(error.controller_failure)
    inner = getattr(error, "_base_exc", None)  # ray.train.v2 UserExceptionWithTraceback
    if isinstance(inner, BaseException):
        return root_causes(inner)
    return [error]


def is_retryable(error: BaseException) -> bool:
    """Whether a restart can fix ``error``: False when any of its :func:`root_causes` is :data:`NOT_RETRYABLE`."""
    return not any(isinstance(c, NOT_RETRYABLE) for c in root_causes(error))


class FailFastPolicy(DefaultFailurePolicy):
    """Ray Train's default failure policy (``FailureConfig.max_failures`` worker-group restarts from the latest
    checkpoint), except that a worker-group failure that is not :func:`is_retryable` raises at once
    (``FailureDecision.RAISE``): one attempt, not ``max_failures + 1`` that each resume and fail the same way.

    Ray 2.60 has no public setting for this: ``FailureConfig.fail_fast`` is gone from Train V2, and its
    ``FailurePolicy`` interface (``ray.train.v2._internal.execution.failure_handling``) is what the controller asks.
    """

    def make_decision(self, training_failed_error):
        from ray.train import WorkerGroupError

        if isinstance(training_failed_error, WorkerGroupError) and not is_retryable(training_failed_error):
            return FailureDecision.RAISE
        return super().make_decision(training_failed_error)


class Trainer(TorchTrainer):
    """``TorchTrainer`` whose controller decides on failures with :class:`FailFastPolicy`, and whose ``fit`` leaves
    Ctrl-C to Python (``KeyboardInterrupt``)."""

    def _initialize_and_run_controller(self, **controller_init_kwargs):
        controller_init_kwargs["failure_policy"] = FailFastPolicy(self.run_config.failure_config)
        return super()._initialize_and_run_controller(**controller_init_kwargs)

    def _register_sigint_handler(self, controller):
        """Install nothing. Ray Train's handler (called by ``fit`` on the main thread) answers the first Ctrl-C by
        asking the controller to abort and waiting for the answer, which does not come while the controller is
        blocked (a worker group waiting for resources: one Ctrl-C then does nothing, the third exits silently), and
        it stays installed after ``fit``. Python's ``KeyboardInterrupt`` instead ends ``fit`` at once; the caller's
        ``ray.shutdown`` (or leaving the cluster) ends the controller and its workers, which the driver owns."""


SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"
"""Ray Train V2's record of a run's checkpoints (``<storage>/<run name>/``), read when a run of that name starts."""


DAMAGED_DIR = "damaged"
"""Where :func:`repair_run_storage` sets aside a checkpoint whose files do not match their checksums
(``<storage>/<run name>/damaged/<checkpoint folder>``): kept for inspection, never read by Ray Train."""


def repair_run_storage(storage_path: str, name: str) -> list[str]:
    """Make the stored checkpoints of run ``name`` loadable again after a write was cut short (a full disk, a killed
    node) or a checkpoint file was damaged in place, so that the run resumes from its newest intact checkpoint;
    returns one line per repair (empty: none).

    A checkpoint folder is complete when its ``extra.json`` (written last, atomically) holds the step, none of its
    files is empty, and every file its manifest lists has the size listed (``par_ray.train.checkpoint.write_extra``).
    Incomplete folders are removed. Complete folders that a readable snapshot does not list (or that sit beside no
    snapshot) are orphans: written before Train registered them, or registered out of the snapshot by its retention
    rule (``num_to_keep``) before the interrupt let it delete them. Train never reads or deletes an orphan, so the
    retention rule is applied here: they are removed, and the resumed run repeats their steps (the data of a step
    depends only on the step). The checkpoint the run would resume from (the newest by step) is then read whole and
    its files checked against the SHA-256 checksums of its manifest (``hashlib``); a damaged one (bytes overwritten
    in place keep the size) is moved to :data:`DAMAGED_DIR` and the next newest is checked, until one is intact.
    Ray Train's snapshot (:data:`SNAPSHOT_FILE`) is rewritten from the checkpoints left, in step order and with their
    reports, when it does not parse (ENOSPC truncates it to 0 bytes and every later start raises
    ``CheckpointManagerInitializationError``) or names a checkpoint that is incomplete or was set aside; with no
    checkpoint left it is removed (the run starts afresh). Local paths and storage URIs alike (pyarrow, as Ray's
    storage).
    """
    import pyarrow.fs

    fs, run_dir = pyarrow.fs.FileSystem.from_uri(f"{storage_path.rstrip('/')}/{name}")
    if fs.get_file_info(run_dir).type != pyarrow.fs.FileType.Directory:
        return []
    notes, complete = [], {}
    for info in sorted(fs.get_file_info(pyarrow.fs.FileSelector(run_dir)), key=lambda i: i.path):
        if info.type != pyarrow.fs.FileType.Directory or not info.base_name.startswith("checkpoint_"):
            continue
        extra = _complete_checkpoint(fs, info.path)
        if extra is None:
            fs.delete_dir(info.path)
            notes.append(f"removed incomplete checkpoint {info.base_name} (empty, missing or cut-short files)")
        else:
            complete[info.base_name] = extra
    snapshot_path = f"{run_dir}/{SNAPSHOT_FILE}"

    def remove_orphans(listed) -> list[str]:
        removed = []
        for n in sorted(set(complete) - set(listed)):
            fs.delete_dir(f"{run_dir}/{n}")
            removed.append(f"removed checkpoint {n} (step {complete.pop(n)['step']}): Ray Train never registered it "
                           f"or had retired it; the resumed run repeats its steps")
        return removed

    def set_aside_damaged(names) -> list[str]:
        """The newest of ``names`` checked, a damaged one moved to DAMAGED_DIR, until one is intact."""
        damaged = []
        for n in sorted(names, key=lambda n: complete[n]["step"], reverse=True):
            bad = _damaged_files(fs, f"{run_dir}/{n}", complete[n])
            if not bad:
                break
            _move_dir(fs, f"{run_dir}/{n}", f"{run_dir}/{DAMAGED_DIR}/{n}")
            damaged.append(f"{n} (step {complete.pop(n)['step']}): {', '.join(bad)} does not match its SHA-256 in "
                           f"extra.json")
        return damaged

    if fs.get_file_info(snapshot_path).type != pyarrow.fs.FileType.File:
        return notes + remove_orphans([])
    with fs.open_input_stream(snapshot_path) as f:
        text = f.read().decode(errors="replace")
    damaged = []
    try:
        listed = [r["checkpoint_dir_name"] for r in json.loads(text)["checkpoint_results"]]
        if all(n in complete for n in listed):
            notes += remove_orphans(listed)
            damaged = set_aside_damaged(listed)
            if not damaged:
                return notes
            why = "named a damaged checkpoint"
        else:
            why = "named an incomplete checkpoint"
    except (ValueError, KeyError, TypeError):
        why = f"was unreadable ({len(text)} bytes)"
    if not damaged:
        damaged = set_aside_damaged(list(complete))
    aside = f"damaged checkpoint set aside in {DAMAGED_DIR}/: {'; '.join(damaged)}; " if damaged else ""
    if not complete:
        fs.delete_file(snapshot_path)
        return notes + [aside + ("no intact checkpoint is left: starting afresh" if damaged else
                                 f"Ray Train's {SNAPSHOT_FILE} {why} and no complete checkpoint is left: starting "
                                 f"afresh")]
    order = sorted(complete, key=lambda n: complete[n]["step"])
    results = [{"version": 0, "checkpoint_dir_name": n,
                "metrics": complete[n].get("report") or {"step": complete[n]["step"]}} for n in order]
    snapshot = {"ray_version": ray.__version__, "checkpoint_results": results,
                "checkpoint_report_indices": list(range(len(results))), "latest_checkpoint_result": results[-1],
                "pending_training_results": [], "pending_validation_specs": [], "current_report_index": len(results),
                "validated_checkpoint_dir_names": [], "timed_out_validation_checkpoint_dir_names": [],
                "failed_validation_checkpoint_dir_names": []}
    tmp = f"{snapshot_path}.tmp"
    with fs.open_output_stream(tmp) as f:
        f.write(json.dumps(snapshot).encode())
    fs.move(tmp, snapshot_path)
    resuming = f"resuming from step {complete[order[-1]]['step']} ({order[-1]})"
    if why == "named a damaged checkpoint":  # one line: which checkpoint was set aside, and where the run resumes
        return notes + [aside + resuming]
    return notes + [aside + f"Ray Train's {SNAPSHOT_FILE} {why}: rebuilt from the {len(results)} complete "
                            f"checkpoint(s); {resuming}"]


def _complete_checkpoint(fs, directory: str) -> dict | None:
    """The ``extra.json`` of a complete checkpoint folder (``step`` and ``report`` present, no empty file), else
    ``None``."""
    import pyarrow.fs

    files = [i for i in fs.get_file_info(pyarrow.fs.FileSelector(directory, recursive=True))
             if i.type == pyarrow.fs.FileType.File]
    if not files or any(i.size == 0 for i in files):
        return None
    extra_path = f"{directory}/extra.json"
    if not any(i.path == extra_path for i in files):
        return None
    try:
        with fs.open_input_stream(extra_path) as f:
            extra = json.loads(f.read().decode())
    except ValueError:
        return None
    if not isinstance(extra, dict) or "step" not in extra:
        return None
    sizes = {i.path[len(directory) + 1:]: i.size for i in files}
    if any(sizes.get(rel) != size for rel, size in extra.get(MANIFEST_KEY, {}).items()):
        return None  # a file cut short or missing (Train's copy to storage stopped mid-way)
    return extra


def _damaged_files(fs, directory: str, extra: dict) -> list[str]:
    """The files of the checkpoint folder ``directory`` whose SHA-256 differs from the one its ``extra.json`` lists
    (``par_ray.train.checkpoint.CHECKSUM_KEY``; checkpoints written before checksums list none: nothing to check)."""
    bad = []
    for rel, digest in sorted((extra.get(CHECKSUM_KEY) or {}).items()):
        with fs.open_input_stream(f"{directory}/{rel}") as f:
            if sha256_of(f) != digest:
                bad.append(rel)
    return bad


def _move_dir(fs, source: str, target: str) -> None:
    """Move a folder within one pyarrow file system: a rename on a local disk; a copy, then a delete, on an object
    store (S3 and GCS have no folder rename)."""
    import pyarrow.fs

    fs.create_dir(target.rpartition("/")[0], recursive=True)
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        fs.move(source, target)
        return
    pyarrow.fs.copy_files(source, target, source_filesystem=fs, destination_filesystem=fs)
    fs.delete_dir(source)


def config_hash(cfg: TrialConfig) -> str:
    """8 hex digits of a SHA-256 over the flat config, less ``RESUME_FREE_FIELDS`` (placement, fault injection)."""
    flat = {k: str(v) for k, v in to_flat(cfg).items() if k not in RESUME_FREE_FIELDS}
    return hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()[:8]


def run_name(cfg: TrialConfig) -> str:
    """Deterministic run name ``{recipe}-{backbone}-{task}-seed{seed}-{strategy}-{config hash}``: no timestamp.

    Ray Train V2 resumes a run whose name and storage path already hold checkpoints, so re-submitting the *same*
    trial continues it, and a trial with any other setting (a learning rate, the step count) gets another name and
    starts afresh (:func:`config_hash`). The worker count is not hashed: ddp and fsdp checkpoints load on any
    world size. The loop also refuses a checkpoint whose stored config differs (``loop.resume_mismatch``), for runs
    named by hand.
    """
    return (f"{cfg.recipe.name}-{cfg.backbone.name}-{cfg.task.name}-seed{cfg.train.seed}-{cfg.train.strategy}-"
            f"{config_hash(cfg)}")


def torch_config(cfg: TrialConfig) -> TorchConfig:
    """Ray Train's process-group setup: gloo on CPU, NCCL on GPU, collectives timing out after
    ``train.collective_timeout_s`` (Ray's default is 30 minutes) so that ranks out of step fail in bounded time."""
    return TorchConfig(backend="nccl" if cfg.train.use_gpu else "gloo",
                       timeout_s=max(1, math.ceil(cfg.train.collective_timeout_s)))


def fault_injection_errors(cfg: TrialConfig, local: bool) -> list[str]:
    """Why ``train.fail_at_step`` cannot be honoured in this run (empty when off or fine).

    The injected fault kills worker rank 0 once, "once" meaning: unless the worker resumed from a checkpoint. So a
    checkpoint must be written before the fault step (else every restart starts from scratch and dies again), and
    the run must have worker processes (in local mode the worker is this process).
    """
    tc = cfg.train
    if tc.fail_at_step < 0:
        return []
    errs = []
    if local:
        errs.append("train.fail_at_step: fault injection kills a Ray worker process; local mode has none")
    if not 1 <= tc.checkpoint_every <= tc.fail_at_step:
        errs.append(f"train.fail_at_step: {tc.fail_at_step} needs a checkpoint before it "
                    f"(1 <= train.checkpoint_every <= {tc.fail_at_step}), got train.checkpoint_every={tc.checkpoint_every}")
    return errs


def build_trainer(cfg: TrialConfig, name: str | None, storage_path: str, local: bool = False,
                  max_failures: int = 0, callbacks: list | None = None,
                  export_dir: str | None = None, checkpoint_score: tuple[str, str] | None = None,
                  log_level: str = "INFO") -> TorchTrainer:
    """A ``TorchTrainer`` for ``cfg``; validates ``cfg`` first (before any cluster resource is claimed).

    Args:
        name: run name; ``None`` = :func:`run_name`. A re-submitted job with the same name and storage path resumes
            from its latest checkpoint, on any number of workers for ddp and fsdp.
        storage_path: local directory or ``s3://`` / ``gs://`` URI for checkpoints and results.
        local: run in Ray Train's local mode (this process, one worker), regardless of ``train.num_workers``.
        max_failures: worker-group restarts from the latest checkpoint (``FailureConfig``); an error no restart can
            fix (:data:`NOT_RETRYABLE`) fails at once (:class:`FailFastPolicy`).
        callbacks: Ray Train ``UserCallback``s (run on the controller); each sees every step's report once
            (:class:`OncePerStep`), also after a worker-group restart.
        export_dir: also export the final model's weights there (``model.safetensors`` + ``extra.json``, no
            optimizer state: ``par_ray.train.checkpoint.export_model``; local mode keeps no checkpoint files).
        checkpoint_score: (metric, "max" | "min"): keep the ``train.keep_checkpoints`` best checkpoints by this
            reported metric (plus the latest, which Ray always keeps); ``None``: keep the latest ones. The metric
            must be in every report that carries a checkpoint.
        log_level: level of Ray Train's own log lines on the console (``LoggingConfig``); its log files keep all.
    Raises:
        ValueError: an invalid ``cfg``, or fault injection this run cannot honour (:func:`fault_injection_errors`).
    """
    validate(cfg)
    errs = fault_injection_errors(cfg, local)
    if errs:
        raise ValueError("invalid trial config:\n  - " + "\n  - ".join(errs))
    tc = cfg.train
    scaling = ray.train.ScalingConfig(
        num_workers=0 if local else tc.num_workers,
        use_gpu=tc.use_gpu,
        resources_per_worker=None if tc.use_gpu else {"CPU": max(1, tc.threads_per_worker)},
        # every worker on a node of this GPU type (Ray adds an "accelerator_type:<type>" resource to each bundle)
        accelerator_type=tc.accelerator_type or None,
    )
    return Trainer(
        train_loop_per_worker,
        # local mode keeps no checkpoint files (its report holds the checkpoint's folder, which the loop deletes)
        train_loop_config={"trial": cfg, "export_dir": export_dir, "checkpoints": not local},
        torch_config=torch_config(cfg),
        scaling_config=scaling,
        run_config=ray.train.RunConfig(
            name=name or run_name(cfg),
            storage_path=storage_path,
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=tc.keep_checkpoints,
                checkpoint_score_attribute=checkpoint_score[0] if checkpoint_score else None,
                checkpoint_score_order=checkpoint_score[1] if checkpoint_score else "max"),
            callbacks=[OncePerStep(callbacks)] if callbacks else None,
            logging_config=ray.train.LoggingConfig(log_level=log_level),
        ),
    )
