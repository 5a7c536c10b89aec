"""The device table: every accelerator a trial may run on, its memory, its peak and what an hour of it costs.

One table (:data:`DEVICES`) for everything that asks about a device: the memory planner's GB per GPU
(``par_ray.planner.GPU_MEMORY_GB`` is read from it), ``train.accelerator_type`` and ``--gpu-types`` validation, and
the cost model (``par_ray.cost``: GPU-hours = FLOPs ÷ (peak × MFU), dollars = GPU-hours × price). Keys are Ray's
accelerator types (``ray.util.accelerators``; see ``GPU_MEMORY_GB`` for how Ray names them), plus ``CPU`` for the
local preset's CPU workers.

Peaks are the dense bf16 tensor-core figures of NVIDIA's datasheets (no 2:4 sparsity); the CPU's is an fp32
``torch.mm`` peak per core with every core busy (a local sweep runs one 1-CPU trial per core), measured on a
development machine; CPUs differ more than 2× between machines, so measure this one
(``python -m par_ray.hardware --measure-cpu --out cpu.json``, :func:`measure_cpu_peak`) and pass it as
``--prices cpu.json``. Prices are USD per GPU-hour of the node types in ``cluster/aws.yaml``, ``cluster/gcp.yaml`` and
``cluster/kuberay/raycluster.yaml`` (:data:`NODE_PRICES`: node price ÷ GPUs per node), each with its region, date
and source. They are list prices as published by the providers at the date given, copied by hand; they were not
re-checked online when this table was written (December 2026), spot prices move daily, and spot H100 capacity is
often unavailable. A price file overrides any of it (:func:`load_table`, the sweeps' ``--prices FILE``).

MFU (model FLOPs utilisation: the share of the peak a trial's matmuls reach) is an assumption until measured
(:data:`DEFAULT_MFU`); training and evaluation get separate values. A measured one replaces it: the GPU check's
JSON (``benchmarks/gpu_check.py``, ``throughput.*.mfu``) passed as ``--prices``, or past runs
(``python -m analysis`` writes ``cost_overrides.json``: actual GPU-seconds ÷ planned FLOPs of finished trials).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tomllib
import typing
from dataclasses import dataclass, field, replace

from par_ray.cli_args import exit_with


@dataclass(frozen=True)
class NodePrice:
    """What one node type of the cluster configs costs."""

    node: str
    """Instance / machine type (``g6e.12xlarge``, ``a3-highgpu-8g``)."""
    cloud: str
    gpus: int
    """GPUs per node."""
    on_demand: float
    """USD per node-hour, on-demand."""
    spot: float
    """USD per node-hour, spot (typical; spot prices move)."""
    region: str
    date: str
    """When the price was read (YYYY-MM)."""
    source: str


@dataclass(frozen=True)
class Device:
    """One accelerator type: memory, peak and the node types that offer it."""

    memory_gb: float
    """GB per device (decimal, the product figure; the planner's capacity)."""
    peak_tflops: float | None
    """Dense bf16 tensor-core TFLOP/s per device (``CPU``: fp32 ``torch.mm`` GFLOP/s ÷ 1000 per core, every core
    busy);
    ``None`` when unknown (no GPU-hours can be planned on it)."""
    peak_source: str = ""
    nodes: tuple[NodePrice, ...] = ()
    """Priced node types carrying this device (empty: no price, dollars show as n/a)."""
    mfu_train: float | None = None
    """Measured training MFU on this device (replaces :data:`DEFAULT_MFU`); ``None`` = not measured."""
    mfu_eval: float | None = None
    mfu_source: str = ""
    startup_s: float | None = None
    """Measured seconds a trial on this device spends outside its training steps and evaluations (replaces
    :data:`DEFAULT_STARTUP_S`); ``None`` = not measured."""

    def price(self, count: int = 1) -> NodePrice | None:
        """The node a trial of ``count`` devices is priced on: the cheapest per device by on-demand price among the
        node types holding ``count`` on one node (else among all); ``None`` without priced nodes."""
        fits = [n for n in self.nodes if n.gpus >= count] or list(self.nodes)
        return min(fits, key=lambda n: n.on_demand / n.gpus) if fits else None


_AWS = "https://aws.amazon.com/ec2/pricing/on-demand/ and https://aws.amazon.com/ec2/spot/pricing/"
_GCP = "https://cloud.google.com/compute/gpus-pricing and https://cloud.google.com/compute/all-pricing"
_SPOT = "; spot: typical of that month, it moves daily"

NODE_PRICES: dict[str, NodePrice] = {
    # AWS us-east-1, Linux (cluster/aws.yaml)
    "g6e.xlarge": NodePrice("g6e.xlarge", "aws", 1, 1.861, 0.70, "us-east-1", "2025-06", _AWS + _SPOT),
    "g6e.12xlarge": NodePrice("g6e.12xlarge", "aws", 4, 10.493, 4.00, "us-east-1", "2025-06", _AWS + _SPOT),
    # P5 on-demand after AWS's June 2025 price cut for P4/P5 (up to 45 %)
    "p5.48xlarge": NodePrice("p5.48xlarge", "aws", 8, 55.04, 30.0, "us-east-1", "2025-06", _AWS + _SPOT),
    # GCP us-central1 (cluster/gcp.yaml, cluster/kuberay/raycluster.yaml: the same machine types on GKE)
    "g2-standard-8": NodePrice("g2-standard-8", "gcp", 1, 0.8536, 0.30, "us-central1", "2025-06", _GCP + _SPOT),
    "g2-standard-96": NodePrice("g2-standard-96", "gcp", 8, 7.9858, 3.00, "us-central1", "2025-06", _GCP + _SPOT),
    "a3-highgpu-8g": NodePrice("a3-highgpu-8g", "gcp", 8, 88.25, 25.0, "us-central1", "2025-06", _GCP + _SPOT),
}
"""The GPU node types of ``cluster/*.yaml`` and ``cluster/kuberay``, USD per node-hour."""

_DATASHEET = "NVIDIA {} datasheet, dense BF16 tensor TFLOPS (without sparsity)"

DEVICES: dict[str, Device] = {
    "A10G": Device(24, None, "not in this table: the A10G (AWS's A10 variant) has no NVIDIA datasheet; add its peak "
                   "with --prices"),
    "L4": Device(24, 121.0, _DATASHEET.format("L4"),
                 (NODE_PRICES["g2-standard-8"], NODE_PRICES["g2-standard-96"])),
    "L40S": Device(48, 362.05, _DATASHEET.format("L40S"),
                   (NODE_PRICES["g6e.xlarge"], NODE_PRICES["g6e.12xlarge"])),
    "A100": Device(40, 312.0, _DATASHEET.format("A100")),
    "A100-40G": Device(40, 312.0, _DATASHEET.format("A100")),
    "A100-80G": Device(80, 312.0, _DATASHEET.format("A100")),
    "H100": Device(80, 989.4, _DATASHEET.format("H100 SXM"),
                   (NODE_PRICES["p5.48xlarge"], NODE_PRICES["a3-highgpu-8g"])),
    "H200": Device(141, 989.4, _DATASHEET.format("H200 SXM")),
    "CPU": Device(0, 0.087, "fp32 torch.mm at 2048^3 per core with both cores of a 2-core AMD EPYC (Zen 3) VM busy, "
                  "December 2026; machines differ 2x and more (docs/performance.md): measure yours with python -m "
                  "par_ray.hardware --measure-cpu --out cpu.json and pass --prices cpu.json"),
}
"""Ray accelerator type → :class:`Device`. ``CPU`` is the local preset's worker (one core per thread; no price)."""

GPU_TYPES = tuple(k for k in DEVICES if k != "CPU")
"""The GPU types a trial may name (``train.accelerator_type``, ``--gpu-types``)."""
ANY_GPU = "H100"
"""The type a GPU trial without ``train.accelerator_type`` is costed as: the paper preset then plans for an 80 GB
GPU of any type (``par_ray.presets.PAPER_GPU_MEMORY_GB``)."""

DEFAULT_MFU = {"gpu": {"train": 0.25, "eval": 0.15},
               "cpu": {"train": 0.38, "train_compiled": 0.70, "train_compiled_medium": 0.84,
                       "train_compiled_bf16": 0.75, "eval": 0.42, "eval_medium": 0.45, "eval_bf16": 0.84}}
"""Assumed MFU by device kind and phase (``train``, ``eval``), until a measurement replaces it. A phase may have
variants a kind sets where they differ: ``_compiled`` for training with ``train.compile`` and ``_medium`` for
``train.float32_matmul_precision='medium'`` (bf16 products); :meth:`Table.mfu_of` takes the most specific one the
kind has (``train_compiled_medium``, then ``train_compiled``, then ``train``). On CPU every MFU is against the IEEE
float32 peak, so a ``_medium`` one may pass 1. GPU: the trials' matmuls are small
(B·T of a few thousand tokens, hidden 896–3584) and the loop adds many small kernels per iteration, so a quarter of
the bf16 peak in training and less in evaluation (smaller batches per call, the readout's narrow matmuls) — no GPU
has measured it yet (``benchmarks/gpu_check.py`` does).

CPU (the local preset: 1-CPU workers, one torch thread each, as many trials side by side as the machine has cores):
relative to the CPU peak *per core with every core busy* (:func:`measure_cpu_peak` with ``workers`` = the cores),
measured with tiny-qwen2 and tiny-qwen3 local-preset trials training side by side on a 2-core AMD EPYC VM (December
2026; 40 steps of the trial's own (d, R) draws, FLOPs of those draws, then one full evaluation): training 0.39 and
0.37 (0.46 / 0.40 alone), evaluation 0.42 (0.44 alone). Two trials slow each other more than two big matmuls do
(the per-core matmul peak drops 5 % with both cores busy, a training step 12–19 %): backward and AdamW are memory
bound and share the memory bandwidth and L3. Checked in a real local sweep (docs/cost.md): the trials
reached 0.34–0.37 training and 0.38–0.42 evaluation, Ray's own processes taking ~20 % of the two cores. These
evaluation figures are of the coarse test grid (6/12/24/48, batches of 256); the fine grid the local preset now
evaluates (15 depths, batches of 128) measured 0.49 side by side in one run, where training measured 0.43–0.47: this
VM's step rate moves ~±10 % between runs while its matmul peak moves ~5 %, so 0.42 stays (evaluation is ~10 % of a
local trial: 0.42 vs 0.49 moves its planned wall ~2 %); the ``main_results`` sweep's forward-only evaluations
reached 0.37–0.53, counted with the test sequences they ran (docs/experiments.md §43). ``train_compiled`` is the
local sweeps' recipe (``presets.LOCAL_CURRICULUM``: d_train 16 on a length curriculum, compiled decoder layers, two
trials side by side on the same VM): 0.65–0.72 measured by the main job's trials and 0.60–0.70 by the ablations
sweep's (December 2026, docs/experiments.md §26), against the eager 0.38, which planned those trials at twice their
time; on a slower Intel machine two 4,500-step trials reached 0.57 / 0.58 of this peak and took 2–3 % longer than
planned (§33).
``train_compiled_medium`` and ``eval_medium`` (``train.float32_matmul_precision='medium'`` with eager attention) are
``train_compiled`` and ``eval`` times what a 4,500-step trial reached under ``medium`` over float32 (training 0.444 /
0.371 = 1.20, evaluation 1.241 / 1.168 = 1.06, on an AMD EPYC where ``medium`` ran other float32 kernels, §35); with
AMX-BF16's bf16 products two trials side by side ran their last phase ~1.2x faster as well (§34). A trial on two threads
(``train.threads_per_worker`` 2) reaches less of its doubled peak than one thread does of its own (0.37 against
0.57: Ray's own processes wake up often enough to stall one thread while the other waits at the parallel region's
barrier, 5-27 % of a two-thread step beside an idle Ray cluster, §37): plan those with a measured MFU (``--prices``).
``train_compiled_bf16`` and ``eval_bf16`` (``train.cpu_bf16_autocast`` with eager attention): the six trials of the
main job run that way on the 2-core AMD EPYC VM with AVX512-BF16 (2026-12-06, §38) reached 0.65–0.81 in training
with a bf16 state between iterations (0.75 taken); with the float32 state the model keeps since (§39, §40) its ten
trials of seeds 0–4 reached 0.66–0.77 (median 0.74), so 0.75 stands; evaluation is ``eval`` × 2, the ratio of a
float32 and a bf16 evaluation side by side (16 s against 8 s).
On that VM a float32 trial side by side trained 1.6x slower than a bf16 one (a 600-step proxy pair, 381 against 239 s),
i.e. below the ``train_compiled`` it is planned at: that figure came from other runs and machines, and it is the plan
such a machine should replace with its own measurement.
What a trial reaches inside a Ray sweep is measured by ``python -m analysis`` (``cost_overrides.json``)."""

DEFAULT_STARTUP_S = {"gpu": 60.0, "cpu": 30.0}
"""Assumed seconds per trial, by device kind, beside its training steps and evaluations: Ray Train's worker group,
building or loading the model, the MLflow run, reports and checkpoints; the trial holds its devices meanwhile, so
they count in its device-hours and its wall time (``par_ray.cost.TrialCost``). CPU: the smoke test's six trials
(``sweeps/backbone_scaling.py --smoke-test``, 2-core AMD EPYC VM, December 2026) took 28–33 s of wall time each
around 2–3 s of steps and evaluations; two 8-minute local trials spent ~44 s of theirs outside them, 3 checkpoints
included (docs/cost.md).
GPU: assumed until measured (``benchmarks/gpu_session.py``): a CUDA context and process group per worker, and
weights read from shared storage (1–15 GB for the paper's backbones)."""

MFU_PHASES = ("train", "train_compiled", "train_medium", "train_compiled_medium", "train_bf16", "train_compiled_bf16",
              "eval", "eval_medium", "eval_bf16")
"""The phases a price file's ``[mfu.gpu]`` / ``[mfu.cpu]`` may set (:data:`DEFAULT_MFU`): in (0, 1], a ``_medium``
or ``_bf16`` one in (0, 4] (bf16 arithmetic against the float32 peak)."""
BF16_VARIANTS = ("_medium", "_bf16")
"""Suffixes of the phases whose MFU is bf16 arithmetic measured against the float32 peak, so may pass 1."""


@dataclass(frozen=True)
class Table:
    """The device table in force: :data:`DEVICES` with a price file's overrides."""

    devices: dict[str, Device] = field(default_factory=lambda: dict(DEVICES))
    mfu: dict[str, dict[str, float]] = field(default_factory=lambda: {k: dict(v) for k, v in DEFAULT_MFU.items()})
    source: str = "built-in (par_ray/hardware.py)"

    def device(self, accelerator_type: str, use_gpu: bool) -> tuple[str, Device]:
        """(name, device) a trial runs on: ``CPU`` without GPUs, its accelerator type, or :data:`ANY_GPU`."""
        name = "CPU" if not use_gpu else (accelerator_type or ANY_GPU)
        if name not in self.devices:
            raise ValueError(f"train.accelerator_type: {name!r} is not in the device table "
                             f"({sorted(self.devices)}; add it with --prices)")
        return name, self.devices[name]

    def mfu_of(self, name: str, phase: str, compiled: bool = False, medium: bool = False,
               bf16: bool = False) -> float:
        """MFU of ``phase`` (``train`` or ``eval``) on device ``name``: measured if known, else the kind's most
        specific default (:data:`DEFAULT_MFU`): ``compiled`` training (``train.compile``) takes ``train_compiled``,
        ``medium`` (bf16 matmul products) a ``_medium`` variant and ``bf16`` (``train.cpu_bf16_autocast``) a
        ``_bf16`` one, where the kind has them (``bf16`` first: autocast's matmuls are bf16 whatever ``medium``)."""
        dev = self.devices[name]
        measured = dev.mfu_train if phase == "train" else dev.mfu_eval
        if measured:
            return measured
        assumed = self.mfu["cpu" if name == "CPU" else "gpu"]
        base = phase + ("_compiled" if compiled and phase == "train" else "")
        variant = "_bf16" if bf16 else "_medium" if medium else ""
        for key in (base + variant, base, phase):
            if key in assumed:
                return assumed[key]
        raise KeyError(f"no MFU for phase {phase!r} of {name!r}")

    def startup_s_of(self, name: str) -> float:
        """Seconds a trial on device ``name`` spends outside its steps and evaluations: measured
        (``Device.startup_s``) if known, else :data:`DEFAULT_STARTUP_S` of its kind."""
        measured = self.devices[name].startup_s
        return measured if measured is not None else DEFAULT_STARTUP_S["cpu" if name == "CPU" else "gpu"]


def load_table(path: str | None = None) -> Table:
    """The built-in table, with the overrides of ``path`` (``None``: none).

    ``path`` is one of:

    - a price file, TOML or JSON (by its extension; JSON otherwise)::

          [mfu.gpu]            # assumed MFU of every GPU (train, train_compiled, eval); [mfu.cpu]: CPU workers
          train = 0.3
          [devices.H100]       # any field of Device; a new key adds a device
          peak_tflops = 989.4
          mfu_train = 0.31     # measured on this device
          startup_s = 45       # seconds per trial outside its steps and evaluations (measured)
          [[devices.H100.nodes]]   # replaces the device's node prices
          node = "p5.48xlarge"
          cloud = "aws"
          gpus = 8
          on_demand = 55.04
          spot = 30.0
          region = "us-east-1"
          date = "2026-12"
          source = "AWS console"

    - the GPU check's JSON (``benchmarks/gpu_check.py``): its measured training MFU (the mean of
      ``throughput.*.mfu``) becomes ``mfu_train`` of the device it ran on (``environment``'s device name, mapped to
      Ray's accelerator type as Ray does: the first model token after "NVIDIA").

    Raises ``ValueError`` naming ``--prices`` and the problem (unreadable file, unknown field, bad value).
    """
    if path is None:
        return Table()
    try:
        with open(path, "rb") as f:
            raw = f.read()
        data = tomllib.loads(raw.decode()) if str(path).endswith(".toml") else json.loads(raw)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        how = "" if isinstance(e, OSError) else " as TOML" if str(path).endswith(".toml") else \
            " as JSON (a file not named .toml is read as JSON)"
        raise ValueError(f"--prices: cannot read {path!r}{how} ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--prices: {path!r} holds {type(data).__name__}, expected a table of devices / mfu")
    if "sections" in data and "schema" in data:  # the GPU check's output
        data = _from_gpu_check(data, path)
    table = Table(source=str(path))
    errs = [f"{k}: unknown section; sections: ['devices', 'mfu']" for k in data if k not in ("devices", "mfu")]
    mfu = data.get("mfu") or {}
    for kind, phases in (mfu.items() if isinstance(mfu, dict) else [("", mfu)]):
        for phase, value in (phases.items() if isinstance(phases, dict) else [("", phases)]):
            ok = _fraction(value) or (str(phase).endswith(BF16_VARIANTS) and _number(value) and 0 < value <= 4)
            if kind not in table.mfu or phase not in MFU_PHASES or not ok:
                errs.append(f"mfu.{kind}.{phase}: expected mfu.gpu|cpu.{'|'.join(MFU_PHASES)} in (0, 1] (a _medium "
                            f"or _bf16 one in (0, 4]), got {value!r}")
            else:
                table.mfu[kind][phase] = float(value)
    fields = set(Device.__dataclass_fields__)
    devices = data.get("devices") or {}
    if not isinstance(devices, dict):
        errs.append(f"devices: expected a table of device names, got {devices!r}")
        devices = {}
    for name, entry in devices.items():
        if not isinstance(entry, dict):
            errs.append(f"devices.{name}: expected a table of fields {sorted(fields)}, got {entry!r}")
            continue
        unknown = set(entry) - fields
        if unknown:
            errs.append(f"devices.{name}: unknown field(s) {sorted(unknown)}; fields: {sorted(fields)}")
            continue
        entry = dict(entry)
        try:
            if "nodes" in entry:
                entry["nodes"] = tuple(NodePrice(**n) for n in entry["nodes"])
            base = table.devices.get(name) or Device(memory_gb=entry.get("memory_gb", 0),
                                                    peak_tflops=entry.get("peak_tflops"))
            dev = replace(base, **entry)
        except TypeError as e:
            errs.append(f"devices.{name}: {e}")
            continue
        errs += device_errors(name, dev)
        table.devices[name] = dev
    if errs:
        raise ValueError(f"--prices {path}: " + "; ".join(errs))
    return table


def device_errors(name: str, dev: Device) -> list[str]:
    """Every problem of ``dev`` (the device ``name`` of a price file, :func:`load_table`) as ``"devices.<name>.<field>:
    message"`` strings: numbers of the right type and range (memory > 0 GB, 0 for ``CPU`` allowed; peak > 0 or
    unset; MFU in (0, 1] or unset; start-up seconds >= 0 or unset; per node type at least one device and prices
    >= 0), text where text belongs."""
    errs = []

    def check(field: str, ok: bool, expected: str, value: typing.Any) -> None:
        if not ok:
            errs.append(f"devices.{name}.{field}: expected {expected}, got {value!r}")

    low = 0 if name == "CPU" else None
    check("memory_gb", _number(dev.memory_gb) and (dev.memory_gb > 0 or dev.memory_gb == low),
          "GB per device > 0" + (" (0 for CPU workers)" if low is not None else ""), dev.memory_gb)
    check("peak_tflops", dev.peak_tflops is None or (_number(dev.peak_tflops) and dev.peak_tflops > 0),
          "TFLOP/s per device > 0", dev.peak_tflops)
    for k in ("mfu_train", "mfu_eval"):
        check(k, getattr(dev, k) is None or _fraction(getattr(dev, k)), "a fraction in (0, 1]", getattr(dev, k))
    check("startup_s", dev.startup_s is None or (_number(dev.startup_s) and dev.startup_s >= 0), "seconds >= 0",
          dev.startup_s)
    for k in ("peak_source", "mfu_source"):
        check(k, isinstance(getattr(dev, k), str), "text", getattr(dev, k))
    for i, n in enumerate(dev.nodes):
        where = f"nodes[{i}]"
        check(f"{where}.gpus", isinstance(n.gpus, int) and not isinstance(n.gpus, bool) and n.gpus >= 1,
              "devices per node, an integer >= 1", n.gpus)
        for k in ("on_demand", "spot"):
            check(f"{where}.{k}", _number(getattr(n, k)) and getattr(n, k) >= 0, "USD per node-hour >= 0",
                  getattr(n, k))
        for k in ("node", "cloud", "region", "date", "source"):
            check(f"{where}.{k}", isinstance(getattr(n, k), str), "text", getattr(n, k))
    return errs


def _number(value: typing.Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fraction(value: typing.Any) -> bool:
    return _number(value) and 0 < value <= 1


def ray_accelerator_type(device_name: str) -> str:
    """Ray's accelerator type of an NVML device name, as ``ray/_private/accelerators/nvidia_gpu.py`` derives it:
    "NVIDIA H100 80GB HBM3" → H100, "NVIDIA A100-SXM4-80GB" → A100."""
    words = device_name.replace("NVIDIA", "").split()
    return words[0].split("-")[0] if words else device_name


def _from_gpu_check(doc: dict, path: str) -> dict:
    """A GPU check's JSON (``benchmarks/gpu_check.py``) as price-file overrides: the training MFU it measured on the
    device it ran on, as this table counts MFU — its ``train_mfu`` section's FLOP/s over the device's
    :attr:`Device.peak_tflops` here (the peak the cost model divides by)."""
    sections = doc.get("sections", {})
    train = sections.get("train_mfu") or {}
    flops_per_s = (train.get("result") or {}).get("flops_per_s") if train.get("status") == "ok" else None
    env = (sections.get("environment") or {}).get("result") or {}
    device = env.get("device") or ""
    if doc.get("dry_run") or not flops_per_s or not device:
        raise ValueError(f"--prices: {path!r} is a GPU check without a measured GPU MFU (dry run, or its train_mfu "
                         f"section did not succeed)")
    name = ray_accelerator_type(str(device))
    dev = DEVICES.get(name)
    if dev is None or dev.peak_tflops is None:
        raise ValueError(f"--prices: {path!r} ran on {device!r} ({name}), which has no bf16 peak in "
                         f"par_ray/hardware.py DEVICES; known: "
                         f"{sorted(n for n, d in DEVICES.items() if d.peak_tflops)}")
    return {"devices": {name: {"mfu_train": flops_per_s / (dev.peak_tflops * 1e12),
                               "mfu_source": f"{path} (benchmarks/gpu_check.py, {doc.get('started', '?')})"}}}


# ----------------------------------------------------------------------------------------------------------------------
# Measuring this machine's CPU peak

def measure_cpu_peak(workers: int = 1, seconds: float = 2.0, size: int = 2048) -> float:
    """fp32 ``torch.mm`` FLOP/s of one core while ``workers`` cores run it at once, one thread each: the peak one CPU
    worker of a local sweep gets when ``workers`` trials (1-CPU workers) train side by side. Square ``size``³
    products, repeated for ``seconds``; the best timed batch of each core, averaged over the cores.

    Run in threads of this process with torch's intra-op threads set to 1 for the measurement (``torch.mm`` releases
    the GIL), restored after. Raises ``ValueError`` naming ``workers`` or ``seconds`` if not positive."""
    import threading
    import time

    import torch

    if workers < 1 or workers > (os.cpu_count() or 1):
        raise ValueError(f"workers: must be in 1..{os.cpu_count()} (this machine's CPUs), got {workers}")
    if not seconds > 0:
        raise ValueError(f"seconds: must be > 0, got {seconds}")
    flops = 2 * size ** 3
    best = [0.0] * workers
    start = threading.Barrier(workers)

    def run(i: int) -> None:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)
        start.wait()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            torch.mm(a, b)
            best[i] = max(best[i], flops / (time.perf_counter() - t0))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pool = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        torch.set_num_threads(threads)
    return sum(best) / workers


def cpu_peak_overrides(peak_flops: float, workers: int) -> dict:
    """A price file (:func:`load_table`) setting the ``CPU`` peak to ``peak_flops`` (FLOP/s per worker), measured
    with ``workers`` cores busy."""
    import datetime
    import platform

    where = _cpu_model() or platform.machine()
    when = datetime.date.today().isoformat()
    return {"devices": {"CPU": {"peak_tflops": peak_flops / 1e12, "peak_source": (
        f"fp32 torch.mm at 2048^3 per core with {workers} core(s) busy, measured {when} on {where} "
        f"(python -m par_ray.hardware --measure-cpu)")}}}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m par_ray.hardware`` argument parser, built without running anything (grouped flags, example)."""
    ap = argparse.ArgumentParser(
        allow_abbrev=False,  # a flag's prefix is an error, never another flag
        prog="python -m par_ray.hardware", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure this machine's CPU peak and write it as a price file for the sweeps' --prices.",
        epilog="The local preset's cost plan (--dry-run) assumes a CPU peak per core; CPUs differ 2x and more,\n"
               "so measure yours (about 2 s) and pass the file on.\n"
               "\nexample:\n  python -m par_ray.hardware --measure-cpu --out cpu.json\n"
               "  python sweeps/backbone_scaling.py --preset local --prices cpu.json --dry-run")
    what = ap.add_argument_group("what to measure")
    what.add_argument("--measure-cpu", action="store_true", required=True,
                      help="measure the fp32 matmul peak per core")
    what.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                      help="cores busy at once, one thread each: the local sweep's trials side by side (default: "
                           "all CPUs, as a local sweep of 1-CPU trials runs them)")
    what.add_argument("--seconds", type=float, default=2.0, help="measuring time (default 2)")
    out = ap.add_argument_group("output")
    out.add_argument("--out", help="write the price file here, its folder made if need be (default: print it)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """``python -m par_ray.hardware --measure-cpu [--workers N] [--out FILE]``: this machine's CPU peak as a price
    file for the sweeps' ``--prices``."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.out:  # before measuring: its folder is made (runs/cpu.json in a fresh clone), a folder is no file
        if os.path.isdir(args.out) or args.out.endswith(os.sep):
            ap.error(f"--out: {args.out} is a folder; name the price file, e.g. {os.path.join(args.out, 'cpu.json')}")
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        except OSError as e:
            ap.error(f"--out: cannot make the folder of {args.out} ({e.strerror})")
    try:
        peak = measure_cpu_peak(args.workers, args.seconds)
    except ValueError as e:  # "workers: …" / "seconds: …": the flag of that name
        ap.error(f"--{e}")
    text = json.dumps(cpu_peak_overrides(peak, args.workers), indent=2) + "\n"
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            print(f"error: --out: cannot write {args.out} ({e.strerror})", file=sys.stderr)
            return 1
        print(f"CPU peak {peak / 1e9:.1f} GFLOP/s per core with {args.workers} busy: {args.out}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    exit_with(main)
