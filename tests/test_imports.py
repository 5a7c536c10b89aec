"""Only Ray Train workers build a model, so only they import transformers' model code, DeepSpeed and par_ray's model
modules (docs/experiments.md §12: that import takes tens of seconds on a busy 2-core machine).

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
from pathlib import Path

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
