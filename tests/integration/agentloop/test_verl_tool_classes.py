"""A verl user's tool file runs unchanged: the verl-layout YAML of ``tests/e2e/verl_tools``
names a class written against verl's tool API; samples sharing one worker's runner each get
their own instance from the row's ``create_kwargs``, scored answers come back as tool
messages with step rewards and metrics, and every instance is rewarded and released."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentloop import MultiTurnConfig
from agentloop.parsers import ToolCall
from agentloop.tools import ToolRunner, load_tool_config
from agentloop.tools.session import ToolSession
from agentloop.tools.verl_adapter import VerlTool
from tests.e2e.verl_tools.gsm8k_tool import Gsm8kTool

pytestmark = pytest.mark.integration

YAML = Path(__file__).parents[2] / "e2e" / "verl_tools" / "gsm8k_tool_config.yaml"
NAME = "calc_gsm8k_reward"


async def sample(
    tools: dict, runner: ToolRunner, session_id: str, truth: str, answers: list[str]
) -> tuple[list, dict[str, float]]:
    """One sample's calls, one model turn each, then its end-of-sample rewards."""
    session = ToolSession(
        tools,
        runner,
        MultiTurnConfig(),
        session_id=session_id,
        tools_kwargs={NAME: {"create_kwargs": {"ground_truth": truth}}},
    )
    outcomes = []
    try:
        for turn, answer in enumerate(answers):
            outcomes += await session.execute([ToolCall(NAME, {"answer": answer}, "")], turn)
    finally:
        rewards = await session.release()
    return outcomes, rewards


async def test_the_verl_gsm8k_tool_scores_each_sample_against_its_own_ground_truth():
    tools = load_tool_config(YAML)
    tool = tools[NAME]
    assert isinstance(tool, VerlTool) and isinstance(tool.tool, Gsm8kTool)
    assert tool.tool_schema["function"]["parameters"]["required"] == ["answer"]
    runner = ToolRunner(tools, timeout_s=10)

    (right, right_rewards), (wrong, wrong_rewards) = await asyncio.gather(
        sample(tools, runner, "a", "72", ["70", "#### 72"]),
        sample(tools, runner, "b", "1,000", ["999"]),
    )

    assert [(o.text, o.reward, o.metrics) for o in right] == [
        ("Submitted answer '70': score 0.0", 0.0, {"submitted": 1}),
        ("Submitted answer '#### 72': score 1.0", 1.0, {"submitted": 2}),
    ]
    assert right_rewards == {NAME: 1.0}
    assert [(o.text, o.reward) for o in wrong] == [("Submitted answer '999': score 0.0", 0.0)]
    assert wrong_rewards == {NAME: 0.0}
    assert tool.tool._state == {}  # every instance released
