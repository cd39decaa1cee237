"""Run one command in a workspace copy: the project's bubblewrap sandbox (``bwrap_command``)
with only that folder writable, no network, rlimits, a wall-clock limit and an output cap.

Backends follow python_exec's rules: ``bwrap`` where its probe run works (``sandbox: auto``),
else ``process`` (a plain child in its own session and, where ``unshare -rn`` works, its own
network namespace), logged once with what to install; ``sandbox: bwrap`` where bwrap cannot run
is refused. Under bwrap every process of a command lives in the sandbox's PID namespace, so a
kill at a limit takes the whole tree; ``--die-with-parent`` takes it when the worker dies.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from agentloop.tools.sandbox import (
    Child,
    Limits,
    bwrap_command,
    bwrap_problem,
    collect_output,
    kill_group,
    network_isolation,
)

__all__ = ["Backend", "CommandResult", "resolve_backend", "run_command"]

logger = logging.getLogger(__name__)

Backend = Literal["bwrap", "process"]


@functools.cache
def _warn_fallback(problem: str) -> None:
    logger.warning(
        "workspace sandbox: bwrap is unavailable (%s); commands run as plain processes, which "
        "do not isolate the filesystem or limit processes. Install bubblewrap "
        "(Debian/Ubuntu: apt-get install bubblewrap) for the sandbox.",
        problem,
    )


def resolve_backend(sandbox: Literal["auto", "bwrap", "process"]) -> Backend:
    """The backend a ``sandbox`` setting gives here; ``bwrap`` where it cannot run raises."""
    if sandbox == "process":
        return "process"
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    if sandbox == "bwrap":
        raise ValueError(
            f"workspace sandbox: bwrap cannot run here ({problem}); install bubblewrap "
            "(apt-get install bubblewrap) or set sandbox: auto or process"
        )
    _warn_fallback(problem)
    return "process"


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one command did."""

    exit_code: int | None
    """Its exit status (negative: killed by that signal)."""
    output: bytes
    """stdout and stderr together, at most the output cap."""
    seconds: float
    timed_out: bool = False
    overflow: bool = False
    """The output passed the cap; the command was stopped there."""

    @property
    def reason(self) -> str | None:
        """Why the command did not finish normally (None: it did, whatever its exit code)."""
        if self.timed_out:
            return f"timed out after {self.seconds:.1f} s and was killed"
        if self.overflow:
            return f"printed more than {len(self.output)} bytes and was stopped"
        if self.exit_code in (-signal.SIGXCPU, -signal.SIGKILL):
            return "stopped at its CPU-time limit"
        return None

    def tail(self, chars: int) -> str:
        """The last ``chars`` characters of the output."""
        return self.output[-4 * chars :].decode("utf-8", "replace")[-chars:]


async def run_command(
    argv: Sequence[str],
    *,
    workdir: str,
    uid: int | None,
    backend: Backend,
    limits: Limits,
    timeout_s: float,
    max_output_bytes: int,
    python_env: str | None,
    env: Mapping[str, str] | None = None,
    share_net: bool = False,
    binds: Sequence[str] = (),
    ro_binds: Sequence[str] = (),
) -> CommandResult:
    """Run ``argv`` in ``workdir`` under ``backend`` until it exits, passes ``timeout_s`` (the
    sandbox is killed) or prints more than ``max_output_bytes`` (stopped there). ``share_net``,
    ``binds``, ``ro_binds``: as ``bwrap_command``'s (a harness agent's network and folders)."""
    if backend == "bwrap":  # bwrap clears the environment; the sandbox's comes from --setenv
        command = bwrap_command(
            workdir, limits, uid, argv=argv, python_env=python_env, env=env,
            share_net=share_net, binds=binds, ro_binds=ro_binds,
        )  # fmt: skip
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    else:
        bin_dir = os.path.join(python_env or sys.prefix, "bin")
        launch = [*limits.launcher(sys.executable), *argv]
        isolate = not share_net and network_isolation() == "namespace"
        command = ["unshare", "-rn", *launch] if isolate else launch
        env = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", **(env or {})}
    info_r, info_w = os.pipe() if backend == "bwrap" else (-1, -1)
    if info_w >= 0:  # bwrap writes its sandbox's pid here, so a kill takes the whole tree
        command[1:1] = ["--info-fd", str(info_w)]
    start = time.perf_counter()
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            cwd=workdir,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={"PYTHONIOENCODING": "utf-8", "HOME": workdir, **(env or {})},
            start_new_session=True,
            pass_fds=(info_w,) if info_w >= 0 else (),
        )
        if info_w >= 0:
            os.close(info_w)
            info_w = -1
        child = Child(proc, info_r)
        return await _wait(child, backend, timeout_s, max_output_bytes, start)
    finally:
        for fd in (info_r, info_w):
            if fd >= 0:
                os.close(fd)


async def _wait(
    child: Child, backend: Backend, timeout_s: float, max_bytes: int, start: float
) -> CommandResult:
    proc = child.proc
    try:
        out, overflow = await asyncio.wait_for(collect_output(child, max_bytes), timeout_s)
    except TimeoutError:
        child.stop()
        await proc.wait()
        return CommandResult(None, b"", time.perf_counter() - start, timed_out=True)
    except asyncio.CancelledError:  # the agent's own limit, or the sample ended
        child.stop()
        await proc.wait()
        raise
    finally:
        kill_group(proc.pid)  # anything left in the session (the process backend)
    code = proc.returncode
    if backend == "bwrap" and code is not None and code > 128:
        code = 128 - code  # bwrap reports death by signal N as exit code 128 + N
    return CommandResult(code, out, time.perf_counter() - start, overflow=overflow)
