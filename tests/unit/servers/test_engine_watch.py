"""An engine process ends itself once its server is gone (``servers/engine_watch.py``).

Real processes: a keeper (a child subreaper, so orphans come to it and it can reap them)
starts a "server" that names itself and starts an "engine" (spawned: a fresh interpreter that
loads the plugin, as vLLM's does; or forked: the at-fork hook), then SIGKILLs the server and
reports how the engine ended.
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from servers import engine_watch

ROOT = Path(__file__).resolve().parents[3]

KEEPER = r"""
import ctypes, os, signal, sys, time
ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
how, named = sys.argv[1], sys.argv[2]
r, w = os.pipe()
ready_r, ready_w = os.pipe()  # the engine's watch is set up (the server is killed after)
server = os.fork()
if server == 0:
    from servers import engine_watch
    if named == "self":
        engine_watch.name_parent()
    else:  # another process is the server: this one's children must not watch it
        os.environ[engine_watch.PARENT_ENV] = str(os.getppid())
    engine_watch.register()
    if how == "spawn":
        import subprocess
        code = (
            "from servers import engine_watch; import os, time; engine_watch.register(); "
            f"os.write({ready_w}, b'1'); time.sleep(60)"
        )
        engine = subprocess.Popen([sys.executable, "-c", code], pass_fds=(ready_w,)).pid
    else:
        engine = os.fork()
        if engine == 0:  # the at-fork hook has run
            os.write(ready_w, b"1")
            time.sleep(60)
            os._exit(0)
    os.read(ready_r, 1)
    os.write(w, f"{engine}\n".encode())
    time.sleep(60)
    os._exit(0)
engine = int(os.read(r, 64))
os.kill(server, signal.SIGKILL)
os.waitpid(server, 0)
t0 = time.monotonic()
deadline = t0 + float(sys.argv[3])
while time.monotonic() < deadline:
    pid, status = os.waitpid(engine, os.WNOHANG)
    if pid:
        print("ended", os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1)
        break
    time.sleep(0.05)
else:
    os.kill(engine, signal.SIGKILL)
    os.waitpid(engine, 0)
    print("alive")
"""


def _keeper(how: str, named: str, wait_s: float) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(engine_watch.PARENT_ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", KEEPER, how, named, str(wait_s)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("how", ["spawn", "fork"])
def test_an_engine_ends_itself_once_its_server_is_killed(how):
    # SIGTERM first: vLLM's handler shuts the engine down (SIGKILL only after GRACE_S)
    assert _keeper(how, "self", wait_s=30) == f"ended {int(signal.SIGTERM)}"


def test_a_child_of_another_process_than_the_named_server_does_not_watch():
    # named: the keeper, not the killed server; the orphan lives until the keeper kills it
    assert _keeper("fork", "other", wait_s=3 * engine_watch.POLL_S) == "alive"


def test_vllm_loads_the_watch_as_a_general_plugin():
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert {p.name: p.value for p in plugins}["agentloop_engine_watch"] == (
        "servers.engine_watch:register"
    )
