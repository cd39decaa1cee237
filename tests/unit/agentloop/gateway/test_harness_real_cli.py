"""The real Claude Code and Codex CLIs (as ``make harnesses`` installs them), run as
``harness:`` agents in the bubblewrap sandbox over a scripted engine, cannot write outside
their workspace: the scripted model's first turn calls the CLI's own shell tool (Claude Code's
``Bash``, Codex's ``exec_command``) with one command writing into the test's folder on the host,
into the Python environment and beside it, and into the CLIs' own install folder, then into the
workspace. Every outside write fails with the error the CLI sends back to the model, none
reaches the host, the inside write scores the workspace check, the session is one token-exact
segment (the tool result a mask-0 delta), and no process of the session is left.

The engine is scripted, so the CLIs' first prompts (~11.7k and ~8.4k tokens rendered with
tiny-qwen3's template) need no model window: the budget is ``prompt_length`` alone."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import pytest

from agentloop import AgentLoopContext, RolloutConfig
from agentloop.config import GatewayConfig
from agentloop.gateway import GatewayAgentLoop
from agentloop.gateway.harness import (
    HarnessNotInstalled,
    HarnessSpec,
    harness_dir,
    resolve_binary,
)
from agentloop.tools.sandbox import bwrap_problem
from tests.unit.agentloop.gateway.helpers import CONTEXTS, hermes_call, stop_gateways
from tests.unit.agentloop.scripted import ScriptedServer

pytestmark = pytest.mark.slow

SHELL_TOOLS = {"claude-code": ("Bash", "command"), "codex": ("exec_command", "cmd")}
"""Each CLI's shell tool and its command argument, as the CLI declares them in its request."""
PROMPT = [{"role": "user", "content": "Write the files."}]


@pytest.fixture
async def cleanup():
    yield
    await stop_gateways()


def installed(name: str) -> Path:
    """The CLI's binary, or a skip saying it is not installed (the only allowed skip)."""
    try:
        return resolve_binary(HarnessSpec.of(name)).resolve()
    except HarnessNotInstalled as e:
        pytest.skip(f"the harness CLIs are not installed (make harnesses needs npm): {e}")


def session_processes(session_id: str) -> list[int]:
    """Live processes whose environment names ``session_id`` (the CLI and all it started)."""
    marker = f"AGENTLOOP_SESSION_ID={session_id}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ:
            found.append(int(pid))
    return found


def harness_loop(tokenizer, turns: list[str], name: str, logs: Path):
    """A harness loop over ``turns`` with room for the CLI's whole first prompt."""
    server = ScriptedServer(tokenizer, turns, end_token="<|im_end|>")
    config = RolloutConfig(
        prompt_length=32768, response_length=2048, gateway=GatewayConfig(log_dir=str(logs))
    )
    context = AgentLoopContext(server, tokenizer, config)
    CONTEXTS.append(context)  # stop_gateways stops its gateway
    spec = {"name": name, "sandbox": "bwrap", "timeout_s": 300}
    return GatewayAgentLoop(context, harness=spec), server


@pytest.mark.parametrize("name", ["claude-code", "codex"])
async def test_the_real_cli_cannot_write_outside_its_workspace(tokenizer, tmp_path, cleanup, name):
    binary = installed(name)
    if (problem := bwrap_problem()) is not None:
        pytest.skip(f"bwrap cannot run here: {problem} (apt-get install bubblewrap)")
    token = secrets.token_hex(4)
    targets = {  # path -> the error the write must meet in the sandbox
        tmp_path / "outside.txt": "No such file or directory",  # the host's /tmp is not shown
        Path(sys.prefix) / f"escape-{token}.txt": "Read-only file system",
        Path(sys.prefix).parent / f"escape-{token}.txt": "Permission denied",  # made by bwrap
        harness_dir() / "node_modules" / f"escape-{token}.txt": "Read-only file system",
    }
    command = "; ".join([*(f"echo x > {path}" for path in targets), "echo x > inside.txt"])
    tool, argument = SHELL_TOOLS[name]
    turns = [hermes_call(tool, **{argument: command}), "Done."]
    loop, server = harness_loop(tokenizer, turns, name, tmp_path / "logs")
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "README.md").write_text("a task\n")
    task = {"workspace": str(tmp_path / "repo"), "check": "grep -qx x inside.txt"}
    try:
        out = await loop.run({}, raw_prompt=PROMPT, extra_info={"workspace_task": task})
        await loop.context.close_resources()
        left = session_processes(out.record.session_id)
        escaped = [path for path in targets if path.exists()]
    finally:
        for path in targets:  # a sandbox that leaked must not leave files in the checkout
            path.unlink(missing_ok=True)

    assert escaped == [] and left == []
    assert out.extra.get("agent_error") is None, out.extra["agent_error"]
    assert out.reward_score == 1.0  # the command ran: inside.txt holds x in the workspace
    assert not (tmp_path / "repo" / "inside.txt").exists()  # in the sample's copy only
    # one token-exact segment: sampled ids, the tool result as a mask-0 delta, sampled ids
    assert out.segments == [] and len(server.requests) == 2
    first, second = (r["prompt_ids"] for r in server.requests)
    n0, n1 = len(server.sampled[0]), len(server.sampled[1])
    assert first == out.prompt_ids and second[: len(first) + n0] == first + server.sampled[0]
    delta = second[len(first) + n0 :]
    assert out.response_ids == server.sampled[0] + delta + server.sampled[1]
    assert out.response_mask == [1] * n0 + [0] * len(delta) + [1] * n1
    scripted = [-0.01 * (i + 1) for i in range(n0)] + [-0.01 * (i + 1) for i in range(n1)]
    assert [lp for lp, m in zip(out.response_log_probs, out.response_mask, strict=True) if m] == (
        scripted
    )
    # the tool result the CLI sent back: every outside write refused by the sandbox
    result = tokenizer.decode(delta)
    assert "<tool_response>" in result and tool not in result, result
    said = [line.split(": line 1: ", 1)[1] for line in result.splitlines() if ": line 1: " in line]
    assert said == [f"{path}: {error}" for path, error in targets.items()], result
    assert binary.is_file() and (tmp_path / "logs" / out.record.session_id / "transcript.txt")


@pytest.mark.parametrize(("name", "segments"), [("claude-code", 2), ("codex", 1)])
async def test_an_empty_reply_is_final_to_codex_and_claude_code_calls_again(
    tokenizer, tmp_path, cleanup, name, segments
):
    """A reply with no text (a model that samples its end-of-turn token first): Codex takes it
    as the answer; Claude Code calls again with a history that differs at that reply, which
    the gateway cannot extend token for token, so the session has a second segment with the
    reason, each weighing half the session."""
    installed(name)
    if (problem := bwrap_problem()) is not None:
        pytest.skip(f"bwrap cannot run here: {problem} (apt-get install bubblewrap)")
    loop, server = harness_loop(tokenizer, ["", "Done.", "Again."], name, tmp_path / "logs")
    (tmp_path / "repo").mkdir()
    task = {"workspace": str(tmp_path / "repo"), "check": "true"}
    out = await loop.run({}, raw_prompt=PROMPT, extra_info={"workspace_task": task})

    assert out.extra.get("agent_error") is None, out.extra["agent_error"]
    outs = [out, *out.segments]
    assert len(server.requests) == len(outs) == segments
    assert [o.record.branch_reason for o in outs] == [None] + [
        "the history differs from segment 0's at message 1"
    ] * (segments - 1)
    assert [o.record.weight for o in outs] == [1 / segments] * segments
    assert [o.reward_score for o in outs] == [1.0] * segments  # the check's, on each
