"""Optimizer and learning-rate schedule of every strategy: AdamW with a linear warm-up and a cosine decay.

ddp and fsdp build torch's ``AdamW`` and ``LambdaLR`` here (:func:`build_optimizer`, :func:`build_scheduler`); the
DeepSpeed config (``par_ray.train.strategies.deepspeed_config``) takes the same hyper-parameters from
:func:`adamw_params` and the same schedule from :func:`build_scheduler`, so every strategy runs the same math.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch

ADAM_BETAS = (0.9, 0.95)
"""AdamW (beta1, beta2)."""
ADAM_EPS = 1e-8
"""AdamW epsilon."""


def adamw_params(train_cfg) -> dict:
    """AdamW's hyper-parameters from ``TrainConfig``: ``lr``, ``betas``, ``eps``, ``weight_decay``."""
    return {"lr": train_cfg.lr, "betas": ADAM_BETAS, "eps": ADAM_EPS, "weight_decay": train_cfg.weight_decay}


def build_optimizer(params: Iterable[torch.nn.Parameter], train_cfg) -> torch.optim.AdamW:
    """torch's AdamW over ``params`` (:func:`adamw_params`)."""
    return torch.optim.AdamW(params, **adamw_params(train_cfg))


def lr_lambda(train_cfg) -> Callable[[int], float]:
    """Linear warm-up over ``warmup_steps``, then cosine decay to 10 % of the peak by ``steps``."""
    warm, total = train_cfg.warmup_steps, train_cfg.steps

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, total - warm))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def build_scheduler(optimizer, train_cfg) -> torch.optim.lr_scheduler.LambdaLR:
    """The LR schedule of :func:`lr_lambda` on ``optimizer``, stepped once per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(train_cfg))
