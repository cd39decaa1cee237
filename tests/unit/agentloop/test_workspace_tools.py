"""The workspace tools on the plain-process backend (fast; the bwrap sandbox is in
tests/unit/agentloop/test_workspace_tools_loop.py): each tool's answer, every refusal
word for word (a path leaving the workspace, old text found 0 or 2 times), the truncation
marker, the per-command time limit, the tool config entry, the worker's hook and the step's
workspace metrics."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from agentloop.base import AgentLoopOutput
from agentloop.tools import load_tool_config
from agentloop.workspace import (
    TOOL_NAMES,
    WorkspaceAgentError,
    WorkspaceConfig,
    WorkspacePool,
    WorkspaceTask,
    bash,
    current_workspace,
    read_file,
    run_check,
    run_loop_in_workspace,
    str_replace,
    workspace_metrics,
    workspace_tools,
    write_file,
)

OUTSIDE = "is outside the workspace; give a path inside it (relative to the workspace folder)"


@pytest.fixture()
def task(tmp_path) -> WorkspaceTask:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    check = "grep -q 'a + b' calc.py && echo fixed || { echo broken; exit 1; }"
    return WorkspaceTask(workspace=repo, problem="fix add", check=("sh", "-c", check))


def make_pool(tmp_path: Path, **kw) -> WorkspacePool:
    return WorkspacePool(
        WorkspaceConfig(root=str(tmp_path / "runs"), sandbox="process", warm_per_task=0, **kw)
    )


@pytest.fixture()
async def ws(tmp_path, task):
    pool = make_pool(tmp_path, tool_output_chars=200, agent_timeout_s=1.0)
    async with pool.sample(task) as ws:
        yield ws
    await pool.close()


def test_the_tools_have_their_names_and_schemas():
    tools = workspace_tools()
    assert (
        tuple(tools)
        == TOOL_NAMES
        == (
            "bash",
            "read_file",
            "write_file",
            "str_replace",
            "run_check",
        )
    )
    params = tools["read_file"].tool_schema["function"]["parameters"]
    assert params["required"] == ["path"]
    assert params["properties"]["start_line"] == {
        "type": "integer",
        "description": "The first line to show (1-based; default the first).",
    }
    assert tools["str_replace"].tool_schema["function"]["parameters"]["required"] == [
        "path",
        "old",
        "new",
    ]
    assert tools["run_check"].tool_schema["function"]["parameters"] == {
        "type": "object",
        "properties": {},
    }
    assert tools["bash"].config == {"call_timeout_s": 86400.0}


async def test_bash_returns_the_exit_code_and_the_output(ws):
    assert await bash("echo out; echo err >&2; exit 3") == "[exit code 3]\nout\nerr\n"
    assert await bash("pwd") == f"[exit code 0]\n{ws.path}\n"
    assert await bash("true") == "[exit code 0]"


async def test_long_output_keeps_head_and_tail_around_a_marker(ws):
    text = await bash("printf 'a%.0s' $(seq 1000); printf 'END'")
    # "[exit code 0]\n" + 1000 a + "END" = 1017 characters, 200 kept
    assert (
        text == "[exit code 0]\n" + "a" * 86 + "\n[... 817 characters cut ...]\n" + "a" * 97 + "END"
    )


async def test_a_command_past_its_time_limit_is_killed(ws):
    start = time.perf_counter()
    text = await bash("echo started; sleep 60")
    assert time.perf_counter() - start < 30
    assert text.startswith("[timed out after ") and text.endswith(" s and was killed]")


async def test_read_file_numbers_lines_and_takes_a_range(ws):
    assert await read_file("calc.py") == "     1\tdef add(a, b):\n     2\t    return a - b"
    assert await read_file("calc.py", start_line=2) == "     2\t    return a - b"
    assert await read_file(str(ws.path / "calc.py"), end_line=1) == "     1\tdef add(a, b):"
    assert await read_file("calc.py", start_line=5) == (
        "Error: lines 5-2 are out of range: 'calc.py' has 2 lines"
    )
    assert await read_file("nope.py") == "Error: 'nope.py' does not exist"
    assert await read_file(".") == "Error: '.' is a folder, not a file"


async def test_paths_that_leave_the_workspace_are_refused(ws, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host data")
    os.symlink(tmp_path, ws.path / "link")
    assert await read_file("../secret.txt") == f"Error: '../secret.txt' {OUTSIDE}"
    assert await read_file(str(secret)) == f"Error: {str(secret)!r} {OUTSIDE}"
    assert await read_file("link/secret.txt") == f"Error: 'link/secret.txt' {OUTSIDE}"
    assert await write_file("../evil.txt", "x") == f"Error: '../evil.txt' {OUTSIDE}"
    assert await write_file("link/evil.txt", "x") == f"Error: 'link/evil.txt' {OUTSIDE}"
    assert await str_replace("link/secret.txt", "host", "x") == (
        f"Error: 'link/secret.txt' {OUTSIDE}"
    )
    assert await read_file("") == "Error: path is empty; give a path relative to the workspace"
    assert secret.read_text() == "host data" and not (tmp_path / "evil.txt").exists()


async def test_write_file_creates_folders_and_overwrites(ws):
    assert await write_file("pkg/sub/new.py", "x = 1\n") == "created pkg/sub/new.py (6 characters)"
    assert (ws.path / "pkg" / "sub" / "new.py").read_text() == "x = 1\n"
    assert await write_file("pkg/sub/new.py", "x = 2\n") == (
        "overwrote pkg/sub/new.py (6 characters)"
    )
    assert await bash("cat pkg/sub/new.py") == "[exit code 0]\nx = 2\n"
    assert await write_file("pkg", "x") == "Error: 'pkg' is a folder, not a file"


async def test_str_replace_needs_exactly_one_occurrence(ws):
    (ws.path / "twice.py").write_text("a = 1\na = 1\n")
    assert await str_replace("calc.py", "a * b", "a + b") == (
        "Error: old occurs 0 times in calc.py; it must occur exactly once (include more of the "
        "surrounding text to make it unique)"
    )
    assert await str_replace("twice.py", "a = 1", "a = 2") == (
        "Error: old occurs 2 times in twice.py; it must occur exactly once (include more of the "
        "surrounding text to make it unique)"
    )
    assert await str_replace("gone.py", "a", "b") == (
        "Error: 'gone.py' does not exist or is not a file"
    )
    assert await str_replace("calc.py", "", "b") == (
        "Error: old is empty; give the exact text to replace"
    )
    assert (ws.path / "twice.py").read_text() == "a = 1\na = 1\n"
    assert await str_replace("calc.py", "a - b", "a + b") == "replaced 1 occurrence in calc.py"
    assert (ws.path / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"


async def test_run_check_reports_without_ending_the_sample(ws):
    assert await run_check() == "check failed: score 0 (0 passed, 0 failed)\nbroken\n"
    await str_replace("calc.py", "a - b", "a + b")
    assert await run_check() == "check passed: score 1 (0 passed, 0 failed)\nfixed\n"
    assert current_workspace() is ws and ws.path.exists()


async def test_the_tools_need_a_sample_workspace():
    with pytest.raises(LookupError, match="no workspace in this context"):
        await bash("true")


def test_a_tool_config_entry_gives_the_tools_and_the_pool_config(tmp_path):
    path = tmp_path / "tools.yaml"
    entry = {"type": "workspace", "workspace": {"agent_timeout_s": 5, "tool_output_chars": 500}}
    path.write_text(yaml.safe_dump({"tools": [{"class_name": "workspace", "config": entry}]}))
    tools = load_tool_config(path)
    assert sorted(tools) == sorted(TOOL_NAMES)
    assert tools["bash"].workspace == WorkspaceConfig(agent_timeout_s=5, tool_output_chars=500)
    entry = {"type": "workspace", "tools": ["bash", "read_file"], "call_timeout_s": 60}
    path.write_text(yaml.safe_dump({"tools": [{"class_name": "workspace", "config": entry}]}))
    tools = load_tool_config(path)
    assert sorted(tools) == ["bash", "read_file"] and tools["bash"].config["call_timeout_s"] == 60


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"tools": ["bash", "ls"]},
            "{path}: tools[0]: workspace tools: 'ls' is not one (tools: ('bash', 'read_file', "
            "'write_file', 'str_replace', 'run_check'))",
        ),
        (
            {"workspace": {"timeout": 3}},
            "{path}: tools[0]: workspace tools: workspace.timeout is not a WorkspaceConfig key "
            "(keys: agent_timeout_s, cpu_time_s, max_concurrent_prepares, max_file_mb, "
            "max_output_bytes, max_processes, max_warm, memory_mb, output_tail_chars, "
            "python_env, root, sample_timeout_s, sandbox, tool_output_chars, warm_per_task)",
        ),
        (
            {"workspace": {"tool_output_chars": 10}},
            "{path}: tools[0]: workspace needs sample_timeout_s > 0 and tool_output_chars >= 200",
        ),
    ],
)
def test_a_bad_workspace_entry_names_the_key(tmp_path, config, message):
    path = tmp_path / "tools.yaml"
    entry = {"class_name": "workspace", "config": {"type": "workspace", **config}}
    path.write_text(yaml.safe_dump({"tools": [entry]}))
    with pytest.raises(ValueError) as err:
        load_tool_config(path)
    assert str(err.value) == message.format(path=path)


def _output() -> AgentLoopOutput:
    return AgentLoopOutput([1], [2], [1], [-0.1], 2, metrics={"generate_s": 0.5})


async def test_the_hook_scores_the_loop_with_the_check(tmp_path, task):
    pool = make_pool(tmp_path)

    async def fixing_loop() -> AgentLoopOutput:
        assert await str_replace("calc.py", "a - b", "a + b") == "replaced 1 occurrence in calc.py"
        return _output()

    out = await run_loop_in_workspace(pool, task, fixing_loop, timeout_s=60)
    assert out.reward_score == 1.0
    assert out.extra["workspace"]["score"] == 1.0 and out.extra["workspace"]["agent_error"] is None
    assert out.metrics["generate_s"] == 0.5 and out.metrics["workspace/warm"] == 0.0
    assert out.metrics["workspace/check_timeout"] == 0.0
    assert out.metrics["workspace/check_s"] > 0 and out.metrics["workspace/prepare_s"] > 0

    async def idle_loop() -> AgentLoopOutput:
        return _output()

    assert (await run_loop_in_workspace(pool, task, idle_loop, timeout_s=60)).reward_score == 0.0

    async def crashing_loop() -> AgentLoopOutput:
        raise KeyError("boom")

    with pytest.raises(WorkspaceAgentError) as err:
        await run_loop_in_workspace(pool, task, crashing_loop, timeout_s=60)
    assert str(err.value) == "the agent failed: KeyError: 'boom'; the check then scored 0"
    await pool.close()


def test_the_step_metrics_fold_the_samples_workspace_metrics():
    sample = {"workspace/prepare_s": 1.0, "workspace/check_s": 2.0, "workspace/warm": 1.0}
    samples = [
        {**sample, "workspace/check_timeout": 1.0, "workspace/sandbox_errors": 0.0},
        {
            **sample,
            "workspace/prepare_s": 3.0,
            "workspace/check_timeout": 0.0,
            "workspace/sandbox_errors": 2.0,
            "workspace/warm": 0.0,
        },  # fmt: skip
        {"generate_s": 1.0},  # a row without a task
    ]
    assert workspace_metrics(samples) == {
        "workspace/samples": 2.0,
        "workspace/prepare_s/mean": 2.0,
        "workspace/prepare_s/max": 3.0,
        "workspace/check_s/mean": 2.0,
        "workspace/check_s/max": 2.0,
        "workspace/check_timeouts": 1.0,
        "workspace/sandbox_errors": 2.0,
        "workspace/warm/frac": 0.5,
    }
    assert workspace_metrics([{"generate_s": 1.0}]) == {}


async def test_a_langgraph_tool_calls_the_same_functions(ws):
    from langchain_core.tools import StructuredTool

    tool = StructuredTool.from_function(coroutine=bash)  # what a LangGraph agent binds
    assert tool.name == "bash" and tool.args["command"]["type"] == "string"
    assert await tool.ainvoke({"command": "echo hi"}) == "[exit code 0]\nhi\n"


def test_gateway_agents_run_in_the_workspace_only_with_a_python_agent():
    from agentloop.base import AgentLoopContext
    from agentloop.config import RolloutConfig
    from agentloop.gateway.loop import GatewayAgentLoop

    async def agent(row, llm):
        return None

    context = AgentLoopContext(None, None, RolloutConfig())
    assert GatewayAgentLoop(context, agent=agent).runs_in_workspace is True
    assert GatewayAgentLoop(context, command=["true"]).runs_in_workspace is False
