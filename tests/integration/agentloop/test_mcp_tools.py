"""MCP servers from a JSON config (a real MCP server over stdio, written for the tests with
the mcp SDK): tools listed with schemas, called concurrently from tool_agent, a server that
exits mid-rollout restarted up to its max_restarts, bad configs rejected at start-up, a server
that cannot start reported in one line, and a tool's exception read by the model with its
message while the server's traceback goes to its log file."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig
from agentloop.tool_agent import ToolAgentLoop
from agentloop.tools import close_mcp_servers, load_tool_config
from agentloop.tools.mcp import load_mcp_servers
from agentloop.tools.mcp_errors import RUN_DIR_ENV
from tests.unit.agentloop.scripted import ScriptedServer

pytestmark = pytest.mark.integration

SERVER = Path(__file__).with_name("mcp_server.py")
UNITS_SERVER = Path(__file__).with_name("mcp_units_server.py")
PROMPT = [{"role": "user", "content": "Add 2 and 3."}]


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def write_config(tmp_path: Path, command: str = sys.executable, **options) -> Path:
    path = tmp_path / "mcp.json"
    spec = {"command": command, "args": [str(SERVER)], **options}
    path.write_text(json.dumps({"mcpServers": {"calc": spec}}))
    return path


@pytest.fixture(autouse=True)
def run_dir(tmp_path, monkeypatch) -> Path:
    """Server stderr logs go to ``<tmp_path>/logs``, as the trainer's run dir would hold them."""
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


def tool_loop(tokenizer, tools, turns, **multi_turn):
    server = ScriptedServer(tokenizer, turns)
    config = RolloutConfig(response_length=1024, multi_turn=MultiTurnConfig(**multi_turn))
    return ToolAgentLoop(AgentLoopContext(server, tokenizer, config, tools)), server


def tool_messages(tokenizer, server) -> list[str]:
    """Tool responses the model saw, from the prompt of its last turn."""
    text = tokenizer.decode(server.requests[-1]["prompt_ids"], skip_special_tokens=False)
    return [p.split("\n</tool_response>")[0] for p in text.split("<tool_response>\n")[1:]]


def test_json_config_lists_every_tool_with_its_schema(tmp_path):
    tools = load_tool_config(write_config(tmp_path))
    assert sorted(tools) == ["calc-add", "calc-crash", "calc-hang", "calc-pid", "calc-slow_echo"]
    add = tools["calc-add"].tool_schema["function"]
    assert add["description"] == "Add two integers."
    assert add["parameters"]["required"] == ["a", "b"]
    assert add["parameters"]["properties"]["a"]["type"] == "integer"


async def test_tool_agent_calls_mcp_tools_concurrently_and_sees_results(tmp_path, tokenizer):
    tools = load_mcp_servers(write_config(tmp_path))
    turn = "\n".join(
        [call("calc-slow_echo", text=f"t{i}", seconds=0.6) for i in range(3)]
        + [call("calc-add", a=2, b=3)]
    )
    loop, server = tool_loop(tokenizer, tools, [turn, "The answer is 5."], max_parallel_calls=4)
    start = time.perf_counter()
    out = await loop.run({"temperature": 1.0}, raw_prompt=PROMPT)
    elapsed = time.perf_counter() - start
    assert tool_messages(tokenizer, server) == ["echo: t0", "echo: t1", "echo: t2", "5"]
    assert out.record.tool_calls == 4 and out.record.tool_errors == 0
    assert elapsed < 1.5  # three 0.6 s calls overlapped
    prompt_text = tokenizer.decode(out.prompt_ids, skip_special_tokens=False)
    assert '"name": "calc-slow_echo"' in prompt_text


async def test_server_exiting_mid_rollout_is_restarted_up_to_max_restarts(tmp_path, tokenizer):
    tools = load_mcp_servers(write_config(tmp_path, max_restarts=1))
    turns = [
        call("calc-crash"),
        call("calc-add", a=1, b=1),
        call("calc-crash"),
        call("calc-add", a=2, b=2),
        "done",
    ]
    loop, server = tool_loop(tokenizer, tools, turns)
    out = await loop.run({"temperature": 1.0}, raw_prompt=PROMPT)
    assert tool_messages(tokenizer, server) == [
        "Error: MCP server 'calc' failed on 'crash': MCPError: Connection closed",
        "2",  # restarted on this call
        "Error: MCP server 'calc' failed on 'crash': MCPError: Connection closed",
        "Error: MCP server 'calc' is down (restarted 1 time(s); max_restarts in its entry of "
        "the MCP config allows more)",
    ]
    assert out.record.stop_reason == "no_tool_call"
    assert out.record.tool_error_kinds == ["tool_infra"] * 3


def test_missing_server_command_fails_at_start_up(tmp_path):
    with pytest.raises(ValueError) as info:
        load_mcp_servers(write_config(tmp_path, command="no-such-mcp-server"))
    assert str(info.value) == (
        "MCP server 'calc' failed to start: command 'no-such-mcp-server' not found on PATH"
    )


@pytest.mark.parametrize(
    ("code", "why"),
    [
        (
            "import nonexistent_module_xyz",
            "exited with code 1 running `{python} -c 'import nonexistent_module_xyz'`; last "
            "stderr lines: ModuleNotFoundError: No module named 'nonexistent_module_xyz' "
            "(full log: {log})",
        ),
        (
            "import sys; sys.exit(3)",
            "exited with code 3 running `{python} -c 'import sys; sys.exit(3)'`; no stderr "
            "output (log: {log})",
        ),
    ],
    ids=["import_error", "silent_exit"],
)
def test_server_that_fails_to_start_is_one_line_with_exit_code_command_and_stderr(
    tmp_path, code, why
):
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps({"mcpServers": {"units": {"command": sys.executable, "args": ["-c", code]}}})
    )
    with pytest.raises(ValueError) as info:
        load_mcp_servers(path)
    log = tmp_path / "logs" / f"mcp-units-{os.getpid()}.log"
    message = why.format(python=sys.executable, log=log)
    assert str(info.value) == f"MCP server 'units' failed to start: {message}"


def write_units_config(tmp_path: Path, *args: str) -> Path:
    path = tmp_path / "mcp.json"
    spec = {"command": sys.executable, "args": [str(UNITS_SERVER), *args]}
    path.write_text(json.dumps({"mcpServers": {"units": spec}}))
    return path


@pytest.mark.parametrize("log_format", ["rich", "plain"])
async def test_tool_exception_reaches_the_model_with_its_message_and_traceback_goes_to_log(
    tmp_path, tokenizer, capfd, caplog, log_format
):
    caplog.set_level(logging.INFO, logger="agentloop.tools")
    tools = load_mcp_servers(
        write_units_config(tmp_path, *(["plain"] if log_format == "plain" else []))
    )
    turns = [
        call("units-convert", value=1, unit="furlong"),  # a plain ValueError in the server
        call("units-convert", value=-1, unit="m"),  # the SDK's own ToolError
        call("units-convert", value=2, unit="km"),
        "done",
    ]
    loop, server = tool_loop(tokenizer, tools, turns)
    out = await loop.run({"temperature": 1.0}, raw_prompt=PROMPT)
    assert tool_messages(tokenizer, server) == [
        "Error: units-convert failed: ValueError: unknown unit 'furlong'",
        "Error: units-convert failed: value must be >= 0",
        "2000 m",
    ]
    assert out.record.tool_error_kinds == ["tool_failed", "tool_failed"]
    log = tmp_path / "logs" / f"mcp-units-{os.getpid()}.log"
    assert "Traceback" not in capfd.readouterr().err  # not on the trainer's console
    assert "ValueError: unknown unit 'furlong'" in log.read_text()
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("agentloop.tools.mcp")]
    assert f"MCP server units started; its stderr goes to {log}" in messages
    assert (
        f"MCP server units: tool convert raised ValueError: unknown unit 'furlong' "
        f"(traceback in {log})"
    ) in messages


async def test_concurrent_tool_exceptions_each_reach_their_own_call(tmp_path):
    tools = load_mcp_servers(write_units_config(tmp_path))
    units = ["furlong", "league", "cubit", "m", "fathom", "span", "km", "ell"] * 2

    async def convert(unit: str) -> str:
        try:
            return (await tools["units-convert"].execute("i", {"value": 1, "unit": unit})).text
        except Exception as exc:  # noqa: BLE001 - the message is what is compared
            return str(exc)

    answers = await asyncio.gather(*(convert(u) for u in units))
    expected = {"m": "1 m", "km": "1000 m"}
    assert answers == [
        expected.get(u, f"units-convert failed: ValueError: unknown unit {u!r}") for u in units
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{oops", "not valid JSON (Expecting property name enclosed in double quotes, line 1)"),
        ('{"servers": {}}', 'expected {"mcpServers": {name: {...}}}'),
        ('{"mcpServers": {"a": {"args": []}}}', "server 'a' needs either command (+ args) or url"),
        ('{"mcpServers": {"a": {"command": "x", "args": "y"}}}', "server 'a': args must be a list"),
        (
            '{"mcpServers": {"a": {"command": "x", "max_restarts": -1}}}',
            "server 'a': max_restarts must be an integer >= 0",
        ),
        (
            '{"mcpServers": {"a": {"command": "x", "ping_timeout_s": "5"}}}',
            "server 'a': ping_timeout_s must be a number > 0",
        ),
    ],
    ids=[
        "bad_json",
        "no_mcpServers",
        "no_command_or_url",
        "args_not_list",
        "bad_max_restarts",
        "bad_ping_timeout",
    ],
)
def test_bad_mcp_config_is_named(tmp_path, content, message):
    path = tmp_path / "mcp.json"
    path.write_text(content)
    with pytest.raises(ValueError) as info:
        load_mcp_servers(path)
    assert str(info.value) == f"MCP config {path}: {message}"


def test_verl_yaml_mcp_entry_selects_tools(tmp_path):
    write_config(tmp_path)
    yaml_path = tmp_path / "tools.yaml"
    entry = {
        "class_name": "mcp",
        "config": {"type": "mcp"},
        "mcp": {"mcp_servers_config_path": "mcp.json", "tool_selected_list": ["add"]},
    }
    yaml_path.write_text(yaml.safe_dump({"tools": [entry]}))
    assert list(load_tool_config(yaml_path)) == ["calc-add"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("transport", "path"), [("sse", "/sse"), ("streamable-http", "/mcp")])
async def test_http_transports_list_and_call_tools(tmp_path, transport, path):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), transport, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "MCP HTTP server did not start"
            time.sleep(0.2)
        spec = {"url": f"http://127.0.0.1:{port}{path}"}
        if transport == "streamable-http":
            spec["type"] = transport
        config = tmp_path / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {"web": spec}}))
        tools = load_mcp_servers(config)
        assert sorted(tools) == ["web-add", "web-crash", "web-hang", "web-pid", "web-slow_echo"]
        assert (await tools["web-add"].execute("i", {"a": 4, "b": 5})).text == "9"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _mcp_children() -> list:
    import psutil

    return [p for p in psutil.Process().children(recursive=True) if str(SERVER) in p.cmdline()]


def test_start_up_checks_read_the_schemas_and_leave_no_mcp_server_running(
    tmp_path, tiny_qwen3_path
):
    """``prepare_rollout`` loads the tool config to check it (the agent-loop workers start
    their own servers): it keeps the schemas and stops what it started."""
    from trainer.config.actor import ModelConfig
    from trainer.config.schema import ActorRolloutRefConfig, Config
    from trainer.launch.rollout import prepare_rollout

    config = Config(actor_rollout_ref=ActorRolloutRefConfig(model=ModelConfig(path="tiny-qwen3")))
    config.actor_rollout_ref.rollout.multi_turn = MultiTurnConfig(
        tool_config_path=str(write_config(tmp_path))
    )
    before = {p.pid for p in _mcp_children()}  # servers earlier tests of the module keep
    tools = load_tool_config(write_config(tmp_path))  # the control: a loaded server runs
    assert {p.pid for p in _mcp_children()} - before
    close_mcp_servers(tools.values())
    assert {p.pid for p in _mcp_children()} - before == set()
    setup = prepare_rollout(config)
    assert setup.tool_names == sorted(tools)
    assert "calc-add" in [s["function"]["name"] for s in setup.tool_schemas]
    assert {p.pid for p in _mcp_children()} - before == set()
