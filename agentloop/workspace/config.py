"""``WorkspaceConfig``: the workspace pool's limits and sandbox, validated at construction."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

from agentloop.tools.sandbox import Limits

__all__ = ["WorkspaceConfig"]


@dataclass(kw_only=True, slots=True)
class WorkspaceConfig:
    root: str | None = None
    """Folder of the run folders (default ``<temp dir>/agentloop-workspaces``)."""
    warm_per_task: int = 2
    """Prepared copies kept ready per task (0: every copy is made when a sample asks)."""
    max_warm: int = 64
    """Prepared copies kept ready over all tasks; past it no refill starts."""
    max_concurrent_prepares: int = 4
    """Copies (and setups) made at once."""
    sandbox: Literal["auto", "bwrap", "process"] = "auto"
    """``bwrap``: the bubblewrap sandbox (refused where it cannot run); ``process``: plain
    processes (no filesystem isolation); ``auto``: bwrap where it runs, else process, logged."""
    python_env: str | None = sys.prefix
    """Python environment shown read-only in the sandbox (its ``bin`` first on PATH), so a
    check like ``python -m pytest`` finds pytest; default the worker's own; None: the base
    interpreter with the standard library only."""
    agent_timeout_s: float = 120.0
    """Default wall-clock limit of one agent command (``Workspace.run``, the ``bash`` tool)."""
    sample_timeout_s: float = 3600.0
    """Wall-clock limit of a whole agent loop run in a workspace (the worker's hook); past it
    the loop is cancelled, its commands killed, and the sample fails."""
    tool_output_chars: int = 8000
    """Characters of a workspace tool's answer kept (``bash``, ``read_file``, ``run_check``);
    past it the middle is cut and marked with how much was cut."""
    cpu_time_s: int = 600
    """CPU seconds per command (RLIMIT_CPU)."""
    memory_mb: int = 4096
    """Address space per process (RLIMIT_AS)."""
    max_file_mb: int = 256
    """Largest file a command may write (RLIMIT_FSIZE)."""
    max_processes: int = 256
    """Processes and threads at once per workspace (RLIMIT_NPROC of its own uid; bwrap as
    root, or its user namespace otherwise)."""
    max_output_bytes: int = 1 << 20
    """Output read from one command; past it the command is stopped."""
    output_tail_chars: int = 4000
    """Characters of the check's output kept in its result."""

    def __post_init__(self) -> None:
        if self.warm_per_task < 0 or self.max_warm < 0:
            raise ValueError("workspace: warm_per_task and max_warm must be >= 0")
        if self.max_concurrent_prepares < 1:
            raise ValueError(
                f"workspace: max_concurrent_prepares must be >= 1, got "
                f"{self.max_concurrent_prepares}"
            )
        if self.agent_timeout_s <= 0 or self.cpu_time_s < 1 or self.memory_mb < 64:
            raise ValueError(
                "workspace needs agent_timeout_s > 0, cpu_time_s >= 1, memory_mb >= 64"
            )
        if self.sample_timeout_s <= 0 or self.tool_output_chars < 200:
            raise ValueError("workspace needs sample_timeout_s > 0 and tool_output_chars >= 200")
        if self.max_file_mb < 1 or self.max_processes < 2 or self.max_output_bytes < 1:
            raise ValueError(
                "workspace needs max_file_mb >= 1, max_processes >= 2, max_output_bytes >= 1"
            )

    @property
    def limits(self) -> Limits:
        return Limits(
            cpu_time_s=self.cpu_time_s,
            memory_mb=self.memory_mb,
            max_file_mb=self.max_file_mb,
            max_processes=self.max_processes,
        )
