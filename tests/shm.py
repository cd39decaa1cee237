"""Shared-memory segments of killed engines: a vLLM engine killed with SIGKILL cannot unlink
its ``/dev/shm/psm_*`` segments (RAM on CI), so tests that kill one remove the segments that
appeared while it ran."""

from __future__ import annotations

from pathlib import Path

SHM = Path("/dev/shm")


def shm_segments() -> set[Path]:
    return set(SHM.glob("psm_*")) if SHM.is_dir() else set()


def remove_new_segments(before: set[Path]) -> None:
    for segment in shm_segments() - before:
        segment.unlink(missing_ok=True)
