"""The two tools and the score every gateway example agent shares, so the five agents differ
only in the framework that drives them.

The tools are plain Python functions (each framework wraps them its own way); the score is
the calculator task's reward (``recipes/calculator/reward.py``: the last ``#### N`` line
equals the ground truth), so any agent here rolls out the rows of
``python -m recipes.calculator.data``.
"""

from __future__ import annotations

import json
from typing import Any

from agentloop.tools.base import ToolArgumentError
from agentloop.tools.calculator import evaluate, format_value
from recipes.calculator.reward import compute_score

__all__ = ["TOOLS", "calculator", "multiply", "prompt_of", "run_tool", "score", "task_of"]


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. (17 * 23 + 4) / 3.

    Args:
        expression: Numbers, + - * / // % ** and parentheses.
    """
    try:
        return format_value(evaluate(expression))
    except ToolArgumentError as err:
        return f"Error: {err}"


def multiply(a: float, b: float) -> str:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    product = a * b
    return str(int(product)) if float(product).is_integer() else str(product)


def _schema(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS = [
    _schema(
        "calculator",
        "Evaluate an arithmetic expression exactly, e.g. (17 * 23 + 4) / 3.",
        {"expression": {"type": "string", "description": "Numbers, + - * / // % **, ()."}},
    ),
    _schema(
        "multiply",
        "Multiply two numbers.",
        {"a": {"type": "number"}, "b": {"type": "number"}},
    ),
]
"""The tools in the OpenAI chat-completions shape (for agents on the bare ``openai`` SDK)."""

_FUNCTIONS = {"calculator": calculator, "multiply": multiply}


def run_tool(name: str, arguments: str) -> str:
    """One call's result as the tool message text; a bad call is an error the model reads."""
    if name not in _FUNCTIONS:
        return f"Error: unknown tool {name!r}; the tools are {', '.join(_FUNCTIONS)}"
    try:
        kwargs = json.loads(arguments or "{}")
        return _FUNCTIONS[name](**kwargs)
    except (json.JSONDecodeError, TypeError) as err:
        return f"Error: bad arguments for {name}: {err}"


def prompt_of(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The row's chat messages (``raw_prompt``; ``prompt`` in a file not yet loaded)."""
    return [dict(m) for m in row.get("raw_prompt") or row["prompt"]]


def task_of(row: dict[str, Any]) -> tuple[str, str]:
    """(system prompt, the last user message) for frameworks that take a task string."""
    messages = prompt_of(row)
    system = "\n".join(m["content"] for m in messages if m["role"] == "system")
    user = [m["content"] for m in messages if m["role"] == "user"][-1]
    return system, user


def score(row: dict[str, Any], answer: str | None) -> float:
    """The calculator task's reward of the agent's final answer text."""
    truth = str(row["reward_model"]["ground_truth"])
    return float(
        compute_score(row.get("data_source", ""), answer or "", truth, row.get("extra_info", {}))
    )
