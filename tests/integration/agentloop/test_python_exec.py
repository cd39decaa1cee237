"""python_exec runs code in a real child process: computes, is stopped at the wall-clock,
CPU-time, memory and file-size limits, cannot open a socket (network namespace or blocked
sockets), sees none of the parent's environment, leaves no background process behind, and its
output is truncated; the filesystem is not isolated (documented, and proved here)."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from agentloop.tools import ToolError
from agentloop.tools.python_exec import PythonExecTool, network_isolation

pytestmark = pytest.mark.integration

SOCKET_CODE = """
import socket
s = socket.socket()
s.settimeout(2)
s.connect(("1.1.1.1", 80))
print("connected")
"""


async def run(code: str, **config) -> str:
    tool = PythonExecTool(config)
    return (await tool.execute("i", {"code": code})).text


async def test_runs_code_in_a_temp_dir_and_returns_its_output():
    text = await run("import os\nprint(sum(range(10)))\nprint(os.listdir('.'))")
    assert text == "45\n['main.py']\n"


async def test_errors_show_the_traceback_and_exit_code():
    text = await run("raise ValueError('boom')")
    assert "ValueError: boom" in text and text.endswith("[exit code 1]")


async def test_infinite_loop_is_stopped_at_the_wall_clock_limit():
    with pytest.raises(ToolError) as info:
        await run("while True: pass", timeout_s=1.5, cpu_time_s=30)
    assert str(info.value) == (
        "python_exec: the code ran past the 1.5 s wall-clock limit and was stopped"
    )


async def test_busy_loop_is_stopped_at_the_cpu_time_limit():
    text = await run("while True: pass", timeout_s=20, cpu_time_s=1)
    assert text.endswith("[stopped: CPU-time limit of 1 s]")


async def test_allocation_past_the_memory_limit_fails():
    text = await run("x = bytearray(1 << 30)\nprint('allocated')", memory_mb=256)
    assert "MemoryError" in text and "allocated" not in text


@pytest.mark.parametrize("network", ["auto", "block"])
async def test_code_cannot_open_a_socket(network):
    tool = PythonExecTool({"network": network})
    text = (await tool.execute("i", {"code": SOCKET_CODE})).text
    assert "connected" not in text
    if tool.isolation == "namespace":
        assert "Network is unreachable" in text
    else:
        assert "PermissionError: network access is disabled in python_exec" in text
    assert tool.isolation == (network_isolation() if network == "auto" else "block")


async def test_block_mode_still_imports_ssl_and_urllib():
    text = await run("import ssl, urllib.request\nprint('ok')", network="block")
    assert text == "ok\n"


async def test_long_output_is_truncated_in_the_middle():
    text = await run("print('a' * 5000 + 'b' * 5000)", max_output_chars=100)
    assert text.startswith("a" * 50) and "...(truncated)..." in text
    assert text.rstrip("\n").endswith("b" * 49)


async def test_runner_and_loader_keys_in_the_tool_config_are_accepted():
    text = await run("print(1)", type="native", max_concurrency=2, timeout_s=5)
    assert text == "1\n"


async def test_the_parent_environment_does_not_reach_the_code(monkeypatch):
    monkeypatch.setenv("AGENTLOOP_TEST_SECRET", "hunter2-do-not-leak")
    text = await run("import json, os\nprint(json.dumps({**os.environ, 'cwd': os.getcwd()}))")
    assert "hunter2-do-not-leak" not in text
    env = json.loads(text)
    cwd = env.pop("cwd")
    # LC_CTYPE is Python's own C-locale coercion (PEP 538) in the child, not the parent's
    assert set(env) <= {"PATH", "HOME", "PYTHONIOENCODING", "LC_CTYPE"}, env
    assert env["HOME"] == cwd and os.path.basename(cwd).startswith("python_exec-")


async def test_each_call_gets_a_fresh_working_dir_that_is_removed_afterwards():
    code = "import os\nprint(os.listdir('.'))\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())"
    first = (await run(code)).splitlines()
    second = (await run(code)).splitlines()
    assert first[0] == second[0] == "['main.py']"
    assert first[1] != second[1]
    assert not os.path.exists(first[1]) and not os.path.exists(second[1])


async def test_writing_a_file_past_max_file_mb_fails():
    code = (
        "with open('small.bin', 'wb') as f:\n    f.write(bytes(512 * 1024))\nprint('small ok')\n"
        "with open('big.bin', 'wb') as f:\n    f.write(bytes(2 * 1024 * 1024))\nprint('big ok')"
    )
    text = await run(code, max_file_mb=1)
    assert text.startswith("small ok\n") and "big ok" not in text
    assert "OSError: [Errno 27] File too large" in text and text.endswith("[exit code 1]")


def test_max_file_mb_below_one_is_rejected():
    with pytest.raises(ValueError) as info:
        PythonExecTool({"max_file_mb": 0})
    assert str(info.value) == "python_exec needs max_file_mb >= 1, got 0"


async def test_background_processes_do_not_outlive_the_call():
    code = (
        "import subprocess\n"
        "kids = [subprocess.Popen(['sleep', '60'], stdout=subprocess.DEVNULL,\n"
        "        stderr=subprocess.DEVNULL) for _ in range(3)]\n"
        "print(' '.join(str(k.pid) for k in kids))"
    )
    pids = [int(p) for p in (await run(code)).split()]
    assert len(pids) == 3
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running: {pids}"
        await asyncio.sleep(0.1)


async def test_filesystem_is_not_isolated_code_writes_where_its_user_can(tmp_path):
    # Documented limit (docs/security.md): python_exec confines time, memory, file size,
    # environment and network, not the filesystem.
    outside = tmp_path / "outside.txt"
    text = await run(f"open({str(outside)!r}, 'w').write('written')\nprint('done')")
    assert text == "done\n" and outside.read_text() == "written"


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its (new) parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
