"""Tools from typed, documented Python functions (sync or async).

```python
@function_tool
def add(a: int, b: int) -> int:
    \"\"\"Add two integers.

    Args:
        a: The first number.
        b: The second number.
    \"\"\"
    return a + b
```

The JSON schema comes from the signature (``str``/``int``/``float``/``bool``, ``list[...]``,
``dict``, ``Literal[...]``, ``X | None``, defaults) and the docstring (first paragraph: the
description; a Google-style ``Args:`` section: the parameter descriptions). Sync functions run
in a thread so they never block the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

from agentloop.tools.base import BaseTool, ToolError, ToolResult

__all__ = ["FunctionTool", "function_tool", "schema_from_function"]

_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _json_type(hint: Any, where: str) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if origin is Literal:
        values = list(typing.get_args(hint))
        kinds = {_SIMPLE.get(type(v)) for v in values}
        if None in kinds or len(kinds) != 1:
            raise TypeError(f"{where}: Literal values must share one of str/int/float/bool")
        return {"type": kinds.pop(), "enum": values}
    if origin in (list, tuple, set, frozenset) or hint in (list, tuple, set):
        args = typing.get_args(hint)
        schema: dict[str, Any] = {"type": "array"}
        if args and args[0] is not Ellipsis:
            schema["items"] = _json_type(args[0], where)
        return schema
    if origin is dict or hint is dict:
        return {"type": "object"}
    if hint is Any:
        return {}
    raise TypeError(
        f"{where}: annotation {hint!r} has no JSON schema; use str, int, float, bool, list[...], "
        "dict, Literal[...] or X | None"
    )


def _split_optional(hint: Any) -> tuple[Any, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
        raise TypeError(f"union {hint!r} is not supported: use one type or X | None")
    return hint, False


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    doc = inspect.getdoc(fn) or ""
    parts = re.split(r"\n\s*\n", doc, maxsplit=1)
    description = (
        " ".join(parts[0].split()) if parts[0] and not parts[0].startswith("Args:") else ""
    )
    params: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*$(.*?)(?=^\S|\Z)", doc, re.M | re.S)
    if match:
        current = None
        for line in match.group(1).splitlines():
            item = re.match(r"^\s+(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if item and (current is None or len(line) - len(line.lstrip()) <= 8):
                current = item.group(1)
                params[current] = item.group(2).strip()
            elif current and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
    return description, params


def schema_from_function(
    fn: Callable[..., Any], name: str | None = None, description: str | None = None
) -> dict[str, Any]:
    """OpenAI function schema of ``fn``; raises ``TypeError`` naming what cannot be described."""
    fn_name = name or fn.__name__
    hints = typing.get_type_hints(fn)
    doc_description, doc_params = _docstring(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        where = f"tool {fn_name!r} parameter {pname!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{where}: *args/**kwargs cannot be described; name every parameter")
        if pname not in hints:
            raise TypeError(f"{where} has no type annotation; annotate it (e.g. {pname}: str)")
        hint, optional = _split_optional(hints[pname])
        prop = _json_type(hint, where)
        if pname in doc_params:
            prop["description"] = doc_params[pname]
        if param.default is not param.empty:
            if param.default is not None:
                prop["default"] = param.default
        elif not optional:
            required.append(pname)
        properties[pname] = prop
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {
        "type": "function",
        "function": {
            "name": fn_name,
            "description": description if description is not None else doc_description,
            "parameters": parameters,
        },
    }


def _as_text(value: Any, name: str) -> str:
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (bool, int, float, list, dict)):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            pass
    raise ToolError(
        f"tool {name!r} returned {type(value).__name__}; return str, a number, or JSON data"
    )


class FunctionTool(BaseTool):
    """A ``BaseTool`` around one Python function; stateless across trajectories."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(config, schema_from_function(fn, name, description))
        self.fn = fn

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        if inspect.iscoroutinefunction(self.fn):
            value = await self.fn(**arguments)
        else:
            value = await asyncio.to_thread(self.fn, **arguments)
        if isinstance(value, ToolResult):
            return value
        return ToolResult(_as_text(value, self.name))


def function_tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None
) -> Any:
    """Decorator (bare or with ``name=``/``description=``) returning a ``FunctionTool``."""

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description)

    return wrap(fn) if fn is not None else wrap
