"""``agentloop-studio`` over real HTTP (the console script's uvicorn, an httpx client): an MCP
config's servers start with the page's load and answer its calls, a server that cannot start
is one line as the CLI gives it, and stopping the studio stops the MCP servers it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.integration.trainer.studio_process import wait_until_up
from trainer.workers.fsdp import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
MCP_SERVER = REPO / "tests" / "integration" / "agentloop" / "mcp_server.py"


def test_mcp_tools_start_with_the_page_answer_its_calls_and_stop_with_it(tmp_path):
    config = tmp_path / "mcp.json"
    spec = {"command": sys.executable, "args": [str(MCP_SERVER)]}
    config.write_text(json.dumps({"mcpServers": {"calc": spec}}))
    broken = tmp_path / "broken.json"
    broken.write_text(
        json.dumps({"mcpServers": {"calc": {"command": "no-such-mcp-server", "args": []}}})
    )
    port = free_port()
    studio = subprocess.Popen(
        [sys.executable, "-m", "trainer.cli.studio", "--port", str(port)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    pid = -1  # the MCP server's, once asked
    try:
        assert studio.stderr is not None
        assert studio.stderr.readline().strip() == f"agentloop-studio: open {url}/"
        wait_until_up(studio, url)
        with httpx.Client(base_url=url, timeout=60) as client:
            failed = client.post("/api/tools/load", json={"path": str(broken)})
            assert failed.status_code == 400
            assert failed.json() == {
                "error": "MCP server 'calc' failed to start: command 'no-such-mcp-server' not "
                "found on PATH"
            }
            tools = client.post("/api/tools/load", json={"path": str(config)}).json()["tools"]
            assert {t["name"]: t["source"] for t in tools}["calc-add"] == (
                "mcp.json: MCP server 'calc'"
            )
            added = client.post(
                "/api/tools/call", json={"name": "calc-add", "arguments": {"a": 2, "b": 3}}
            ).json()
            assert (added["text"], added["ok"]) == ("5", True)
            pid = int(client.post("/api/tools/call", json={"name": "calc-pid"}).json()["text"])
            assert psutil.pid_exists(pid)
            page = client.get("/tools")
            assert 'id="tool-calc-add"' in page.text and "MCP server &#39;calc&#39;" in page.text
    finally:
        studio.send_signal(signal.SIGINT)
        studio.wait(30)
    deadline = time.monotonic() + 15
    assert pid > 0
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the MCP server outlived the studio"
        time.sleep(0.2)
