"""The shared memory an engine leaves behind when it is killed.

A vLLM engine runs in child processes of its server (``EngineCore``, and where it has one, a
``Worker``: several ranks, or ``VLLM_ENABLE_V1_MULTIPROCESSING=1``; ``servers/cpu_layout.py``).
They hold a named semaphore ``/dev/shm/sem.*`` (called ``sem.loky-<pid>-*``: joblib, imported
by transformers through scikit-learn, renames every ``multiprocessing`` semaphore) and, with a
worker process, map two message-queue segments ``/dev/shm/psm_*`` (160-250 MB each). A clean
shutdown unlinks them; a killed engine cannot, and ``/dev/shm`` is RAM. So a server records
what its engine's processes hold (``engine_shm``: the segments they map, and the semaphores
named after their pids, since a semaphore maps a temporary file that is unlinked once it has
its name) and whoever kills it removes exactly those (``remove_shm``), leaving other engines'
entries alone. A server adds the folder its engine's temporary files go in
(``agentloop-vllm-*``, ``servers/scratch.py``) and, with LoRA on, the folder it writes adapter
versions into (``agentloop-lora-*``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from servers.scratch import SCRATCH_PREFIX

__all__ = [
    "SHM",
    "engine_shm",
    "mapped",
    "owner_pid",
    "remove_shm",
    "semaphore_pid",
    "shm_entries",
]

logger = logging.getLogger(__name__)

SHM = Path("/dev/shm")
_KINDS = ("psm_", "sem.")  # multiprocessing.shared_memory segments, named POSIX semaphores
# a server's LoRA adapter versions (servers/weights.py), its engine's temporary files
# (servers/scratch.py)
_FOLDERS = ("agentloop-lora-", SCRATCH_PREFIX)
_SEM_PID = re.compile(r"sem\.[A-Za-z]+-(\d+)-")  # sem.loky-<creator pid>-<random>
# <folder prefix><owner pid>-<random>
_FOLDER_PID = re.compile(f"(?:{'|'.join(map(re.escape, _FOLDERS))})(\\d+)-")


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:  # the thread or process is gone
            continue
    return out


def _descendants(pid: int) -> list[int]:
    found, stack = [], _children(pid)
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(_children(child))
    return found


def shm_entries() -> set[str]:
    """Names of the ``psm_*`` segments, ``sem.*`` semaphores and servers' folders
    (``agentloop-vllm-*``, ``agentloop-lora-*``) in ``/dev/shm`` now."""
    if not SHM.is_dir():
        return set()
    return {p.name for p in SHM.iterdir() if p.name.startswith((*_KINDS, *_FOLDERS))}


def semaphore_pid(name: str) -> int | None:
    """The pid a ``sem.loky-<pid>-*`` semaphore is named after (its creator), else None."""
    match = _SEM_PID.match(name)
    return int(match.group(1)) if match else None


def owner_pid(name: str) -> int | None:
    """The pid an entry is named after: a semaphore's creator (``semaphore_pid``) or the
    server owning an ``agentloop-vllm-<pid>-*`` / ``agentloop-lora-<pid>-*`` folder; else
    None (a segment: who maps it is read with ``mapped``)."""
    match = _FOLDER_PID.match(name)
    return int(match.group(1)) if match else semaphore_pid(name)


def mapped(pid: int) -> set[str]:
    """Names of the ``/dev/shm`` segments and semaphores ``pid`` maps (and has not unlinked);
    empty where its maps are gone or not ours to read."""
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return set()
    names = set()
    for line in lines:
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if path.startswith(f"{SHM}/") and not path.endswith(" (deleted)"):
            name = path[len(str(SHM)) + 1 :]
            if name.startswith(_KINDS):
                names.add(name)
    return names


def engine_shm(pid: int | None = None) -> list[str]:
    """Sorted names of the ``/dev/shm`` segments mapped, and semaphores created, by the child
    processes of ``pid`` (default: this process), i.e. by the engine a server started. Empty
    where ``/proc`` is not readable (not Linux)."""
    root = os.getpid() if pid is None else pid
    children = _descendants(root)
    names: set[str] = set()
    for child in children:
        names |= mapped(child)
    if children:
        names |= {entry for entry in shm_entries() if semaphore_pid(entry) in children}
    return sorted(names)


def remove_shm(names: list[str]) -> list[str]:
    """Unlink these ``/dev/shm`` entries (names from ``engine_shm``, or a server's adapter or
    engine scratch folder); returns those removed. Processes still mapping one keep their
    memory until they exit; the name is gone at once."""
    removed = []
    for name in names:
        if "/" in name or name in (".", "..") or not name.startswith((*_KINDS, *_FOLDERS)):
            raise ValueError(f"{name!r} is not a /dev/shm segment or semaphore name")
        path = SHM / name
        try:
            if name.startswith(_FOLDERS):
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:  # the engine's own shutdown got there first
            continue
        removed.append(name)
    if removed:
        logger.info("removed %d shared-memory entries of a killed engine", len(removed))
    return removed
