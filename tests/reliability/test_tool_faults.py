"""Tool faults injected for real into a tool_agent rollout (real MCP server over stdio, real
python_exec subprocesses; the model's turns are scripted): a hung MCP server, one that is
only slow, one that crashes, and a python_exec child killed by a signal. Each call comes
back as a tool message, the server is restarted where it must be, and the rollout goes on
to its last turn."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig
from agentloop.tool_agent import ToolAgentLoop
from agentloop.tools import load_tool_config
from agentloop.tools.mcp import load_mcp_servers
from tests.unit.agentloop.scripted import ScriptedServer

pytestmark = pytest.mark.integration

SERVER = Path(__file__).resolve().parents[1] / "integration" / "agentloop" / "mcp_server.py"
PROMPT = [{"role": "user", "content": "Use the tools."}]


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def mcp_tools(tmp_path: Path, **options):
    path = tmp_path / "mcp.json"
    spec = {"command": sys.executable, "args": [str(SERVER)], **options}
    path.write_text(json.dumps({"mcpServers": {"calc": spec}}))
    return load_mcp_servers(path)


async def rollout(tokenizer, tools, turns, timeout_s: float):
    server = ScriptedServer(tokenizer, turns)
    config = RolloutConfig(
        response_length=2048, multi_turn=MultiTurnConfig(tool_timeout_s=timeout_s)
    )
    out = await ToolAgentLoop(AgentLoopContext(server, tokenizer, config, tools)).run(
        {"temperature": 1.0}, raw_prompt=PROMPT
    )
    text = tokenizer.decode(server.requests[-1]["prompt_ids"], skip_special_tokens=False)
    messages = [p.split("\n</tool_response>")[0] for p in text.split("<tool_response>\n")[1:]]
    return out, messages


async def test_a_hung_mcp_server_times_out_is_restarted_and_the_rollout_goes_on(
    tmp_path, tokenizer
):
    tools = mcp_tools(tmp_path, ping_timeout_s=1)
    turns = [call("calc-pid"), call("calc-hang"), call("calc-pid"), call("calc-add", a=2, b=3)]
    # The call after the hang waits for the ping (1 s), the stop (~2 s) and the restart.
    out, messages = await rollout(tokenizer, tools, [*turns, "done"], timeout_s=8)
    first_pid, timed_out, second_pid, added = messages
    assert timed_out == "Error: tool 'calc-hang' timed out after 8 s"
    assert first_pid.isdigit() and second_pid.isdigit() and second_pid != first_pid
    assert added == "5"
    assert tools["calc-pid"].connection.restarts == 1
    assert out.record.tool_error_kinds == ["tool_timeout"]
    assert out.record.stop_reason == "no_tool_call" and out.num_turns == 10


async def test_a_slow_mcp_call_times_out_but_the_server_that_answers_pings_is_kept(
    tmp_path, tokenizer
):
    tools = mcp_tools(tmp_path, ping_timeout_s=1)
    turns = [call("calc-pid"), call("calc-slow_echo", text="x", seconds=4), call("calc-pid")]
    out, messages = await rollout(tokenizer, tools, [*turns, "done"], timeout_s=1)
    assert messages[1] == "Error: tool 'calc-slow_echo' timed out after 1 s"
    assert messages[0] == messages[2]  # same process
    assert tools["calc-pid"].connection.restarts == 0


async def test_a_crashed_mcp_server_past_its_restarts_errors_every_call_and_the_rollout_ends(
    tmp_path, tokenizer
):
    tools = mcp_tools(tmp_path, max_restarts=0)
    out, messages = await rollout(
        tokenizer, tools, [call("calc-crash"), call("calc-add", a=1, b=1), "done"], timeout_s=5
    )
    assert messages == [
        "Error: MCP server 'calc' failed on 'crash': MCPError: Connection closed",
        "Error: MCP server 'calc' is down (restarted 0 time(s); max_restarts in its entry of "
        "the MCP config allows more)",
    ]
    assert out.record.stop_reason == "no_tool_call"


async def test_a_python_exec_child_killed_by_a_signal_is_a_tool_message(tmp_path, tokenizer):
    config = tmp_path / "tools.yaml"
    config.write_text(
        "tools:\n  - class_name: agentloop.tools.python_exec.PythonExecTool\n"
        "    config: {type: native, timeout_s: 10}\n"
    )
    tools = load_tool_config(config)
    code = "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)"
    turns = [call("python_exec", code=code), call("python_exec", code="print(6 * 7)"), "done"]
    out, messages = await rollout(tokenizer, tools, turns, timeout_s=20)
    assert messages == ["before\n\n[exit code -11]", "42\n"]
    assert out.record.stop_reason == "no_tool_call"
