"""Cluster resources: connecting to Ray, what each trial holds, how many trials run at once, and the dry run's table.

A trial holds its Train workers (from the ``TorchTrainer`` that ``par_ray.train.trainer.build_trainer`` makes) plus a
driver that reserves memory, not CPU (:data:`DRIVER_RESOURCES`). ``max_concurrent_trials`` comes from the cluster's
resources and the largest trial's need, so trials never wait on each other for workers. :func:`joined` joins
``RAY_ADDRESS``, a running local cluster (``ray start --head``, also with ``--temp-dir``), or starts a new local one,
and says which (``par_ray.train.cluster.joined``, which the single-run CLI uses too).
"""

from __future__ import annotations

import contextlib
import os
import typing
from dataclasses import dataclass

from par_ray import cost
from par_ray.config import TrialConfig
from par_ray.hardware import Table
from par_ray.train import cluster
from par_ray.train.cluster import (ACCELERATOR_PREFIX, autoscaler_limits_unknown, cluster_capacity,  # noqa: F401
                                   exception_chain, format_resources, gpu_type_hint, ray_address, unfit)
from par_ray.sweep.spec import (GPU_TYPES_KEY, GRID_DIMS, Plan, SweepConfigError, cells_of, count_trials, domain_ends,
                                fixed_overrides, trial_label)

DRIVER_RESOURCES = {"CPU": 0.0, "memory": 512 * 2**20}
"""What a trial's driver (a Tune actor that only waits on its TorchTrainer) reserves. Memory, not a CPU sliver: on a
2-core machine a 0.01-CPU driver plus a 1-CPU worker would let only one trial run at a time."""


def trial_resources(cfg: TrialConfig, storage: str) -> dict[str, float]:
    """Cluster resources one trial holds: its Train workers (from the trainer ``build_trainer`` makes) + its driver."""
    from par_ray.train.trainer import build_trainer

    need = dict(build_trainer(cfg, "resources", storage_path=storage).scaling_config.total_resources)
    for k, v in DRIVER_RESOURCES.items():
        need[k] = need.get(k, 0.0) + v
    return {k: float(v) for k, v in need.items() if v}


def max_concurrent_trials(needs: list[tuple[str, dict[str, float]]], cluster: typing.Mapping[str, float]) -> int:
    """How many of the largest trials fit the cluster at once. ``needs``: (label, resources) per trial.

    Raises :class:`SweepConfigError` listing the trials that cannot fit at all (they would wait forever).
    """
    too_big = unfit(needs, cluster)
    if too_big:
        hint = gpu_type_hint(needs, cluster, "--gpu-types {}")
        raise SweepConfigError(f"the Ray cluster ({format_resources(cluster)}) cannot fit these trials: " + "; ".join(too_big)
                               + ". Choose smaller --backbones, --preset local, or add nodes."
                               + (f" Or: {hint}." if hint else ""))
    largest: dict[str, float] = {}
    for _, need in needs:
        for k, v in need.items():
            largest[k] = max(largest.get(k, 0.0), v)
    return max(1, min(int(cluster.get(k, 0.0) // v) for k, v in largest.items() if v > 0))


# --------------------------------------------------------------------------------------------------------------------
# Connecting to the cluster (``par_ray.train.cluster``, shared with the single-run CLI)

@contextlib.contextmanager
def joined():
    """:func:`par_ray.train.cluster.joined` at :func:`ray_address` for the block; a cluster that refuses this process's
    token is bad input: :class:`SweepConfigError`."""
    try:
        with cluster.joined() as context:
            yield context
    except cluster.ClusterTokenError as e:
        raise SweepConfigError(str(e)) from None


def cluster_has_gpu() -> bool:
    import ray

    return ray.cluster_resources().get("GPU", 0) > 0


def local_preset_guess() -> str:
    """``auto`` for a dry run, without starting Ray: what a new local cluster would choose (or RAY_ADDRESS's)."""
    if os.environ.get("RAY_ADDRESS", "local") != "local":  # an existing cluster: ask it (connecting claims nothing)
        with joined():
            return "paper" if cluster_has_gpu() else "local"
    try:
        import torch

        return "paper" if torch.cuda.is_available() else "local"
    except Exception:  # noqa: BLE001 - no torch CUDA runtime means no GPU
        return "local"


# --------------------------------------------------------------------------------------------------------------------
# The dry run: each trial's reservation and the planner's memory per GPU

def print_plan(plan: Plan, train_storage: str, costs: SweepCost | None = None) -> None:
    """``--dry-run``: the trials, what Ray reserves for each (its Train workers + its driver) and the planner's peak
    memory per GPU of one training step (the trial's memory); then, given ``costs`` (:func:`sweep_cost`), what each
    trial and the sweep cost (:func:`print_costs`). Starts nothing."""
    print(f"sweep {plan.spec.name}: {plan.spec.description or 'no description'}")
    shown = plan.trials
    cells = cells_of(plan.spec, plan.preset)
    cell_keys = [k for k in (cells[0] if cells else ()) if k not in GRID_DIMS]
    if plan.search is None and cells:
        crossed = " × ".join(["cells", *[name for key, name in (("recipe", "recipes"), ("task.name", "tasks"))
                                          if key not in cells[0]], "backbones", "seeds"])
        print(f"preset {plan.preset}: {len(plan.trials)} trials (grid: {len(cells)} {crossed})")
    elif plan.search is None:
        print(f"preset {plan.preset}: {len(plan.trials)} trials (grid: recipes × tasks × backbones × seeds)")
    else:
        shown = _shown(plan)
        print(f"preset {plan.preset}: Optuna + ASHA on {plan.metric} ({plan.mode}), {plan.search.num_samples} trials "
              f"over {len(shown)} grid point(s); search space:")
        for k, d in plan.search.space.items():
            print(f"  {k}: {_describe_domain(d)}")
    # the values the trials get: a smoke test's (and --set's) over the sweep's own
    fixed = {k: plan.param_space.get(k, v) for k, v in {**fixed_overrides(plan.spec, plan.preset),
                                                        **plan.overrides}.items()}
    if fixed:  # e.g. the halting sweep's stopping rules, which no table column shows
        print("every trial: " + ", ".join(f"{k}={v}" for k, v in fixed.items()))
    cell_col = " cell |" if cell_keys else ""
    print(f"| # | recipe | backbone | task | seed |{cell_col} strategy | GPUs/workers | Ray reservation (Train workers "
          f"+ trial driver) | steps | d_train | test depths | trial memory per GPU (planner) |")
    print(f"|---:|---|---|---|---:|{'---|' if cell_keys else ''}---|---:|---|---:|---:|---|---|")
    for i, (params, cfg) in enumerate(shown):
        tr = cfg.train
        try:
            res = reservation(trial_resources(cfg, train_storage))
        except Exception as e:  # noqa: BLE001 - a dry run reports what it cannot compute
            res = f"? ({type(e).__name__})"
        cell = f" {', '.join(f'{k}={params[k]}' for k in cell_keys)} |" if cell_keys else ""
        gpus = f"{tr.num_workers} × {tr.accelerator_type}" if tr.accelerator_type else f"{tr.num_workers}"
        print(f"| {i} | {cfg.recipe.name} | {cfg.backbone.name} | {cfg.task.name} | {tr.seed} |{cell} {tr.strategy}"
              f"{f' ZeRO-{tr.zero_stage}' if tr.strategy == 'deepspeed' else ''} | {gpus} | {res} | "
              f"{tr.steps} | {cfg.task.train_depth} | {','.join(map(str, cfg.eval.depths))} | "
              f"{_memory_estimate(cfg)} |")
    from par_ray.presets import PAPER_GPU_TYPE, PAPER_HEADROOM, gpu_targets

    gpu_types = str(plan.param_space.get(GPU_TYPES_KEY) or "")
    if gpu_types:
        sizes = ", ".join(f"{t} {gb:g} GB" + (f" (at most {n} per trial)" if n else "")
                          for t, gb, n in gpu_targets(gpu_types.split(",")))
        print(f"GPUs/workers: GPU count × Ray accelerator type. --gpu-types {gpu_types}: each trial takes the first "
              f"type, then the fewest GPUs, whose memory holds its planned peak within {PAPER_HEADROOM:.0%} ({sizes}). "
              f"A trial on more GPUs than one node of its type has runs across nodes; TYPE:N caps a type at N GPUs.")
    elif any(cfg.train.use_gpu for _, cfg in shown):
        print(f"GPUs/workers: GPU count × Ray accelerator type; without --gpu-types every trial is planned for, and "
              f"asks Ray for, {PAPER_GPU_TYPE} (pass --gpu-types, e.g. L40S:4,H100, to choose the type per trial).")
    print(f"Ray reservation: the trial's Train workers, plus {DRIVER_RESOURCES['memory'] / 2**30:g} GiB of host RAM "
          f"for its driver (the Tune actor that waits on the TorchTrainer), not the trial's memory. Trial memory per "
          f"GPU: the planner's peak of one training step and of each evaluation (par_ray.planner), per worker.")
    if costs is not None:
        print_costs(costs)


# --------------------------------------------------------------------------------------------------------------------
# What the sweep costs (par_ray.cost): FLOPs, GPU-hours, wall time and dollars

@dataclass(frozen=True)
class SweepCost:
    """The cost plan of a sweep: one :class:`~par_ray.cost.TrialCost` per trial shown, and the totals."""

    rows: list[tuple[str, TrialConfig, cost.TrialCost | None, str]]
    """(label, config, cost or ``None``, why not) per trial of the plan (a search: per grid point shown)."""
    n_trials: int
    """Trials Tune will run (a search: its samples, costed as the mean of the rows)."""
    concurrency: int
    concurrency_note: str
    table: Table

    @property
    def costs(self) -> list[cost.TrialCost]:
        return [c for _, _, c, _ in self.rows if c is not None]

    def _total(self, value: typing.Callable[[cost.TrialCost], float | None]) -> float | None:
        values = [value(c) for c in self.costs]
        if not values or any(v is None for v in values) or len(values) < len(self.rows):
            return None
        return sum(values) * self.n_trials / len(values)  # a search: num_samples × the mean trial

    @property
    def flops(self) -> float | None:
        return self._total(lambda c: c.flops.total)

    @property
    def gpu_hours(self) -> float | None:
        return self._total(lambda c: c.gpu_hours)

    @property
    def usd(self) -> float | None:
        return self._total(lambda c: c.usd)

    @property
    def usd_spot(self) -> float | None:
        return self._total(lambda c: c.usd_spot)

    @property
    def checkpoint_bytes(self) -> float | None:
        return self._total(lambda c: c.flops.checkpoint_bytes)

    @property
    def wall_hours(self) -> float | None:
        if len(self.costs) < len(self.rows) or not self.rows:
            return None
        durations = [c.wall_hours for c in self.costs]
        durations = (durations * -(-self.n_trials // len(durations)))[:self.n_trials]
        return cost.sweep_wall_hours(durations, self.concurrency)


def sweep_cost(plan: Plan, table: Table, concurrency: int | None = None) -> SweepCost:
    """Cost every trial of ``plan`` (:func:`par_ray.cost.trial_cost`) under ``table``, at ``concurrency`` trials at
    once (``None``: :func:`planned_concurrency`, what a dry run can know)."""
    rows = []
    for params, cfg in _shown(plan):
        try:
            c, why = cost.trial_cost(cfg, table), ""
        except Exception as e:  # noqa: BLE001 - a plan reports what it cannot compute
            c, why = None, f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
        rows.append((trial_label(cfg), cfg, c, why))
    note = "the cluster's limit"
    if concurrency is None:
        concurrency, note = planned_concurrency(plan)
    return SweepCost(rows=rows, n_trials=count_trials(plan), concurrency=concurrency, concurrency_note=note,
                     table=table)


def planned_concurrency(plan: Plan) -> tuple[int, str]:
    """(trials at once, why) without a cluster: CPU trials share this machine's cores (as a new local Ray cluster
    would); GPU trials all run at once (an autoscaling cluster adds the nodes; a smaller cluster takes longer)."""
    cfgs = [cfg for _, cfg in plan.trials]
    if any(cfg.train.use_gpu for cfg in cfgs):
        return count_trials(plan), "all at once: an autoscaling cluster with enough nodes"
    cpus = os.cpu_count() or 1
    need = max(cfg.train.num_workers * max(1, cfg.train.threads_per_worker) for cfg in cfgs)
    return max(1, cpus // need), f"this machine's {cpus} CPUs"


def print_costs(sc: SweepCost) -> None:
    """The cost table: per trial FLOPs (train, eval), devices, device-hours, wall time, dollars (on-demand, spot)
    and checkpoint bytes; then the sweep's totals and the assumptions behind them."""
    print(f"\nWhat it costs (par_ray.cost; device table: {sc.table.source}):")
    print("| # | trial | devices | train FLOPs | eval FLOPs | GPU-hours | wall | $ on-demand | $ spot | checkpoints |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for i, (label, cfg, c, why) in enumerate(sc.rows):
        if c is None:
            print(f"| {i} | {label} | n/a | n/a ({why}) | | | | | | |")
            continue
        print(f"| {i} | {label} | {c.count} × {c.device} | {cost.si(c.flops.train)} | {cost.si(c.flops.eval)} | "
              f"{c.gpu_hours:.3g} | {cost.hours(c.wall_hours)} | {cost.usd(c.usd)} | {cost.usd(c.usd_spot)} | "
              f"{cost.si(c.flops.checkpoint_bytes, 'B')} |")
    search = f" ({sc.n_trials} samples × the mean of the {len(sc.rows)} rows)" if sc.n_trials != len(sc.rows) else ""
    wall = sc.wall_hours
    print(f"| total | {sc.n_trials} trials{search} | | {_si(sc.flops, 'FLOP')} | | {_g(sc.gpu_hours)} | "
          f"{'n/a' if wall is None else cost.hours(wall)} | {cost.usd(sc.usd)} | {cost.usd(sc.usd_spot)} | "
          f"{_si(sc.checkpoint_bytes, 'B')} |")
    print(f"Wall: the sweep at up to {sc.concurrency} trial(s) at once ({sc.concurrency_note}), each trial's "
          f"GPU-hours spread over its devices. GPU-hours = FLOPs ÷ (peak × MFU), training and evaluation apart, + "
          f"the start-up × its devices; $ = GPU-hours × the price per GPU-hour of the node type that holds the "
          f"trial. Assumptions:")
    for line in cost.assumptions(sc.costs, sc.table):
        print(f"  {line}")


def check_budget(sc: SweepCost, max_usd: float | None) -> None:
    """Raise :class:`SweepConfigError` naming ``--max-usd`` when the sweep's planned on-demand dollars exceed
    ``max_usd`` or cannot be planned (a trial without a price or a peak); nothing when ``max_usd`` is ``None``."""
    if max_usd is None:
        return
    if sc.usd is None:
        missing = sorted({label for label, _, c, _ in sc.rows if c is None or c.usd is None})
        shown = f"{missing[:3]}" + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise SweepConfigError(f"--max-usd: the sweep's cost cannot be planned: no price or peak for "
                               f"{len(missing)} trial(s), {shown} (add them with --prices FILE)")
    if sc.usd > max_usd:
        raise SweepConfigError(f"--max-usd: the sweep is planned at {cost.usd(sc.usd)} on-demand "
                               f"({cost.usd(sc.usd_spot)} spot, {sc.gpu_hours:.3g} GPU-hours over {sc.n_trials} "
                               f"trials), over the budget of {cost.usd(max_usd)}; nothing was started "
                               f"(--dry-run lists each trial's cost)")


def cost_summary(sc: SweepCost) -> str:
    """One line: the planned total a real run prints before it starts."""
    wall = sc.wall_hours
    return (f"planned cost: {sc.n_trials} trials, {_si(sc.flops, 'FLOP')}, {_g(sc.gpu_hours)} GPU-hours, "
            f"{cost.usd(sc.usd)} on-demand / {cost.usd(sc.usd_spot)} spot, about "
            f"{'n/a' if wall is None else cost.hours(wall)} of wall time at up to {sc.concurrency} at once "
            f"(par_ray.cost; --dry-run lists each trial)")


def _si(x: float | None, unit: str) -> str:
    return "n/a" if x is None else cost.si(x, unit)


def _g(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _shown(plan: Plan) -> list[tuple[dict, TrialConfig]]:
    """The trials the dry run lists: every trial of a grid; a search's grid points at the first end of each domain."""
    if plan.search is None:
        return list(plan.trials)
    first = {k: domain_ends(k, d)[0] for k, d in plan.search.space.items()}
    return [(p, c) for p, c in plan.trials if all(p.get(k) == v for k, v in first.items())]


def reservation(need: typing.Mapping[str, float]) -> str:
    """``trial_resources`` as "<workers> (workers) + <driver RAM> (driver)"."""
    workers = {k: v - DRIVER_RESOURCES.get(k, 0.0) for k, v in need.items()}
    workers = {k: v for k, v in workers.items() if v > 1e-9}
    return (f"{format_resources(workers)} (workers) + {DRIVER_RESOURCES['memory'] / 2**30:g} GiB host RAM "
            f"(driver)")


def _describe_domain(domain: typing.Any) -> str:
    from ray.tune.search.sample import Categorical

    if isinstance(domain, Categorical):
        return "choice " + str(list(domain.categories))
    sampler = type(domain.get_sampler()).__name__.lower().replace("_", "")
    return f"{sampler} [{domain.lower}, {domain.upper}]"


def _memory_estimate(cfg: TrialConfig) -> str:
    """Peak memory per GPU of one training step from ``par_ray.planner.plan_trial`` at the largest train depth, and
    of its evaluations (``plan_evaluation``: accuracy by depth, halting when trained, the probe)."""
    try:
        from par_ray.planner import plan_evaluation, plan_trial

        estimate, ev = plan_trial(cfg), plan_evaluation(cfg)
    except Exception as e:  # noqa: BLE001 - the planner is optional for a dry run; say why it is missing
        return f"n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
    teacher = f", EMA teacher {estimate.teacher / 1e9:.2f} GB included" if estimate.teacher else ""
    evals = f"eval {(ev.resident + ev.plain) / 1e9:.2f} GB, probe {(ev.resident + ev.probe) / 1e9:.2f} GB"
    if ev.halting:
        evals += f", halting {(ev.resident + ev.halting) / 1e9:.2f} GB"
    return f"train {estimate.total / 1e9:.2f} GB ({estimate.peak_phase}{teacher}); {evals}"
