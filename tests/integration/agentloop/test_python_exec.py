"""python_exec runs code in a real child process: computes, is stopped at the wall-clock,
CPU-time and memory limits, cannot open a socket (network namespace or blocked sockets),
and its output is truncated."""

from __future__ import annotations

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
