"""python_exec runs code in a real child process, in both sandboxes (bwrap and a plain process):
computes, is stopped at the wall-clock, CPU-time, memory, file-size and output-size limits,
cannot open a socket, sees none of the parent's environment and leaves no background process
behind. Under bwrap it sees nothing of the repo or $HOME, cannot write outside its work dir and
a fork bomb is stopped; the plain process does not isolate the filesystem (documented, and
proved here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from agentloop.tools import ToolError
from agentloop.tools.python_exec import PythonExecTool, bwrap_problem, network_isolation

pytestmark = pytest.mark.integration

SOCKET_CODE = """
import socket
s = socket.socket()
s.settimeout(2)
s.connect(("1.1.1.1", 80))
print("connected")
"""


REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(params=["bwrap", "process"])
def sandbox(request) -> str:
    if request.param == "bwrap" and (problem := bwrap_problem()) is not None:
        pytest.skip(f"bwrap sandbox unavailable here: {problem} (apt-get install bubblewrap)")
    return request.param


async def run(code: str, **config) -> str:
    tool = PythonExecTool(config)
    return (await tool.execute("i", {"code": code})).text


def traceback_tail(text: str) -> str:
    """The error line, a blank line and the exit marker: how a traceback ends for the model."""
    return "\n".join(text.rstrip("\n").splitlines()[-3:])


async def test_runs_code_in_a_temp_dir_and_returns_its_output(sandbox):
    text = await run("import os\nprint(sum(range(10)))\nprint(os.listdir('.'))", sandbox=sandbox)
    assert text == "45\n['main.py']\n"


async def test_errors_show_the_traceback_and_exit_code(sandbox):
    text = await run("raise ValueError('boom')", sandbox=sandbox)
    assert "ValueError: boom" in text and text.endswith("[exit code 1]")


async def test_a_signal_death_reads_as_a_negative_exit_code(sandbox):
    code = "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)"
    assert await run(code, sandbox=sandbox) == "before\n\n[exit code -11]"


async def test_infinite_loop_is_stopped_at_the_wall_clock_limit(sandbox):
    with pytest.raises(ToolError) as info:
        await run("while True: pass", timeout_s=1.5, cpu_time_s=30, sandbox=sandbox)
    assert str(info.value) == (
        "python_exec: the code ran past the 1.5 s wall-clock limit and was stopped"
    )


async def test_busy_loop_is_stopped_at_the_cpu_time_limit(sandbox):
    text = await run("while True: pass", timeout_s=20, cpu_time_s=1, sandbox=sandbox)
    assert text.endswith("[stopped: CPU-time limit of 1 s]")


async def test_allocation_past_the_memory_limit_fails(sandbox):
    text = await run("x = bytearray(1 << 30)\nprint('allocated')", memory_mb=256, sandbox=sandbox)
    assert traceback_tail(text) == "MemoryError\n\n[exit code 1]"
    assert "allocated" not in text


@pytest.mark.parametrize("network", ["auto", "block"])
async def test_code_cannot_open_a_socket(network):
    tool = PythonExecTool({"network": network, "sandbox": "process"})
    text = (await tool.execute("i", {"code": SOCKET_CODE})).text
    assert "connected" not in text
    if tool.isolation == "namespace":
        assert "Network is unreachable" in text
    else:
        assert "PermissionError: network access is disabled in python_exec" in text
    assert tool.isolation == (network_isolation() if network == "auto" else "block")


async def test_block_mode_still_imports_ssl_and_urllib():
    text = await run("import ssl, urllib.request\nprint('ok')", network="block", sandbox="process")
    assert text == "ok\n"


async def test_long_output_is_truncated_in_the_middle(sandbox):
    text = await run("print('a' * 5000 + 'b' * 5000)", max_output_chars=100, sandbox=sandbox)
    assert text.startswith("a" * 50) and "...(truncated)..." in text
    assert text.rstrip("\n").endswith("b" * 49)


# A fresh interpreter runs one call and prints how far its peak RSS rose during it (ru_maxrss,
# KiB): buffering the 1 GB the child prints would raise it by about 1 GB.
RSS_PROBE = """
import asyncio, json, resource, sys
from agentloop.tools.python_exec import PythonExecTool
tool = PythonExecTool({"sandbox": sys.argv[1], "timeout_s": 60, "cpu_time_s": 60})
code = "import sys\\nfor _ in range(1024): sys.stdout.write('x' * (1 << 20))"
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
text = asyncio.run(tool.execute("i", {"code": code})).text
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_kib": after - before, "text": text}))
"""


def test_printing_1_gb_is_cut_at_the_byte_bound_without_buffering_it(sandbox):
    probe = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, sandbox],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(probe.stdout)
    assert result["growth_kib"] < 50 * 1024, result["growth_kib"]
    text = result["text"]
    assert text.endswith("\n[output cut: more than 1048576 bytes; the process was stopped]")
    assert len(text) < 4100 and text.startswith("x" * 1000)


def test_a_byte_bound_below_the_char_bound_is_rejected():
    with pytest.raises(ValueError) as info:
        PythonExecTool({"max_output_bytes": 100})
    assert str(info.value) == (
        "python_exec needs max_output_bytes >= max_output_chars (4000), got 100"
    )


async def test_runner_and_loader_keys_in_the_tool_config_are_accepted():
    text = await run("print(1)", type="native", max_concurrency=2, timeout_s=5)
    assert text == "1\n"


async def test_the_parent_environment_does_not_reach_the_code(monkeypatch, sandbox):
    monkeypatch.setenv("AGENTLOOP_TEST_SECRET", "hunter2-do-not-leak")
    code = "import json, os\nprint(json.dumps({**os.environ, 'cwd': os.getcwd()}))"
    text = await run(code, sandbox=sandbox)
    assert "hunter2-do-not-leak" not in text
    env = json.loads(text)
    cwd = env.pop("cwd")
    # LC_CTYPE is Python's own C-locale coercion (PEP 538) in the child, not the parent's;
    # under bwrap the base interpreter finds libpython through LD_LIBRARY_PATH.
    assert set(env) <= {"PATH", "HOME", "PYTHONIOENCODING", "LC_CTYPE", "LD_LIBRARY_PATH"}, env
    assert env["HOME"] == cwd and os.path.basename(cwd).startswith("python_exec-")


async def test_each_call_gets_a_fresh_working_dir_that_is_removed_afterwards(sandbox):
    code = "import os\nprint(os.listdir('.'))\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())"
    first = (await run(code, sandbox=sandbox)).splitlines()
    second = (await run(code, sandbox=sandbox)).splitlines()
    assert first[0] == second[0] == "['main.py']"
    assert first[1] != second[1]
    assert not os.path.exists(first[1]) and not os.path.exists(second[1])


async def test_writing_a_file_past_max_file_mb_fails(sandbox):
    code = (
        "with open('small.bin', 'wb') as f:\n    f.write(bytes(512 * 1024))\nprint('small ok')\n"
        "with open('big.bin', 'wb') as f:\n    f.write(bytes(2 * 1024 * 1024))\nprint('big ok')"
    )
    text = await run(code, max_file_mb=1, sandbox=sandbox)
    assert text.startswith("small ok\n") and "big ok" not in text
    assert "OSError: [Errno 27] File too large" in text and text.endswith("[exit code 1]")


def test_max_file_mb_below_one_is_rejected():
    with pytest.raises(ValueError) as info:
        PythonExecTool({"max_file_mb": 0})
    assert str(info.value) == "python_exec needs max_file_mb >= 1, got 0"


async def test_background_processes_do_not_outlive_the_call(sandbox):
    # Sandbox PIDs are not host PIDs under bwrap: find the processes by their $HOME (the
    # call's own work dir), which every process the code starts inherits.
    code = (
        "import os, subprocess\n"
        "kids = [subprocess.Popen(['sleep', '60'], stdout=subprocess.DEVNULL,\n"
        "        stderr=subprocess.DEVNULL) for _ in range(3)]\n"
        "print(os.environ['HOME'])"
    )
    home = (await run(code, sandbox=sandbox)).strip()
    assert home.startswith("/") and "python_exec-" in home
    _wait_until_gone(home)


async def test_filesystem_is_not_isolated_in_the_process_sandbox(tmp_path):
    # Documented limit (docs/security.md): the plain process sandbox confines time, memory,
    # file size, environment and network, not the filesystem.
    outside = tmp_path / "outside.txt"
    code = f"open({str(outside)!r}, 'w').write('written')\nprint('done')"
    text = await run(code, sandbox="process")
    assert text == "done\n" and outside.read_text() == "written"


# --- the bwrap sandbox: each test asserts what the model gets back --------------------------


@pytest.fixture
def bwrap() -> None:
    if (problem := bwrap_problem()) is not None:
        pytest.skip(f"bwrap sandbox unavailable here: {problem} (apt-get install bubblewrap)")


def not_found(path: str) -> str:
    return f"FileNotFoundError: [Errno 2] No such file or directory: {path!r}\n\n[exit code 1]"


async def test_bwrap_code_cannot_read_a_file_of_the_repo(bwrap):
    path = str(REPO / "pyproject.toml")
    assert os.path.exists(path)
    text = await run(f"print(open({path!r}).read())", sandbox="bwrap")
    assert traceback_tail(text) == not_found(path)


async def test_bwrap_code_cannot_read_a_file_in_home(bwrap):
    secret = Path.home() / f".python_exec_test_{uuid.uuid4().hex}"
    secret.write_text("hunter2")
    try:
        text = await run(f"print(open({str(secret)!r}).read())", sandbox="bwrap")
    finally:
        secret.unlink()
    assert traceback_tail(text) == not_found(str(secret))


async def test_bwrap_code_cannot_write_outside_its_work_dir(bwrap):
    text = await run("open('/usr/python_exec_test', 'w')", sandbox="bwrap")
    assert traceback_tail(text) == (
        "OSError: [Errno 30] Read-only file system: '/usr/python_exec_test'\n\n[exit code 1]"
    )
    assert not os.path.exists("/usr/python_exec_test")


async def test_bwrap_tmp_is_private_to_the_call(bwrap):
    name = f"python_exec_test_{uuid.uuid4().hex}"
    text = await run(f"open('/tmp/{name}', 'w').write('x')\nprint('ok')", sandbox="bwrap")
    assert text == "ok\n" and not os.path.exists(f"/tmp/{name}")


async def test_bwrap_code_cannot_open_a_socket(bwrap):
    tool = PythonExecTool({"sandbox": "bwrap"})
    text = (await tool.execute("i", {"code": SOCKET_CODE})).text
    assert traceback_tail(text) == ("OSError: [Errno 101] Network is unreachable\n\n[exit code 1]")
    assert tool.isolation == "namespace"


async def test_bwrap_fork_bomb_is_stopped_at_the_process_limit(bwrap):
    code = "import os\nprint(os.environ['HOME'], flush=True)\nwhile True: os.fork()"
    started = time.monotonic()
    text = await run(code, sandbox="bwrap", max_processes=16, timeout_s=20)
    assert time.monotonic() - started < 10
    # Every process past the limit prints this traceback; they write at once, so lines of
    # different tracebacks interleave and only the error line and the exit are fixed.
    assert "\nBlockingIOError: [Errno 11] Resource temporarily unavailable\n" in text
    assert text.endswith("\n\n[exit code 1]")
    _wait_until_gone(text.splitlines()[0])


async def test_bwrap_sees_the_standard_library_only(bwrap):
    code = (
        "import json, sqlite3, ssl\ntry:\n    import pytest\nexcept ImportError as e:\n    print(e)"
    )
    assert await run(code, sandbox="bwrap") == "No module named 'pytest'\n"


def _wait_until_gone(home: str) -> None:
    """Every process whose environment has HOME=home has exited (zombies count as gone)."""
    deadline = time.monotonic() + 10
    while left := _processes_with_home(home):
        assert time.monotonic() < deadline, f"still running: {left}"
        time.sleep(0.1)


def _processes_with_home(home: str) -> list[int]:
    needle = f"HOME={home}".encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read() + b"\0"
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in b"\0" + environ and state != "Z":
            found.append(int(entry))
    return found


def test_auto_falls_back_to_the_process_sandbox_and_says_so_once(monkeypatch, caplog):
    from agentloop.tools import python_exec

    monkeypatch.setattr(python_exec, "bwrap_problem", lambda: "bwrap is not installed")
    python_exec._auto_backend.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="agentloop.tools.python_exec"):
            tools = [PythonExecTool(), PythonExecTool()]
    finally:
        python_exec._auto_backend.cache_clear()
    fallback = "unshare" if network_isolation() == "namespace" else "block"
    assert [tool.backend for tool in tools] == [fallback, fallback]
    assert caplog.messages == [
        "python_exec: the bwrap sandbox is unavailable (bwrap is not installed); falling back "
        f"to the {fallback!r} backend, which does not isolate the filesystem or limit "
        "processes. Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) for "
        "filesystem isolation."
    ]
