"""Parallel strategies: the only module that knows DDP, FSDP2 or DeepSpeed exist (STYLE rule 10).

Each strategy is one function ``(model, train_cfg, world) -> Engine``. The training loop calls :func:`prepare` once
and then only talks to the :class:`Engine` interface (forward via ``engine.model``, ``backward``, ``step``,
``save``/``load``, ``all_reduce_sum``); it never branches on the strategy name.

Devices and precision: on GPU, bf16 autocast with NCCL; on CPU, float32 with gloo (bf16 autocast on CPU is slow and
changes the numbers the CPU parity tests compare).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class World:
    """Where this process sits: rank, world size and device."""

    rank: int = 0
    size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_distributed(self) -> bool:
        return self.size > 1 and dist.is_available() and dist.is_initialized()


def lr_lambda(train_cfg) -> Callable[[int], float]:
    """Linear warm-up over ``warmup_steps``, then cosine decay to 10 % of the peak by ``steps``."""
    warm, total = train_cfg.warmup_steps, train_cfg.steps

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, total - warm))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


class Engine:
    """A prepared model and its optimizer: what the loop drives, whatever the strategy.

    Attributes:
        model: the module to call (wrapped by the strategy; its ``forward`` is ``LoopedLM.iterate``).
        raw: the unwrapped ``LoopedLM`` (for evaluation and inspection).
        device: where inputs go.
    """

    def __init__(self, model: nn.Module, raw: nn.Module, optimizer, scheduler, train_cfg, world: World):
        self.model, self.raw, self.optimizer, self.scheduler = model, raw, optimizer, scheduler
        self.train_cfg, self.world, self.device = train_cfg, world, world.device

    def autocast(self):
        """bf16 autocast on CUDA, nothing on CPU."""
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        """Clip, optimizer step, LR schedule, zero grads. Returns the global gradient norm before clipping."""
        clip = self.train_cfg.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over ranks (identity on one rank)."""
        if self.world.is_distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    # Checkpoints: a directory; which ranks write what is the strategy's business.
    def save(self, directory: str, extra: dict) -> None:
        """Write model + optimizer + scheduler state and ``extra`` (JSON) into ``directory`` (rank 0 only here)."""
        if self.world.rank == 0:
            torch.save({"model": self.raw.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict()}, os.path.join(directory, "state.pt"))
            with open(os.path.join(directory, "extra.json"), "w") as f:
                json.dump(extra, f)

    def load(self, directory: str) -> dict:
        """Restore what :meth:`save` wrote; returns ``extra``."""
        state = torch.load(os.path.join(directory, "state.pt"), map_location=self.device, weights_only=True)
        self.raw.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        with open(os.path.join(directory, "extra.json")) as f:
            return json.load(f)


def _adamw(params, train_cfg):
    return torch.optim.AdamW(params, lr=train_cfg.lr, weight_decay=train_cfg.weight_decay, betas=(0.9, 0.95))


def ddp(model: nn.Module, train_cfg, world: World) -> Engine:
    """DistributedDataParallel (plain module on one rank).

    Iterations before the gradient window run under ``no_grad``, so DDP's hooks only see the window. The untied
    baseline leaves core copies past R unused in a step, hence ``find_unused_parameters`` for it.
    """
    model = model.to(world.device)
    wrapped = model
    if world.is_distributed:
        wrapped = nn.parallel.DistributedDataParallel(
            model, device_ids=[world.device.index] if world.device.type == "cuda" else None,
            find_unused_parameters=not getattr(model, "tied", True),
        )
    opt = _adamw(model.parameters(), train_cfg)
    return Engine(wrapped, model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(train_cfg)), train_cfg, world)


STRATEGIES: dict[str, Callable[[nn.Module, object, World], Engine]] = {"ddp": ddp}


def prepare(model: nn.Module, train_cfg, world: World) -> Engine:
    """Wrap ``model`` with ``train_cfg.strategy``; ``ValueError`` naming ``train.strategy`` if unknown."""
    if train_cfg.strategy not in STRATEGIES:
        raise ValueError(f"train.strategy: {train_cfg.strategy!r} is not one of {sorted(STRATEGIES)}")
    return STRATEGIES[train_cfg.strategy](model, train_cfg, world)
