"""Which Ray cluster to join and joining it; what the connected cluster holds, and whether a run's Train workers fit.

:func:`joined` joins ``RAY_ADDRESS``, a running cluster on this machine (``ray start --head``, also with
``--temp-dir``), or starts a new local one, and says which (:func:`ray_address`); the sweeps and the single-run CLI
both join through it. A stale ``ray_current_cluster`` file left by a head that died is reported and skipped, never
retried forever; a cluster that refuses this process's token is one error (:class:`ClusterTokenError`), not 20 s of
``ray.init`` retries.

One capacity check for the sweeps (``par_ray.sweep.resources.max_concurrent_trials``: every trial) and the
single-run CLI (``python -m par_ray.train``: its one run, :func:`check_fits`), made after Ray is connected and before
anything is written or started: a run whose workers can never be placed would otherwise wait for them forever (Ray
Train's worker-group timeout, logged every minute). The capacity counts what the cluster's autoscaler may add
(:func:`cluster_capacity`); when an autoscaler adds nodes without publishing its limits
(:func:`autoscaler_limits_unknown`) nothing can be said, and both callers skip the check.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import typing

GCS_PROBE_TIMEOUT_S = 2.0
"""How long :func:`ray_address` waits for the head named in ``ray_current_cluster`` to accept a connection."""
ACCELERATOR_PREFIX = "accelerator_type:"
"""Ray's resource for a node's GPU type (``ray._common.utils.RESOURCE_CONSTRAINT_PREFIX``): a node has 1 of it, a
worker of a trial with ``train.accelerator_type`` asks for 0.001."""


def cluster_capacity() -> dict[str, float]:
    """The connected cluster's resources (Ray's names: ``CPU``, ``GPU``, ``memory`` in bytes …): the larger of what it
    has now and what its autoscaler may add. Needs ``ray.init`` first."""
    import ray

    now = {k: float(v) for k, v in ray.cluster_resources().items()}
    try:  # the autoscaler's node-group limits, as Ray Train reads them (ray.train.v2 worker_group.py)
        from ray._private.state import state

        most = state.get_max_resources_from_cluster_config() or {}
    except Exception:  # noqa: BLE001 - no autoscaler config: a fixed cluster
        most = {}
    return {k: max(now.get(k, 0.0), float(most.get(k, 0) or 0)) for k in set(now) | set(most)}


def autoscaler_limits_unknown() -> bool:
    """Whether an autoscaler may add nodes to the connected cluster without Ray publishing how many.

    :func:`cluster_capacity` then sees only the nodes running now (a CPU-0 head before any worker starts): in Ray
    2.60 neither the v1 autoscaler (``ray up``, ``ray start --autoscaling-config``) nor v2 (KubeRay) writes the
    cluster config that ``get_max_resources_from_cluster_config`` reads. v1 is recognised by its status in the GCS
    (what ``ray status`` prints), which maps nodes to the node types of its config; the read-only monitor of a fixed
    cluster names each node ``node_<id>`` instead.
    """
    from ray._private import ray_constants
    from ray._private.state import state
    from ray.autoscaler.v2.utils import is_autoscaler_v2
    from ray.experimental.internal_kv import _internal_kv_get

    try:
        if state.get_max_resources_from_cluster_config():
            return False
        if is_autoscaler_v2(fetch_from_server=True):
            return True
        status = json.loads(_internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS) or b"{}")
    except Exception:  # noqa: BLE001 - no autoscaler state to read: a fixed cluster
        return False
    mapping = (status.get("autoscaler_report") or {}).get("node_type_mapping") or {}
    return any(node_type != f"node_{node_id}" for node_id, node_type in mapping.items())


def format_resources(resources: typing.Mapping[str, float]) -> str:
    """CPU, GPU and memory, then the GPU types (Ray's ``accelerator_type:<type>`` resources: a trial's constraint, a
    cluster's node types), e.g. "4 GPU on L40S nodes"."""
    keys = [k for k in ("CPU", "GPU", "memory") if k in resources]
    text = ", ".join(f"{resources[k] / 2**30:.1f} GiB memory" if k == "memory" else f"{resources[k]:g} {k}"
                     for k in keys) or "nothing"
    types = sorted(k.removeprefix(ACCELERATOR_PREFIX) for k, v in resources.items()
                   if k.startswith(ACCELERATOR_PREFIX) and v)
    return text + (f" on {'/'.join(types)} nodes" if types else "")


def unfit(needs: typing.Iterable[tuple[str, typing.Mapping[str, float]]], cluster: typing.Mapping[str, float]
          ) -> list[str]:
    """``"<label> needs <resources>"`` for every (label, resources) in ``needs`` that exceeds ``cluster`` in some
    resource (it could never be placed), sorted and each once; empty when all fit."""
    return sorted({f"{label} needs {format_resources(need)}" for label, need in needs
                   if any(cluster.get(k, 0.0) + 1e-9 < v for k, v in need.items())})


def gpu_type_hint(needs: typing.Iterable[tuple[str, typing.Mapping[str, float]]], cluster: typing.Mapping[str, float],
                  flag: str) -> str:
    """A clause for a "cannot fit" error when ``needs`` ask for a GPU type (``accelerator_type:<type>``) the
    ``cluster`` has no node of while it has GPUs of other types: it names them and ``flag`` (formatted with their
    types, e.g. ``"--gpu-types {}"``); ``""`` otherwise. The paper preset asks for H100s unless told."""
    have = sorted(k.removeprefix(ACCELERATOR_PREFIX) for k, v in cluster.items()
                  if k.startswith(ACCELERATOR_PREFIX) and v)
    wanted = sorted({k.removeprefix(ACCELERATOR_PREFIX) for _, need in needs for k, v in need.items()
                     if k.startswith(ACCELERATOR_PREFIX) and v} - set(have))
    if not (have and wanted):
        return ""
    return (f"they ask for {'/'.join(wanted)} GPUs and the cluster's are {'/'.join(have)}: to run on those, pass "
            f"{flag.format(','.join(have))}")


def check_fits(label: str, need: typing.Mapping[str, float]) -> None:
    """Raise ``ValueError`` ("the Ray cluster (…) cannot fit <label>: it needs …") when ``need`` (a run's Train
    workers, Ray's resource names) exceeds the connected cluster's :func:`cluster_capacity`; nothing when it fits, or
    when an autoscaler may add nodes without publishing its limits. Needs ``ray.init`` first; claims nothing."""
    if autoscaler_limits_unknown():
        return
    cluster = cluster_capacity()
    if unfit([(label, need)], cluster):
        hint = gpu_type_hint([(label, need)], cluster, "--set train.accelerator_type={}")
        raise ValueError(f"the Ray cluster ({format_resources(cluster)}) cannot fit {label}: it needs "
                         f"{format_resources(need)}" + (f"; {hint}" if hint else ""))


# --------------------------------------------------------------------------------------------------------------------
# Connecting to the cluster: the sweeps (``par_ray.sweep.resources``) and the single-run CLI

def ray_address() -> str:
    """The address :func:`joined` gives ``ray.init``: ``RAY_ADDRESS`` if set; else the cluster named in Ray's
    ``ray_current_cluster`` file (written by ``ray start --head``) if its head answers; else ``"local"`` (a new
    local cluster).

    A head that died leaves that file behind, and ``ray.init()`` would retry "Failed to connect to GCS" at its
    address without end. So the address is probed first (a TCP connect, :data:`GCS_PROBE_TIMEOUT_S`); a dead one is
    named on stderr with how to clear it, and a new local cluster is started instead.
    """
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    from ray._common.utils import get_ray_address_file
    from ray._private.utils import read_ray_address

    default = read_ray_address()
    found = [(get_ray_address_file(None), default)] if default else []
    found += [(get_ray_address_file(d), a) for d in _running_head_temp_dirs()
              if (a := read_ray_address(d)) and a != default]
    for path, address in found:
        if _answers(address):
            return address
        print(f"warning: {path} names a Ray cluster at {address} that does not answer (a head that stopped without "
              f"`ray stop`); skipping it. To clear it: `ray stop` (or delete that file); to use a cluster, set "
              f"RAY_ADDRESS", file=sys.stderr, flush=True)
    return "local"


def check_outlives_job(flag: str, raw: str, buckets: bool = False) -> None:
    """Raise ``ValueError`` naming ``flag`` when ``raw``, the folder a run writes its results to, is a relative local
    path inside a Ray job (``ray job submit``, which sets ``RAY_JOB_CONFIG_JSON_ENV_VAR`` in the job's driver): the job
    runs in a temporary copy of its working directory, which Ray deletes later or hands, results and all, to the next
    job of the same code (a rerun would then resume the old run). Nothing for an absolute path, a URI, or outside a
    job. ``buckets``: the flag also takes a bucket URI (the sweeps' ``--storage``)."""
    if "://" in raw or os.path.isabs(os.path.expanduser(raw)) or "RAY_JOB_CONFIG_JSON_ENV_VAR" not in os.environ:
        return
    or_bucket = " or a bucket URI (s3://…, gs://…)" if buckets else ""
    raise ValueError(f"{flag}: {raw!r} is a relative path, and this Ray job runs in a temporary copy of its working "
                     f"directory ({os.path.abspath(raw)}), which Ray deletes, or reuses for the next job of the same "
                     f"code; give an absolute path every node sees{or_bucket}")


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=GCS_PROBE_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


def _running_head_temp_dirs() -> list[str]:
    """The ``--temp-dir`` of every Ray node running on this host (from its raylet's command line, as
    ``ray.init(address="auto")`` finds running clusters from their processes). A head started with ``ray start
    --head --temp-dir X`` names itself in ``X/ray_current_cluster``; a private ``ray.init()`` instance (a test's, a
    notebook's) writes no such file, so it is never joined."""
    import psutil

    dirs = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if not cmd or not os.path.basename(cmd[0]).startswith("raylet"):
            continue
        for arg in cmd[1:]:
            for flag in ("--temp_dir=", "--temp-dir="):
                if arg.startswith(flag) and arg[len(flag):] not in dirs:
                    dirs.append(arg[len(flag):])
    return dirs


@contextlib.contextmanager
def joined(address: str | None = None):
    """Ray for the block: the cluster at ``address`` (default :func:`ray_address`), joined with ``ray.init`` and left
    with ``ray.shutdown``, or for ``"local"`` a new local cluster (``par_ray.train.trainer.local_ray``: its State API
    pinned to its own dashboard, every variable it sets restored on exit), shut down after the block. Says which on
    stdout (``Ray: joined ADDRESS``, ``Ray: started a local cluster (N CPU, M GPU)``). Yields the ``RayContext``, or
    ``None`` when Ray is initialised already: then it is left as it was.

    The console gets Ray's WARNING-and-above lines and what the workers print (``log_to_driver``: the training loop's
    progress lines, failures); Ray Train's INFO lines go to its log files only (the trial's ``LoggingConfig``,
    ``par_ray.sweep.run``; ``quiet_worker_logging``): ``par_ray.train.trainer.worker_runtime_env`` is the job's
    ``runtime_env``. A Ctrl-C or SIGTERM while Ray starts or stops is held until it has, and the processes a local
    cluster starts ignore Ctrl-C, which reaches this driver only (``par_ray.train.trainer.signals_held``). Leaving
    early (``contextlib.ExitStack.close``) lets the workers' last forwarded log lines print before what the caller
    prints next.

    Raises :class:`ClusterTokenError` when the cluster at ``address`` refuses this process's token (or its lack of
    one), after one attempt.
    """
    import ray

    from par_ray.train.trainer import local_ray, signals_held, worker_runtime_env

    if ray.is_initialized():
        yield None
        return
    address = address or ray_address()
    init = dict(logging_level="WARNING", log_to_driver=True, configure_logging=True)
    if address == "local":
        with local_ray(num_cpus=None, **init) as context:
            res = ray.cluster_resources()
            print(f"Ray: started a local cluster ({res.get('CPU', 0):g} CPU, {res.get('GPU', 0):g} GPU)", flush=True)
            yield context
        return
    _check_token(address)
    try:
        with signals_held("Ray has started", children_ignore_ctrl_c=True):
            context = ray.init(address=address, runtime_env=worker_runtime_env(local=False), **init)
    except (ray.exceptions.AuthenticationError, RuntimeError, ConnectionError) as e:
        # Ray 2.60 wraps the AuthenticationError: "Failed to connect to GCS" (RuntimeError), raised again as
        # "Failed to connect to Ray cluster" (ConnectionError) when joining an address
        if not _auth_failure(e):
            raise
        raise _token_error(address) from None
    print(f"Ray: joined {address}", flush=True)
    try:
        yield context
    finally:
        with signals_held("Ray has stopped"):
            ray.shutdown()


class ClusterTokenError(ValueError):
    """The Ray cluster at an address requires token authentication and this process has no token it accepts."""


def _token_error(address: str) -> ClusterTokenError:
    return ClusterTokenError(f"Ray: the cluster at {address} requires token authentication and this process has no "
                            f"token for it; set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token")


def _check_token(address: str) -> None:
    """One connection attempt to the GCS at ``address`` (``host:port``) before ``ray.init``: a cluster that refuses this
    process's token (or its lack of one) raises :class:`ClusterTokenError` at once, where ``ray.init`` would retry for
    ~20 s (``RAY_NUM_REDIS_GET_RETRIES``), logging a warning each second, then raise. Any other outcome (connected,
    GCS not up yet) is left to ``ray.init``. Ray's ``GcsClient`` (``ray._raylet``, what ``ray.init`` itself uses).
    With ``RAY_AUTH_MODE=token`` and no token at all (``AuthenticationTokenLoader``) it raises before connecting: Ray's
    client would abort the process there."""
    if not re.fullmatch(r"[\w.\-]+:\d+", address):  # local, auto, ray://…: ray.init's own resolution
        return
    try:
        from ray._raylet import AuthenticationTokenLoader, GcsClient
    except ImportError:  # another Ray: ray.init's own error stands
        return
    if (os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
            and not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)):
        # Ray's client aborts the process (a failed C++ check, no exception) when token mode has no token to send
        raise ClusterTokenError(f"Ray: RAY_AUTH_MODE=token is set but this process has no token for the cluster at "
                                f"{address} (no RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token); set "
                                f"RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token")
    try:
        GcsClient(address=address)
    except Exception as e:  # noqa: BLE001 - only an authentication failure is ours to name
        if _auth_failure(e):
            raise _token_error(address) from None


def exception_chain(error: BaseException | None) -> typing.Iterator[BaseException]:
    """``error``, then the exceptions it was raised from or while handling (``__cause__``, else ``__context__``),
    each once."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _auth_failure(error: BaseException | None) -> bool:
    """Whether ``error`` or an exception in its chain is Ray's token ``AuthenticationError`` (or names it)."""
    import ray

    return any(isinstance(e, ray.exceptions.AuthenticationError) or "AuthenticationError" in str(e)
               for e in exception_chain(error))
