"""OpenAI chat messages as the gateway compares and renders them.

SDKs echo a returned assistant message back in their own way: ``content`` null or ``""``,
arguments JSON re-serialized with other spacing or key order, extra keys (``refusal``,
``annotations``, ``reasoning_content``), call ids of their own. ``comparable`` maps a message
to what survives those normalizations (role, text, calls as name + parsed arguments), so a
call that extends an earlier one is recognised however the SDK wrote it.

``render_messages`` turns OpenAI messages into the chat-template dicts of the rollout's
format (tool calls' arguments as the template wants them). A model turn the gateway sampled
is never rendered from these dicts into the trajectory (its sampled ids are kept); the dicts
only give the template what it needs to render the messages after it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentloop.messages import text_of

__all__ = [
    "ContextLengthError",
    "GatewayInputError",
    "comparable",
    "render_messages",
    "tool_schemas",
]

_ROLES = ("system", "developer", "user", "assistant", "tool")


class GatewayInputError(ValueError):
    """A request the gateway cannot serve; ``param`` names the offending field (400).
    ``code``: the dialect-neutral error code a client branches on (None: none)."""

    code: str | None = None

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(GatewayInputError):
    """A call whose prompt is over the session's token budget (400 with the context-length
    code of each dialect: OpenAI ``context_length_exceeded``, Anthropic an
    ``invalid_request_error`` whose message holds the counts). ``tokens`` and ``limit`` are
    the counts; ``key`` the config key that sets the limit."""

    code = "context_length_exceeded"

    def __init__(self, tokens: int, limit: int, key: str, what: str = "the prompt") -> None:
        super().__init__(
            f"{what} has {tokens} tokens, over the limit of {limit} tokens (set {key} higher, "
            "or shorten it)",
            "messages",
        )
        self.tokens = tokens
        self.limit = limit
        self.key = key


def _arguments(raw: Any, where: str) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return raw  # compared as written; the template gets the text
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    raise GatewayInputError(f"{where}.function.arguments must be a JSON string", where)


def _calls(message: dict[str, Any], where: str) -> list[tuple[str, Any]]:
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise GatewayInputError(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise GatewayInputError(f"{at}.function.name is missing", f"{at}.function.name")
        out.append((function["name"], _arguments(function.get("arguments"), at)))
    return out


def _role(message: Any, where: str) -> str:
    if not isinstance(message, dict):
        raise GatewayInputError(f"{where} must be an object with a 'role'", where)
    role = message.get("role")
    if role not in _ROLES:
        raise GatewayInputError(
            f"{where}.role must be one of {', '.join(_ROLES)}, got {role!r}", f"{where}.role"
        )
    return "system" if role == "developer" else role


def _text(message: dict[str, Any], where: str) -> str:
    content = message.get("content")
    if content is None:
        return ""
    try:
        return text_of(content)
    except (TypeError, ValueError) as exc:
        raise GatewayInputError(f"{where}.content: {exc}", f"{where}.content") from None


def comparable(message: dict[str, Any], index: int = 0) -> tuple[Any, ...]:
    """What of a message must match for a call to extend an earlier one: role, text, and
    the calls' names and parsed arguments (never their ids, spacing or extra keys)."""
    where = f"messages[{index}]"
    role = _role(message, where)
    calls = _calls(message, where) if role == "assistant" else []
    return (
        role,
        _text(message, where),
        json.dumps(calls, sort_keys=True, ensure_ascii=False) if calls else "",
    )


def render_messages(
    messages: Sequence[dict[str, Any]], *, string_arguments: bool, start: int = 0
) -> list[dict[str, Any]]:
    """Chat-template dicts of OpenAI messages: text content, calls with arguments as JSON
    text (``string_arguments``, templates that test ``arguments is string``) or the dict.
    ``start``: index of the first message in the request (for error names)."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages, start=start):
        where = f"messages[{i}]"
        role = _role(message, where)
        rendered: dict[str, Any] = {"role": role, "content": _text(message, where)}
        if role == "assistant" and message.get("tool_calls"):
            rendered["tool_calls"] = [
                {
                    "id": call.get("id") or f"call_{i}_{j}",
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": (
                            json.dumps(args, ensure_ascii=False)
                            if string_arguments and not isinstance(args, str)
                            else args
                        ),
                    },
                }
                for j, (call, (name, args)) in enumerate(
                    zip(message["tool_calls"], _calls(message, where), strict=True)
                )
            ]
        if role == "tool":
            if message.get("tool_call_id"):
                rendered["tool_call_id"] = str(message["tool_call_id"])
            if message.get("name"):
                rendered["name"] = str(message["name"])
        out.append(rendered)
    return out


def tool_schemas(tools: Any) -> list[dict[str, Any]]:
    """A request's ``tools`` as chat-template schemas (function tools only)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise GatewayInputError("tools must be a list of function tools", "tools")
    out = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise GatewayInputError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                "'parameters': ...}}}}",
                f"tools[{i}]",
            )
        # as the agent wrote it (key order included: the template renders it as JSON)
        schema = {k: v for k, v in function.items() if v is not None}
        out.append({"type": "function", "function": schema})
    return out
