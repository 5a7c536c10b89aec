"""Checkpoints of every strategy: what each writes, how it reads back into training, and how any of them loads as a
plain model on one process, without a GPU or a process group.

    from par_ray.train.checkpoint import load_trained
    trained = load_trained("runs/x")          # a run directory (its final/), or any checkpoint directory
    trained.model(input_ids_BT, read_positions_Q, R, read="last")

A checkpoint is a directory per report. Each strategy's engine (``par_ray.train.strategies``) names its format
(``Engine.checkpoint``, one of :data:`FORMATS`); ``Engine.save`` / ``Engine.load`` call that format's functions here,
on every rank. Rank 0 writes ``extra.json`` (:data:`EXTRA_FILE`: the loop's step, time and flat config) for every
format. Every rank reports its own directory; Ray Train V2 merges them into one checkpoint (file names never collide:
DCP and DeepSpeed name files by rank, and only rank 0 writes the rest).

- ddp (:data:`FULL_STATE`): rank 0 writes ``state.pt``, one full copy of model, optimizer and scheduler (+
  ``"ema"``); every rank resumes from it; read as a plain model with ``torch.load``.
- fsdp (:data:`DCP_SHARDS`): torch.distributed.checkpoint, every rank its shards ``__{rank}_0.distcp`` (model,
  optimizer named by FQN, ``"ema"``), rank 0 ``.metadata`` and ``scheduler.pt``; resumes on any world size (DCP
  reshards); read as a plain model with ``dcp.load`` without a process group (DCP's single-process mode gathers
  every rank's shards).
- deepspeed (:data:`ZERO_PARTITIONS`): DeepSpeed's ``save_checkpoint`` under ``ds/`` + ``latest`` (ZeRO 1/2/3
  partitions per rank, module states), rank 0 ``ema.pt``; resumes on the same world size; read as a plain model
  with DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``, which merges every rank's fp32 partitions on the
  CPU.

The **export** (:data:`EXPORT`, ``python -m par_ray.train``'s ``final/``, :func:`export_model`) is what a user loads
for analysis and probes: the looped model's weights only, float32 as trained (no optimizer, scheduler or EMA state:
those live only in the resumable checkpoints above), in ``model.safetensors``, plus ``extra.json`` (step and flat
trial config, also in the file's metadata). Every strategy writes the same file: rank 0 gathers the full weights
(ddp: its replica; fsdp: ``get_model_state_dict(full_state_dict=True)``; deepspeed: every parameter's fp32 master
copy, ``safe_get_full_fp32_param``). It is readable without par_ray::

    from safetensors import safe_open
    with safe_open("runs/x/final/model.safetensors", "pt") as f:
        f.metadata()["par_ray.config"], f.get_tensor("embed_tokens.weight")

Tied weights are stored once (safetensors refuses shared tensors); ``metadata()["par_ray.aliases"]`` (JSON) maps each
dropped name to the name it shares storage with (``lm_head.weight`` → ``embed_tokens.weight`` for a parent with tied
word embeddings).

The format is recognised by its files (:func:`checkpoint_format`), so a directory needs no other label; the config
comes from ``extra.json`` (or, for exports that predate it, the run's ``result.json``). Older ``final/`` directories
(the strategy's full checkpoint, optimizer state included) still load: they are checkpoints of the formats above.
"""

from __future__ import annotations

import hashlib
import json
import os
import typing
from dataclasses import dataclass
from typing import Callable

import torch

from par_ray.config import TrialConfig, from_flat
from par_ray.prompts import render
from par_ray.tasks import build_task
from par_ray.trial import resolve
from par_ray.weights import parent_tokenizer, resolved_backbone

EXTRA_FILE = "extra.json"
"""The loop's bookkeeping (step, time, flat config), JSON, written by rank 0 beside every format's state."""
STATE_FILE = "state.pt"
"""ddp: rank 0's full copy (``{"model", "optimizer", "scheduler"[, "ema"]}``)."""
DCP_METADATA = ".metadata"
"""fsdp: the DCP checkpoint's metadata file (rank 0); the shards are ``__{rank}_0.distcp``."""
SCHEDULER_FILE = "scheduler.pt"
"""fsdp: the LR scheduler's state (rank 0; DCP holds model, optimizer and EMA shards)."""
DEEPSPEED_TAG = "ds"
"""deepspeed: the tag ``save_checkpoint`` writes under (a directory of that name)."""
DEEPSPEED_LATEST = "latest"
"""deepspeed: the file naming the newest tag."""
EMA_FILE = "ema.pt"
"""deepspeed: rank 0's full copy of the EMA teacher (not partitioned under ZeRO)."""
EXPORT_FILE = "model.safetensors"
"""The export's weights (:func:`export_model`): safetensors, float32, tied weights stored once."""
EXPORT = "safetensors"
"""The export's format name (:attr:`Trained.format`, :func:`checkpoint_format`)."""
RESULT_FILE = "result.json"
"""``python -m par_ray.train``'s result beside ``final/`` (the config of exports older than ``extra.json``'s)."""


MANIFEST_KEY = "files"
"""``extra.json``'s manifest: ``{relative path: bytes}`` of every file rank 0 wrote into the checkpoint before it."""
CHECKSUM_KEY = "sha256"
"""``extra.json``'s content checksums: ``{relative path: SHA-256 hex digest}`` of the same files."""


def sha256_of(f: typing.BinaryIO) -> str:
    """SHA-256 hex digest of what is left to read in the binary file object ``f`` (``hashlib``, 1 MiB at a time)."""
    digest = hashlib.sha256()
    for chunk in iter(lambda: f.read(2**20), b""):
        digest.update(chunk)
    return digest.hexdigest()


def write_extra(directory: str, extra: dict, rank: int) -> None:
    """Rank 0 writes the loop's bookkeeping (``extra``, JSON) beside the strategy's state: last and atomically (a
    temporary file, then a rename), so a checkpoint folder with an ``extra.json`` is complete (a full disk or a
    killed worker leaves none; ``par_ray.train.trainer.repair_run_storage`` relies on it). It also lists the size
    (:data:`MANIFEST_KEY`) and the SHA-256 (:data:`CHECKSUM_KEY`) of every file rank 0 wrote there: Ray Train copies
    the folder to storage file by file, not atomically, and on a full disk a copy can stop mid-file after
    ``extra.json`` arrived (the sizes tell); a file damaged in place keeps its size (the checksum tells)."""
    if rank == 0:
        path = os.path.join(directory, EXTRA_FILE)
        files, checksums = {}, {}
        for root, _, names in os.walk(directory):
            for name in names:
                full = os.path.join(root, name)
                rel = os.path.relpath(full, directory)
                if rel != EXTRA_FILE and not rel.endswith(".tmp"):
                    files[rel] = os.path.getsize(full)
                    with open(full, "rb") as f:
                        checksums[rel] = sha256_of(f)
        with open(path + ".tmp", "w") as f:
            json.dump({**extra, MANIFEST_KEY: files, CHECKSUM_KEY: checksums}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)


def save_atomic(obj, path: str) -> None:
    """``torch.save`` to a temporary file, then a rename: ``path`` is whole or absent, never cut short."""
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def read_extra(directory: str) -> dict:
    """The ``extra`` dict :func:`write_extra` stored in ``directory`` (its file manifest left out)."""
    with open(os.path.join(directory, EXTRA_FILE)) as f:
        extra = json.load(f)
    extra.pop(MANIFEST_KEY, None)
    extra.pop(CHECKSUM_KEY, None)
    return extra


def _torch_load(path: str, map_location=None):
    """``torch.load(path, weights_only=True)`` of a file par_ray wrote (a state dict).

    Raises ``ValueError`` naming the file when it does not read back: it was damaged after it was written (bytes
    overwritten, a copy cut short). torch's own message for such a file proposes loading it with
    ``weights_only=False``, which would run whatever the damaged bytes say; it is not passed on. A rerun with
    ``--resume`` (a sweep) or the same command (``python -m par_ray.train``) checks the latest checkpoint's files
    against their checksums (``par_ray.train.trainer.repair_run_storage``), sets a damaged one aside and resumes from
    the newest intact one."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # damaged bytes fail anywhere in the unpickler: UnpicklingError, EOFError, RuntimeError (a
        # zip archive cut or overwritten), UnicodeDecodeError, KeyError …; the type is named in the message
        raise ValueError(f"{path}: damaged, it does not read back as the state par_ray wrote ({type(e).__name__} "
                         f"in torch.load); rerun with --resume (a sweep) or the same command (python -m "
                         f"par_ray.train) to set this checkpoint aside and resume from the newest intact one") from None


def _ema_state(state: dict | None, directory: str) -> dict:
    """The checkpoint's EMA teacher state; ``ValueError`` when a run with an EMA teacher resumes one without it."""
    if state is None:
        raise ValueError(f"{directory}: the checkpoint holds no EMA teacher, but this run distills from one "
                         f"(recipe.distill='ema'); resume it under the config that wrote it")
    return state


# --------------------------------------------------------------------------------------------------------------------
# ddp: one full copy. ``engine``: a ``par_ray.train.strategies.Engine`` (raw, optimizer, scheduler, ema, world).


def save_full_state(engine, directory: str, extra: dict) -> None:
    """Write model + optimizer + scheduler state (+ EMA teacher) and ``extra`` into ``directory``; rank 0 only
    (DDP replicas are identical: one full copy is the checkpoint). Called on every rank."""
    if engine.world.rank == 0:
        state = {"model": engine.raw.state_dict(), "optimizer": engine.optimizer.state_dict(),
                 "scheduler": engine.scheduler.state_dict()}
        if engine.ema is not None:
            state["ema"] = engine.ema.state_dict()
        save_atomic(state, os.path.join(directory, STATE_FILE))
    write_extra(directory, extra, engine.world.rank)


def load_full_state(engine, directory: str) -> dict:
    """Restore what :func:`save_full_state` wrote (every rank reads the full copy); returns ``extra``."""
    state = _torch_load(os.path.join(directory, STATE_FILE), map_location=engine.device)
    engine.raw.load_state_dict(state["model"])
    engine.optimizer.load_state_dict(state["optimizer"])
    steps_on_host(engine.optimizer)
    engine.scheduler.load_state_dict(state["scheduler"])
    if engine.ema is not None:
        engine.ema.load_state_dict(_ema_state(state.get("ema"), directory))
    return read_extra(directory)


def steps_on_host(optimizer: torch.optim.Optimizer) -> None:
    """Move each parameter's ``step`` counter of a non-fused, non-capturable optimizer to the CPU, where torch keeps
    it (its note "special device hosting for step"); ``load_state_dict`` leaves ``step`` on the device it was loaded
    to. On a GPU, torch's foreach AdamW reads every counter with ``.item()`` each step: loaded to the GPU, a resumed
    run would wait on the device twice per parameter per step (~580 times at Qwen2.5-0.5B)."""
    for group in optimizer.param_groups:
        if group.get("fused") or group.get("capturable"):
            continue  # those keep step on the parameter's device themselves
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if torch.is_tensor(step) and step.device.type != "cpu":
                optimizer.state[param]["step"] = step.cpu()


def _full_state_model(directory: str, template: torch.nn.Module) -> dict[str, torch.Tensor]:
    return _torch_load(os.path.join(directory, STATE_FILE), map_location="cpu")["model"]


def _gather_replica(engine) -> dict[str, torch.Tensor] | None:
    """ddp (and a plain model): rank 0's replica is the full model."""
    if engine.world.rank != 0:
        return None
    return {k: v.detach().cpu() for k, v in engine.raw.state_dict().items()}


# --------------------------------------------------------------------------------------------------------------------
# fsdp: torch.distributed.checkpoint (DCP) shards


def save_dcp(engine, directory: str, extra: dict) -> None:
    """Every rank writes its own shards (``__{rank}_0.distcp``); rank 0 the ``.metadata``, scheduler and extra.

    ``get_state_dict`` names optimizer state by parameter FQN (not id), which is what lets :func:`load_dcp` reshard
    onto another world size.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    if engine.ema is not None:  # the EMA teacher's shards, in the same DCP checkpoint
        state["ema"] = get_model_state_dict(engine.ema)
    dcp.save(state, checkpoint_id=directory)
    if engine.world.rank == 0:
        save_atomic(engine.scheduler.state_dict(), os.path.join(directory, SCHEDULER_FILE))
    write_extra(directory, extra, engine.world.rank)


def load_dcp(engine, directory: str) -> dict:
    """Load into this run's sharding, whatever the world size that wrote the checkpoint (DCP reshards); returns
    ``extra``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                         set_model_state_dict, set_state_dict)

    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)  # templates in this run's sharding
    state = {"model": model_sd, "optimizer": optim_sd}
    if engine.ema is not None:
        state["ema"] = get_model_state_dict(engine.ema)
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(engine.model, engine.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    if engine.ema is not None:
        set_model_state_dict(engine.ema, state["ema"])
    engine.scheduler.load_state_dict(_torch_load(os.path.join(directory, SCHEDULER_FILE)))
    return read_extra(directory)


def _dcp_model(directory: str, template: torch.nn.Module) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner

    # The optimizer state in the same checkpoint is not requested, hence a partial load.
    state = {"model": {k: v.detach().clone() for k, v in template.state_dict().items()}}
    dcp.load(state, checkpoint_id=directory, planner=DefaultLoadPlanner(allow_partial_load=True))
    return state["model"]


def _gather_dcp(engine) -> dict[str, torch.Tensor] | None:
    """fsdp: every rank joins ``get_model_state_dict(full_state_dict=True, cpu_offload=True)``, which all-gathers each
    parameter's shards; rank 0 gets full CPU tensors (the sharded parameters' dtype: float32), the others none."""
    if not engine.world.has_process_group:  # Ray Train's local mode: the model is left plain (strategies.fsdp)
        return _gather_replica(engine)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(engine.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if engine.world.rank == 0 else None


# --------------------------------------------------------------------------------------------------------------------
# deepspeed: DeepSpeed's own checkpoints (ZeRO partitions per rank)


def save_zero(engine, directory: str, extra: dict) -> None:
    """``save_checkpoint`` on every rank: rank r writes its ZeRO partitions (``zero_pp_rank_{r}_*``), rank 0 the
    module states (ZeRO 1/2) and the ``latest`` tag. Resuming needs the same world size (DeepSpeed's own
    checkpoints; its universal-checkpoint conversion is not wired in here). Rank 0 also writes the EMA teacher's
    full copy, ``ema.pt``. ``engine.model``: the ``deepspeed.DeepSpeedEngine``."""
    engine.model.save_checkpoint(directory, tag=DEEPSPEED_TAG)
    if engine.ema is not None and engine.world.rank == 0:
        save_atomic(engine.ema.state_dict(), os.path.join(directory, EMA_FILE))
    write_extra(directory, extra, engine.world.rank)


def load_zero(engine, directory: str) -> dict:
    """Restore what :func:`save_zero` wrote (model, optimizer and LR scheduler states; EMA teacher); returns
    ``extra``. Raises ``FileNotFoundError`` when ``directory`` holds no DeepSpeed checkpoint."""
    path, _ = engine.model.load_checkpoint(directory, tag=DEEPSPEED_TAG, load_optimizer_states=True,
                                           load_lr_scheduler_states=True)
    if path is None:
        raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory}")
    if engine.ema is not None:
        file = os.path.join(directory, EMA_FILE)
        state = _torch_load(file, map_location=engine.device) if os.path.isfile(file) else None
        engine.ema.load_state_dict(_ema_state(state, directory))
    return read_extra(directory)


def _zero_model(directory: str, template: torch.nn.Module) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(directory, tag=DEEPSPEED_TAG)


def _gather_zero(engine) -> dict[str, torch.Tensor] | None:
    """deepspeed: each parameter's fp32 master copy, assembled from every rank's partition
    (``deepspeed.utils.safe_get_full_fp32_param``: a collective per parameter under ZeRO 1/2/3, on every rank in the
    same order); frozen parameters (no master copy) are read from the module (ZeRO-3: gathered first). Buffers come
    from the module. Rank 0 gets full CPU tensors, the others none."""
    import deepspeed as ds
    from deepspeed.utils import safe_get_full_fp32_param

    raw, rank = engine.raw, engine.world.rank
    params: dict[str, torch.Tensor] = {}
    for name, p in raw.named_parameters():  # tied parameters once
        full = safe_get_full_fp32_param(p)
        if full is None:  # no master copy (frozen): the module's own value
            if hasattr(p, "ds_id"):  # ZeRO-3: partitioned, gather it
                with ds.zero.GatheredParameters([p], modifier_rank=None):
                    full = p.detach().float().clone()
            else:
                full = p.detach().float()
        if rank == 0:
            params[name] = full.detach().cpu()
    if rank != 0:
        return None
    names = {id(p): n for n, p in raw.named_parameters()}
    return {k: params[names[id(v)]] if id(v) in names else v.detach().cpu()
            for k, v in raw.state_dict(keep_vars=True).items()}


# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointFormat:
    """One strategy's checkpoint format: how it is saved, resumed and read as a plain model (module docstring)."""

    name: str
    """The strategy that writes it: ``ddp``, ``fsdp`` or ``deepspeed``."""
    save: Callable[..., None]
    """``(engine, directory, extra) -> None``, called on every rank."""
    load: Callable[..., dict]
    """``(engine, directory) -> extra``, called on every rank, into the engine's own sharding."""
    model_state: Callable[[str, torch.nn.Module], dict]
    """``(directory, template) -> full float32 model state dict`` on one process (:func:`model_state_dict`)."""
    marker: str
    """The file or directory whose presence identifies the format (:func:`checkpoint_format`)."""
    gather: Callable[..., dict | None]
    """``(engine) -> full model state dict on rank 0 (CPU), None elsewhere``, called on every rank
    (:func:`export_model`)."""


FULL_STATE = CheckpointFormat("ddp", save_full_state, load_full_state, _full_state_model, STATE_FILE,
                              _gather_replica)
DCP_SHARDS = CheckpointFormat("fsdp", save_dcp, load_dcp, _dcp_model, DCP_METADATA, _gather_dcp)
ZERO_PARTITIONS = CheckpointFormat("deepspeed", save_zero, load_zero, _zero_model, DEEPSPEED_TAG, _gather_zero)

FORMATS: dict[str, CheckpointFormat] = {f.name: f for f in (FULL_STATE, DCP_SHARDS, ZERO_PARTITIONS)}
"""Strategy name → its checkpoint format."""


# --------------------------------------------------------------------------------------------------------------------
# The export: weights only, safetensors (module docstring)


def tied_aliases(module: torch.nn.Module) -> dict[str, str]:
    """``{dropped name: kept name}`` for state-dict entries that are the same tensor in ``module`` (tied weights,
    e.g. ``lm_head.weight`` → ``embed_tokens.weight``): the first name in state-dict order is kept."""
    first: dict[int, str] = {}
    aliases = {}
    for name, t in module.state_dict(keep_vars=True).items():
        if id(t) in first:
            aliases[name] = first[id(t)]
        else:
            first[id(t)] = name
    return aliases


def export_model(engine, directory: str, extra: dict) -> None:
    """Write the trained model's weights, without optimizer state, as ``directory/model.safetensors`` + ``extra.json``.

    Called on every rank (FSDP and ZeRO gather collectively; :attr:`CheckpointFormat.gather`); rank 0 writes. The
    tensors are the strategy's full-precision weights (float32 master weights, whatever the compute dtype), one
    entry per state-dict name, tied weights once (:func:`tied_aliases`, listed in the metadata). The file is written
    to a temporary name and renamed, then ``extra.json`` last (:func:`write_extra`): a directory with both is whole.
    Loaded by :func:`load_trained`; readable with ``safetensors.safe_open`` alone (module docstring).

    Args:
        engine: a ``par_ray.train.strategies.Engine`` (its :attr:`checkpoint` format says how to gather).
        extra: the loop's bookkeeping; its ``"config"`` (flat trial config) is what :func:`load_trained` needs.
    """
    from safetensors.torch import save_file

    state = engine.checkpoint.gather(engine)
    if engine.world.rank == 0:
        aliases = tied_aliases(engine.raw)
        tensors = {k: v.contiguous() for k, v in state.items() if k not in aliases}
        metadata = {"format": "pt", "par_ray.kind": "looped_lm", "par_ray.step": str(extra.get("step", -1)),
                    "par_ray.strategy": engine.checkpoint.name, "par_ray.aliases": json.dumps(aliases),
                    "par_ray.config": json.dumps(extra.get("config"))}
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, EXPORT_FILE)
        save_file(tensors, path + ".tmp", metadata=metadata)
        os.replace(path + ".tmp", path)
    write_extra(directory, extra, engine.world.rank)


def _export_model(directory: str, template: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The export's tensors, tied names filled in from the file's alias table."""
    from safetensors import safe_open

    path = os.path.join(directory, EXPORT_FILE)
    with safe_open(path, "pt", device="cpu") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
        aliases = json.loads((f.metadata() or {}).get("par_ray.aliases", "{}"))
    for name, kept in aliases.items():
        state[name] = state[kept]
    return state


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
    """``safetensors`` (an export, :func:`export_model`) or ``ddp``, ``fsdp``, ``deepspeed``: the checkpoint format
    it was read from."""


def checkpoint_format(directory: str) -> str:
    """``safetensors`` (an export), ``ddp``, ``fsdp`` or ``deepspeed`` from the files in ``directory``;
    ``FileNotFoundError`` naming what was looked for when it holds none of them."""
    if os.path.isfile(os.path.join(directory, EXPORT_FILE)):
        return EXPORT
    if os.path.isfile(os.path.join(directory, STATE_FILE)):
        return FULL_STATE.name
    if os.path.isfile(os.path.join(directory, DCP_METADATA)):
        return DCP_SHARDS.name
    if (os.path.isdir(os.path.join(directory, DEEPSPEED_TAG))
            or os.path.isfile(os.path.join(directory, DEEPSPEED_LATEST))):
        return ZERO_PARTITIONS.name
    raise FileNotFoundError(f"{directory}: no model checkpoint here (looked for {EXPORT_FILE} (export), {STATE_FILE} "
                            f"(ddp), {DCP_METADATA} (fsdp DCP) and {DEEPSPEED_TAG}/ (DeepSpeed ZeRO))")


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
    if os.path.isfile(os.path.join(directory, EXTRA_FILE)):
        flat = read_extra(directory).get("config")
        if flat:
            return from_flat(flat)
    result = os.path.join(os.path.dirname(os.path.abspath(directory)), RESULT_FILE)
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
    if fmt == EXPORT:
        return _export_model(directory, template)
    return FORMATS[fmt].model_state(directory, template)


def load_trained(path: str) -> Trained:
    """The model of a run directory (its ``final/`` export) or of any checkpoint directory, on the CPU.

    Works for the export (``model.safetensors``) and every strategy's checkpoint format (ddp ``state.pt``, FSDP2
    DCP shards, DeepSpeed ZeRO-1/2/3 partitions) on one process, without a GPU or a process group. Pretrained backbones rebuild their parent from
    ``backbone.pretrained`` first (its weights are then replaced by the checkpoint's).

    Raises:
        FileNotFoundError: no checkpoint or no stored config at ``path``.
        RuntimeError: the checkpoint's tensors do not fit the config's model (``load_state_dict``, strict).
    """
    from par_ray.model.looped import build_looped

    directory = resolve_checkpoint_dir(path)
    cfg = stored_config(directory)
    # the vocabulary the training loop built: task | halting | CoT | dense classes (par_ray.trial.VocabLayout)
    model = build_looped(resolved_backbone(cfg.backbone), cfg.recipe, vocab_size=resolve(cfg).vocab.size)
    wanted = model.state_dict().keys()
    # DeepSpeed's merged state may also list buffers the module does not save; every saved key must be present.
    state = {k: v for k, v in model_state_dict(directory, model).items() if k in wanted}
    model.load_state_dict(state, strict=True)
    model.eval()
    step = -1
    if os.path.isfile(os.path.join(directory, EXTRA_FILE)):
        step = int(read_extra(directory).get("step", -1))
    return Trained(model=model, config=cfg, step=step, format=checkpoint_format(directory))


def trained_task(cfg: TrialConfig, train: bool = False):
    """The task as the trial's model read it in training (``train_loop_per_worker``): rendered through the parent's
    tokenizer for a pretrained backbone (``par_ray.prompts.render``: the task's words as single parent tokens, loaded
    offline from ``backbone.pretrained``), compact task ids for a random-init one. ``train``: the training variant
    (``TaskConfig.train_filler`` separators). What probes of a loaded model (:func:`load_trained`) sample from.

    Raises:
        ValueError: the parent's tokenizer cannot be found offline, or the task does not render through it.
    """
    return render(build_task(cfg.task, train=train), parent_tokenizer(cfg.backbone))


def evaluate_trained(trained: Trained, eval_cfg=None) -> dict:
    """Accuracy by depth, d50 and G of a loaded model on this process (``par_ray.evaluation``, paper §4.2).

    Args:
        eval_cfg: an ``EvalConfig``; default the trial's own, so the numbers match the run's final report.
    Returns:
        ``{"acc": {d: full-state acc}, "acc_query": {d: per-query acc}, "sequences": {d: test sequences (more near
        the crossing under eval.bracket_*)}, "d50": int | None, "G": float, "G_censored": bool, "G_interp": float,
        "interval": par_ray.evaluation.ExtrapolationInterval | None (95 %, with eval.bootstrap_resamples)}``.
    """
    from par_ray.evaluation import accuracy_by_depth, extrapolation_from_counts

    cfg = trained.config
    eval_cfg = eval_cfg or cfg.eval
    task = trained_task(cfg)
    acc = accuracy_by_depth(trained.model, task, eval_cfg, cfg.recipe.ops_per_iteration, torch.device("cpu"))
    ex = extrapolation_from_counts({d: (v["right"], v["n"]) for d, v in acc.items()}, task.full_state_chance,
                                   cfg.task.train_depth, eval_cfg.bootstrap_resamples, eval_cfg.seed)
    return {"acc": {d: v["acc"] for d, v in acc.items()}, "acc_query": {d: v["acc_query"] for d, v in acc.items()},
            "sequences": {d: v["n"] for d, v in acc.items()}, "d50": ex.d50, "G": ex.G, "G_censored": ex.censored,
            "G_interp": ex.G_interp, "interval": ex.interval, "chance": task.full_state_chance}
