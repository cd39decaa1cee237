"""Tool classes written against verl's tool API run unchanged: both result shapes, dict and
JSON-string parameters, step rewards and metrics, release exactly once (errors and
cancellation included), verl's concurrency/timeout keys as runner limits, and clear errors."""

from __future__ import annotations

import asyncio
import functools
import importlib.machinery
import importlib.util
import json
import logging
import sys
import time
import types
from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch
import yaml

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig
from agentloop.parsers import ToolCall
from agentloop.tool_agent import ToolAgentLoop
from agentloop.tools import BaseTool, ToolRunner, load_tool_config
from agentloop.tools.session import ToolSession
from agentloop.tools.verl_adapter import SchemaView, VerlTool, verl_tool
from tests.unit.agentloop.scripted import ScriptedServer
from tests.unit.agentloop.verl_api_tools import ADD_SCHEMA, NewVerlTool, OldVerlTool
from trainer.rewards import process_rewards

HERE = "tests.unit.agentloop"
OLD = f"{HERE}.verl_api_tools.OldVerlTool"
NEW = f"{HERE}.verl_api_tools.NewVerlTool"
GSM8K_YAML = Path(__file__).parents[2] / "e2e" / "verl_tools" / "gsm8k_tool_config.yaml"
no_verl = pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl installed")


@pytest.fixture(autouse=True)
def clear_logs():
    OldVerlTool.log.clear()
    NewVerlTool.log.clear()


def load(tmp_path: Path, entry: dict[str, Any]) -> dict[str, BaseTool]:
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": [entry]}))
    return load_tool_config(path)


def old_entry(**config: Any) -> dict[str, Any]:
    return {"class_name": OLD, "config": {"type": "native", **config}, "tool_schema": ADD_SCHEMA}


def add(a: int, b: int = 1) -> ToolCall:
    return ToolCall("add", {"a": a, "b": b}, raw="")


def session_of(tools: dict[str, BaseTool], tools_kwargs=None, timeout_s=5.0) -> ToolSession:
    runner = ToolRunner(tools, timeout_s=timeout_s)
    return ToolSession(tools, runner, MultiTurnConfig(), session_id="r", tools_kwargs=tools_kwargs)


async def test_older_verl_tool_gets_a_json_string_and_its_text_reward_and_metrics_flow(tmp_path):
    tools = load(tmp_path, old_entry())
    assert isinstance(tools["add"], VerlTool) and tools["add"].json_parameters
    session = session_of(tools, {"add": {"create_kwargs": {"offset": 100}}})
    (outcome,) = await session.execute([add(2, 3)], turn=0)
    assert (outcome.text, outcome.ok, outcome.reward, outcome.metrics) == (
        "105",
        True,
        0.25,
        {"adds": 1},
    )
    assert session.calls[0].reward == 0.25  # the call's process reward
    assert await session.release() == {"add": 105.0}
    # create_kwargs as keywords (older verl) and as create_kwargs= (current verl)
    assert OldVerlTool.log == [
        ("create", ("r-add", 100, {"create_kwargs": {"offset": 100}})),
        ("execute", '{"a": 2, "b": 3}'),
        ("calc_reward", "r-add"),
        ("release", "r-add"),
    ]


async def test_newer_verl_tool_gets_a_dict_and_its_schema_from_the_class(tmp_path, caplog):
    tools = load(tmp_path, {"class_name": NEW, "config": {"type": "native"}})
    tool = tools["add"]
    assert tool.tool_schema == ADD_SCHEMA and not tool.json_parameters
    session = session_of(tools, {"add": {"create_kwargs": {"ground_truth": 7}}})
    with caplog.at_level(logging.WARNING):
        (outcome,) = await session.execute([add(2, 5)], turn=0)
    assert (outcome.text, outcome.reward, outcome.metrics) == ("7", 1.0, {"adds": 1})
    assert "tool 'add' returned images or videos; tool messages are text" in caplog.text
    assert await session.release() == {"add": 0.5}
    assert NewVerlTool.log == [
        ("create", {"ground_truth": 7, "create_kwargs": {"ground_truth": 7}}),
        ("execute", {"a": 2, "b": 5}),
        ("release", "r-add"),
    ]


async def test_a_verl_tool_gets_agent_data_and_the_rows_execute_kwargs_as_verl_passes_them(
    tmp_path,
):
    name = f"{HERE}.verl_api_tools.SessionVerlTool"
    tools = load(tmp_path, {"class_name": name, "config": {"type": "native"}})
    session = session_of(tools, {"add": {"execute_kwargs": {"offset": 100}}})
    session.agent_data.messages = [{"role": "user", "content": "add"}]
    first = await session.execute([add(2, 5)], turn=0)
    session.agent_data.messages.append({"role": "assistant", "content": "..."})
    second = await session.execute([add(1, 1)], turn=1)
    assert [o.text for o in first + second] == ["107", "102"]
    # extra_fields persist across the sample's calls; the chat so far; the step rewards
    assert [entry[1:] for entry in NewVerlTool.log if entry[0] == "execute"] == [
        ("r", 1, 1, 100),
        ("r", 2, 2, 100),
    ]
    assert session.agent_data.tool_rewards == [1.0, 2.0]
    assert (session.agent_data.assistant_turns, session.agent_data.user_turns) == (2, 1)
    await session.release()


def test_the_tool_reads_its_schema_by_attribute_as_from_verls_pydantic_model(tmp_path):
    wrapped = load(tmp_path, old_entry())["add"].tool
    assert isinstance(wrapped.tool_schema, SchemaView)
    assert wrapped.name == "add" and wrapped.tool_schema.function.parameters.required == ["a", "b"]
    assert wrapped.tool_schema.function.parameters.properties["a"].type == "integer"
    assert wrapped.tool_schema.function.strict is None  # unset optional field
    assert wrapped.tool_schema.model_dump(exclude_none=True) == ADD_SCHEMA


class StrAnnotated(OldVerlTool):
    async def execute(self, instance_id: str, parameters: str, **kwargs):  # a string annotation
        return parameters, None, None


class Unannotated(OldVerlTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return {"text": json.dumps(parameters)}, None, None  # verl's first base class: a dict


@pytest.mark.parametrize(("cls", "text"), [(StrAnnotated, '{"a": 1}'), (Unannotated, '{"a": 1}')])
async def test_parameters_are_a_json_string_only_where_annotated_str(cls, text):
    tool = verl_tool(cls, {}, ADD_SCHEMA, "w")
    assert tool.json_parameters is (cls is StrAnnotated)
    result = await tool.execute("i", {"a": 1})
    assert (result.text, result.reward, result.metrics) == (text, None, {})


@pytest.mark.parametrize(
    ("verl_config", "limits"),
    [
        ({"num_workers": 4}, {"max_concurrency": 4}),
        # verl's rate_limit is job-wide (one limiter for every worker); num_workers per worker
        ({"num_workers": 8, "rate_limit": 2}, {"max_concurrency": 8, "job_max_concurrency": 2}),
        ({"rate_limit": 3}, {"job_max_concurrency": 3}),
        (
            {"num_workers": 8, "rate_limit": 2, "enable_global_rate_limit": False},
            {"max_concurrency": 8},
        ),
        ({"num_workers": 8, "max_concurrency": 3}, {}),  # our own key wins
        ({"rate_limit": 2, "job_max_concurrency": 5}, {}),
        ({"timeout": 5}, {"call_timeout_s": 5.0}),
        ({"timeout": 5, "call_timeout_s": 9}, {}),
        ({"retrieval_service_url": "http://x", "topk": 3}, {}),
    ],
)
def test_verl_keys_become_runner_limits_and_the_tool_gets_its_config_untouched(
    tmp_path, verl_config, limits
):
    tool = load(tmp_path, old_entry(**verl_config))["add"]
    config = {"type": "native", **verl_config}
    assert tool.tool.config == config
    assert tool.config == {**config, **limits}


async def test_num_workers_caps_calls_in_flight_and_timeout_bounds_each_call(tmp_path):
    tools = load(tmp_path, old_entry(num_workers=1, timeout=0.2))
    session = session_of(tools, timeout_s=30)
    start = time.perf_counter()
    outcomes = await session.execute([add(-1), add(-1)], turn=0)  # a=-1 hangs
    assert time.perf_counter() - start >= 0.4  # one at a time, 0.2 s each
    assert [(o.text, o.error_kind) for o in outcomes] == [
        ("Error: tool 'add' timed out after 0.2 s", "tool_timeout")
    ] * 2
    await session.release()
    assert [e for e, _ in OldVerlTool.log].count("release") == 1


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"num_workers": 0}, "config.num_workers must be an integer > 0, got 0"),
        ({"num_workers": True}, "config.num_workers must be an integer > 0, got True"),
        ({"rate_limit": "fast"}, "config.rate_limit must be an integer > 0, got 'fast'"),
        ({"timeout": -1}, "config.timeout must be a number of seconds > 0, got -1"),
        (
            {"enable_global_rate_limit": "yes"},
            "config.enable_global_rate_limit must be true or false, got 'yes'",
        ),
    ],
)
def test_bad_verl_limit_values_name_the_key(tmp_path, config, message):
    with pytest.raises(ValueError) as info:
        load(tmp_path, old_entry(**config))
    assert str(info.value) == f"{tmp_path / 'tools.yaml'}: tools[0]: {message}"


def test_a_class_following_neither_api_names_both_and_what_it_lacks(tmp_path):
    with pytest.raises(ValueError) as info:
        load(tmp_path, {"class_name": f"{HERE}.verl_api_tools.NoReleaseTool"})
    assert str(info.value) == (
        f"{tmp_path / 'tools.yaml'}: tools[0]: {HERE}.verl_api_tools.NoReleaseTool is not a "
        "BaseTool subclass and does not follow verl's tool API (missing: calc_reward, release); "
        "subclass agentloop.tools.BaseTool, or write it against verl's API: __init__(config, "
        "tool_schema), async create/execute/calc_reward/release and get_openai_tool_schema"
    )


@no_verl
@pytest.mark.parametrize("module", ["verl.tools.gsm8k_tool", "my_verl_tools"])
def test_a_class_needing_verl_says_to_install_it_or_use_your_own_module(
    tmp_path, monkeypatch, module
):
    (tmp_path / "my_verl_tools.py").write_text("from verl.tools.base_tool import BaseTool\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as info:
        load(tmp_path, {"class_name": f"{module}.Gsm8kTool", "config": {"type": "native"}})
    where = f"{tmp_path / 'tools.yaml'}: tools[0].class_name"
    assert str(info.value) == (
        f"{where}={module + '.Gsm8kTool'!r}: cannot import module {module!r} "
        "(ModuleNotFoundError: No module named 'verl'); install the package that provides "
        "'verl', put its folder on PYTHONPATH, or correct the name; a class written against "
        "verl's tool API runs here as is once verl is installed"
    )


class SchemaLess(OldVerlTool):
    def __init__(self, config: dict, tool_schema):
        self.tool_schema = tool_schema

    def get_openai_tool_schema(self):
        return None


def test_a_tool_without_any_schema_says_where_to_give_one():
    with pytest.raises(ValueError) as info:
        verl_tool(SchemaLess, {}, None, "tools.yaml: tools[0]")
    assert str(info.value) == (
        "tools.yaml: tools[0]: SchemaLess has no tool schema; add tool_schema to the entry or "
        "return one from its get_openai_tool_schema()"
    )


async def test_a_failing_call_is_a_tool_message_and_the_instance_is_still_released_once(tmp_path):
    tools = load(tmp_path, old_entry())
    session = session_of(tools)
    (outcome,) = await session.execute([add(0)], turn=0)
    assert (outcome.text, outcome.error_kind) == (
        "Error: tool 'add' failed: ValueError: a must not be 0",
        "tool_failed",
    )
    await session.release()
    await session.release()
    await tools["add"].release("r-add")  # a second release of the instance does nothing
    assert [e for e, _ in OldVerlTool.log] == ["create", "execute", "calc_reward", "release"]


class RewardFails(OldVerlTool):
    async def calc_reward(self, instance_id, **kwargs):
        raise RuntimeError("no reward")


class RewardHangs(OldVerlTool):
    async def calc_reward(self, instance_id, **kwargs):
        await asyncio.sleep(10)


async def test_a_failing_reward_still_releases_and_then_raises():
    tools = {"add": verl_tool(RewardFails, {}, ADD_SCHEMA, "w")}
    session = session_of(tools)
    await session.execute([add(1)], turn=0)
    with pytest.raises(RuntimeError, match="no reward"):
        await session.release()
    assert OldVerlTool.log[-1] == ("release", "r-add")


async def test_a_cancelled_sample_still_releases_its_instance():
    tools = {"add": verl_tool(RewardHangs, {}, ADD_SCHEMA, "w")}
    session = session_of(tools)
    await session.execute([add(1)], turn=0)
    task = asyncio.create_task(session.release())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [e for e, _ in OldVerlTool.log].count("release") == 1


class NoId(OldVerlTool):
    async def create(self, instance_id=None, **kwargs):
        return None


class BareText(OldVerlTool):
    async def execute(self, instance_id: str, parameters: str, **kwargs):
        return "5"


@pytest.mark.parametrize(
    ("cls", "text"),
    [
        (
            NoId,
            "Error: tool 'add' could not start: TypeError: NoId.create returned None; return "
            "the instance id or (instance_id, ToolResponse)",
        ),
        (
            BareText,
            "Error: tool 'add' failed: TypeError: BareText.execute returned str; return a tuple "
            "(text or ToolResponse, reward, metrics)",
        ),
    ],
)
async def test_wrong_return_shapes_reach_the_model_saying_what_to_return(cls, text):
    tools = {"add": verl_tool(cls, {}, ADD_SCHEMA, "w")}
    session = session_of(tools)
    (outcome,) = await session.execute([add(1)], turn=0)
    assert outcome.text == text
    await session.release()
    # NoId's instance is released after its bad create (that release fails: it kept no state)
    assert [e for e, _ in OldVerlTool.log].count("release") == 1


class EmptyId(OldVerlTool):
    async def create(self, instance_id=None, **kwargs):
        await super().create(instance_id, **kwargs)  # allocates the instance's state
        return ""


@pytest.mark.parametrize(
    ("cls", "returned", "fails"), [(EmptyId, "''", False), (NoId, "None", True)]
)
async def test_a_bad_create_releases_the_id_it_was_given_once_and_logs_a_failed_release(
    cls, returned, fails, caplog
):
    tool = verl_tool(cls, {}, ADD_SCHEMA, "w")
    with caplog.at_level(logging.WARNING), pytest.raises(TypeError) as info:
        await tool.create("r-add")
    assert str(info.value) == (
        f"{cls.__name__}.create returned {returned}; return the instance id or "
        "(instance_id, ToolResponse)"
    )
    assert [e for e in OldVerlTool.log if e[0] == "release"] == [("release", "r-add")]
    assert tool.tool.state == {}  # EmptyId's allocated state is gone
    await tool.release("r-add")  # never created: not released again
    assert [e for e, _ in OldVerlTool.log].count("release") == 1
    failed = [r for r in caplog.records if r.name == "agentloop.tools.verl_adapter"]
    assert [r.getMessage() for r in failed] == (
        ["add: releasing instance r-add after create returned no instance id failed"]
        if fails
        else []
    )
    if fails:
        assert failed[0].exc_info[0] is KeyError


async def test_a_bad_create_given_no_id_has_none_to_release():
    tool = verl_tool(NoId, {}, ADD_SCHEMA, "w")
    with pytest.raises(TypeError, match=r"^NoId\.create returned None; "):
        await tool.create()
    assert OldVerlTool.log == []


class SyncCreate(OldVerlTool):
    def create(self, instance_id=None, **kwargs):
        return instance_id


class SyncExecute(OldVerlTool):
    def execute(self, instance_id, parameters, **kwargs):
        return "", 0.0, {}


class SyncRewardAndRelease(OldVerlTool):
    def calc_reward(self, instance_id, **kwargs):
        return 0.0

    def release(self, instance_id, **kwargs):
        pass


def test_a_plain_def_create_is_refused_at_load_time_saying_to_make_it_async(tmp_path):
    with pytest.raises(ValueError) as info:
        load(tmp_path, {**old_entry(), "class_name": f"{__name__}.SyncCreate"})
    assert str(info.value) == (
        f"{tmp_path / 'tools.yaml'}: tools[0]: SyncCreate.create is a plain `def`; make it "
        "`async def`: verl's tool API is async, and a plain method would run on the agent-loop "
        "worker's event loop, blocking every sample, where no call timeout can interrupt it"
    )


@pytest.mark.parametrize(
    ("cls", "named"),
    [
        (SyncExecute, "SyncExecute.execute is a plain `def`; make it"),
        (
            SyncRewardAndRelease,
            "SyncRewardAndRelease.calc_reward and SyncRewardAndRelease.release are plain `def`s; "
            "make them",
        ),
    ],
)
def test_every_plain_def_method_is_named(cls, named):
    with pytest.raises(ValueError) as info:
        verl_tool(cls, {}, ADD_SCHEMA, "w")
    assert str(info.value) == (
        f"w: {named} `async def`: verl's tool API is async, and a plain method would run on the "
        "agent-loop worker's event loop, blocking every sample, where no call timeout can "
        "interrupt it"
    )


def traced(method):
    """A decorator whose plain wrapper hands back the async method's coroutine."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        return method(*args, **kwargs)

    return wrapper


class TracedExecute(OldVerlTool):
    execute = traced(OldVerlTool.execute)


async def test_an_async_method_behind_a_plain_decorator_is_accepted():
    tool = verl_tool(TracedExecute, {}, ADD_SCHEMA, "w")
    instance = await tool.create("i")
    assert (await tool.execute(instance, {"a": 2, "b": 3})).text == "5"


class FakeFunction(pydantic.BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool  # unlike our schemas: required here, so a schema without it fails


class FakeToolSchema(pydantic.BaseModel):
    type: str
    function: FakeFunction


@pytest.fixture
def fake_verl(monkeypatch):
    """verl installed, as far as the adapter can tell: ``verl.tools.schemas`` exists."""
    for name in ("verl", "verl.tools", "verl.tools.schemas"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["verl.tools.schemas"].OpenAIFunctionToolSchema = FakeToolSchema


def test_with_verl_installed_the_tool_gets_verls_schema_class(fake_verl):
    schema = {**ADD_SCHEMA, "function": {**ADD_SCHEMA["function"], "strict": False}}
    tool = verl_tool(OldVerlTool, {}, schema, "w")
    assert isinstance(tool.tool.tool_schema, FakeToolSchema)
    assert tool.tool_schema == schema


def test_with_verl_installed_a_schema_it_rejects_says_so(fake_verl):
    with pytest.raises(pydantic.ValidationError) as expected:
        FakeToolSchema.model_validate(ADD_SCHEMA)
    with pytest.raises(ValueError) as info:
        verl_tool(OldVerlTool, {}, ADD_SCHEMA, "w")
    assert str(info.value) == (
        f"w: tool_schema does not fit verl's OpenAIFunctionToolSchema: {expected.value}"
    )


async def test_tool_agent_runs_the_gsm8k_verl_tool_and_its_reward_is_a_process_reward(tokenizer):
    tools = load_tool_config(GSM8K_YAML)
    answer = {"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}
    turns = [f"<tool_call>\n{json.dumps(answer)}\n</tool_call>", "#### 72"]
    config = RolloutConfig(prompt_length=1024, response_length=512)
    loop = ToolAgentLoop(
        AgentLoopContext(ScriptedServer(tokenizer, turns), tokenizer, config, tools)
    )
    out = await loop.run(
        {"temperature": 1.0},
        raw_prompt=[{"role": "user", "content": "Natalia sold 48 clips, then half as many..."}],
        tools_kwargs={"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}},
    )
    record = out.record
    assert [(c.name, c.ok, c.reward) for c in record.calls] == [("calc_gsm8k_reward", True, 1.0)]
    assert record.tool_rewards == {"calc_gsm8k_reward": 1.0}
    assert tools["calc_gsm8k_reward"].tool._state == {}  # released
    batch = types.SimpleNamespace(response_mask=torch.tensor([out.response_mask]), records=[record])
    process = process_rewards(batch, 0.5)
    assert process[0, record.turn_ends[0]].item() == 0.5 and process.sum().item() == 0.5
