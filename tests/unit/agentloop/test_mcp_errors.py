"""Reading an MCP server's stderr file: crash tracebacks in the two formats the SDK writes
(plain logging, rich), one still being written, a start-up traceback's tail, and exception
groups unwrapped to their cause. (The integration tests run the same against real servers.)"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from agentloop.tools.mcp_errors import RUN_DIR_ENV, ServerLog, crash_messages, log_dir, root_cause

PLAIN = """\
ERROR mcp.server.mcpserver.server: Tool 'convert' raised an unexpected exception
Traceback (most recent call last):
  File "/srv/units.py", line 9, in convert
    raise ValueError(f"unknown unit {unit!r}")
ValueError: unknown unit 'furlong'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/venv/mcp/server/mcpserver/tools/base.py", line 213, in run
    raise UnexpectedToolError(f"Error executing tool {self.name}") from exc
mcp.server.mcpserver.exceptions.UnexpectedToolError: Error executing tool convert
"""

# rich, at 80 columns: the message and the final line wrapped, the first record's path column
RICH = """\
[11/24/26 03:15:28] ERROR    Tool 'convert' raised an unexpected   server.py:455
                             exception
                             ╭─ Traceback (most recent call last─╮
                             │ /srv/units.py:9 in convert        │
                             ╰───────────────────────────────────╯
                             ValueError: unknown unit 'league' is
                             not a length

                             The above exception was the direct
                             cause of the following exception:

                             ╭─ Traceback (most recent call last─╮
                             │ /venv/mcp/server/mcpserver/tools/ │
                             ╰───────────────────────────────────╯
                             UnexpectedToolError: Error executing
                             tool convert
"""


def test_crash_messages_are_read_from_plain_and_rich_tracebacks():
    for text, message in [
        (PLAIN, "ValueError: unknown unit 'furlong'"),
        (RICH, "ValueError: unknown unit 'league' is not a length"),
    ]:
        lines = text.split("\n")
        assert crash_messages(lines) == [(len(lines) - 1, "convert", message)]


def test_a_crash_still_being_written_is_read_again_once_complete(tmp_path):
    log = ServerLog("units", tmp_path)
    handle = log.open()
    cut = RICH.index("tool convert")
    handle.write(RICH[:cut])  # the server has not written the wrapped tool name yet
    handle.flush()
    assert log.crash_message("convert") is None
    handle.write(RICH[cut:] + PLAIN)
    handle.close()
    assert log.crash_message("convert") == "ValueError: unknown unit 'league' is not a length"
    assert log.crash_message("convert") == "ValueError: unknown unit 'furlong'"
    assert log.crash_message("convert") is None


def test_tail_of_a_python_traceback_is_its_exception(tmp_path):
    log = ServerLog("units", tmp_path)
    with log.open() as handle:
        handle.write(
            "Traceback (most recent call last):\n"
            '  File "/srv/units.py", line 1, in <module>\n'
            "    import mcp\n"
            "ModuleNotFoundError: No module named 'mcp'\n"
            "[agentloop] MCP server exited with code 1\n"
        )
    assert log.tail() == "ModuleNotFoundError: No module named 'mcp'"
    assert log.exit_code() == 1
    assert log.path == tmp_path / f"mcp-units-{os.getpid()}.log"


def test_log_dir_is_under_the_run_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    assert log_dir() == Path(tmp_path) / "logs"


def test_root_cause_unwraps_nested_exception_groups():
    cause = ConnectionError("refused")
    group = BaseExceptionGroup(
        "outer", [asyncio.CancelledError(), ExceptionGroup("inner", [cause])]
    )
    assert root_cause(group) is cause
    plain = ValueError("plain")
    assert root_cause(plain) is plain
