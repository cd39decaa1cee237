"""A real ``agentloop-serve`` process for tests and benchmarks: started in its own process
group on a free port, its URL read from the ``serving ... on <url>`` line, stopped with SIGINT
(clean engine shutdown) and killed with its group if that does not end it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def serve_cli(
    *args: str, env: dict[str, str] | None = None, start_timeout_s: float = 400
) -> Iterator[str]:
    """``agentloop-serve --port 0 <args>``; yields the server's base URL."""
    script = str(Path(sys.executable).parent / "agentloop-serve")
    proc = subprocess.Popen(
        [script, "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,  # the CLI and its engine core: one process group
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + start_timeout_s
        line = ""
        while not line.startswith("serving "):
            assert time.monotonic() < deadline, "agentloop-serve did not start in time"
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "agentloop-serve exited before serving"
        yield line.strip().rsplit(" ", 1)[-1]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
