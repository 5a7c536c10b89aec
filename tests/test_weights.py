"""Pretrained weights, offline first (par_ray.weights): a hub id resolves to a local directory (model dir, hub cache),
every missing backbone is one error naming where it looked, and a checkpoint's sizes are checked against the
registry."""

from __future__ import annotations

import json
import os

import pytest
import torch

from par_ray import weights
from par_ray.config import BackboneConfig
from par_ray.model.registry import BACKBONES, get_spec

HUB_ID = "Qwen/Qwen2.5-0.5B"


def _hub_cache(root, repo_id: str, files: dict[str, str]) -> str:
    """A hub cache as ``hf download --cache-dir root`` leaves it: refs/main → snapshots/<commit>/files."""
    commit = "0" * 40
    repo = os.path.join(root, "models--" + repo_id.replace("/", "--"))
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    snap = os.path.join(repo, "snapshots", commit)
    os.makedirs(snap, exist_ok=True)
    for name, src in files.items():
        os.symlink(src, os.path.join(snap, name))  # the cache's snapshot files are links into its blobs
    return snap


@pytest.mark.parametrize("name", [n for n, s in BACKBONES.items() if s.hub_name])
def test_every_registry_entry_matches_its_own_config_and_refuses_other_sizes(name):
    spec = get_spec(name)
    config = spec.build_config().to_dict()
    assert spec.mismatches(config) == []
    bad = spec.mismatches({**config, "hidden_size": config["hidden_size"] + 64, "model_type": "llama"})
    assert any("hidden_size" in m for m in bad) and any("model_type 'llama'" in m for m in bad)


def test_a_model_dir_tree_is_found_first_and_checked(tmp_path, write_checkpoint):
    path = write_checkpoint(tmp_path / "models" / HUB_ID, "qwen2.5-0.5b")
    assert weights.find_checkpoint(HUB_ID, str(tmp_path / "models")) == path
    assert weights.resolve_pretrained(HUB_ID, "qwen2.5-0.5b", str(tmp_path / "models")) == path
    # the same directory named as a local checkpoint
    assert weights.resolve_pretrained(path, "qwen2.5-0.5b") == path


def test_a_hub_cache_is_read_with_huggingface_hubs_own_lookup(tmp_path, write_checkpoint, monkeypatch):
    src = write_checkpoint(tmp_path / "src", "qwen2.5-0.5b")
    files = {n: os.path.join(src, n) for n in os.listdir(src)}
    snap = _hub_cache(tmp_path / "cache", HUB_ID, files)
    assert weights.find_checkpoint(HUB_ID, str(tmp_path / "cache")) == snap  # --model-dir as a hub cache
    assert weights.find_checkpoint(HUB_ID) is None  # the tests' own empty default cache
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))  # the default cache ($HF_HUB_CACHE / $HF_HOME)
    assert weights.find_checkpoint(HUB_ID) == snap
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    os.rename(tmp_path / "cache", tmp_path / "home")
    os.makedirs(tmp_path / "home" / "hub")
    os.rename(tmp_path / "home" / ("models--" + HUB_ID.replace("/", "--")),
              tmp_path / "home" / "hub" / ("models--" + HUB_ID.replace("/", "--")))
    assert weights.default_cache() == str(tmp_path / "home" / "hub")
    assert weights.find_checkpoint(HUB_ID) is not None


def test_a_missing_backbone_is_one_error_naming_it_where_it_looked_and_the_download(tmp_path):
    errors = weights.weights_errors([("qwen2.5-0.5b", HUB_ID), ("qwen2.5-0.5b", HUB_ID), ("tiny-qwen2", None),
                                     ("qwen3-0.6b", "Qwen/Qwen3-0.6B-Base")], str(tmp_path))
    assert len(errors) == 2
    assert errors[0].startswith(f"backbone.pretrained: qwen2.5-0.5b weights '{HUB_ID}' not found on this machine")
    assert str(tmp_path / HUB_ID) in errors[0] and f"hub cache {tmp_path}" in errors[0]
    assert f"hub cache {weights.default_cache()}" in errors[0]
    assert f"hf download {HUB_ID} --local-dir {tmp_path / HUB_ID}" in errors[0]
    assert "qwen3-0.6b" in errors[1]


def test_incomplete_or_wrong_size_checkpoints_are_refused(tmp_path, write_checkpoint):
    wrong = write_checkpoint(tmp_path / "wrong", "qwen2.5-0.5b", hidden_size=1024)
    with pytest.raises(ValueError, match=r"qwen2.5-0.5b checkpoint .*hidden_size 1024 differs from the registry's 896"):
        weights.resolve_pretrained(wrong, "qwen2.5-0.5b")
    family = write_checkpoint(tmp_path / "family", "qwen3-0.6b")
    with pytest.raises(ValueError, match="model_type 'qwen3' is not 'qwen2'"):
        weights.resolve_pretrained(family, "qwen2.5-0.5b")
    bare = write_checkpoint(tmp_path / "bare", "qwen2.5-0.5b", tokenizer=False)
    with pytest.raises(ValueError, match="no tokenizer"):
        weights.resolve_pretrained(bare, "qwen2.5-0.5b")
    assert weights.resolve_pretrained(bare, "qwen2.5-0.5b", tokenizer=False) == bare  # what model build needs
    with open(os.path.join(bare, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"a": "model-00001-of-00002.safetensors"}}, f)
    with pytest.raises(ValueError, match="shards missing"):
        weights.resolve_pretrained(bare, "qwen2.5-0.5b", tokenizer=False)


def test_a_hub_id_in_the_cache_loads_weights_and_tokenizer_offline(tmp_path, monkeypatch, write_checkpoint):
    """The model build (hub id resolved by weights.resolved_backbone, then backbones.load) and the halting/prompt
    tokenizer read a hub id from the cache, with no network
    (HF_HUB_OFFLINE=1 in the tests) and the same weights as the directory it was saved to."""
    from par_ray.model import backbones

    torch.manual_seed(0)
    model = backbones.load("tiny-qwen2")
    src = tmp_path / "src"
    model.save_pretrained(src)
    write_checkpoint(tmp_path / "tok", "tiny-qwen2")  # the Qwen tokenizer files beside the tiny weights
    for name in os.listdir(tmp_path / "tok"):
        if name != "config.json" and name != "model.safetensors":
            os.symlink(tmp_path / "tok" / name, src / name)
    _hub_cache(tmp_path / "cache", "org/tiny", {n: str(src / n) for n in os.listdir(src)})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    local = weights.resolved_backbone(BackboneConfig(name="tiny-qwen2", pretrained="org/tiny"))
    loaded = backbones.load("tiny-qwen2", pretrained=local.pretrained)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    tok = weights.parent_tokenizer(BackboneConfig(name="tiny-qwen2", pretrained="org/tiny"))
    assert tok.encode(" Yes", add_special_tokens=False) == [7414]
    assert weights.parent_tokenizer(BackboneConfig()) is None
    with pytest.raises(ValueError, match="tiny-qwen2 weights 'org/missing' not found"):
        weights.resolved_backbone(BackboneConfig(name="tiny-qwen2", pretrained="org/missing"))
    with pytest.raises(ValueError, match="not a local checkpoint directory"):
        backbones.load("tiny-qwen2", pretrained="org/tiny")  # the model package reads local directories only
