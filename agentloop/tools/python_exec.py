"""``python_exec``: run model-written Python in a separate process with limits.

Each call gets a fresh temporary working directory (removed afterwards), a CPU-time limit
(RLIMIT_CPU), a memory limit (RLIMIT_AS), a file-size limit (RLIMIT_FSIZE), a wall-clock
timeout, an environment of its own (``PATH``, ``HOME`` = the work dir, ``PYTHONIOENCODING``;
nothing of the parent's) and no network. Output is read as it comes, in chunks: past
``max_output_bytes`` the child is killed and the model gets a notice, so a child that prints
gigabytes costs the parent at most that much memory; below it the middle is cut down to
``max_output_chars``.

Limits are set by a small launcher that runs *in the child* after exec (``python -c``: it calls
``setrlimit`` and then ``execv`` of the real command), not by ``preexec_fn``, which is unsafe
in a parent with threads (Ray workers have them).

Two sandboxes (``sandbox`` in the config):

- ``bwrap`` (bubblewrap; ``auto`` picks it where a probe run works): a new mount namespace that
  shows only ``/usr`` and the few ``/etc`` files the loader needs (read-only), the base Python
  installation read-only at ``/opt/python`` (its ``site-packages`` hidden: the code gets the
  standard library only), a private ``/tmp``, ``/dev`` and ``/proc``, and the call's work dir
  (read-write, at its host path). Nothing of the repo, the venv or ``$HOME`` is there. New
  network, PID, IPC and UTS namespaces, and a process-count limit (RLIMIT_NPROC, counted for a
  uid of the call's own: a random unused one when the parent is root, else the caller's uid in
  a user namespace of its own). Killing bwrap kills every process of the sandbox.
- ``process``: a plain child. No network: a fresh network namespace (``unshare -rn``) where the
  OS allows it, else socket creation is blocked in Python before the code runs (a guard code
  can get around through ``_socket``, not a boundary); ``network_isolation()`` says which. Not
  isolated: the filesystem (same user), the number of processes, other local processes.

``auto`` falls back to ``process`` where bwrap is missing or cannot run, and logs once which
backend it fell back to and what to install. The child's process group is killed when the
call ends, so background processes do not outlive it. See docs/security.md for the table.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Literal

from agentloop.tools.base import BaseTool, ToolError, ToolResult
from agentloop.tools.runner import truncate_text
from agentloop.tools.sandbox import (
    BLOCK_SOCKETS,
    Child,
    Limits,
    bwrap_command,
    bwrap_problem,
    collect_output,
    kill_group,
    network_isolation,
    sandbox_uid,
)

__all__ = ["PythonExecConfig", "PythonExecTool", "bwrap_problem", "network_isolation"]

logger = logging.getLogger(__name__)

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

Backend = Literal["bwrap", "unshare", "block"]


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
    max_output_bytes: int = 1 << 20
    """Most output read from the child; past it the child is killed, the model gets the first
    this-many bytes (cut to ``max_output_chars``) and ``[output cut: more than N bytes; the
    process was stopped]``. Bounds the parent's memory."""
    max_file_mb: int = 64
    """Largest file the code may write (RLIMIT_FSIZE); a bigger write fails with ``OSError:
    [Errno 27] File too large``."""
    max_processes: int = 64
    """Processes (and threads) the code may have at once under bwrap (RLIMIT_NPROC for the
    call's own uid); one more fails with ``BlockingIOError: [Errno 11]``."""
    sandbox: Literal["auto", "bwrap", "process"] = "auto"
    """``bwrap``: filesystem, network and PID isolation with bubblewrap; ``process``: a plain
    child (see ``network``); ``auto``: ``bwrap`` where it runs here, else ``process``."""
    network: Literal["auto", "namespace", "block"] = "auto"
    """For ``sandbox: process`` (bwrap always has a network namespace of its own). ``auto``: a
    network namespace if ``unshare -rn`` works here, else blocked sockets."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.cpu_time_s < 1 or self.memory_mb < 64:
            raise ValueError("python_exec needs timeout_s > 0, cpu_time_s >= 1, memory_mb >= 64")
        if self.max_file_mb < 1:
            raise ValueError(f"python_exec needs max_file_mb >= 1, got {self.max_file_mb}")
        if self.max_output_bytes < self.max_output_chars:
            raise ValueError(
                f"python_exec needs max_output_bytes >= max_output_chars "
                f"({self.max_output_chars}), got {self.max_output_bytes}"
            )
        if self.max_processes < 2:
            raise ValueError(f"python_exec needs max_processes >= 2, got {self.max_processes}")


@functools.cache
def _auto_backend(network: str) -> Backend:
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    fallback = _process_backend(network)
    logger.warning(
        "python_exec: the bwrap sandbox is unavailable (%s); falling back to the %r backend, "
        "which does not isolate the filesystem or limit processes. Install bubblewrap "
        "(Debian/Ubuntu: apt-get install bubblewrap) for filesystem isolation.",
        problem,
        fallback,
    )
    return fallback


def _process_backend(network: str) -> Backend:
    if network == "auto":
        return "unshare" if network_isolation() == "namespace" else "block"
    return "unshare" if network == "namespace" else "block"


class PythonExecTool(BaseTool):
    schema = SCHEMA

    def __init__(
        self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None
    ):
        super().__init__(config, tool_schema or SCHEMA)
        # "type" belongs to the config loader; "max_concurrency", "call_timeout_s" to the runner.
        runner_keys = ("type", "max_concurrency", "call_timeout_s")
        options = {k: v for k, v in self.config.items() if k not in runner_keys}
        self.options = PythonExecConfig(**options)
        opts = self.options
        self.limits = Limits(
            cpu_time_s=opts.cpu_time_s,
            memory_mb=opts.memory_mb,
            max_file_mb=opts.max_file_mb,
            max_processes=opts.max_processes,
        )
        sandbox, network = self.options.sandbox, self.options.network
        if sandbox == "bwrap" and (problem := bwrap_problem()) is not None:
            raise ValueError(
                f"python_exec sandbox: bwrap cannot run here ({problem}); install bubblewrap "
                "(apt-get install bubblewrap) or set sandbox: auto or process"
            )
        self.backend: Backend = (
            _auto_backend(network)
            if sandbox == "auto"
            else ("bwrap" if sandbox == "bwrap" else _process_backend(network))
        )
        """``bwrap``, ``unshare`` (plain child in a network namespace) or ``block``."""
        self.isolation: Literal["namespace", "block"] = (
            "block" if self.backend == "block" else "namespace"
        )
        """How the network is cut off."""

    def _command(self, workdir: str, uid: int | None) -> list[str]:
        if self.backend == "bwrap":
            return bwrap_command(workdir, self.limits, uid)
        launch = [*self.limits.launcher(sys.executable), sys.executable, "-I", "-B"]
        if self.backend == "unshare":
            return ["unshare", "-rn", *launch, "main.py"]
        return [*launch, "-c", BLOCK_SOCKETS]

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolError("python_exec needs a 'code' string")
        opts = self.options
        with tempfile.TemporaryDirectory(prefix="python_exec-") as workdir:
            with open(os.path.join(workdir, "main.py"), "w") as f:
                f.write(code)
            uid = sandbox_uid(workdir) if self.backend == "bwrap" else None
            command = self._command(workdir, uid)
            info_r, info_w = os.pipe() if self.backend == "bwrap" else (-1, -1)
            if info_w >= 0:  # bwrap writes its sandbox's pid here, so we can kill that first
                command[1:1] = ["--info-fd", str(info_w)]
            try:
                proc = await asyncio.create_subprocess_exec(
                    *command,
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
                    pass_fds=(info_w,) if info_w >= 0 else (),
                )
                if info_w >= 0:
                    os.close(info_w)
                    info_w = -1
                child = Child(proc, info_r)
                out, overflow = await _run(child, opts)
            finally:
                for fd in (info_r, info_w):
                    if fd >= 0:
                        os.close(fd)
        text = truncate_text(out.decode("utf-8", "replace"), opts.max_output_chars, "middle")
        rc = proc.returncode
        if self.backend == "bwrap" and rc is not None and rc > 128:
            rc = 128 - rc  # bwrap reports death by signal N as exit code 128 + N
        if overflow:
            text += (
                f"\n[output cut: more than {opts.max_output_bytes} bytes; the process was stopped]"
            )
        elif rc == -signal.SIGXCPU or rc == -signal.SIGKILL:
            text += f"\n[stopped: CPU-time limit of {opts.cpu_time_s} s]"
        elif rc != 0:
            text += f"\n[exit code {rc}]"
        return ToolResult(text, metrics={"exit_code": rc})


async def _run(child: Child, opts: PythonExecConfig) -> tuple[bytes, bool]:
    """Wait for the child under the wall clock; returns (output, whether it was cut)."""
    try:
        return await asyncio.wait_for(collect_output(child, opts.max_output_bytes), opts.timeout_s)
    except TimeoutError:
        child.stop()
        await child.proc.wait()
        raise ToolError(
            f"python_exec: the code ran past the {opts.timeout_s:g} s wall-clock limit "
            "and was stopped"
        ) from None
    except asyncio.CancelledError:
        child.stop()
        raise
    finally:
        # Background processes the code started (same group) do not outlive the call.
        if child.proc.returncode is not None:
            kill_group(child.proc.pid)
