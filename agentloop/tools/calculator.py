"""``calculator``: exact arithmetic on an expression, for math tasks (GSM8K, the demo).

Parsed with ``ast`` and evaluated node by node (no ``eval``): integers and decimals, ``+ - *
/ // % **``, unary signs and parentheses. Integers stay exact (``/`` gives a fraction that is
printed as an integer when it is one, else as a rounded decimal). Limits keep a model from
stalling the worker: expression length, exponent size and result digits.

```yaml
tools:
  - class_name: agentloop.tools.calculator.CalculatorTool
    config: {type: native}
```
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction
from typing import Any

from agentloop.tools.base import BaseTool, ToolArgumentError, ToolResult

__all__ = ["CALCULATOR_SCHEMA", "CalculatorTool", "evaluate", "format_value"]

CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly, e.g. (17 * 23 + 4) / 3.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": "Numbers, + - * / // % ** and parentheses.",
                }
            },
            "required": ["expression"],
        },
    },
}

MAX_CHARS = 200
MAX_EXPONENT = 100
MAX_DIGITS = 60

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression``; ``ToolArgumentError`` says what is not allowed."""
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    if not text:
        raise ToolArgumentError("the expression is empty")
    if len(text) > MAX_CHARS:
        raise ToolArgumentError(f"the expression is longer than {MAX_CHARS} characters")
    text = _THOUSANDS.sub("", text)  # 1,000 -> 1000
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolArgumentError(f"cannot parse {expression!r} as arithmetic") from None
    return _eval(tree.body)


def _checked(value: Fraction) -> Fraction:
    if max(len(str(abs(value.numerator))), len(str(value.denominator))) > MAX_DIGITS:
        raise ToolArgumentError(f"a number in the calculation has more than {MAX_DIGITS} digits")
    return value


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(Fraction(str(node.value)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise ToolArgumentError(
                    f"exponents must be whole numbers of at most {MAX_EXPONENT}"
                )
            if left == 0 and right < 0:
                raise ToolArgumentError("division by zero")
        elif isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ToolArgumentError("division by zero")
        return _checked(Fraction(_BINARY[type(node.op)](left, right)))
    what = type(node).__name__
    if isinstance(node, ast.Name):
        what = f"the name {node.id!r}"
    elif isinstance(node, ast.Call):
        what = "a function call"
    elif isinstance(node, ast.Constant):
        what = f"the value {node.value!r}"
    elif isinstance(node, ast.Tuple):
        what = "a comma-separated list"
    raise ToolArgumentError(
        f"only numbers, + - * / // % ** and parentheses are allowed, not {what}"
    )


def format_value(value: Fraction) -> str:
    """An integer as is; otherwise a decimal rounded to 6 places (trailing zeros dropped)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


class CalculatorTool(BaseTool):
    """Stateless per call; a row may pass ``create_kwargs: {ground_truth: "31"}``, and then
    ``calc_reward`` is 1.0 when some result of the sample equaled it (the tool reward in
    ``SampleRecord.tool_rewards``: did the model compute the answer with the tool)."""

    schema = CALCULATOR_SCHEMA

    def __init__(self, config=None, tool_schema=None) -> None:
        super().__init__(config, tool_schema)
        self._truth: dict[str, Fraction | None] = {}
        self._hit: dict[str, bool] = {}

    async def create(self, instance_id: str | None = None, **create_kwargs: Any) -> str:
        instance_id = await super().create(instance_id)
        truth = create_kwargs.get("ground_truth")
        self._truth[instance_id] = None if truth is None else evaluate(str(truth))
        self._hit[instance_id] = False
        return instance_id

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        value = evaluate(str(arguments["expression"]))
        if value == self._truth.get(instance_id):
            self._hit[instance_id] = True
        return ToolResult(format_value(value))

    async def calc_reward(self, instance_id: str) -> float:
        return float(self._hit.get(instance_id, False))

    async def release(self, instance_id: str) -> None:
        self._truth.pop(instance_id, None)
        self._hit.pop(instance_id, None)
