"""The calculator tool: exact arithmetic, every refusal with its message, loaded from the verl
YAML layout and called through the worker's ToolRunner like any tool."""

from __future__ import annotations

import pytest
import yaml

from agentloop.parsers import ToolCall
from agentloop.tools import ToolRunner, load_tool_config
from agentloop.tools.calculator import evaluate, format_value


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("17*23+4", "395"),
        ("(17 * 23 + 4) / 3", "131.666667"),
        ("10 / 4", "2.5"),
        ("0.1 + 0.2", "0.3"),  # exact, not 0.30000000000000004
        ("7 // 2", "3"),
        ("-3 % 5", "2"),
        ("2 ** 10", "1024"),
        ("2 ^ 3", "8"),
        ("6 × 7 ÷ 2", "21"),
        ("1,234,567 + 1", "1234568"),
        ("-(-4)", "4"),
    ],
)
def test_values_are_exact(expression, value):
    assert format_value(evaluate(expression)) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "the expression is empty"),
        ("1 +", "cannot parse '1 +' as arithmetic"),
        ("x + 1", "only numbers, + - * / // % ** and parentheses are allowed, not the name 'x'"),
        (
            "__import__('os')",
            "only numbers, + - * / // % ** and parentheses are allowed, not a function call",
        ),
        (
            "(1, 2)",
            "only numbers, + - * / // % ** and parentheses are allowed, not a comma-separated list",
        ),
        ("'a' * 3", "only numbers, + - * / // % ** and parentheses are allowed, not the value 'a'"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("9 ** 9 ** 9", "exponents must be whole numbers of at most 100"),
        ("2 ** 0.5", "exponents must be whole numbers of at most 100"),
        ("9 ** 99", "a number in the calculation has more than 60 digits"),
        ("1" * 201, "the expression is longer than 200 characters"),
    ],
)
def test_what_it_refuses_it_names(expression, message):
    from agentloop.tools import ToolArgumentError

    with pytest.raises(ToolArgumentError) as info:
        evaluate(expression)
    assert str(info.value) == message


async def test_loaded_from_verl_yaml_and_run_by_the_tool_runner(tmp_path):
    path = tmp_path / "tools.yaml"
    entry = {
        "class_name": "agentloop.tools.calculator.CalculatorTool",
        "config": {"type": "native"},
    }
    path.write_text(yaml.safe_dump({"tools": [entry]}))
    tools = load_tool_config(path)
    assert list(tools) == ["calculator"]
    runner = ToolRunner(tools, timeout_s=5)
    instance = await tools["calculator"].create("s0")
    ok, bad = await runner.run(
        [
            ToolCall("calculator", {"expression": "48 * 12 - 7"}, ""),
            ToolCall("calculator", {"expression": "48 / (2 - 2)"}, ""),
        ],
        {"calculator": instance},
    )
    assert (ok.ok, ok.text) == (True, "569")
    assert (bad.ok, bad.text, bad.error_kind) == (False, "Error: division by zero", "tool_failed")


async def test_tool_reward_says_whether_a_result_hit_the_ground_truth():
    from agentloop.tools import CalculatorTool

    tool = CalculatorTool()
    hit = await tool.create("a", ground_truth="24,000")
    miss = await tool.create("b", ground_truth="31")
    plain = await tool.create("c")
    for instance in (hit, miss, plain):
        await tool.execute(instance, {"expression": "1200 * 20"})
    assert [await tool.calc_reward(i) for i in (hit, miss, plain)] == [1.0, 0.0, 0.0]
    await tool.release(hit)
    assert await tool.calc_reward(hit) == 0.0
