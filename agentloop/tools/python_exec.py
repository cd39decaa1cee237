"""``python_exec``: run model-written Python in a separate process with limits.

Each call gets a fresh temporary working directory (removed afterwards), a CPU-time limit
(RLIMIT_CPU), a memory limit (RLIMIT_AS), a file-size limit (RLIMIT_FSIZE), a wall-clock
timeout, truncated output, an environment of its own (``PATH``, ``HOME`` = the temp dir,
``PYTHONIOENCODING``; nothing of the parent's) and no network: a fresh network namespace
(``unshare -rn``: only a loopback that is down) where the OS allows it, otherwise socket
creation is blocked inside the child before the code runs. ``network_isolation()`` says which
applies on this machine. The child's process group is killed when the call ends, so
background processes it started do not outlive the call (unless they left the group with
``setsid``).

Not isolated: the filesystem (the child runs as the same user and can read and write whatever
that user can; as root that is everything), the number of processes (RLIMIT_NPROC counts all
of a user's processes and root ignores it), and other local processes (same PID namespace).
The ``block`` fallback is a Python-level guard that code can get around (``_socket``), not a
boundary. Run untrusted code in a container or VM for that.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Literal

from agentloop.tools.base import BaseTool, ToolError, ToolResult
from agentloop.tools.runner import truncate_text

__all__ = ["PythonExecConfig", "PythonExecTool", "network_isolation"]

SCHEMA = {
    "type": "function",
    "function": {
        "name": "python_exec",
        "description": "Run Python code and return what it prints (stdout and stderr).",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source to run."}},
            "required": ["code"],
        },
    },
}

# Runs before the user's code when no network namespace is available.
_BLOCK_SOCKETS = """
import runpy, socket, sys
class _NoNetwork(socket.socket):
    def __init__(self, *args, **kwargs):
        raise PermissionError("network access is disabled in python_exec")
def _blocked(*args, **kwargs):
    raise PermissionError("network access is disabled in python_exec")
socket.socket = _NoNetwork
socket.create_connection = _blocked
socket.socketpair = _blocked
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
"""


@dataclass(kw_only=True, slots=True)
class PythonExecConfig:
    timeout_s: float = 10.0
    """Wall-clock limit; past it the process group is killed."""
    cpu_time_s: int = 5
    """CPU seconds (RLIMIT_CPU)."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS)."""
    max_output_chars: int = 4000
    """Output kept (the middle is cut)."""
    max_file_mb: int = 64
    """Largest file the code may write (RLIMIT_FSIZE); a bigger write fails with ``OSError:
    [Errno 27] File too large``."""
    network: Literal["auto", "namespace", "block"] = "auto"
    """``auto``: a network namespace if ``unshare -rn`` works here, else blocked sockets."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.cpu_time_s < 1 or self.memory_mb < 64:
            raise ValueError("python_exec needs timeout_s > 0, cpu_time_s >= 1, memory_mb >= 64")
        if self.max_file_mb < 1:
            raise ValueError(f"python_exec needs max_file_mb >= 1, got {self.max_file_mb}")


@functools.cache
def network_isolation() -> Literal["namespace", "block"]:
    """``namespace`` where an unprivileged/rooted ``unshare -rn`` works, else ``block``."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return "block"
    try:
        probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "block"
    return "namespace" if probe.returncode == 0 else "block"


def _limits(cpu_s: int, memory_bytes: int, file_bytes: int) -> None:  # in the child, pre-exec
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class PythonExecTool(BaseTool):
    schema = SCHEMA

    def __init__(
        self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None
    ):
        super().__init__(config, tool_schema or SCHEMA)
        # "type" and "max_concurrency" belong to the config loader and the ToolRunner.
        options = {k: v for k, v in self.config.items() if k not in ("type", "max_concurrency")}
        self.options = PythonExecConfig(**options)
        mode = self.options.network
        self.isolation = network_isolation() if mode == "auto" else mode

    def _command(self) -> list[str]:
        python = [sys.executable, "-I", "-B"]
        if self.isolation == "namespace":
            return ["unshare", "-rn", *python, "main.py"]
        return [*python, "-c", _BLOCK_SOCKETS]

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolError("python_exec needs a 'code' string")
        opts = self.options
        with tempfile.TemporaryDirectory(prefix="python_exec-") as workdir:
            with open(os.path.join(workdir, "main.py"), "w") as f:
                f.write(code)
            proc = await asyncio.create_subprocess_exec(
                *self._command(),
                cwd=workdir,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "HOME": workdir,
                    "PYTHONIOENCODING": "utf-8",
                },
                start_new_session=True,
                preexec_fn=functools.partial(
                    _limits, opts.cpu_time_s, opts.memory_mb << 20, opts.max_file_mb << 20
                ),
            )
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), opts.timeout_s)
            except TimeoutError:
                _kill_group(proc.pid)
                await proc.wait()
                raise ToolError(
                    f"python_exec: the code ran past the {opts.timeout_s:g} s wall-clock limit "
                    "and was stopped"
                ) from None
            except asyncio.CancelledError:
                _kill_group(proc.pid)
                raise
            # Background processes the code started (same group) do not outlive the call.
            _kill_group(proc.pid)
        text = truncate_text(out.decode("utf-8", "replace"), opts.max_output_chars, "middle")
        rc = proc.returncode
        if rc == -signal.SIGXCPU or rc == -signal.SIGKILL:
            text += f"\n[stopped: CPU-time limit of {opts.cpu_time_s} s]"
        elif rc != 0:
            text += f"\n[exit code {rc}]"
        return ToolResult(text, metrics={"exit_code": rc})


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
