"""The recipe's one tool: the custom operator ``a @ b = 3a - 2b``, which the model is never
told and can only compute by calling it."""

from __future__ import annotations

from langchain_core.tools import tool

__all__ = ["apply_op", "custom_op"]


def apply_op(a: int, b: int) -> int:
    return 3 * a - 2 * b


@tool
def custom_op(a: int, b: int) -> int:
    """Compute a @ b, the custom operator @, for integers a and b."""
    return apply_op(a, b)
