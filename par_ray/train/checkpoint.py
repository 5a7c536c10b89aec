"""Load the model of any run's checkpoint or final export on one process, without a GPU or a process group.

    from par_ray.model import load_trained
    trained = load_trained("runs/x")          # a run directory (its final/), or any checkpoint directory
    trained.model(input_ids_BT, read_positions_Q, R, read="last")

A checkpoint directory is what ``Engine.save`` writes, in its strategy's format (``par_ray.train.strategies``), plus
``extra.json`` with the step and the flat config that trained it. Each format is read back into a full, unsharded
float32 state dict of the plain ``LoopedLM``:

=========  =====================================  ============================================================
strategy   files                                  read with
=========  =====================================  ============================================================
ddp        ``state.pt`` (rank 0's full copy)      ``torch.load``
fsdp       ``.metadata`` + ``__{rank}_0.distcp``  ``torch.distributed.checkpoint.load`` without a process group
                                                  (DCP's single-process mode gathers every rank's shards)
deepspeed  ``ds/`` + ``latest`` (ZeRO 1/2/3)      DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``,
                                                  which merges every rank's fp32 partitions on the CPU
=========  =====================================  ============================================================

The format is recognised by its files, so a directory needs no other label; the config comes from ``extra.json``
(or, for exports that predate it, the run's ``result.json``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from par_ray.config import TrialConfig, from_flat

DEEPSPEED_TAG = "ds"
"""The tag ``DeepSpeedEngine.save`` writes under (``par_ray.train.strategies``)."""


@dataclass
class Trained:
    """A trained looped model, ready for inference on the CPU."""

    model: torch.nn.Module
    """The plain ``LoopedLM`` in eval mode, float32, on the CPU."""
    config: TrialConfig
    """The config that trained it."""
    step: int
    """Optimizer steps behind these weights (-1 if the checkpoint does not say)."""
    format: str
    """``ddp``, ``fsdp`` or ``deepspeed``: the checkpoint format it was read from."""


def checkpoint_format(directory: str) -> str:
    """``ddp``, ``fsdp`` or ``deepspeed`` from the files in ``directory``; ``FileNotFoundError`` naming what was
    looked for when it holds none of them."""
    if os.path.isfile(os.path.join(directory, "state.pt")):
        return "ddp"
    if os.path.isfile(os.path.join(directory, ".metadata")):
        return "fsdp"
    if os.path.isdir(os.path.join(directory, DEEPSPEED_TAG)) or os.path.isfile(os.path.join(directory, "latest")):
        return "deepspeed"
    raise FileNotFoundError(f"{directory}: no model checkpoint here (looked for state.pt (ddp), .metadata (fsdp DCP) "
                            f"and {DEEPSPEED_TAG}/ (DeepSpeed ZeRO))")


def resolve_checkpoint_dir(path: str) -> str:
    """``path`` itself if it is a checkpoint directory, else its ``final/`` export (``python -m par_ray.train``)."""
    for candidate in (path, os.path.join(path, "final")):
        if os.path.isdir(candidate):
            try:
                checkpoint_format(candidate)
                return candidate
            except FileNotFoundError:
                continue
    raise FileNotFoundError(f"{path}: neither a checkpoint directory nor a run directory with a final/ export")


def stored_config(directory: str) -> TrialConfig:
    """The config saved with a checkpoint (``extra.json``), else the run's ``result.json`` beside ``final/``."""
    extra = os.path.join(directory, "extra.json")
    if os.path.isfile(extra):
        with open(extra) as f:
            flat = json.load(f).get("config")
        if flat:
            return from_flat(flat)
    result = os.path.join(os.path.dirname(os.path.abspath(directory)), "result.json")
    if os.path.isfile(result):
        with open(result) as f:
            return from_flat(json.load(f)["config"])
    raise FileNotFoundError(f"{directory}: no config (extra.json has none and there is no ../result.json)")


def model_state_dict(directory: str, template: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full model state dict stored in ``directory``, whatever the strategy that wrote it.

    Args:
        template: a plain model of the right architecture; DCP loads into copies of its tensors.
    Raises:
        FileNotFoundError: ``directory`` holds no known format.
    """
    fmt = checkpoint_format(directory)
    if fmt == "ddp":
        return torch.load(os.path.join(directory, "state.pt"), map_location="cpu", weights_only=True)["model"]
    if fmt == "fsdp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import DefaultLoadPlanner

        # The optimizer state in the same checkpoint is not requested, hence a partial load.
        state = {"model": {k: v.detach().clone() for k, v in template.state_dict().items()}}
        dcp.load(state, checkpoint_id=directory, planner=DefaultLoadPlanner(allow_partial_load=True))
        return state["model"]
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(directory, tag=DEEPSPEED_TAG)


def load_trained(path: str) -> Trained:
    """The model of a run directory (its ``final/`` export) or of any checkpoint directory, on the CPU.

    Works for every strategy's format (ddp ``state.pt``, FSDP2 DCP shards, DeepSpeed ZeRO-1/2/3 partitions) on one
    process, without a GPU or a process group. Pretrained backbones rebuild their parent from
    ``backbone.pretrained`` first (its weights are then replaced by the checkpoint's).

    Raises:
        FileNotFoundError: no checkpoint or no stored config at ``path``.
        RuntimeError: the checkpoint's tensors do not fit the config's model (``load_state_dict``, strict).
    """
    from par_ray.cot import extra_vocab
    from par_ray.halting import model_vocab_size
    from par_ray.model.looped import build_looped
    from par_ray.objectives import dense_classes
    from par_ray.stages import uses_halting
    from par_ray.tasks import build_task

    directory = resolve_checkpoint_dir(path)
    cfg = stored_config(directory)
    task = build_task(cfg.task)
    # the vocabulary the training loop built: task tokens, halting tokens, dense state classes, CoT STEP/END
    vocab = (model_vocab_size(task, cfg.backbone, uses_halting(cfg)) + dense_classes(task, cfg.recipe)
             + extra_vocab(cfg.recipe, cfg.backbone))
    model = build_looped(cfg.backbone, cfg.recipe, vocab_size=vocab)
    wanted = model.state_dict().keys()
    # DeepSpeed's merged state may also list buffers the module does not save; every saved key must be present.
    state = {k: v for k, v in model_state_dict(directory, model).items() if k in wanted}
    model.load_state_dict(state, strict=True)
    model.eval()
    step = -1
    if os.path.isfile(os.path.join(directory, "extra.json")):
        with open(os.path.join(directory, "extra.json")) as f:
            step = int(json.load(f).get("step", -1))
    return Trained(model=model, config=cfg, step=step, format=checkpoint_format(directory))


def evaluate_trained(trained: Trained, eval_cfg=None) -> dict:
    """Accuracy by depth, d50 and G of a loaded model on this process (``par_ray.evaluation``, paper §4.2).

    Args:
        eval_cfg: an ``EvalConfig``; default the trial's own, so the numbers match the run's final report.
    Returns:
        ``{"acc": {d: full-state acc}, "acc_query": {d: per-query acc}, "d50": int | None, "G": float,
        "G_censored": bool}``.
    """
    from par_ray.evaluation import accuracy_by_depth, extrapolation
    from par_ray.tasks import build_task

    cfg = trained.config
    eval_cfg = eval_cfg or cfg.eval
    task = build_task(cfg.task)
    acc = accuracy_by_depth(trained.model, task, eval_cfg, cfg.recipe.ops_per_iteration, torch.device("cpu"))
    ex = extrapolation({d: v["acc"] for d, v in acc.items()}, task.full_state_chance, cfg.task.train_depth)
    return {"acc": {d: v["acc"] for d, v in acc.items()}, "acc_query": {d: v["acc_query"] for d, v in acc.items()},
            "d50": ex.d50, "G": ex.G, "G_censored": ex.censored, "chance": task.full_state_chance}
