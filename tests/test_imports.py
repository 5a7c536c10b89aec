"""Import structure: the layering contracts (import-linter), and which processes import model code.

The layers (sweeps → par_ray.sweep → analysis → train → … → trial → registries → config), the rule that
``par_ray.config`` imports nothing from par_ray and the absence of import cycles are import-linter contracts in
pyproject.toml; :func:`test_import_contracts_hold` runs ``lint-imports`` on them (CI runs it too), and
:func:`test_every_module_is_in_a_layer` keeps a new module from escaping the layers contract.

What import-linter cannot express is which *process* imports what: only Ray Train workers build a model, so only they
import transformers' model code, DeepSpeed and par_ray's model modules (docs/experiments.md §12: that import takes
tens of seconds on a busy 2-core machine).

A Tune trial driver imports ``par_ray.sweep.run`` (its function's module), resolves its trial and builds the
``TorchTrainer`` (``par_ray.train.trainer``); a Ray Train controller imports ``par_ray.train.loop`` to unpickle
``train_loop_per_worker`` and ``par_ray.train.trainer`` for the trainer's callbacks. Each step is checked in one fresh
subprocess (this process has imported everything already), ending with a worker's model import as a control that the
check can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MODEL_MODULES = ("transformers.models", "deepspeed", "par_ray.model.backbones", "par_ray.model.looped")
"""Modules (and their submodules) imported only where a model is built. ``par_ray.model.registry``, the backbone
sizes as data, is allowed: config validation and the sweep CLI read it."""

_SCRIPT = """
import json, sys

def model_modules():
    return sorted(m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in {prefixes!r}))

seen = {{}}
import par_ray.sweep.run
seen["trial driver: import par_ray.sweep.run"] = model_modules()
import par_ray.train.loop, par_ray.train.trainer
seen["controller: import par_ray.train.loop, par_ray.train.trainer"] = model_modules()

import ray
from par_ray.sweep.spec import resolve
from par_ray.train.trainer import build_trainer
cfg = resolve({{"preset": "local", "backbone.name": "tiny-qwen3", "task.name": "swap_s5", "recipe": "par"}})
build_trainer(cfg, name="trial_imports", storage_path=sys.argv[1])
assert not ray.is_initialized(), "building the trainer started Ray"
seen["trial driver: resolve a local trial, build_trainer"] = model_modules()

import par_ray.model.looped
seen["worker: import par_ray.model.looped"] = model_modules()
print(json.dumps(seen))
"""


def test_trial_driver_and_controller_import_no_model_code(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT.format(prefixes=MODEL_MODULES), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    *driver_and_controller, (worker, worker_modules) = seen.items()
    for step, modules in driver_and_controller:
        assert modules == [], f"{step} imported model code: {modules}"
    assert "transformers.models" in worker_modules and "par_ray.model.looped" in worker_modules, worker_modules


def test_the_training_loop_imports_the_ray_train_module_it_calls():
    """``train_loop_per_worker`` calls ``ray.train.torch.get_device()``: the loop imports that module itself, not
    through whichever other module (the trainer, Ray's Torch backend) happened to import it first."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    code = "import ray.train, par_ray.train.loop; print(hasattr(ray.train, 'torch'))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split()[-1] == "True", proc.stdout + proc.stderr[-2000:]


# --------------------------------------------------------------------------------------------------------------------
# Layering (import-linter contracts in pyproject.toml)


def _contracts() -> list[dict]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]["contracts"]


def test_import_contracts_hold():
    """``lint-imports``: the layers contract, config at the bottom importing nothing from par_ray, no cycles."""
    proc = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                           "sys.exit(lint_imports(no_cache=True, no_logo=True))"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    names = {c["name"] for c in _contracts()}
    types = {c["type"] for c in _contracts()}
    assert {"layers", "forbidden", "acyclic_siblings"} <= types, names


def _layer_modules() -> set[str]:
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    # "a | b" independent siblings, "a : b" siblings, "(a)" optional (a module another change adds)
    return {m.strip().strip("()") for layer in layers["layers"] for m in layer.replace(":", "|").split("|")}


def _package_modules(package: str) -> set[str]:
    """Every module and subpackage of ``package`` (a directory under the repository root), dotted."""
    out = set()
    for path in (ROOT / package).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_every_module_is_in_a_layer():
    """Each par_ray module is a layer of the contract or inside one (``par_ray.train.loop`` is in ``par_ray.train``),
    or a package whose children are (``par_ray.model``): a new module must be placed in pyproject.toml's layers."""
    listed = _layer_modules()
    missing = sorted(m for m in _package_modules("par_ray") - {"par_ray"}
                     if not any(m == layer or m.startswith(layer + ".") or layer.startswith(m + ".")
                                for layer in listed))
    assert not missing, f"add these modules to the layers contract in pyproject.toml: {missing}"


@pytest.mark.parametrize("module", ["par_ray.config"])
def test_bottom_layer_imports_nothing_from_the_project(module):
    """The contract's own claim, read from the source: no ``par_ray`` / ``analysis`` / ``sweeps`` import anywhere in
    ``module`` (at the top or inside a function)."""
    source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
    bad = [line for line in source.splitlines()
           if line.strip().startswith(("from par_ray", "import par_ray", "from analysis", "from sweeps"))]
    assert not bad, bad


_NO_CLUSTER_STACK = """
import importlib, importlib.abc, sys

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"ray", "deepspeed", "mlflow", "polars", "optuna"}:
            raise ImportError(f"{name} is blocked: the GPU check machine does not have it")

sys.meta_path.insert(0, Blocked())
for module in ("par_ray.model.looped", "par_ray.model.backbones", "par_ray.train.step", "par_ray.train.strategies",
               "par_ray.evaluation", "par_ray.planner", "par_ray.prompts", "par_ray.weights"):
    importlib.import_module(module)
sys.path.insert(0, "benchmarks")
importlib.import_module("gpu_check")
"""


def test_model_step_and_evaluation_import_without_ray_deepspeed_mlflow_or_polars():
    """The GPU check machine has torch and transformers only: par_ray's model, training step, evaluation, planner
    and benchmarks/gpu_check.py must import with Ray, DeepSpeed, MLflow, polars and Optuna blocked (a
    ``sys.meta_path`` finder that refuses them, in a fresh process)."""
    r = subprocess.run([sys.executable, "-c", _NO_CLUSTER_STACK], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    control = subprocess.run([sys.executable, "-c", _NO_CLUSTER_STACK + "\nimport par_ray.train.loop\n"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert control.returncode != 0 and "ray is blocked" in control.stderr  # the blocker can fail the check
