"""Fresh copies of a task's workspace, and the per-run folder they live in.

A folder is copied with ``cp -a --reflink=auto`` (copy-on-write where the file system allows it,
e.g. btrfs or XFS; a plain copy otherwise); an archive is unpacked once per run into the run
folder (members that would land outside it are refused) and copied from there. Every folder of a
run lives under ``<root>/<pid>-<token>/``; ``sweep_stale`` removes those whose worker process is
gone (a crash), at the next start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import tarfile
import zipfile
from pathlib import Path

from servers.pids import pid_alive

__all__ = [
    "RUN_ROOT_NAME",
    "chown_tree",
    "copy_tree",
    "make_run_root",
    "remove_run_root",
    "remove_tree",
    "sweep_stale",
    "unpack",
]

logger = logging.getLogger(__name__)

RUN_ROOT_NAME = "agentloop-workspaces"
"""The folder (under the temp dir by default) that holds every run's folder."""


def remove_tree(path: str | Path) -> None:
    """Remove ``path`` whatever the sandboxed commands did to its modes (chmod -w, 000)."""

    def fix(func: object, failed: str, exc_info: object) -> None:
        parent = os.path.dirname(failed)
        for folder in (parent, failed):
            try:
                os.chmod(folder, 0o700)
            except OSError:
                pass
        if os.path.isdir(failed) and not os.path.islink(failed):
            shutil.rmtree(failed, ignore_errors=True)
        else:
            try:
                os.unlink(failed)
            except FileNotFoundError:
                pass

    shutil.rmtree(path, onerror=fix)


def sweep_stale(root: Path) -> list[Path]:
    """Remove the run folders under ``root`` whose worker (the pid in the name) is gone;
    returns what was removed."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for entry in root.iterdir():
        pid, _, _ = entry.name.partition("-")
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            remove_tree(entry)
            removed.append(entry)
    if removed:
        logger.info("workspace pool: removed %d folder(s) of crashed runs", len(removed))
    return removed


def make_run_root(root: Path) -> Path:
    """This worker's run folder, ``<root>/<pid>-<token>``, after sweeping stale ones."""
    root.mkdir(parents=True, exist_ok=True)
    sweep_stale(root)
    run = root / f"{os.getpid()}-{secrets.token_hex(4)}"
    for _ in range(3):  # another pool's close may remove an empty ``root`` just now
        try:
            run.mkdir()
            return run
        except FileNotFoundError:
            root.mkdir(parents=True, exist_ok=True)
    run.mkdir()
    return run


def remove_run_root(run: Path) -> None:
    """Remove a run folder, and the shared folder above it if no other run is left there."""
    remove_tree(run)
    try:
        run.parent.rmdir()
    except OSError:  # another run's folder is still there
        pass


def _unpack_sync(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                target = (dest / name).resolve()
                if not target.is_relative_to(dest.resolve()):
                    raise ValueError(f"{archive}: member {name!r} would land outside the folder")
            zf.extractall(dest)
    else:
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")  # refuses absolute paths, .. and device files


async def unpack(archive: Path, dest: Path) -> Path:
    """Unpack ``archive`` into ``dest`` off the event loop; a single top folder is the
    workspace itself (``repo.tar.gz`` holding ``repo/...``)."""
    await asyncio.to_thread(_unpack_sync, archive, dest)
    entries = list(dest.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


async def _run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise OSError(f"{argv[0]} exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")


async def copy_tree(source: Path, dest: Path) -> None:
    """``dest``: a fresh copy of the folder ``source`` (copy-on-write where possible)."""
    await _run("cp", "-a", "--reflink=auto", "--", str(source), str(dest))


async def chown_tree(path: Path, uid: int) -> None:
    """Give ``path`` and all in it to ``uid`` (the sandbox's user, as root): only it may write."""
    await _run("chown", "-R", f"{uid}:{uid}", "--", str(path))
