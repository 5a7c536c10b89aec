"""The command line every ``sweeps/*.py`` script shares: flags → :class:`~par_ray.sweep.spec.Options` → run.

Bad input exits with status 2 and one line naming the flag (argparse) or the field (:class:`SweepConfigError`).
"""

from __future__ import annotations

import argparse
import os
import sys
import typing

from par_ray import presets
from par_ray.config import parse_overrides
from par_ray.model.registry import BACKBONES
from par_ray.accelerators import GPU_MEMORY_GB
from par_ray.sweep.run import run_sweep
from par_ray.sweep.spec import DEFAULT_STORAGE, PRESET_CHOICES, Options, SweepConfigError, SweepSpec


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 0,1,2, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"seeds must be >= 0, got {text!r}")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"duplicate seeds in {text!r}")
    return values


def _backbones(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in BACKBONES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown backbone(s) {unknown or [text]}; choose from {sorted(BACKBONES)}")
    return names


def _gpu_types(text: str) -> tuple[str, ...]:
    types = tuple(x.strip() for x in text.split(",") if x.strip())
    try:
        presets.gpu_targets(types)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--gpu-types: ")) from None
    if not types:
        raise argparse.ArgumentTypeError(f"expected comma-separated GPU types like L40S,H100, got {text!r}")
    return types


def _usd(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a dollar amount >= 0 like 500, got {text!r}")
    return value


def build_parser(spec: SweepSpec) -> argparse.ArgumentParser:
    """The argument parser of ``python sweeps/<spec.name>.py``, built without running anything: the common flags in
    groups, the sweep's one-line description and an example (``tests/test_docs_commands.py`` parses the docs'
    commands with it)."""
    dry = f"python sweeps/{spec.name}.py --dry-run"
    smoke = f"python sweeps/{spec.name}.py --smoke-test --storage runs/smoke"
    width = len(smoke) + 2
    p = argparse.ArgumentParser(
        allow_abbrev=False,  # a flag's prefix is an error, never another flag
        prog=f"python sweeps/{spec.name}.py", description=spec.description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Without a GPU in the Ray cluster it runs the local preset on CPU. Results, the MLflow store and\n"
               "the analysis go under --storage; --resume continues an interrupted sweep there.\n"
               f"\nexamples:\n  {dry:<{width}}# the trials, their resources and cost; starts nothing\n"
               f"  {smoke:<{width}}# a few steps per trial: the whole pipeline in minutes")
    what = p.add_argument_group("what to run")
    what.add_argument("--preset", choices=PRESET_CHOICES, default="auto",
                      help="auto (default): paper if the Ray cluster has a GPU, else local")
    what.add_argument("--seeds", type=_ints, default=None,
                      help=f"comma-separated seeds (default {','.join(map(str, spec.seeds))})")
    what.add_argument("--backbones", type=_backbones, default=None,
                      help="comma-separated backbone names (default: the preset's)")
    what.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", dest="overrides",
                      help="override a config field of every trial, e.g. --set train.lr=3e-4 (repeatable; recorded "
                           "in the parent run; --resume must repeat the same ones)")
    what.add_argument("--smoke-test", action="store_true", help="a few steps per trial, tiny evaluation")
    if spec.search is not None:
        what.add_argument("--metric", default=None,
                          help=f"metric to optimize (default {spec.search.metric}): G, G_interp (the interpolated G), "
                               "G_lo, G_interp_lo (their lower 95 %% bounds), acc_longest, acc_d<D>, loss …")
        what.add_argument("--mode", choices=("max", "min"), default=None,
                          help="maximise or minimise the metric (default: its direction: min for loss, max for G "
                               "and accuracies)")
        what.add_argument("--num-samples", type=int, default=None,
                          help=f"trials (default {spec.search.num_samples})")
    where = p.add_argument_group("where the results go")
    where.add_argument("--storage", default=None,
                       help=f"directory or bucket URI for Tune/Train results, the default MLflow store and the "
                            f"analysis (default {DEFAULT_STORAGE.format(name=spec.name)}; absolute inside a Ray job)")
    where.add_argument("--mlflow-uri", default=None,
                       help="tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///<storage>/mlflow.db)")
    where.add_argument("--resume", action="store_true", help="continue the sweep stored under --storage")
    gpu = p.add_argument_group("GPU cluster (paper preset)")
    gpu.add_argument("--gpu-types", type=_gpu_types, default=(),
                     help=f"paper preset: the Ray accelerator types trials may run on, cheapest first, e.g. "
                          f"L40S:4,H100 (TYPE:N = at most N GPUs per trial, one node's worth); each trial takes the "
                          f"first type and the fewest GPUs its planned memory fits. Types: {', '.join(GPU_MEMORY_GB)}. "
                          f"Default: {presets.PAPER_GPU_TYPE}. With --preset auto it selects paper")
    gpu.add_argument("--model-dir", default=os.environ.get("PAR_RAY_MODEL_DIR") or None, metavar="DIR",
                     help="paper preset: where the pretrained parents are (default $PAR_RAY_MODEL_DIR, set by "
                          "cluster/setup_node.sh), looked for before the hub cache ($HF_HOME): "
                          "DIR/<hub id> (hf download ID --local-dir DIR/ID) or a hub cache (hf download ID --cache-dir "
                          "DIR); the same path on every node. Nothing is downloaded: a missing backbone is an error "
                          "before the sweep starts")
    cost = p.add_argument_group("plan and cost")
    cost.add_argument("--dry-run", action="store_true",
                      help="print the trials, their resources, planned memory and cost, then exit")
    cost.add_argument("--prices", default=None, metavar="FILE",
                      help="device table overrides: a TOML/JSON price file (peaks, MFU, $/node-hour) or the GPU "
                           "check's JSON (its measured MFU); default: par_ray/hardware.py's table")
    cost.add_argument("--max-usd", type=_usd, default=None, metavar="X",
                      help="refuse to start (exit 2, nothing started) when the planned on-demand cost of the sweep "
                           "exceeds X dollars, or cannot be planned (a trial without a price); the dry run prints the "
                           "plan, then refuses the same way. inf: no cap, but every trial must be priced")
    return p


def parse_args(spec: SweepSpec, argv: typing.Sequence[str] | None = None) -> Options:
    """The common flags (:func:`build_parser`) → :class:`Options`; argparse exits with status 2 and one line naming
    the bad flag."""
    p = build_parser(spec)
    a = p.parse_args(argv)
    if getattr(a, "num_samples", None) is not None and a.num_samples < 1:
        p.error(f"argument --num-samples: must be >= 1, got {a.num_samples}")
    try:
        overrides = parse_overrides(a.overrides)
    except ValueError as e:
        p.error(str(e))
    return Options(preset=a.preset, seeds=a.seeds, backbones=a.backbones, storage=a.storage, mlflow_uri=a.mlflow_uri,
                   dry_run=a.dry_run, resume=a.resume, smoke_test=a.smoke_test, metric=getattr(a, "metric", None),
                   mode=getattr(a, "mode", None), num_samples=getattr(a, "num_samples", None), gpu_types=a.gpu_types,
                   overrides=overrides,
                   model_dir=a.model_dir, prices=a.prices, max_usd=a.max_usd)


def main(spec: SweepSpec, argv: typing.Sequence[str] | None = None) -> int:
    """Entry point of a ``sweeps/*.py`` script: parse the common flags, run; bad input → one line, exit status 2; a
    Ctrl-C that Tune did not take (before its trials start, or a second one) → one line, exit status 130."""
    opts = parse_args(spec, argv)
    try:
        return run_sweep(spec, opts)
    except KeyboardInterrupt:  # run_sweep has printed the --resume hint if the sweep had started
        print("\ninterrupted", file=sys.stderr)
        return 130
    except SweepConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, an unreachable store: the runs are closed already (run_sweep)
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        return 1


def os_error_line(e: OSError) -> str:
    """One line for an ``OSError``: what failed and on which path (``No space left on device: /runs/x/...``)."""
    what = e.strerror or str(e) or type(e).__name__
    path = e.filename if e.filename is not None else ""
    return f"{what}: {path}" if path else what
