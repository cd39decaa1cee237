"""Agent-loop registry (decorator, YAML user loops, clear errors), start-up row checks, and
AgentLoopWorker running mixed loops concurrently in-process against a scripted server."""

from __future__ import annotations

import asyncio
import time

import pytest
import yaml

from agentloop import (
    AgentConfig,
    AgentLoopWorker,
    RolloutConfig,
    get_agent_loop,
    load_agent_loop_config,
    registered_agent_loops,
    validate_rows,
)
from tests.unit.agentloop.scripted import ScriptedServer, SleepTool
from tests.unit.agentloop.user_loops import EchoPromptLoop

USER = [{"role": "user", "content": "hi"}]


def write_loops(tmp_path, entries) -> str:
    path = tmp_path / "loops.yaml"
    path.write_text(yaml.safe_dump(entries))
    return str(path)


def test_builtin_loops_are_registered():
    assert {"single_turn_agent", "tool_agent"} <= set(registered_agent_loops())


def test_yaml_user_loop_registers_with_its_kwargs(tmp_path):
    path = write_loops(
        tmp_path,
        [
            {
                "name": "echo_prompt",
                "_target_": "tests.unit.agentloop.user_loops.EchoPromptLoop",
                "k": 3,
            }
        ],
    )
    assert load_agent_loop_config(path) == ["echo_prompt"]
    spec = get_agent_loop("echo_prompt")
    assert spec.cls is EchoPromptLoop and spec.kwargs == {"k": 3}


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            [{"name": "x", "_target_": "nowhere.mod.Loop"}],
            "{path}: agent loop 'x': _target_='nowhere.mod.Loop': cannot import module "
            "'nowhere.mod' (ModuleNotFoundError: No module named 'nowhere'); install the package "
            "that provides 'nowhere', put its folder on PYTHONPATH, or correct the name",
        ),
        (
            [{"name": "x", "_target_": "tests.unit.agentloop.user_loops.Missing"}],
            "{path}: agent loop 'x': _target_='tests.unit.agentloop.user_loops.Missing': module "
            "'tests.unit.agentloop.user_loops' defines no 'Missing'; define it there or name one "
            "it defines",
        ),
        (
            [{"name": "x", "_target_": "tests.unit.agentloop.user_loops.NotALoop"}],
            "{path}: agent loop 'x': tests.unit.agentloop.user_loops.NotALoop is not an "
            "AgentLoopBase subclass",
        ),
        ([{"_target_": "a.b"}], "{path}: entry 0 needs 'name' and '_target_'"),
        ({"name": "x"}, "{path}: expected a YAML list of {{name, _target_, ...kwargs}}"),
    ],
    ids=["module_missing", "attr_missing", "not_a_loop", "no_name", "not_a_list"],
)
def test_bad_user_loop_config_names_the_problem(tmp_path, entries, message):
    path = write_loops(tmp_path, entries)
    with pytest.raises(ValueError) as info:
        load_agent_loop_config(path)
    assert str(info.value) == message.format(path=path)


def test_unknown_agent_name_lists_registered_loops():
    with pytest.raises(ValueError) as info:
        get_agent_loop("nope")
    assert str(info.value).startswith(
        "agent_name 'nope' is not a registered agent loop; registered: "
    )
    assert "single_turn_agent" in str(info.value) and "tool_agent" in str(info.value)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"prompt": USER},
            "row 0 has no 'raw_prompt' (a list of chat messages): give rows a 'prompt' column of "
            "messages and set data.return_raw_chat=True",
        ),
        ({"raw_prompt": USER, "agent_name": "nope"}, "agent_name 'nope' is not a registered"),
        (
            {"raw_prompt": USER, "extra_info": {"tools_kwargs": {"web": {}}}},
            "row 0: tools_kwargs names tool 'web', which is not configured; configured tools: "
            "sleep (actor_rollout_ref.rollout.multi_turn.tool_config_path)",
        ),
    ],
    ids=["no_raw_prompt", "unknown_agent", "unconfigured_tool"],
)
def test_validate_rows_rejects_bad_rows(row, message):
    with pytest.raises(ValueError) as info:
        validate_rows([row], ["sleep"], "single_turn_agent")
    assert str(info.value).startswith(message)


async def test_worker_runs_rows_concurrently_with_default_and_user_loops(tmp_path, tokenizer):
    path = write_loops(
        tmp_path,
        [
            {
                "name": "echo_prompt",
                "_target_": "tests.unit.agentloop.user_loops.EchoPromptLoop",
                "k": 1,
            }
        ],
    )

    class SlowServer(ScriptedServer):
        async def generate(self, request):
            await asyncio.sleep(0.3)
            return await super().generate(request)

    config = RolloutConfig(response_length=64, agent=AgentConfig(agent_loop_config_path=path))
    worker = AgentLoopWorker(
        config, SlowServer(tokenizer, ["a"] * 8), tokenizer, tools={"sleep": SleepTool()}
    )
    rows = [{"raw_prompt": USER, "uid": str(i)} for i in range(6)]
    rows.append({"raw_prompt": USER, "agent_name": "echo_prompt", "data_source": "d"})
    start = time.perf_counter()
    outs = await worker.generate_sequences(rows)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0  # six 0.3 s generations overlapped on one event loop
    assert [o.record.stop_reason for o in outs[:6]] == ["stop"] * 6
    assert outs[6].extra["kwargs"] == {"k": 1}
    assert outs[6].extra["row_keys"] == ["agent_name", "data_source"]
    assert all(o.metrics["total_s"] > 0 for o in outs)
    assert worker.tool_names() == ["sleep"]


async def test_worker_names_the_sample_whose_loop_failed(tokenizer):
    worker = AgentLoopWorker(
        RolloutConfig(prompt_length=4), ScriptedServer(tokenizer, []), tokenizer
    )
    with pytest.raises(RuntimeError) as info:
        await worker.generate_sequences([{"raw_prompt": USER, "uid": "u1"}])
    assert str(info.value).startswith(
        "agent loop 'single_turn_agent' failed on sample 0 (uid u1): "
        "PromptTooLongError: prompt has "
    )
    assert "tokens > rollout.prompt_length=4" in str(info.value)
