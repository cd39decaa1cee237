"""A real Hugging Face hub cache built from local files, so that a hub id (``Qwen/Qwen3-0.6B``)
resolves with no hub: the layout huggingface_hub itself writes (``blobs/`` named by content
hash, ``snapshots/<commit>/`` of relative links to them, ``refs/main`` holding the commit).

In this process::

    snapshot = add_to_hf_cache(tmp_path / "hf", "Qwen/Qwen3-0.6B", tiny_qwen3_path)
    use_hf_cache(monkeypatch, tmp_path / "hf")           # HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE=1

In a subprocess (a run script that names the hub id)::

    subprocess.run([...], env={**os.environ, **hf_env(tmp_path / "hf")})

The project resolves hub ids reading these variables at each call (``trainer/models/hub.py``),
so setting them after ``huggingface_hub`` was imported works too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest

__all__ = ["COMMIT", "add_to_hf_cache", "hf_env", "use_hf_cache"]

COMMIT = "0123456789abcdef0123456789abcdef01234567"
"""The commit hash snapshots get unless told otherwise (40 hex digits, as on the hub)."""

_SKIP = {"agentloop-asset.json"}  # the asset cache's manifest is no file of a hub repository


def add_to_hf_cache(
    hf_home: str | Path,
    repo_id: str,
    source: str | Path,
    *,
    files: Iterable[str] | None = None,
    commit: str = COMMIT,
) -> Path:
    """Copy the files of model folder ``source`` (every file, or only ``files``: names relative
    to it) into the hub cache under ``hf_home`` as repository ``repo_id`` at ``commit``, which
    ``refs/main`` then names. Returns the snapshot folder (``.../snapshots/<commit>``)."""
    org, _, name = repo_id.partition("/")
    if not org or not name or "/" in name:
        raise ValueError(f"repo_id must be org/name, got {repo_id!r}")
    source = Path(source)
    repo = Path(hf_home) / "hub" / f"models--{org}--{name}"
    snapshot = repo / "snapshots" / commit
    names = (
        sorted(str(p.relative_to(source)) for p in source.rglob("*") if p.is_file())
        if files is None
        else list(files)
    )
    for rel in names:
        if rel in _SKIP:
            continue
        data = (source / rel).read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            shutil.copyfile(source / rel, blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    snapshot.mkdir(parents=True, exist_ok=True)
    refs = repo / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / "main").write_text(commit)  # no newline: huggingface_hub reads it as is
    return snapshot


def hf_env(hf_home: str | Path, *, offline: bool = True) -> dict[str, str]:
    """Environment variables pointing huggingface_hub at the cache under ``hf_home``.
    ``HF_HUB_CACHE`` is set too, so an inherited one cannot win over ``HF_HOME``."""
    home = Path(hf_home).absolute()
    return {
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_HUB_OFFLINE": "1" if offline else "0",
    }


def use_hf_cache(
    monkeypatch: pytest.MonkeyPatch, hf_home: str | Path, *, offline: bool = True
) -> None:
    """``hf_env`` in this process for the test's duration (``TRANSFORMERS_OFFLINE``, which
    would also mean offline, is removed)."""
    for key, value in hf_env(hf_home, offline=offline).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
