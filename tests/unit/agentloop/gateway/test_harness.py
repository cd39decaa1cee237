"""Harness agents (``harness: claude-code|codex``) with a stand-in CLI: the environment and
Codex config each gets, the start-up refusal when the CLI is missing, the sample's reward from
the workspace check, and the faults (a crash, a harness past its limit killed with its tree, a
check that hangs), each failing its sample only."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import sys
import tomllib
from pathlib import Path

import pytest

from agentloop import AgentLoopWorker
from agentloop.base import load_agent_loop_config
from agentloop.gateway import GatewayAgentLoop
from agentloop.gateway.endpoint import LLMEndpoint
from agentloop.gateway.harness import (
    HarnessSpec,
    codex_config,
    harness_argv,
    harness_env,
    resolve_binary,
)
from agentloop.tools.sandbox import bwrap_problem
from tests.unit.agentloop.gateway.helpers import CONTEXTS, make_loop, stop_gateways

FAKE = Path(__file__).with_name("fake_harness.py")
PROMPT = [{"role": "user", "content": "fix it"}]
LLM = LLMEndpoint("http://127.0.0.1:9/sessions/s1/v1", "key-1", "tiny-qwen3", "s1")


@pytest.fixture
async def cleanup():
    yield
    await stop_gateways()


@pytest.fixture
def fake_binary(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "fake-cli"
    path.parent.mkdir()
    script = path.parent / FAKE.name  # beside it: the sandbox shows the binary's folder only
    script.write_text(FAKE.read_text())
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    path.chmod(0o755)
    return path


def workspace(tmp_path: Path, mode: str, token: str = "0") -> Path:
    folder = tmp_path / f"repo-{mode}"
    folder.mkdir()
    (folder / "mode.txt").write_text(mode)
    (folder / "token.txt").write_text(token)
    return folder


def row(folder: Path, check: str = "test -f solved.txt", timeout: float = 60) -> dict:
    task = {"workspace": str(folder), "check": check, "check_timeout_s": timeout}
    return {"raw_prompt": PROMPT, "extra_info": {"workspace_task": {**task, "problem": "fix"}}}


def harness_loop(tokenizer, tmp_path, binary, name="claude-code", turns=("Done.",), **options):
    spec = {"name": name, "binary": str(binary), "sandbox": "process"} | options
    loop, _ = make_loop(tokenizer, list(turns), log_dir=str(tmp_path / "logs"))
    return GatewayAgentLoop(loop.context, harness=spec)


def test_claude_code_env_has_its_dialect_a_private_home_and_no_phoning_home(tmp_path):
    spec = HarnessSpec.of("claude-code")
    env = harness_env(spec, LLM, tmp_path / "home", Path("/opt/cli/claude"), None)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/sessions/s1"
    assert env["ANTHROPIC_API_KEY"] == "key-1" and env["OPENAI_BASE_URL"] == LLM.base_url
    assert env["HOME"] == str(tmp_path / "home")
    assert env["CLAUDE_CONFIG_DIR"] == str(tmp_path / "home" / ".claude")
    for key in ("DISABLE_TELEMETRY", "DISABLE_AUTOUPDATER", "DISABLE_ERROR_REPORTING",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"):  # fmt: skip
        assert env[key] == "1"
    assert env["PATH"].startswith("/opt/cli:") and "CODEX_HOME" not in env
    argv = harness_argv(spec, Path("/opt/cli/claude"), "fix it", "tiny-qwen3")
    assert argv == ["/opt/cli/claude", "-p", "fix it", "--model", "tiny-qwen3",
                    "--dangerously-skip-permissions", "--output-format", "stream-json",
                    "--verbose"]  # fmt: skip


def test_codex_gets_a_generated_codex_home_with_the_session_as_responses_provider(tmp_path):
    spec = HarnessSpec.of({"name": "codex", "args": ["--json"], "model": "m2"})
    env = harness_env(spec, LLM, tmp_path, Path("/opt/codex/bin/codex"), None)
    assert env["CODEX_HOME"] == str(tmp_path / "codex") and env["AGENTLOOP_API_KEY"] == "key-1"
    assert "ANTHROPIC_BASE_URL" not in env
    config = tomllib.loads(codex_config(LLM.base_url, "m2"))
    assert config["model"] == "m2" and config["model_provider"] == "agentloop"
    assert config["model_providers"]["agentloop"] == {
        "name": "agentloop gateway",
        "base_url": LLM.base_url,
        "env_key": "AGENTLOOP_API_KEY",
        "wire_api": "responses",
    }
    assert config["check_for_update_on_startup"] is False
    assert config["analytics"] == {"enabled": False} and config["feedback"] == {"enabled": False}
    assert config["otel"] == {"exporter": "none"}
    argv = harness_argv(spec, Path("/c"), "fix it", "m2")
    assert argv == ["/c", "exec", "--skip-git-repo-check",
                    "--dangerously-bypass-approvals-and-sandbox", "-m", "m2", "fix it",
                    "--json"]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("aider", "harness: name must be one of ['claude-code', 'codex'], got 'aider'"),
        ({"name": "codex", "timeout": 3}, "harness: 'timeout' is not a harness option (options: "
         "('name', 'model', 'args', 'timeout_s', 'memory_mb', 'binary', 'workspace_dir', "
         "'sandbox'))"),
        ({"name": "codex", "args": "--json"},
         "harness: args must be a list of strings, got '--json'"),
        ({"name": "codex", "timeout_s": 0}, "harness: timeout_s must be a number > 0, got 0"),
        ({"name": "codex", "sandbox": "docker"},
         "harness: sandbox must be auto, bwrap or process, got 'docker'"),
    ],
)  # fmt: skip
def test_bad_harness_entries_are_refused_naming_the_key(value, message):
    with pytest.raises(ValueError) as info:
        HarnessSpec.of(value)
    assert str(info.value) == message


def test_a_missing_cli_stops_the_run_at_start_up_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTLOOP_HARNESS_DIR", str(tmp_path / "none"))
    loops = tmp_path / "loops.yaml"
    loops.write_text(
        "- {name: fix_codex, _target_: agentloop.gateway.GatewayAgentLoop, harness: codex}\n"
    )
    with pytest.raises(ValueError) as info:
        load_agent_loop_config(loops)
    binary = tmp_path / "none/node_modules/@openai/codex-linux-x64/vendor"
    assert str(info.value) == (
        f"{loops}: agent loop 'fix_codex': harness 'codex': {binary}/x86_64-unknown-linux-musl/"
        f"bin/codex is not installed; install the pinned CLIs with `make harnesses` (npm ci in "
        f"{tmp_path / 'none'}), or set AGENTLOOP_HARNESS_DIR"
    )
    with pytest.raises(ValueError, match="^a gateway agent loop takes exactly one of .* got "
                       "command, harness$"):  # fmt: skip
        GatewayAgentLoop.check_config(command="x", harness="codex")


def test_a_given_binary_that_is_not_executable_is_refused(tmp_path):
    spec = HarnessSpec.of({"name": "codex", "binary": str(tmp_path / "nope")})
    with pytest.raises(ValueError) as info:
        resolve_binary(spec)
    missing = tmp_path / "nope"
    assert str(info.value) == f"harness 'codex': binary {missing} is not an executable file"


@pytest.mark.parametrize("name", ["claude-code", "codex"])
async def test_a_harness_sample_is_scored_by_the_workspace_check(
    tokenizer, tmp_path, fake_binary, cleanup, name
):
    loop = harness_loop(tokenizer, tmp_path, fake_binary, name=name)
    out = await loop.run({}, **row(workspace(tmp_path, "solve")))
    assert out.extra.get("agent_error") is None and out.reward_score == 1.0
    assert out.metrics["gateway_calls"] == 1.0
    logs = tmp_path / "logs" / out.record.session_id
    transcript = (logs / "transcript.txt").read_text()
    assert '"Done."' in transcript or "Done." in transcript
    assert (logs / "home" / ".claude" / "projects" / "session.jsonl").is_file()
    seen = json.loads((logs / "home" / "seen.json").read_text())
    assert seen["argv"][-1] == ("--verbose" if name == "claude-code" else "fix")
    assert seen["cwd"] != str(tmp_path / "repo-solve")  # a fresh copy, not the task's folder
    assert not (tmp_path / "repo-solve" / "solved.txt").exists()
    if name == "codex":
        config = Path(seen["env"]["CODEX_HOME"]).name
        assert config == "codex" and (logs / "home" / "codex" / "config.toml").is_file()


async def test_a_stopping_worker_removes_the_harness_pools_copies_and_run_folder(
    tokenizer, tmp_path, fake_binary, cleanup
):
    """The trainer stops its workers with ``close_workspaces``: the copies the harness runner's
    pool prepared ahead (warm) on the worker's loop go with the pool's run folder."""
    made = harness_loop(tokenizer, tmp_path, fake_binary)  # its config (logs) and engine
    worker = AgentLoopWorker(made.config, made.context.server, tokenizer)
    spec = {"name": "claude-code", "binary": str(fake_binary), "sandbox": "process"}
    loop = GatewayAgentLoop(worker.context, harness=spec)  # a sample on the worker's context
    CONTEXTS.append(worker.context)  # stop_gateways stops its gateway
    out = await loop.run({}, **row(workspace(tmp_path, "solve")))
    assert out.reward_score == 1.0
    [pool] = worker.context.resources.values()  # the pool lives with the worker
    assert any(pool.run_root.iterdir())  # the warm copies for the next sample
    await worker.close_workspaces()
    assert not pool.run_root.exists()
    assert worker.context.resources == {}


async def test_a_crashing_harness_fails_its_sample_with_its_stderr(
    tokenizer, tmp_path, fake_binary, cleanup
):
    loop = harness_loop(tokenizer, tmp_path, fake_binary)
    out = await loop.run({}, **row(workspace(tmp_path, "crash")))
    assert out.reward_score == 0.0 and out.record.stop_reason == "agent_error"
    assert out.extra["agent_error"].endswith(
        "AgentFailed: the harness 'claude-code' exited with 3: fake harness: boom\n; "
        "the check then scored 0"
    )


def _processes_with(arg: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if arg.encode() in cmdline:
            found.append(int(pid))
    return found


@pytest.mark.parametrize("sandbox", ["process", "bwrap"])
async def test_a_harness_past_its_limit_is_killed_with_its_tree_and_the_batch_goes_on(
    tokenizer, tmp_path, fake_binary, cleanup, sandbox
):
    if sandbox == "bwrap" and (problem := bwrap_problem()) is not None:
        pytest.skip(f"bwrap cannot run here: {problem}")
    token = f"{4000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6)}"
    hung = harness_loop(tokenizer, tmp_path, fake_binary, timeout_s=3, sandbox=sandbox)
    fine = harness_loop(tokenizer, tmp_path, fake_binary, sandbox=sandbox)
    hang_row = row(workspace(tmp_path, "hang", token))
    outs = await asyncio.gather(
        hung.run({}, **hang_row), fine.run({}, **row(workspace(tmp_path, "solve")))
    )
    assert outs[0].reward_score == 0.0 and outs[0].record.stop_reason == "agent_error"
    assert (
        outs[0]
        .extra["agent_error"]
        .endswith(
            "AgentFailed: the harness 'claude-code' passed its 3 s limit and was killed with its "
            "process tree; the check then scored 0"
        )
    )
    assert _processes_with(token) == []  # the grandchild sleep went with it
    assert outs[1].reward_score == 1.0 and outs[1].extra.get("agent_error") is None


async def test_a_hanging_check_is_killed_at_its_limit_and_scores_0_with_the_reason(
    tokenizer, tmp_path, fake_binary, cleanup
):
    token = f"{600 + secrets.randbelow(1000)}.{secrets.randbelow(10**6)}"
    loop = harness_loop(tokenizer, tmp_path, fake_binary)
    out = await loop.run({}, **row(workspace(tmp_path, "solve"), check=f"sleep {token}", timeout=2))
    assert out.reward_score == 0.0 and out.record.stop_reason == "agent_error"
    last = out.extra["agent_error"].splitlines()[-1]
    assert re.fullmatch(
        r"agentloop\.gateway\.endpoint\.AgentFailed: the workspace check timed out after "
        r"2\.\d s and was killed; reward 0",
        last,
    ), last
    assert _processes_with(token) == []


async def test_a_row_without_a_workspace_task_fails_its_sample(
    tokenizer, tmp_path, fake_binary, cleanup
):
    loop = harness_loop(tokenizer, tmp_path, fake_binary)
    out = await loop.run({}, raw_prompt=PROMPT)
    assert out.extra["agent_error"].splitlines()[-1] == (
        "agentloop.gateway.endpoint.AgentFailed: the row has no workspace task "
        "(workspace/check or extra_info.workspace_task)"
    )
