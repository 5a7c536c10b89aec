"""What the connected Ray cluster holds, and whether a run's Train workers fit it at all.

One check for the sweeps (``par_ray.sweep.resources.max_concurrent_trials``: every trial) and the single-run CLI
(``python -m par_ray.train``: its one run), made after Ray is connected and before anything is written or started: a
run whose workers can never be placed would otherwise wait for them forever (Ray Train's worker-group timeout,
logged every minute). The capacity counts what the cluster's autoscaler may add (:func:`cluster_capacity`); when an
autoscaler adds nodes without publishing its limits (:func:`autoscaler_limits_unknown`) nothing can be said, and
both callers skip the check.
"""

from __future__ import annotations

import json
import typing

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


def check_fits(label: str, need: typing.Mapping[str, float]) -> None:
    """Raise ``ValueError`` ("the Ray cluster (…) cannot fit <label>: it needs …") when ``need`` (a run's Train
    workers, Ray's resource names) exceeds the connected cluster's :func:`cluster_capacity`; nothing when it fits, or
    when an autoscaler may add nodes without publishing its limits. Needs ``ray.init`` first; claims nothing."""
    if autoscaler_limits_unknown():
        return
    cluster = cluster_capacity()
    if unfit([(label, need)], cluster):
        raise ValueError(f"the Ray cluster ({format_resources(cluster)}) cannot fit {label}: it needs "
                         f"{format_resources(need)}")
