"""Build-once cache folders for model assets.

An asset lives in ``<cache_dir>/<name>/``. It is built in a temporary sibling folder, a
manifest (``agentloop-asset.json``: name, recipe version, every file with its size) is
written last, and the folder is renamed into place. A folder whose manifest is missing,
unreadable, for another recipe version, or whose files are missing or have another size is
treated as corrupt and rebuilt. A file lock serialises concurrent builds of one asset.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["MANIFEST", "default_cache_dir", "cached_build", "check_manifest"]

logger = logging.getLogger(__name__)

MANIFEST = "agentloop-asset.json"


def default_cache_dir() -> Path:
    """``$AGENTLOOP_HOME/models``, or ``~/.cache/agentloop/models`` when unset."""
    home = os.environ.get("AGENTLOOP_HOME")
    root = Path(home).expanduser() if home else Path.home() / ".cache" / "agentloop"
    return root / "models"


def check_manifest(folder: Path, name: str, version: int) -> str | None:
    """Return why ``folder`` is not a complete build of ``name``@``version``, or None if it is."""
    manifest = folder / MANIFEST
    if not folder.is_dir():
        return "missing"
    if not manifest.is_file():
        return f"no {MANIFEST}"
    try:
        meta = json.loads(manifest.read_text())
        files: dict[str, int] = meta["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable {MANIFEST} ({exc})"
    if meta.get("name") != name or meta.get("version") != version:
        return f"built for {meta.get('name')}@{meta.get('version')}, want {name}@{version}"
    for rel, size in files.items():
        path = folder / rel
        if not path.is_file():
            return f"missing file {rel}"
        if path.stat().st_size != size:
            return f"file {rel} has {path.stat().st_size} bytes, manifest says {size}"
    return None


def _write_manifest(folder: Path, name: str, version: int) -> None:
    files = {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    meta = {"name": name, "version": version, "files": files}
    (folder / MANIFEST).write_text(json.dumps(meta, indent=2) + "\n")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached_build(
    cache_dir: Path, name: str, version: int, build: Callable[[Path], None]
) -> tuple[Path, bool]:
    """Return ``(folder, built)``: the asset folder, building it with ``build(tmp)`` if needed."""
    target = cache_dir / name
    reason = check_manifest(target, name, version)
    if reason is None:
        return target, False
    with _locked(cache_dir / f".{name}.lock"):
        reason = check_manifest(target, name, version)  # another process may have built it
        if reason is None:
            return target, False
        if reason != "missing":
            logger.warning("model cache %s is not usable (%s); rebuilding it", target, reason)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.build-", dir=cache_dir))
        try:
            build(tmp)
            _write_manifest(tmp, name, version)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target, True
