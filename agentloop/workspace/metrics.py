"""Counters and timings of a workspace pool, read as ``workspace/*`` metrics."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

__all__ = ["WorkspaceMetrics"]


@dataclass(slots=True)
class WorkspaceMetrics:
    prepare_s: list[float] = field(default_factory=list)
    """Time to copy (and set up) each workspace, wherever it ran."""
    acquire_s: list[float] = field(default_factory=list)
    """Time each sample waited for its workspace (the critical path)."""
    check_s: list[float] = field(default_factory=list)
    warm_hits: int = 0
    check_timeouts: int = 0
    sandbox_errors: int = 0
    """Copies or setups that failed, and commands the sandbox could not start."""

    def snapshot(self) -> dict[str, float]:
        """``workspace/<name>`` means and counts since the last ``reset``."""
        out: dict[str, float] = {
            "workspace/warm_hits": self.warm_hits,
            "workspace/check_timeouts": self.check_timeouts,
            "workspace/sandbox_errors": self.sandbox_errors,
        }
        for name in ("prepare_s", "acquire_s", "check_s"):
            values = getattr(self, name)
            if values:
                out[f"workspace/{name}"] = statistics.fmean(values)
        return out

    def reset(self) -> None:
        self.prepare_s.clear()
        self.acquire_s.clear()
        self.check_s.clear()
        self.warm_hits = self.check_timeouts = self.sandbox_errors = 0
