"""Pretrained weights, offline first: where a parent checkpoint (weights and tokenizer) is found on this machine.

A cluster node often has no hub access, or a rate-limited one, and a trial that calls ``from_pretrained(hub_id)``
on every worker dies inside model build after its GPUs were claimed. So the paper preset never downloads: the
checkpoints are downloaded once into a directory the cluster shares (``cluster/setup_node.sh``, docs/gpu.md, "Pretrained
weights"), and every process resolves a hub id to a local directory with huggingface_hub's own cache functions
before anything is claimed.

Where a hub id (``Qwen/Qwen2.5-0.5B``) is looked for, in order (:func:`find_checkpoint`):

1. ``MODEL_DIR/Qwen/Qwen2.5-0.5B`` — the tree ``hf download Qwen/Qwen2.5-0.5B --local-dir MODEL_DIR/Qwen/Qwen2.5-0.5B``
   leaves (``--model-dir`` of the sweeps and of ``python -m par_ray.train``);
2. ``MODEL_DIR`` as a hub cache (``hf download Qwen/Qwen2.5-0.5B --cache-dir MODEL_DIR``), through
   ``huggingface_hub.snapshot_download(..., cache_dir=MODEL_DIR, local_files_only=True)``;
3. the default hub cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), the same way.

A local directory (``backbone.pretrained=DIR``) is taken as it is. Either way the directory must hold what loading
needs (:func:`checkpoint_problems`): ``config.json`` whose sizes match the registry entry of ``backbone.name``
(``par_ray.model.registry.BackboneSpec.mismatches``), safetensors weights (``model.safetensors`` or a sharded index
with every shard) and the tokenizer (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``). Nothing here imports
torch or transformers' model code; :func:`load_tokenizer` imports transformers' tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing

from par_ray.model.registry import get_spec
from par_ray.trial import pretrained_kind

TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
"""A checkpoint's tokenizer: a fast ``tokenizer.json``, or the BPE pair it is built from (either set suffices)."""


def default_cache() -> str:
    """The hub cache huggingface_hub reads by default (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub``), read from the environment now (huggingface_hub fixes its constant at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def _cached_snapshot(repo_id: str, cache_dir: str) -> str | None:
    """The local snapshot of ``repo_id``'s main revision in the hub cache ``cache_dir``, or ``None``; never network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None


def search_path(value: str, model_dir: str | None = None) -> list[str]:
    """Where :func:`find_checkpoint` looks for ``value``, in order, as human-readable places (for error messages)."""
    if pretrained_kind(value) == "local":
        return [os.path.abspath(os.path.expanduser(value))]
    places = []
    if model_dir:
        root = os.path.abspath(os.path.expanduser(model_dir))
        places += [os.path.join(root, value), f"hub cache {root}"]
    return places + [f"hub cache {default_cache()}"]


def find_checkpoint(value: str, model_dir: str | None = None) -> str | None:
    """The local directory ``backbone.pretrained=value`` loads from, or ``None`` when it is nowhere on this machine.

    ``value``: a local directory (returned, expanded, if it exists) or a hub id, looked for in the order of the
    module docstring (``model_dir`` first when given). Never touches the network.
    """
    if pretrained_kind(value) == "local":
        path = os.path.abspath(os.path.expanduser(value))
        return path if os.path.isdir(path) else None
    if model_dir:
        root = os.path.abspath(os.path.expanduser(model_dir))
        tree = os.path.join(root, value)
        if os.path.isfile(os.path.join(tree, "config.json")):
            return tree
        snap = _cached_snapshot(value, root)
        if snap:
            return snap
    return _cached_snapshot(value, default_cache())


def checkpoint_problems(path: str, backbone: str, tokenizer: bool = True) -> list[str]:
    """What keeps the checkpoint directory ``path`` from loading as ``backbone`` (a registry name): missing config,
    weights or (with ``tokenizer``) tokenizer files, or config sizes that differ from the registry's entry. Empty
    when it loads."""
    problems = []
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        problems.append("no config.json")
    else:
        with open(config_path) as f:
            problems += get_spec(backbone).mismatches(json.load(f))
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f).get("weight_map", {}).values()))
        missing = [s for s in shards if not os.path.isfile(os.path.join(path, s))]
        if missing:
            problems.append(f"safetensors shards missing: {missing}")
    elif not os.path.isfile(os.path.join(path, "model.safetensors")):
        problems.append("no model.safetensors (nor model.safetensors.index.json)")
    if tokenizer and not any(all(os.path.isfile(os.path.join(path, f)) for f in group) for group in TOKENIZER_FILES):
        problems.append("no tokenizer (tokenizer.json, or vocab.json + merges.txt)")
    return problems


def download_hint(value: str, model_dir: str | None = None) -> str:
    """The one-time command that puts hub id ``value`` where :func:`find_checkpoint` looks."""
    if model_dir:
        return f"hf download {value} --local-dir {os.path.join(model_dir, value)}"
    return f"hf download {value}   (into {default_cache()}; or pass --model-dir DIR)"


def resolve_pretrained(value: str, backbone: str, model_dir: str | None = None, tokenizer: bool = True) -> str:
    """The checkpoint directory for ``backbone.pretrained=value`` as ``backbone``, checked
    (:func:`checkpoint_problems`; ``tokenizer=False``: weights and config only, what building the model needs). Raises ``ValueError`` naming the backbone, every place looked and the download
    command when it is nowhere or incomplete."""
    path = find_checkpoint(value, model_dir)
    if path is None:
        raise ValueError(f"backbone.pretrained: {backbone} weights {value!r} not found on this machine; looked in "
                         f"{'; '.join(search_path(value, model_dir))}. Download them once: "
                         f"{download_hint(value, model_dir)}")
    problems = checkpoint_problems(path, backbone, tokenizer)
    if problems:
        raise ValueError(f"backbone.pretrained: {backbone} checkpoint {path} (for {value!r}) cannot be loaded: "
                         f"{'; '.join(problems)}")
    return path


def weights_errors(pairs: typing.Iterable[tuple[str, str | None]], model_dir: str | None = None) -> list[str]:
    """One error per distinct (backbone name, ``backbone.pretrained``) pair whose checkpoint does not resolve
    (:func:`resolve_pretrained`); random-init pairs (``None``) are skipped. What a sweep or the training CLI checks
    before any cluster resource is claimed."""
    errors = []
    for name, value in dict.fromkeys(pairs):
        if value is None:
            continue
        try:
            resolve_pretrained(value, name, model_dir)
        except ValueError as e:
            errors.append(str(e))
    return errors


def local_pretrained(value: str | None, model_dir: str | None = None) -> str | None:
    """``value`` with a hub id replaced by its local directory where :func:`find_checkpoint` finds one (so workers
    load from disk, never from the hub); otherwise ``value`` unchanged (:func:`weights_errors` reports it)."""
    if value is None:
        return None
    return find_checkpoint(value, model_dir) or value


def load_tokenizer(value: str, backbone: str, model_dir: str | None = None):
    """The parent's tokenizer, from the checkpoint directory :func:`resolve_pretrained` finds, offline
    (``AutoTokenizer.from_pretrained(dir, local_files_only=True)``). Raises ``ValueError`` as it does."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_pretrained(value, backbone, model_dir), local_files_only=True)


def parent_tokenizer(backbone_cfg, model_dir: str | None = None):
    """The tokenizer of ``backbone_cfg`` (a ``BackboneConfig``): ``None`` for a random-init backbone (task ids are
    the model's vocabulary), else :func:`load_tokenizer` of its ``pretrained`` checkpoint."""
    if backbone_cfg.pretrained is None:
        return None
    return load_tokenizer(backbone_cfg.pretrained, backbone_cfg.name, model_dir)


def resolved_backbone(backbone_cfg, model_dir: str | None = None):
    """``backbone_cfg`` (a ``BackboneConfig``) with ``pretrained`` replaced by its local checkpoint directory
    (:func:`resolve_pretrained`, weights and config only), unchanged for a random-init backbone. What the training
    loop and ``load_trained`` pass to ``build_looped``, so the model package reads local directories only.

    Raises:
        ValueError: as :func:`resolve_pretrained`.
    """
    if backbone_cfg.pretrained is None:
        return backbone_cfg
    return dataclasses.replace(backbone_cfg, pretrained=resolve_pretrained(backbone_cfg.pretrained, backbone_cfg.name,
                                                                           model_dir, tokenizer=False))
