"""The sandboxes ``python_exec`` and the repository-task workspaces (``agentloop.workspace``) run
commands in (see python_exec's docstring, docs/security.md and docs/repo-tasks.md).

``bwrap_command``: a bubblewrap sandbox (read-only system, the standard library only or a
Python environment shown read-only, a private writable work dir and /tmp, new
network/PID/IPC/UTS namespaces, a process-count limit);
``Limits.launcher``: the in-child launcher that sets resource limits (and drops to a fresh uid)
after exec, so no ``preexec_fn`` runs in a parent with threads; ``Child``: how to kill all of a
call's processes; ``collect_output``: read a child's output up to a byte limit.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BLOCK_SOCKETS",
    "Child",
    "Limits",
    "bwrap_command",
    "bwrap_problem",
    "collect_output",
    "kill_group",
    "network_isolation",
    "sandbox_uid",
]

# Runs before the user's code when no network namespace is available.
BLOCK_SOCKETS = """
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

# argv: cpu_s memory_bytes file_bytes nproc(-1: none) uid(-1: keep) command...; $HOME: work dir.
# Runs in the child after exec, so no preexec_fn is needed; execvp keeps the limits (and finds a
# bare command name, e.g. ``sh``, on the sandbox's PATH).
LAUNCHER = """
import os, resource as r, sys
cpu, mem, fsize, nproc, uid = map(int, sys.argv[1:6])
r.setrlimit(r.RLIMIT_CPU, (cpu, cpu + 1))
r.setrlimit(r.RLIMIT_AS, (mem, mem))
r.setrlimit(r.RLIMIT_FSIZE, (fsize, fsize))
r.setrlimit(r.RLIMIT_CORE, (0, 0))
if nproc >= 0:
    r.setrlimit(r.RLIMIT_NPROC, (nproc, nproc))
if uid >= 0:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
os.chdir(os.environ["HOME"])  # the work dir: only the new uid may enter it
os.environ.pop("PWD", None)  # bwrap sets it to /
os.execvp(sys.argv[6], sys.argv[6:])
"""

_SANDBOX_PYTHON = "/opt/python"
"""Where the base Python installation is mounted inside bwrap."""
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
)
"""All of ``/etc`` the sandbox sees (bound read-only where present)."""
_SANDBOX_UIDS = (1_000_000_000, 1 << 28)
"""As root, each call runs as a random uid from [start, start + count): no account has one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Resource limits of one call (``PythonExecConfig``'s), set in the child by ``LAUNCHER``."""

    cpu_time_s: int
    memory_mb: int
    max_file_mb: int
    max_processes: int

    def launcher(self, python: str, *, nproc: int = -1, uid: int | None = None) -> list[str]:
        """``python -c LAUNCHER <limits>``; the real command follows it. ``nproc`` -1: no
        process limit; ``uid`` None: keep the uid."""
        numbers = (
            self.cpu_time_s,
            self.memory_mb << 20,
            self.max_file_mb << 20,
            nproc,
            -1 if uid is None else uid,
        )
        return [python, "-I", "-B", "-c", LAUNCHER, *(str(n) for n in numbers)]


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


def _base_interpreter() -> tuple[str, str]:
    """(the base installation's prefix, the interpreter's path inside it); a venv's python is
    a link to the base one, whose standard library is all the sandbox needs."""
    prefix = os.path.realpath(sys.base_prefix)
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    rel = os.path.relpath(exe, prefix)
    if rel.startswith(".."):
        raise OSError(f"the interpreter {exe} is not inside sys.base_prefix {prefix}")
    return prefix, rel


def _mkdirs(path: str, top: tuple[str, ...]) -> list[str]:
    """``--dir`` (mode 0755) for each ancestor of ``path`` below ``/`` that no earlier mount
    made: bwrap would create them mode 0700, which a dropped uid cannot enter."""
    cmd: list[str] = []
    parent = os.path.dirname(path)
    chain: list[str] = []
    while parent not in ("/", "") and parent not in top:
        chain.append(parent)
        parent = os.path.dirname(parent)
    for folder in reversed(chain):
        cmd += ["--perms", "0755", "--dir", folder]
    return cmd


def bwrap_command(
    workdir: str,
    limits: Limits,
    uid: int | None,
    *,
    argv: Sequence[str] | None = None,
    python_env: str | None = None,
    env: Mapping[str, str] | None = None,
    share_net: bool = False,
    binds: Sequence[str] = (),
    ro_binds: Sequence[str] = (),
) -> list[str]:
    """The bwrap sandbox for one call; ``uid``: the uid to drop to (parent is root) or None
    (a user namespace maps the caller's own uid). ``argv``: the command, run in ``workdir``
    (default ``python -I -B main.py``, python_exec's); ``python_env``: a Python environment
    (a venv or an installation prefix) shown read-only at its own path with its ``bin`` first
    on PATH, so a check such as ``python -m pytest`` finds its packages (default: the base
    installation at /opt/python with the standard library only); ``env``: more variables;
    ``share_net``: keep the host's network namespace (a harness reaching a loopback gateway);
    ``binds`` / ``ro_binds``: more folders shown writable / read-only at their host paths."""
    prefix, exe = _base_interpreter()
    cmd = ["bwrap", "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid"]
    cmd += [] if share_net else ["--unshare-net"]
    cmd += ["--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if uid is None:
        cmd += ["--unshare-user"]
    else:  # privileged bwrap keeps only what the launcher needs to drop to ``uid``
        cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    cmd += ["--perms", "0755", "--dir", "/etc"]  # else 0700: a dropped uid reads none of it
    for path in _ETC_FILES:
        cmd += ["--ro-bind-try", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    mounted: tuple[str, ...] = ("/usr", "/tmp", "/proc", "/dev")
    if python_env is None:
        python = f"{_SANDBOX_PYTHON}/{exe}"
        path_head = f"{_SANDBOX_PYTHON}/bin"
        cmd += ["--perms", "0755", "--dir", os.path.dirname(_SANDBOX_PYTHON)]
        cmd += ["--ro-bind", prefix, _SANDBOX_PYTHON]
        site = os.path.relpath(sysconfig.get_path("purelib", vars={"base": prefix}), prefix)
        if not site.startswith("..") and os.path.isdir(os.path.join(prefix, site)):
            cmd += ["--tmpfs", f"{_SANDBOX_PYTHON}/{site}"]  # the standard library only
        library = f"{_SANDBOX_PYTHON}/lib"
    else:  # both at their host paths: a venv's interpreter is a link into the base prefix
        python = os.path.join(prefix, exe)
        env_dir = os.path.realpath(python_env)
        path_head = os.path.join(env_dir, "bin")
        for folder in dict.fromkeys((prefix, env_dir)):
            cmd += [*_mkdirs(folder, mounted), "--ro-bind", folder, folder]
            mounted += (folder,)
        library = os.path.join(prefix, "lib")
    for folder in ro_binds:
        cmd += [*_mkdirs(folder, mounted), "--ro-bind", folder, folder]
        mounted += (folder,)
    for folder in binds:
        cmd += [*_mkdirs(folder, mounted), "--bind", folder, folder]
        mounted += (folder,)
    cmd += [*_mkdirs(workdir, mounted), "--bind", workdir, workdir, "--clearenv"]
    variables = {
        "PATH": f"{path_head}:/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "PYTHONIOENCODING": "utf-8",
        # The base interpreter may find libpython through an absolute RUNPATH under $HOME.
        "LD_LIBRARY_PATH": library,
        **(env or {}),
    }
    for key, value in variables.items():
        cmd += ["--setenv", key, value]
    launch = limits.launcher(python, nproc=limits.max_processes, uid=uid)
    return [*cmd, "--", *launch, *(argv or (python, "-I", "-B", "main.py"))]


_PROBE_LIMITS = Limits(cpu_time_s=5, memory_mb=512, max_file_mb=1, max_processes=16)


@functools.cache
def bwrap_problem() -> str | None:
    """Why the bwrap sandbox cannot run here (None: it can); one probe run, cached."""
    if sys.platform != "linux" or shutil.which("bwrap") is None:
        return "bwrap is not installed"
    try:
        with tempfile.TemporaryDirectory(prefix="python_exec-probe-") as workdir:
            with open(os.path.join(workdir, "main.py"), "w") as f:
                f.write("print('ok')")
            uid = sandbox_uid(workdir)
            probe = subprocess.run(
                bwrap_command(workdir, _PROBE_LIMITS, uid),
                capture_output=True,
                timeout=30,
            )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the probe run failed: {e}"
    if probe.returncode != 0 or probe.stdout != b"ok\n":
        detail = (probe.stdout + probe.stderr).decode("utf-8", "replace").strip()[-300:]
        return f"the probe run exited {probe.returncode}: {detail}"
    return None


def sandbox_uid(workdir: str) -> int | None:
    """As root: a fresh uid for this call (so RLIMIT_NPROC counts only its processes), owning
    the work dir. Otherwise None: the user namespace keeps the caller's uid."""
    if os.geteuid() != 0:
        return None
    uid = _SANDBOX_UIDS[0] + secrets.randbelow(_SANDBOX_UIDS[1])
    os.chown(workdir, uid, uid)
    return uid


class Child:
    """The child process and how to kill all of it. For bwrap, the sandbox's init (from
    ``--info-fd``) is killed first, which takes its PID namespace with it; bwrap then exits on
    its own. Killing bwrap first would leave that init to the host's init to reap."""

    def __init__(self, proc: asyncio.subprocess.Process, info_fd: int) -> None:
        self.proc = proc
        self.info_fd = info_fd

    def stop(self) -> None:
        if self.proc.returncode is None and (pid := self._sandbox_pid()) is not None:
            try:
                os.kill(pid, signal.SIGKILL)
                return
            except ProcessLookupError:
                pass
        kill_group(self.proc.pid)

    def _sandbox_pid(self) -> int | None:
        if self.info_fd < 0:
            return None
        os.set_blocking(self.info_fd, False)
        try:
            info = json.loads(os.read(self.info_fd, 4096) or b"{}")
        except (BlockingIOError, ValueError):
            return None
        pid = info.get("child-pid")
        return pid if isinstance(pid, int) and pid > 1 else None


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def collect_output(child: Child, max_bytes: int) -> tuple[bytes, bool]:
    """Read the child's output as it comes, at most ``max_bytes``; past that, stop it.
    Returns (output, whether it was cut)."""
    stdout = child.proc.stdout
    assert stdout is not None
    out = bytearray()
    overflow = False
    while chunk := await stdout.read(1 << 16):
        if len(out) + len(chunk) > max_bytes:
            out += chunk[: max_bytes - len(out)]
            overflow = True
            child.stop()
            while await stdout.read(1 << 16):  # to EOF, or asyncio never reports the exit
                pass
            break
        out += chunk
    await child.proc.wait()
    return bytes(out), overflow
