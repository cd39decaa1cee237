"""A command the studio runs as a child process (``agentloop-train``, ``agentloop-rollout``):
its own process group (a signal reaches the command and what it started), its output in a log
file the page tails."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

__all__ = ["ChildJob"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class ChildJob:
    """``python -m <module> <args>`` with stdout and stderr in ``log``."""

    def __init__(self, module: str, args: list[str], log: Path) -> None:
        self.log = log
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        """The child's exit code (None while it runs)."""
        return self.process.poll()

    def log_text(self) -> str:
        """The log so far, colour codes removed, progress-bar redraws as lines."""
        if not self.log.is_file():
            return ""
        return _ANSI.sub("", self.log.read_text(errors="replace")).replace("\r", "\n")

    def log_tail(self, lines: int = 15) -> str:
        kept = [line for line in self.log_text().splitlines() if line.strip()]
        return "\n".join(kept[-lines:])
